// ./tandem bench transport — pulling a prompt's KV over the UCX transport.
//
// For prompts of 1K, 8K and 32K tokens of the tiny model (4 layers, 16-token
// blocks: one layer block is 8 KiB), D pulls every layer block from P with
// one logical get per layer (UcxTransport::getv), all four layers in flight
// at once, as the decode agent does. Two block placements:
//  * contiguous: P's and D's blocks are runs of consecutive ids (a fresh
//    pool), so the transport merges a layer into one UCX get of
//    tokens/16 × 8 KiB;
//  * scattered: P's blocks are shuffled, nothing merges, every layer block
//    is its own 8 KiB UCX get.
// Yardsticks measured in the same run: ucx_perftest's ucp_get bandwidth for
// the same transport and the same UCX message size (the merged layer size,
// or 8 KiB with 64 gets outstanding for the scattered case), and
// single-thread memcpy of the same bytes. Target: >= 80 % of ucx_perftest
// for the same transport and size.
//
// Caveat on the yardstick: ucx_perftest reads the same buffer every
// iteration, so small messages are cache-hot on its side (over shared
// memory a 512 KiB get runs at L2 speed, 8 KiB ones at L1 speed); the pull
// reads a prompt's worth of distinct bytes. So each pull is also set
// against ucx_perftest with one get of the prompt's whole KV (2/16/64 MiB:
// the same bytes per iteration as the pull), results *_vs_prompt_size.
//
// TTFT of disaggregated vs monolithic serving: in-process agents (a
// monolithic one, and a prefill + decode pair per transport) serve the same
// fresh prompts of 1K/4K/8K tokens (max_tokens 1, no prefix-cache hits).
// From the decode agent's trace (docs/trace-schema.md): TTFT split into
// P's prefill (as D sees it), the transfer time not hidden behind P's
// compute, and D's first step; and the share of transfer time hidden by
// the layer-wise overlap. Yardstick: the monolithic agent's TTFT.
//
// TTFT with the prefill agent stopped (SIGSTOP), against TTFT with it
// running: see stalledPrefill(); a decode agent stopped behind the router:
// see stalledDecode().
//
// Connection set-up with the authentication handshake (kvproto v4,
// docs/security.md) against the Hello exchange alone (what a connection
// did before it): see connectionSetup().

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "agent/agent_server.h"
#include "agent/router/router_server.h"
#include "agent/transport/ucx_transport.h"
#include "bench/bench_report.h"
#include "src/auth/kv_handshake.h"
#include "src/kvproto/kvproto.h"
#include "engine/model/model_loader.h"
#include "engine/model/weights.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/client.h"

extern char** environ;

using namespace tandem;
using namespace tandem::transport;

namespace {

constexpr size_t kLayerBlockBytes = 2 * 16 * 2 * 32 * sizeof(float);  // K and V, 16 tokens, 2 KV heads, head_dim 32
constexpr int kLayers = 4;

// Runs ucx_perftest as server and client with UCX_TLS=tls once; returns the
// "Final" overall bandwidth in MB/s, 0 if it could not run (why on stderr).
double ucxPerftestOnce(const std::string& tls, size_t size, int outstanding) {
  static int port = 13501;
  const std::string p = std::to_string(port++);
  // About 1 GiB per run, at least 20 iterations.
  const size_t iters = std::clamp<size_t>((size_t{1} << 30) / size, 20, 20000);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  env_strings.push_back("UCX_TLS=" + tls);
  std::vector<char*> env;
  for (auto& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  std::vector<std::string> srv_args = {"ucx_perftest", "-p", p};
  std::vector<char*> srv;
  for (auto& a : srv_args) srv.push_back(a.data());
  srv.push_back(nullptr);
  pid_t server = 0;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  if (posix_spawnp(&server, "ucx_perftest", &fa, nullptr, srv.data(), env.data()) != 0) {
    std::fprintf(stderr, "ucx_perftest: cannot start the server (is ucx-utils installed?)\n");
    posix_spawn_file_actions_destroy(&fa);
    return 0;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string cmd = "UCX_TLS=" + tls + " ucx_perftest 127.0.0.1 -p " + p + " -t ucp_get -s " + std::to_string(size) +
                    " -n " + std::to_string(iters) + " -w " + std::to_string(std::max<size_t>(iters / 10, 2)) + " -O " +
                    std::to_string(outstanding) + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  double mbs = 0;
  char line[512];
  while (f && fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "Final:", 6) == 0) {
      std::istringstream in(line + 6);
      double v[8] = {};
      for (double& x : v) in >> x;
      mbs = v[5];  // iterations, 3 latencies, bandwidth avg, bandwidth overall, ...
    }
  }
  const int client_status = f ? pclose(f) : -1;
  kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
  posix_spawn_file_actions_destroy(&fa);
  if (!(mbs > 0)) {
    std::fprintf(stderr, "ucx_perftest UCX_TLS=%s size %zu: no bandwidth reported (client exit status %d)\n",
                 tls.c_str(), size, client_status);
  }
  return mbs;
}

// ucxPerftestOnce, tried up to three times (the client can race the
// server's start). Still 0 after that: the caller's result then has no
// yardstick and the benchmark fails (bench_report.h).
double ucxPerftest(const std::string& tls, size_t size, int outstanding) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const double mbs = ucxPerftestOnce(tls, size, outstanding);
    if (mbs > 0) return mbs;
  }
  return 0;
}

// --- TTFT of disaggregated vs monolithic ---------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<nlohmann::json> readTrace(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line, nullptr, false));
  return out;
}

struct Agent {
  std::unique_ptr<agent::AgentServer> server;
  std::string trace;
  std::string url;
};

absl::StatusOr<Agent> startAgent(const std::string& dir, const std::string& name, const std::string& model_dir,
                                 agent::AgentRole role, const std::string& tls, int prefill_kv_port) {
  agent::AgentConfig c;
  c.model_dir = model_dir;
  c.model_name = "tiny";
  c.host = "127.0.0.1";
  c.port = 0;
  c.role = role;
  c.worker = name;
  c.engine.num_blocks = 1024;  // 16K tokens: one 8K prompt at a time
  c.engine.seed = 1;
  c.trace_file = dir + "/" + name + ".jsonl";
  c.kv_host = "127.0.0.1";
  c.kv_port = 0;
  c.kv_tls = tls;
  if (prefill_kv_port > 0) c.prefill_peers = {agent::HostPort{.host = "127.0.0.1", .port = prefill_kv_port}};
  TANDEM_ASSIGN_OR_RETURN(auto server, agent::AgentServer::start(c, SystemClock::instance()));
  Agent a{.server = std::move(server), .trace = c.trace_file, .url = ""};
  a.url = strCat("http://127.0.0.1:", a.server->port(), "/v1/completions");
  return a;
}

// Sends `prompts` one at a time; returns false on any failure.
bool serve(const Agent& a, const std::vector<std::string>& prompts) {
  for (const std::string& p : prompts) {
    auto r = http::httpPost(a.url, nlohmann::json{{"model", "tiny"}, {"prompt", p}, {"max_tokens", 1}, {"temperature", 0}},
                            std::chrono::seconds(120));
    if (!r.ok() || r->status != 200) {
      std::fprintf(stderr, "bench_transport: request failed: %s\n",
                   r.ok() ? r->body.c_str() : std::string(r.status().message()).c_str());
      return false;
    }
  }
  return true;
}

bool ttftSplit(std::vector<bench::Result>& results, const std::string& dir) {
  const std::string model_dir = dir + "/tiny";
  absl::Status written =
      engine::writeModelDir(model_dir, *engine::makeRandomWeights(engine::tinyModelConfig(), 1234), engine::DType::kF32);
  if (!written.ok()) return false;
  std::mt19937 rng(3);
  auto fresh = [&](int n) {  // printable ASCII: one token per byte, never a prefix of another prompt
    std::string s(static_cast<size_t>(n), ' ');
    for (char& ch : s) ch = static_cast<char>('!' + rng() % 90);
    return s;
  };
  const std::vector<std::pair<int, int>> sizes = {{1024, 7}, {4096, 5}, {8192, 3}};  // tokens, repetitions
  auto mono = startAgent(dir, "mono", model_dir, agent::AgentRole::kBoth, "", 0);
  if (!mono.ok()) return false;
  std::vector<std::string> warmup = {fresh(512), fresh(512)};
  if (!serve(*mono, warmup)) return false;
  std::map<int, double> mono_ttft;
  for (auto [n, reps] : sizes) {
    std::vector<std::string> prompts;
    for (int i = 0; i < reps; ++i) prompts.push_back(fresh(n - 1));  // + BOS
    if (!serve(*mono, prompts)) return false;
  }
  std::map<int, std::vector<double>> by_size;
  for (const auto& r : readTrace(mono->trace)) {
    if (r["prompt_tokens"].get<int>() > 1000) by_size[r["prompt_tokens"].get<int>()].push_back(r["ttft_ms"].get<double>());
  }
  for (auto& [n, v] : by_size) mono_ttft[n] = median(v);
  mono->server.reset();

  for (const std::string tls : {"tcp", "posix,cma,tcp"}) {
    const std::string tname = tls == "tcp" ? "tcp" : "shm";
    auto p = startAgent(dir, "prefill-" + tname, model_dir, agent::AgentRole::kPrefill, tls, 0);
    if (!p.ok()) return false;
    auto d = startAgent(dir, "decode-" + tname, model_dir, agent::AgentRole::kDecode, tls, p->server->kvPort());
    if (!d.ok()) return false;
    if (!serve(*d, warmup)) return false;
    for (auto [n, reps] : sizes) {
      std::vector<std::string> prompts;
      for (int i = 0; i < reps; ++i) prompts.push_back(fresh(n - 1));
      if (!serve(*d, prompts)) return false;
    }
    struct Split {
      std::vector<double> ttft, prefill, exposed, first_step, transfer, hidden;
    };
    std::map<int, Split> split;
    for (const auto& r : readTrace(d->trace)) {
      const int n = r["prompt_tokens"].get<int>();
      if (n < 1000 || r["path"] != "disagg" || !r["kv_prefill_ms"].is_number()) continue;
      Split& s = split[n];
      s.ttft.push_back(r["ttft_ms"].get<double>());
      s.prefill.push_back(r["kv_prefill_ms"].get<double>());
      s.transfer.push_back(r["kv_transfer_ms"].get<double>());
      s.hidden.push_back(r["kv_transfer_hidden_ms"].get<double>());
      s.exposed.push_back(r["kv_transfer_ms"].get<double>() - r["kv_transfer_hidden_ms"].get<double>());
      s.first_step.push_back(r["kv_first_step_ms"].get<double>());
    }
    for (auto& [n, s] : split) {
      const std::string k = strCat("_", tname, "_", n / 1024, "k");
      const double ttft = median(s.ttft);
      results.push_back({.name = "ttft_disagg_ms" + k, .value = ttft, .unit = "ms", .reference = mono_ttft[n],
                         .reference_name = "monolithic TTFT ms"});
      results.push_back({.name = "ttft_split_prefill_ms" + k, .value = median(s.prefill), .unit = "ms", .reference = ttft,
                         .reference_name = "disagg TTFT ms"});
      results.push_back({.name = "ttft_split_transfer_exposed_ms" + k, .value = median(s.exposed), .unit = "ms",
                         .reference = ttft, .reference_name = "disagg TTFT ms"});
      results.push_back({.name = "ttft_split_first_step_ms" + k, .value = median(s.first_step), .unit = "ms",
                         .reference = ttft, .reference_name = "disagg TTFT ms"});
      double hidden = 0, transfer = 0;
      for (size_t i = 0; i < s.transfer.size(); ++i) {
        hidden += s.hidden[i];
        transfer += s.transfer[i];
      }
      results.push_back({.name = "transfer_hidden_ms" + k, .value = hidden / static_cast<double>(s.transfer.size()),
                         .unit = "ms", .reference = transfer / static_cast<double>(s.transfer.size()),
                         .reference_name = "transfer ms (mean)"});
    }
    d->server.reset();
    p->server.reset();
  }
  return true;
}

// The wall time of one request with max_tokens 1 (its TTFT as the client
// sees it), in ms; negative on failure.
double timedRequest(const Agent& a, const std::string& prompt) {
  const auto start = std::chrono::steady_clock::now();
  if (!serve(a, {prompt})) return -1;
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// An agent in its own process (so it can be stopped with SIGSTOP), started
// from this binary's directory; killed (after SIGCONT) when this goes.
struct ChildAgent {
  pid_t pid = 0;
  int http_port = 0;
  int kv_port = 0;
  std::string trace;  // its trace file
  ChildAgent() = default;
  ChildAgent(const ChildAgent&) = delete;
  ChildAgent& operator=(const ChildAgent&) = delete;
  ~ChildAgent() {
    if (pid <= 0) return;
    kill(pid, SIGCONT);
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
};

// Starts tandem-agent named `name` with `args` and waits for its ports; null on failure.
std::unique_ptr<ChildAgent> spawnAgent(const std::string& dir, const std::string& name, std::vector<std::string> args) {
  const std::string agent_bin = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "tandem-agent").string();
  const std::string port_file = dir + "/" + name + ".port";
  auto child = std::make_unique<ChildAgent>();
  child->trace = dir + "/" + name + ".jsonl";
  std::vector<std::string> all = {agent_bin,   "--model-dir", dir + "/tiny", "--listen",     "127.0.0.1:0",
                                  "--port-file", port_file,   "--log-level",  "error",        "--worker",
                                  name,        "--trace-file", child->trace};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (posix_spawn(&child->pid, agent_bin.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "bench_transport: cannot start %s\n", agent_bin.c_str());
    child->pid = 0;
    return nullptr;
  }
  for (int i = 0; i < 600 && child->http_port == 0; ++i) {
    std::ifstream in(port_file);
    if (!(in >> child->http_port >> child->kv_port)) child->http_port = 0;
    if (child->http_port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (child->http_port == 0) {
    std::fprintf(stderr, "bench_transport: agent %s did not start\n", name.c_str());
    return nullptr;
  }
  return child;
}

// The value of the first series of `name` in `url`'s metrics; -1 if none.
double scrapeValue(const std::string& url, const std::string& name) {
  auto r = http::httpGet(url);
  if (!r.ok()) return -1;
  std::istringstream in(r->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

// A prefill agent that stalls (docs/pd.md "Liveness"): P runs as its own
// process (so it can be stopped with SIGSTOP), D in this one with P as its
// only prefill peer. Yardstick: TTFT with P running. Then, five times: stop
// P, time the first request (D notices the unanswered heartbeats and
// prefills it locally), time a second one (P already suspect), resume P and
// wait until D uses it again. Target (P/D liveness issue): TTFT <= 3 s with
// P stopped, instead of the 60 s prefill deadline.
bool stalledPrefill(std::vector<bench::Result>& results, const std::string& dir) {
  const std::string model_dir = dir + "/tiny";
  auto p = spawnAgent(dir, "stalled-p", {"--role", "prefill", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp",
                                         "--lease-ttl", "5s"});
  if (!p) return false;
  const pid_t pid = p->pid;
  const int kv_port = p->kv_port;
  auto d = startAgent(dir, "decode-stalled", model_dir, agent::AgentRole::kDecode, "tcp", kv_port);
  if (!d.ok()) return false;
  const std::string metrics_url = strCat("http://127.0.0.1:", d->server->port(), "/metrics");
  auto peer_healthy = [&] { return scrapeValue(metrics_url, "tandem_kv_prefill_peer_healthy") == 1; };
  std::mt19937 rng(11);
  auto fresh = [&] {
    std::string s(511, ' ');
    for (char& ch : s) ch = static_cast<char>('!' + rng() % 90);
    return s;
  };
  if (!serve(*d, {fresh(), fresh()})) return false;
  std::vector<double> running, first, after;
  for (int i = 0; i < 5; ++i) running.push_back(timedRequest(*d, fresh()));
  for (int rep = 0; rep < 5; ++rep) {
    kill(pid, SIGSTOP);
    first.push_back(timedRequest(*d, fresh()));
    after.push_back(timedRequest(*d, fresh()));
    kill(pid, SIGCONT);
    for (int i = 0; i < 400 && !peer_healthy(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    if (!peer_healthy()) {
      std::fprintf(stderr, "bench_transport: D never used the resumed P again\n");
      return false;
    }
    // Idle a while, so the stop lands anywhere in the idle heartbeat period.
    std::this_thread::sleep_for(std::chrono::milliseconds(300 * (rep + 1)));
  }
  for (const auto* v : {&running, &first, &after}) {
    if (std::any_of(v->begin(), v->end(), [](double x) { return x < 0; })) return false;
  }
  const double ref = median(running);
  results.push_back({.name = "stalled_prefill_ttft_ms_first", .value = median(first), .unit = "ms", .reference = ref,
                     .reference_name = "TTFT ms with P running"});
  results.push_back({.name = "stalled_prefill_ttft_ms_first_max",
                     .value = *std::max_element(first.begin(), first.end()),
                     .unit = "ms",
                     .reference = ref,
                     .reference_name = "TTFT ms with P running"});
  results.push_back({.name = "stalled_prefill_ttft_ms_after_detection", .value = median(after), .unit = "ms",
                     .reference = ref, .reference_name = "TTFT ms with P running"});
  d->server.reset();
  return true;
}

// A decode agent that stalls, behind the router (docs/routing.md
// "Liveness"): two agents (role both) in their own processes, the router in
// this one. Yardstick: the latency of a request (max_tokens 1) through the
// router with both running. Then, five times: stop the agent that holds a
// session, time that session's next turn (routed to the stopped agent, called
// off once its state stream has been silent for --worker-stale-after, served
// by the other), time a new session's request (the stopped one already
// unresponsive), resume it and wait until the router takes it back. Target
// (P/D liveness issue): the moved request within 3 s.
bool stalledDecode(std::vector<bench::Result>& results, const std::string& dir) {
  std::unique_ptr<ChildAgent> d[2] = {spawnAgent(dir, "stalled-d0", {"--num-blocks", "512"}),
                                      spawnAgent(dir, "stalled-d1", {"--num-blocks", "512"})};
  if (!d[0] || !d[1]) return false;
  agent::AgentConfig rc;
  rc.model_dir = dir + "/tiny";
  rc.model_name = "tiny";
  rc.host = "127.0.0.1";
  rc.port = 0;
  rc.role = agent::AgentRole::kRouter;
  rc.worker = "stalled-router";
  rc.decode_workers = {{.host = "127.0.0.1", .port = d[0]->http_port}, {.host = "127.0.0.1", .port = d[1]->http_port}};
  auto router = agent::RouterServer::start(rc, SystemClock::instance());
  if (!router.ok()) {
    std::fprintf(stderr, "bench_transport: router: %s\n", std::string((router.status().message())).c_str());
    return false;
  }
  const std::string base = strCat("http://127.0.0.1:", (*router)->port());
  for (int i = 0; i < 400; ++i) {
    auto r = http::httpGet(base + "/readyz");
    if (r.ok() && r->status == 200 && scrapeValue(base + "/metrics", "tandem_router_stale_workers") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  // One turn of `session` through the router: its wall time in ms, negative on failure.
  auto turn = [&](const std::string& session, const std::string& prompt) {
    http::ClientRequest req{.method = "POST", .url = base + "/v1/completions"};
    req.headers["Content-Type"] = "application/json";
    req.headers["x-session-id"] = session;
    req.body = nlohmann::json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}}.dump();
    req.timeout = std::chrono::seconds(60);
    const auto start = std::chrono::steady_clock::now();
    auto r = http::httpSend(req);
    if (!r.ok() || r->status != 200) {
      std::fprintf(stderr, "bench_transport: routed request failed: %s\n",
                   r.ok() ? r->body.c_str() : std::string(r.status().message()).c_str());
      return -1.0;
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  // Sessions whose turns d0 served, from its trace.
  auto onD0 = [&] {
    std::vector<std::string> out;
    for (const auto& r : readTrace(d[0]->trace)) {
      if (r["session"].is_string()) out.push_back(r["session"]);
    }
    return out;
  };
  std::vector<double> running, moved, after;
  for (int i = 0; i < 8; ++i) running.push_back(turn(strCat("warm-", i), strCat("warm session ", i, " says hello")));
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<std::string> held;
    for (int k = 0; k < 6 && held.empty(); ++k) {
      const std::string s = strCat("rep-", rep, "-", k);
      // Prompts differ from the first block on, so no cached prefix pulls them to one worker.
      if (turn(s, s + " opens a conversation") < 0) return false;
      for (const std::string& o : onD0()) {
        if (o == s) held.push_back(s);
      }
    }
    if (held.empty()) {
      std::fprintf(stderr, "bench_transport: no session landed on d0\n");
      return false;
    }
    kill(d[0]->pid, SIGSTOP);
    moved.push_back(turn(held[0], held[0] + " opens a conversation and goes on"));
    after.push_back(turn(strCat("new-", rep), strCat("new session ", rep, " starts while d0 is stopped")));
    kill(d[0]->pid, SIGCONT);
    for (int i = 0; i < 400 && scrapeValue(base + "/metrics", "tandem_router_unresponsive_workers") != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    if (scrapeValue(base + "/metrics", "tandem_router_unresponsive_workers") != 0) {
      std::fprintf(stderr, "bench_transport: the router never took the resumed d0 back\n");
      return false;
    }
    // So the stop lands anywhere in the heartbeat period.
    std::this_thread::sleep_for(std::chrono::milliseconds(130 * (rep + 1)));
  }
  for (const auto* v : {&running, &moved, &after}) {
    if (std::any_of(v->begin(), v->end(), [](double x) { return x < 0; })) return false;
  }
  const double ref = median(running);
  results.push_back({.name = "stalled_decode_moved_ms", .value = median(moved), .unit = "ms", .reference = ref,
                     .reference_name = "routed request ms with both running"});
  results.push_back({.name = "stalled_decode_moved_ms_max", .value = *std::max_element(moved.begin(), moved.end()),
                     .unit = "ms", .reference = ref, .reference_name = "routed request ms with both running"});
  results.push_back({.name = "stalled_decode_ms_after_detection", .value = median(after), .unit = "ms",
                     .reference = ref, .reference_name = "routed request ms with both running"});
  router->reset();
  return true;
}

}  // namespace

// From connect() until D holds P's Hello (its remote key: D can pull), over
// tcp on loopback, 200 fresh connections each way, interleaved: with the
// handshake (AuthHello, AuthChallenge, AuthProof, then the Hellos), and the
// Hello exchange alone. P answers as a prefill agent does, in its
// transport's callback. Median of each.
bool connectionSetup(std::vector<bench::Result>& results) {
  const auto keys = *auth::PoolKeys::of({std::string(64, 'b')}, {"bench"});
  std::vector<std::byte> p_mem(1 << 20), d_mem(1 << 20);
  struct Inbox {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<kvproto::Message> messages;
  } inbox;
  std::mutex p_mu;
  std::map<ConnId, auth::KvAuthAcceptor> acceptors;  // under p_mu
  std::unique_ptr<UcxTransport> p;
  TransportCallbacks p_cb;
  p_cb.on_message = [&](ConnId c, std::vector<uint8_t> bytes) {
    auto m = kvproto::decode(bytes);
    if (!m.ok()) return;
    std::lock_guard l(p_mu);
    if (auto* h = std::get_if<kvproto::AuthHello>(&m->body)) {
      auto it = acceptors.try_emplace(c, keys, auth::KvIdentity{kvproto::PeerRole::kPrefill, "prefill"}).first;
      auto r = it->second.onHello(*h);
      if (auto* ch = std::get_if<kvproto::AuthChallenge>(&r)) p->send(c, kvproto::encode({0, *ch}));
    } else if (auto* proof = std::get_if<kvproto::AuthProof>(&m->body)) {
      (void)acceptors.at(c).onProof(*proof);
    } else if (std::holds_alternative<kvproto::Hello>(m->body)) {
      p->send(c, kvproto::encode({0, kvproto::Hello{.rkey = p->packedRkey(), .peer_name = "prefill"}}));
    }
  };
  TransportCallbacks d_cb;
  d_cb.on_message = [&](ConnId, std::vector<uint8_t> bytes) {
    auto m = kvproto::decode(bytes);
    if (!m.ok()) return;
    std::lock_guard l(inbox.mu);
    inbox.messages.push_back(std::move(*m));
    inbox.cv.notify_all();
  };
  auto ps = UcxTransport::start({.host = "127.0.0.1", .port = 0, .region = p_mem, .tls = "tcp"}, p_cb);
  auto ds = UcxTransport::start({.host = "127.0.0.1", .port = 0, .region = d_mem, .tls = "tcp"}, d_cb);
  if (!ps.ok() || !ds.ok()) return false;
  p = std::move(*ps);
  std::unique_ptr<UcxTransport> d = std::move(*ds);
  auto next = [&](kvproto::MessageType type) -> std::optional<kvproto::Message> {
    std::unique_lock l(inbox.mu);
    std::optional<kvproto::Message> found;
    inbox.cv.wait_for(l, std::chrono::seconds(10), [&] {
      for (auto it = inbox.messages.begin(); it != inbox.messages.end(); ++it) {
        if (kvproto::typeOf(it->body) != type) continue;
        found = std::move(*it);
        inbox.messages.erase(it);
        return true;
      }
      return false;
    });
    return found;
  };
  const kvproto::Hello d_hello{.rkey = d->packedRkey(), .peer_name = "decode"};
  auto connect = [&](bool authenticate) -> std::optional<double> {
    const auto start = std::chrono::steady_clock::now();
    const ConnId c = d->connect("127.0.0.1", p->port());
    if (authenticate) {
      auto connector = auth::KvAuthConnector::start(keys, {kvproto::PeerRole::kDecode, "decode"});
      if (!connector.ok()) return std::nullopt;
      d->send(c, kvproto::encode({0, connector->hello()}));
      auto challenge = next(kvproto::MessageType::kAuthChallenge);
      if (!challenge) return std::nullopt;
      auto proof = connector->onChallenge(std::get<kvproto::AuthChallenge>(challenge->body));
      if (!std::holds_alternative<kvproto::AuthProof>(proof)) return std::nullopt;
      d->send(c, kvproto::encode({0, std::get<kvproto::AuthProof>(proof)}));
    }
    d->send(c, kvproto::encode({0, d_hello}));
    if (!next(kvproto::MessageType::kHello)) return std::nullopt;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    d->close(c);
    return ms;
  };
  std::vector<double> with, without;
  for (int i = 0; i < 220; ++i) {
    auto a = connect(true);
    auto b = connect(false);
    if (!a || !b) return false;
    if (i < 20) continue;  // warm-up
    with.push_back(*a);
    without.push_back(*b);
  }
  const double base = median(without);
  results.push_back({.name = "kv_connect_authenticated_ms", .value = median(with), .unit = "ms", .reference = base,
                     .reference_name = "the Hello exchange alone, same run"});
  d->shutdown();
  p->shutdown();
  return true;
}

int main(int argc, char** argv) {
  if (!configureLogging({.spec = "warn"}).ok()) return 1;
  std::vector<bench::Result> results;
  const int max_tokens = 32768;
  const size_t max_blocks = max_tokens / 16;
  const size_t bytes_max = max_blocks * kLayers * kLayerBlockBytes;
  std::mt19937 rng(7);
  for (const std::string tls : {"tcp", "posix,cma,tcp"}) {
    const std::string tname = tls == "tcp" ? "tcp" : "shm";
    // Both KV pools are allocated by UCX, as the agent allocates them.
    auto p_pool = UcxRegion::allocate(bytes_max, {.tls = tls});
    auto d_pool = UcxRegion::allocate(bytes_max, {.tls = tls});
    if (!p_pool.ok() || !d_pool.ok()) {
      std::fprintf(stderr, "UCX region allocation failed\n");
      return 1;
    }
    std::span<std::byte> d_region = (*d_pool)->bytes();
    std::fill_n((*p_pool)->bytes().data(), bytes_max, std::byte{1});
    std::fill_n(d_region.data(), bytes_max, std::byte{0});
    // A control message reaches P only once D's endpoint finished its
    // wire-up (sends wait for it), i.e. once the shared-memory lanes are in
    // place; the pulls are measured after that.
    std::atomic<bool> hello{false};
    TransportCallbacks p_cb;
    p_cb.on_message = [&](ConnId, std::vector<uint8_t>) { hello = true; };
    auto p = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = *p_pool, .tls = tls}, p_cb);
    auto d = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = *d_pool, .tls = tls}, {});
    if (!p.ok() || !d.ok()) {
      std::fprintf(stderr, "transport start failed\n");
      return 1;
    }
    ConnId c = (*d)->connect("127.0.0.1", (*p)->port());
    (*d)->setRemoteRegion(c, (*p)->regionBase(), (*p)->regionLength(), (*p)->packedRkey());
    (*d)->send(c, {1});
    for (int i = 0; i < 5000 && !hello; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!hello) {
      std::fprintf(stderr, "bench_transport: the %s connection did not come up\n", tls.c_str());
      return 1;
    }
    const double perftest_8k = ucxPerftest(tls, kLayerBlockBytes, 64);
    for (int tokens : {1024, 8192, 32768}) {
      const size_t blocks = static_cast<size_t>(tokens / 16);
      const double bytes = static_cast<double>(blocks) * kLayers * kLayerBlockBytes;
      const double perftest_prompt = ucxPerftest(tls, blocks * kLayers * kLayerBlockBytes, 1);
      std::vector<size_t> scattered(max_blocks);
      std::iota(scattered.begin(), scattered.end(), 0);
      std::shuffle(scattered.begin(), scattered.end(), rng);
      for (bool contiguous : {true, false}) {
        // Layer-major regions as KvStorage lays them out: [layer][block].
        auto pull = [&] {
          std::mutex mu;
          std::condition_variable cv;
          int done = 0;
          for (int layer = 0; layer < kLayers; ++layer) {
            std::vector<UcxTransport::Segment> segs;
            for (size_t b = 0; b < blocks; ++b) {
              const size_t p_block = contiguous ? b : scattered[b];
              segs.push_back({d_region.data() + (layer * max_blocks + b) * kLayerBlockBytes,
                              (layer * max_blocks + p_block) * kLayerBlockBytes, kLayerBlockBytes});
            }
            (*d)->getv(c, std::move(segs), [&](absl::Status s) {
              if (!s.ok()) std::fprintf(stderr, "get failed: %s\n", std::string(s.message()).c_str());
              std::lock_guard l(mu);
              if (++done == kLayers) cv.notify_all();
            });
          }
          std::unique_lock l(mu);
          cv.wait(l, [&] { return done == kLayers; });
        };
        // Steady state: the first pulls of a connection are several times
        // slower over shared memory (D maps P's pool on first use).
        for (int i = 0; i < 20; ++i) pull();
        const double secs = bench::medianSeconds(pull, 7);
        const size_t msg = contiguous ? blocks * kLayerBlockBytes : kLayerBlockBytes;
        const double perftest = contiguous ? ucxPerftest(tls, msg, 1) : perftest_8k;
        results.push_back({.name = "kv_pull_" + tname + "_" + std::to_string(tokens / 1024) + "k_" +
                                   (contiguous ? "contiguous" : "scattered"),
                           .value = bytes / secs / 1e6, .unit = "MB/s", .reference = perftest,
                           .reference_name = "ucx_perftest ucp_get " + std::to_string(msg / 1024) + " KiB" +
                                             (contiguous ? "" : " x64 outstanding")});
        results.push_back({.name = results.back().name + "_vs_prompt_size", .value = bytes / secs / 1e6, .unit = "MB/s",
                           .reference = perftest_prompt,
                           .reference_name = "ucx_perftest ucp_get " + std::to_string(blocks * kLayers * kLayerBlockBytes >> 20) +
                                             " MiB (the prompt's KV)"});
        std::fflush(stdout);
      }
    }
  }
  // Single-thread memcpy of each prompt's KV between two buffers, as the
  // pull lays it out (one copy per layer).
  std::vector<std::byte> a(bytes_max, std::byte{3}), b(bytes_max);
  for (int tokens : {1024, 8192, 32768}) {
    const size_t layer_bytes = static_cast<size_t>(tokens / 16) * kLayerBlockBytes;
    const double secs = bench::medianSeconds(
        [&] {
          for (int layer = 0; layer < kLayers; ++layer) {
            std::memcpy(b.data() + layer * max_blocks * kLayerBlockBytes, a.data() + layer * max_blocks * kLayerBlockBytes,
                        layer_bytes);
          }
        },
        9);
    const double mbs = static_cast<double>(layer_bytes) * kLayers / secs / 1e6;
    results.push_back({.name = "memcpy_" + std::to_string(tokens / 1024) + "k", .value = mbs, .unit = "MB/s",
                       .reference = mbs, .reference_name = "memcpy (itself)"});
  }
  std::string dir = (std::filesystem::temp_directory_path() / "tandem-bench-transport-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    std::perror("bench_transport: mkdtemp");
    return 1;
  }
  if (!connectionSetup(results)) {
    std::fprintf(stderr, "bench_transport: the connection set-up comparison failed\n");
    return 1;
  }
  const bool split_ok = ttftSplit(results, dir) && stalledPrefill(results, dir) && stalledDecode(results, dir);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (!split_ok) {
    std::fprintf(stderr, "bench_transport: the TTFT comparison failed\n");
    return 1;
  }
  return bench::writeReport("transport", results, argc, argv);
}
