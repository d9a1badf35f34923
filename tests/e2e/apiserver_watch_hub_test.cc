// The emulator's watch hub (e2e/apiserver/watch_hub.h) as pure code: a Store,
// a FakeClock and a recording stream stand in for the server. Replay from a
// resourceVersion, 410 when history is gone, selector transitions, the
// initial-events bookmark, deadlines and bookmarks from the clock, and a
// client that goes away.

#include "e2e/apiserver/watch_hub.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "src/http/server.h"

namespace tandem::apiserver {
namespace {

using nlohmann::json;
using std::chrono::seconds;

// An open stream that records what the hub sends.
class RecordingStream final : public http::SseWriter {
 public:
  bool send(std::string_view) override { return false; }
  bool sendEvent(const http::SseEvent&) override { return false; }
  bool sendRaw(std::string_view bytes) override {
    if (closed || failWrites || context_.cancelled()) return false;
    events.push_back(json::parse(bytes));
    return true;
  }
  void close() override { closed = true; }
  http::CallContext& context() override { return context_; }

  // "ADDED a", "BOOKMARK 7", "ERROR 410".
  std::vector<std::string> seen() const {
    std::vector<std::string> out;
    for (const auto& e : events) {
      const json& o = e["object"];
      std::string what = e["type"] == "ERROR"      ? std::to_string(o.value("code", 0))
                         : e["type"] == "BOOKMARK" ? o["metadata"].value("resourceVersion", "")
                                                   : o["metadata"].value("name", "");
      out.push_back(e["type"].get<std::string>() + " " + what);
    }
    return out;
  }

  std::vector<json> events;
  bool closed = false;
  bool failWrites = false;

 private:
  http::CallContext context_{MonoTime::max()};
};

class WatchHubTest : public ::testing::Test {
 protected:
  WatchHubTest() : hub_(store_, clock_, seconds(3), std::make_shared<Wakeup>()) {}

  std::shared_ptr<RecordingStream> open(WatchSpec spec) {
    auto stream = std::make_shared<RecordingStream>();
    hub_.open(std::move(spec), stream);
    return stream;
  }

  WatchSpec spec(std::string rv = "") {
    WatchSpec s;
    s.type = configMaps_;
    s.ns = "t";
    s.resourceVersion = std::move(rv);
    s.limit = seconds(10);
    return s;
  }

  void put(const std::string& name, const std::string& app = "x") {
    store_.put(configMaps_.storageKey(),
               {{"metadata", {{"name", name}, {"namespace", "t"}, {"labels", {{"app", app}}}}}});
  }

  const ResourceType configMaps_ = TypeRegistry().builtin("", "configmaps");
  FakeClock clock_;
  Store store_{100};
  WatchHub hub_;
};

TEST_F(WatchHubTest, ReplaysAfterItsResourceVersionThenFollowsTheStore) {
  put("a");  // rv 2
  put("b");  // rv 3
  auto s = open(spec("2"));
  put("a");
  store_.erase(configMaps_.storageKey(), "t", "b");
  EXPECT_EQ(s->seen(), (std::vector<std::string>{"ADDED b", "MODIFIED a", "DELETED b"}));
  EXPECT_EQ(s->events[0]["object"]["kind"], "ConfigMap");
}

TEST_F(WatchHubTest, UnsetResourceVersionStartsWithWhatExists) {
  put("a");
  auto s = open(spec(""));
  EXPECT_EQ(s->seen(), (std::vector<std::string>{"ADDED a"}));
}

TEST_F(WatchHubTest, HistoryNoLongerReachingBackIsAn410ThenTheEnd) {
  Store small(1);
  WatchHub hub(small, clock_, seconds(3), std::make_shared<Wakeup>());
  for (const char* name : {"a", "b", "c"}) {
    small.put(configMaps_.storageKey(), {{"metadata", {{"name", name}, {"namespace", "t"}}}});
  }
  auto s = std::make_shared<RecordingStream>();
  hub.open(spec("2"), s);
  EXPECT_EQ(s->seen(), (std::vector<std::string>{"ERROR 410"}));
  EXPECT_EQ(s->events[0]["object"]["reason"], "Expired");
  EXPECT_TRUE(s->closed);
  EXPECT_EQ(hub.numOpen(), 0u);
}

TEST_F(WatchHubTest, ObjectsEnteringOrLeavingTheSelectorAreAddedOrDeleted) {
  WatchSpec sp = spec("1");
  sp.labels = Selector::parseLabels("app=x");
  auto s = open(sp);
  put("a", "y");
  put("a", "x");
  put("a", "x");
  put("a", "y");
  EXPECT_EQ(s->seen(), (std::vector<std::string>{"ADDED a", "MODIFIED a", "DELETED a"}));
}

TEST_F(WatchHubTest, InitialEventsEndWithAnAnnotatedBookmark) {
  put("a");
  WatchSpec sp = spec("");
  sp.sendInitialEvents = true;
  sp.bookmarks = true;
  auto s = open(sp);
  ASSERT_EQ(s->seen(), (std::vector<std::string>{"ADDED a", "BOOKMARK 2"}));
  EXPECT_EQ(s->events[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
}

TEST_F(WatchHubTest, BookmarksAndTheDeadlineComeFromTheClock) {
  const MonoTime start = clock_.now();
  WatchSpec sp = spec("1");
  sp.bookmarks = true;
  auto asked = open(sp);
  auto plain = open(spec("1"));
  EXPECT_EQ(hub_.nextDeadline(), start + seconds(3));
  hub_.tick(start + seconds(2));
  EXPECT_TRUE(asked->events.empty());
  hub_.tick(start + seconds(3));
  EXPECT_EQ(asked->seen(), (std::vector<std::string>{"BOOKMARK 1"}));
  EXPECT_TRUE(plain->events.empty());
  EXPECT_EQ(hub_.nextDeadline(), start + seconds(6));
  hub_.tick(start + seconds(10) - std::chrono::nanoseconds(1));
  EXPECT_EQ(hub_.numOpen(), 2u);
  hub_.tick(start + seconds(10));
  EXPECT_EQ(hub_.numOpen(), 0u);
  EXPECT_TRUE(asked->closed && plain->closed);
  EXPECT_EQ(hub_.nextDeadline(), MonoTime::max());
}

TEST_F(WatchHubTest, AClientThatLeftIsEndedAtTheNextTick) {
  auto left = open(spec("1"));
  auto broken = open(spec("1"));
  auto staying = open(spec("1"));
  left->context().cancel(http::CancelReason::kClientDisconnected);
  EXPECT_EQ(hub_.nextDeadline(), MonoTime::min());  // due at once
  hub_.tick(clock_.now());
  EXPECT_TRUE(left->closed);
  EXPECT_EQ(hub_.numOpen(), 2u);

  broken->failWrites = true;  // the next event finds the connection gone
  put("a");
  EXPECT_EQ(hub_.nextDeadline(), MonoTime::min());
  hub_.tick(clock_.now());
  EXPECT_TRUE(broken->closed);
  EXPECT_EQ(hub_.numOpen(), 1u);
  EXPECT_EQ(staying->seen(), (std::vector<std::string>{"ADDED a"}));
}

TEST_F(WatchHubTest, LimitAllShortensOpenWatchesAndCloseAllEndsThem) {
  const MonoTime start = clock_.now();
  auto s = open(spec("1"));
  hub_.limitAll(start + seconds(1));
  EXPECT_EQ(hub_.nextDeadline(), start + seconds(1));
  hub_.closeAll();
  EXPECT_TRUE(s->closed);
  auto late = open(spec("1"));
  EXPECT_TRUE(late->closed);
  EXPECT_EQ(hub_.numOpen(), 0u);
}

}  // namespace
}  // namespace tandem::apiserver
