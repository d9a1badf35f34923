// The emulator's timing on a FakeClock, in process, through the real HTTP
// server and src/k8s's client: a watch ends at its timeoutSeconds (or the
// watch-drop fault's time), bookmarks come every bookmarkInterval and only
// to watches that asked, and the slow fault holds an answer back until the
// clock passed its delay. The times are an hour or more, so real time
// passing cannot be what ends anything.

#include <future>

#include <gtest/gtest.h>

#include "e2e/apiserver/api_server.h"
#include "src/http/client.h"
#include "src/k8s/client.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

namespace tandem::apiserver {
namespace {

using std::chrono::hours;
using std::chrono::seconds;
using testutil::waitFor;

class ApiServerClockTest : public ::testing::Test {
 protected:
  void start(ApiServerOptions options) {
    auto server = ApiServer::start(std::move(options), clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto client = k8s::Client::create({.server = server_->baseUrl()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  std::unique_ptr<k8s::Watch> watchConfigMaps(bool bookmarks, int timeoutSeconds = 0) {
    auto w = client_->watch(k8s::configMapsResource(), "default",
                            {.allowBookmarks = bookmarks, .timeoutSeconds = timeoutSeconds});
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  }

  void createConfigMap(const std::string& name) {
    auto c = client_->create(k8s::configMapsResource(), "default",
                             {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", name}}}});
    ASSERT_TRUE(c.ok()) << c.status();
  }

  // The next event's type and object name; "end" when the server ended the watch.
  static std::string next(k8s::Watch& w) {
    auto e = w.next();
    if (!e.ok()) return "error: " + std::string(e.status().message());
    if (!e->has_value()) return "end";
    const char* types[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"};
    return std::string(types[static_cast<int>((*e)->type)]) + " " +
           (*e)->object["metadata"].value("name", (*e)->object["metadata"].value("resourceVersion", ""));
  }

  // `w` still gets events until just before `after` has passed on the
  // clock, and ends then.
  void expectOpenUntil(k8s::Watch& w, Duration after) {
    clock_.advance(after - seconds(1));
    createConfigMap("second");
    EXPECT_EQ(next(w), "ADDED second");
    clock_.advance(seconds(1));
    EXPECT_EQ(next(w), "end");
  }

  FakeClock clock_;
  std::unique_ptr<ApiServer> server_;
  std::unique_ptr<k8s::Client> client_;
};

TEST_F(ApiServerClockTest, WatchEndsAtTimeoutSecondsOnTheClock) {
  start({.port = 0, .maxWatch = hours(10)});
  createConfigMap("first");
  auto w = watchConfigMaps(false, 3600);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(next(*w), "ADDED first");  // the watch is open: its deadline counts from now
  expectOpenUntil(*w, hours(1));
}

TEST_F(ApiServerClockTest, WatchEndsAtTheServersLongestWatch) {
  start({.port = 0, .maxWatch = hours(1)});
  createConfigMap("first");
  auto w = watchConfigMaps(false, 3 * 3600);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(next(*w), "ADDED first");
  expectOpenUntil(*w, hours(1));
}

TEST_F(ApiServerClockTest, WatchDropFaultSetAtRunTimeCutsOpenWatches) {
  start({.port = 0, .maxWatch = hours(10)});
  createConfigMap("first");
  auto w = watchConfigMaps(false);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(next(*w), "ADDED first");
  http::ClientRequest put{
      .method = "PUT", .url = server_->baseUrl() + "/tandem/faults", .body = R"({"watchDropAfterMs":3600000})"};
  put.headers["Content-Type"] = "application/json";
  auto r = http::httpSend(put);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  expectOpenUntil(*w, hours(1));
}

TEST_F(ApiServerClockTest, BookmarksEveryIntervalOnlyToWatchesThatAskedForThem) {
  start({.port = 0, .bookmarkInterval = hours(1), .maxWatch = hours(10)});
  createConfigMap("first");
  auto asked = watchConfigMaps(true);
  auto plain = watchConfigMaps(false);
  ASSERT_NE(asked, nullptr);
  ASSERT_NE(plain, nullptr);
  ASSERT_EQ(next(*asked), "ADDED first");
  ASSERT_EQ(next(*plain), "ADDED first");
  clock_.advance(hours(1));
  // Both watches are served in the same pass of the timer thread, so once
  // `asked` has its bookmark, `plain` would have had one queued too.
  EXPECT_TRUE(next(*asked).starts_with("BOOKMARK ")) << "no bookmark after the interval";
  createConfigMap("second");
  EXPECT_EQ(next(*plain), "ADDED second");
  EXPECT_EQ(next(*asked), "ADDED second");
}

TEST_F(ApiServerClockTest, SlowFaultAnswersOnceTheClockPassedTheDelay) {
  start({.port = 0, .faults = {.slowRate = 1, .slowDelay = hours(2)}});
  const MonoTime sent = clock_.now();
  auto reply = std::async(std::launch::async, [&] { return client_->get(k8s::namespacesResource(), "", "default"); });
  // Advance in steps until the answer arrives: it must not come before two
  // hours passed on the clock.
  ASSERT_TRUE(waitFor([&] {
    if (reply.wait_for(std::chrono::seconds(0)) == std::future_status::ready) return true;
    clock_.advance(std::chrono::minutes(10));
    return false;
  }));
  const MonoTime answered = clock_.now();
  auto ns = reply.get();
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_EQ((*ns)["metadata"]["name"], "default");
  EXPECT_GE(answered - sent, hours(2));
}

}  // namespace
}  // namespace tandem::apiserver
