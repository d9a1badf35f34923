// P/D under injected faults and a soak test. The pair runs the agent's test
// build, tandem-agent-faults (tests/agent/faults/): the real agent with a
// fault-injecting KV transport, configured by its own --fault-* flags.
// For every fault: typed errors to the affected clients, correct output for
// everyone else (compared with a monolithic agent), and no leaked KV block
// or lease on either side once things settle.

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "src/http/client.h"
#include "tests/agent/agent_process.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using testing::AgentProcess;
using testing::metricValue;
using testing::scrape;
using testing::waitFor;
using testing::metricValueWith;

constexpr int kBlocks = 256;

struct Pair {
  std::unique_ptr<AgentProcess> prefill, decode;
};

Pair startPair(std::vector<std::string> p_extra, std::vector<std::string> d_extra) {
  Pair pair;
  std::vector<std::string> p = {"--role", "prefill", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--num-blocks", std::to_string(kBlocks)};
  p.insert(p.end(), p_extra.begin(), p_extra.end());
  pair.prefill = AgentProcess::start(p, TANDEM_FAULT_AGENT);
  if (!pair.prefill) return pair;
  std::vector<std::string> d = {"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--num-blocks", std::to_string(kBlocks),
                                "--prefill-peer", "127.0.0.1:" + std::to_string(pair.prefill->kvPort())};
  d.insert(d.end(), d_extra.begin(), d_extra.end());
  pair.decode = AgentProcess::start(d, TANDEM_FAULT_AGENT);
  return pair;
}

json request(const std::string& prompt, int max_tokens) {
  return {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

struct Reply {
  int status = -1;
  std::string text;
  std::string code;
};

Reply post(const AgentProcess& a, const json& body) {
  Reply r;
  auto resp = http::httpPost(a.url("/v1/completions"), body, std::chrono::seconds(60));
  if (!resp.ok()) return r;
  r.status = resp->status;
  auto j = json::parse(resp->body, nullptr, false);
  if (r.status == 200) r.text = j["choices"][0]["text"];
  else if (j.contains("error") && j["error"]["code"].is_string()) r.code = j["error"]["code"];
  return r;
}

// Both sides settled: every block back, no lease, no transfer in flight.
void expectNoLeaks(const Pair& pair) {
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*pair.decode), "tandem_kv_blocks_free{") == kBlocks; }))
      << "decode leaked blocks:\n" << scrape(*pair.decode);
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*pair.prefill), "tandem_kv_leases_active{") == 0; }))
      << "prefill kept leases:\n" << scrape(*pair.prefill);
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*pair.prefill), "tandem_kv_blocks_free{") == kBlocks; }));
  EXPECT_EQ(metricValue(scrape(*pair.decode), "tandem_kv_transfer_inflight{"), 0);
}

class PdFaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { mono_ = AgentProcess::start({}).release(); }
  static void TearDownTestSuite() {
    delete mono_;
    mono_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(mono_, nullptr); }
  static std::string reference(const std::string& prompt, int max_tokens) { return post(*mono_, request(prompt, max_tokens)).text; }
  static AgentProcess* mono_;
};
AgentProcess* PdFaultTest::mono_ = nullptr;

// P announces too late for D's deadline: each transfer fails
// (prefill_timeout, P told and its lease freed) and, once no pull of it is
// outstanding, D computes the prompt itself with the blocks it had reserved
// (the only P was left): the client gets the right answer, not a 504.
TEST_F(PdFaultTest, LayerAnnouncementsPastTheDeadlineFailOverToLocalPrefill) {
  Pair pair = startPair({"--fault-layer-delay-ms", "1500"}, {"--prefill-timeout", "400ms"});
  ASSERT_TRUE(pair.prefill && pair.decode);
  for (int i = 0; i < 2; ++i) {  // below the unhealthy threshold: both go to P first
    const std::string prompt = "late layers " + std::to_string(i);
    Reply r = post(*pair.decode, request(prompt, 4));
    EXPECT_EQ(r.status, 200) << r.code;
    EXPECT_EQ(r.text, reference(prompt, 4));
  }
  const std::string d = scrape(*pair.decode);
  EXPECT_EQ(metricValueWith(d, "tandem_kv_transfer_failures_total", "reason=\"prefill_timeout\""), 2);
  EXPECT_EQ(testing::seriesValue(d, "tandem_kv_prefill_failovers_total", {"reason=\"deadline\"", "to=\"local\""}), 2)
      << d;
  EXPECT_EQ(metricValue(d, "tandem_request_path_total{path=\"fallback\""), 2);
  expectNoLeaks(pair);
}

TEST_F(PdFaultTest, SlowReaderStopsBeforeTheLeaseEnds) {
  Pair pair = startPair({"--lease-ttl", "400ms"}, {"--fault-get-delay-ms", "1000"});
  ASSERT_TRUE(pair.prefill && pair.decode);
  Reply r = post(*pair.decode, request("slow gets", 4));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.code, "lease_expired");
  expectNoLeaks(pair);
}

// Pulls in flight when D's lease deadline passes: the transfer fails
// (lease_expired), and ends once the held completions arrive after the
// deadline; nothing is trusted or leaked.
TEST_F(PdFaultTest, PullsOutstandingPastTheLeaseEndTheTransfer) {
  Pair pair = startPair({"--lease-ttl", "400ms"}, {"--fault-get-complete-delay-ms", "1000"});
  ASSERT_TRUE(pair.prefill && pair.decode);
  Reply r = post(*pair.decode, request("held completions", 4));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.code, "lease_expired");
  expectNoLeaks(pair);
}

TEST_F(PdFaultTest, PeerThatFailsOnceIsUsedAgainRightAway) {
  Pair pair = startPair({"--fault-fail-first-transfers", "1"}, {});
  ASSERT_TRUE(pair.prefill && pair.decode);
  Reply first = post(*pair.decode, request("fails once", 6));
  EXPECT_EQ(first.status, 503);
  EXPECT_EQ(first.code, "transfer_failed");
  for (int i = 0; i < 3; ++i) {
    std::string prompt = "then works " + std::to_string(i);
    Reply r = post(*pair.decode, request(prompt, 6));
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.text, reference(prompt, 6));
  }
  // One failure does not make the peer unhealthy: the failed request and the
  // three after it all went to P, none fell back.
  EXPECT_EQ(metricValue(scrape(*pair.decode), "tandem_request_path_total{path=\"disagg\""), 4);
  EXPECT_EQ(metricValue(scrape(*pair.decode), "tandem_request_path_total{path=\"fallback\""), 0);
  expectNoLeaks(pair);
}

TEST_F(PdFaultTest, DeadlinesInEveryPhaseLeakNothingAndSparedRequestsAreCorrect) {
  // Requests are queued, mid-transfer or decoding when their 300 ms deadline
  // passes; whatever finishes must be right, and nothing may leak.
  Pair pair = startPair({"--fault-layer-delay-ms", "60"}, {"--request-timeout", "300ms", "--max-num-seqs", "4"});
  ASSERT_TRUE(pair.prefill && pair.decode);
  std::mt19937 rng(41);
  std::vector<std::pair<std::string, int>> reqs;
  for (int i = 0; i < 24; ++i) reqs.emplace_back("phase " + std::to_string(i) + std::string(rng() % 300, 'p'), 5 + static_cast<int>(rng() % 200));
  std::vector<Reply> replies(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] { replies[i] = post(*pair.decode, request(reqs[i].first, reqs[i].second)); });
  }
  for (auto& t : threads) t.join();
  int ok = 0, timed_out = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (replies[i].status == 200) {
      ++ok;
      EXPECT_EQ(replies[i].text, reference(reqs[i].first, reqs[i].second)) << "request " << i;
    } else {
      ++timed_out;
      EXPECT_EQ(replies[i].status, 504) << replies[i].code;
    }
  }
  EXPECT_GT(timed_out, 0);
  expectNoLeaks(pair);
}

// A streaming request the test hangs up on (client cancel) when it decides.
struct Stream {
  std::unique_ptr<http::SseClient> sse;
  std::thread reader;
  std::atomic<int> events{0};
  static std::unique_ptr<Stream> open(const AgentProcess& a, const std::string& prompt, int max_tokens) {
    json body = request(prompt, max_tokens);
    body["stream"] = true;
    auto s = http::SseClient::open(
        {.method = "POST", .url = a.url("/v1/completions"), .body = body.dump(), .timeout = std::chrono::seconds(60)});
    if (!s.ok() || (*s)->status() != 200) return nullptr;
    auto st = std::make_unique<Stream>();
    st->sse = std::move(*s);
    st->reader = std::thread([p = st.get()] {
      (void)p->sse->readEvents([p](const http::SseEvent&) {
        p->events.fetch_add(1);
        return true;
      });
    });
    return st;
  }
  void hangUp() {
    sse->stop();
    reader.join();
  }
};

// The client hangs up in each phase of a disaggregated request, chosen
// deterministically (fault hooks hold the request in that phase): queued on
// D, waiting for P's layers, pulls finished but their completions held
// (gets outstanding), and decoding. Each time: nothing leaks on either side,
// D never frees blocks under an outstanding get, and the peer stays usable.
TEST_F(PdFaultTest, ClientCancelInEveryPhaseLeaksNothing) {
  const std::string prompt = "cancel phase " + std::string(200, 'c');
  const std::string want = reference(prompt, 8);
  {
    SCOPED_TRACE("queued on D behind a running request, then decoding");
    Pair pair = startPair({}, {"--max-num-seqs", "1", "--sse-keepalive", "100ms"});
    ASSERT_TRUE(pair.prefill && pair.decode);
    auto running = Stream::open(*pair.decode, prompt, 2000);
    ASSERT_NE(running, nullptr);
    ASSERT_TRUE(waitFor([&] { return running->events.load() > 0; }));  // decoding
    auto queued = Stream::open(*pair.decode, prompt + " second", 8);
    ASSERT_NE(queued, nullptr);
    ASSERT_TRUE(waitFor([&] { return metricValue(scrape(*pair.decode), "tandem_requests_waiting{") == 1; }));
    queued->hangUp();
    // Noticed at the next keepalive: the queued request goes, the running one stays.
    ASSERT_TRUE(waitFor([&] { return metricValue(scrape(*pair.decode), "tandem_requests_waiting{") == 0; }));
    EXPECT_EQ(metricValue(scrape(*pair.decode), "tandem_requests_running{"), 1);
    running->hangUp();  // cancel while decoding
    expectNoLeaks(pair);
    EXPECT_EQ(post(*pair.decode, request(prompt, 8)).text, want);
  }
  {
    SCOPED_TRACE("waiting for P's layer announcements");
    // P holds its announcements and the lease for ten minutes, longer than
    // any wait below: only D's Abort can end the lease while the test runs.
    Pair pair = startPair({"--fault-layer-delay-ms", "600000", "--lease-ttl", "10m"},
                          {"--lease-ttl", "10m", "--sse-keepalive", "100ms"});
    ASSERT_TRUE(pair.prefill && pair.decode);
    auto st = Stream::open(*pair.decode, prompt, 8);
    ASSERT_NE(st, nullptr);
    ASSERT_TRUE(waitFor([&] { return metricValue(scrape(*pair.prefill), "tandem_kv_leases_active{") == 1; }));
    EXPECT_EQ(metricValue(scrape(*pair.decode), "tandem_kv_transfer_inflight{"), 1);
    st->hangUp();
    ASSERT_TRUE(waitFor([&] {
      return metricValueWith(scrape(*pair.decode), "tandem_kv_transfer_failures_total", "reason=\"cancelled\"") == 1;
    }));
    // D told P: the lease goes now, not when it would expire or the late layers come.
    ASSERT_TRUE(waitFor([&] { return metricValue(scrape(*pair.prefill), "tandem_kv_leases_active{") == 0; }));
    expectNoLeaks(pair);
    // The client went away: the request ends cancelled, not as an error.
    const std::string d = scrape(*pair.decode);
    EXPECT_EQ(metricValueWith(d, "tandem_requests_total", "finish_reason=\"cancelled\""), 1) << d;
    EXPECT_EQ(metricValueWith(d, "tandem_requests_total", "finish_reason=\"error\""), 0);
  }
  {
    SCOPED_TRACE("pulls done but their completions held: gets outstanding");
    Pair pair = startPair({}, {"--fault-get-complete-delay-ms", "2500", "--sse-keepalive", "100ms"});
    ASSERT_TRUE(pair.prefill && pair.decode);
    auto st = Stream::open(*pair.decode, prompt, 8);
    ASSERT_NE(st, nullptr);
    ASSERT_TRUE(waitFor([&] { return metricValue(scrape(*pair.decode), "tandem_kv_transfer_inflight{") == 1; }));
    // P announced, D's gets ran, and the fault transport holds a completion.
    ASSERT_TRUE(waitFor([&] { return pair.decode->log().find("held a get completion") != std::string::npos; }));
    st->hangUp();
    // The hang-up is noticed at the next keepalive and the request cancelled,
    // but the held gets count as outstanding: the blocks stay allocated.
    ASSERT_TRUE(waitFor([&] {
      return metricValueWith(scrape(*pair.decode), "tandem_kv_transfer_failures_total", "reason=\"cancelled\"") == 1;
    }));
    EXPECT_LT(metricValue(scrape(*pair.decode), "tandem_kv_blocks_free{"), kBlocks);
    expectNoLeaks(pair);  // once the completions are handled, everything returns
    EXPECT_EQ(post(*pair.decode, request(prompt, 8)).text, want);
  }
}

TEST_F(PdFaultTest, SoakConcurrentRequestsWithHangupsAndDelays) {
  Pair pair = startPair({"--fault-layer-delay-ms", "15"}, {"--fault-get-delay-ms", "5", "--max-num-seqs", "16"});
  ASSERT_TRUE(pair.prefill && pair.decode);
  // A pool of prompts with precomputed references.
  std::mt19937 rng(42);
  std::vector<std::string> prompts;
  std::vector<std::string> refs;
  for (int i = 0; i < 40; ++i) {
    std::string p = "soak " + std::to_string(i) + " ";
    for (int k = rng() % 200; k > 0; --k) p.push_back(static_cast<char>('a' + rng() % 26));
    prompts.push_back(p);
    refs.push_back(reference(p, 12));
  }
  constexpr int kRequests = 600, kConcurrency = 24;
  std::atomic<int> next{0}, mismatches{0}, completed{0}, hung_up{0}, errors{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < kConcurrency; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937 r(1000 + w);
      for (int i = next.fetch_add(1); i < kRequests; i = next.fetch_add(1)) {
        const size_t p = r() % prompts.size();
        json body = request(prompts[p], 12);
        body["stream"] = true;
        auto s = http::SseClient::open({.method = "POST", .url = pair.decode->url("/v1/completions"), .body = body.dump(),
                                        .timeout = std::chrono::seconds(60)});
        if (!s.ok() || (*s)->status() != 200) {
          errors.fetch_add(1);
          continue;
        }
        const int hang_after = r() % 10 < 3 ? 1 + static_cast<int>(r() % 3) : -1;  // 30%: hang up early
        int events = 0;
        std::string text;
        bool done = false;
        (void)(*s)->readEvents([&](const http::SseEvent& e) {
          if (e.data == "[DONE]") {
            done = true;
            return false;
          }
          auto j = json::parse(e.data, nullptr, false);
          if (j.contains("choices") && !j["choices"].empty()) text += j["choices"][0]["text"].get<std::string>();
          return hang_after < 0 || ++events < hang_after;
        });
        if (hang_after >= 0 && !done) {
          (*s)->stop();
          hung_up.fetch_add(1);
        } else if (done) {
          completed.fetch_add(1);
          if (text != refs[p]) mismatches.fetch_add(1);
        } else {
          errors.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(completed.load(), kRequests / 2);
  EXPECT_GT(hung_up.load(), 0);
  expectNoLeaks(pair);
}

}  // namespace
}  // namespace tandem::agent
