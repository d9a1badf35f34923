// LlamaModel on the CPU backend: against an independent dense reference
// forward (no paging, no BLAS, double precision), and for the engine's
// determinism requirement — chunked prefill, one-shot prefill, batching and
// block placement must give bitwise-identical logits and greedy tokens.

#include "engine/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/backend/cpu/cpu_backend.h"
#include "src/common/strings.h"
#include "tests/engine/model/random_tokens.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;
using testing::randomTokens;

constexpr uint64_t kSeed = 20240611;

std::shared_ptr<const ModelWeights> tinyWeights() {
  static const std::shared_ptr<const ModelWeights> weights = makeRandomWeights(tinyModelConfig(), kSeed);
  return weights;
}

std::vector<BlockId> blockRange(int32_t first, int32_t count) {
  std::vector<BlockId> t;
  for (int32_t i = 0; i < count; ++i) t.push_back(BlockId(first + i));
  return t;
}

// ---- Dense reference ------------------------------------------------------

using Mat = std::vector<double>;  // row-major

// y[rows, out] = x[rows, in] · w[out, in]ᵀ
Mat matmulT(const Mat& x, const std::vector<float>& w, int rows, int in, int out) {
  Mat y(static_cast<size_t>(rows) * out, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      double acc = 0;
      for (int i = 0; i < in; ++i) acc += x[static_cast<size_t>(r) * in + i] * w[static_cast<size_t>(o) * in + i];
      y[static_cast<size_t>(r) * out + o] = acc;
    }
  }
  return y;
}

Mat rmsNormRef(const Mat& x, const std::vector<float>& w, int rows, int dim, double eps) {
  Mat y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += x[static_cast<size_t>(r) * dim + i] * x[static_cast<size_t>(r) * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i)
      y[static_cast<size_t>(r) * dim + i] = x[static_cast<size_t>(r) * dim + i] * inv * w[i];
  }
  return y;
}

// HF rotate_half RoPE on [rows, heads, head_dim], row r at position r.
void ropeRef(Mat& x, int rows, int heads, int head_dim, double theta) {
  const int half = head_dim / 2;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      double* v = x.data() + (static_cast<size_t>(r) * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double angle = r * std::pow(theta, -2.0 * i / head_dim);
        const double a = v[i], b = v[i + half];
        v[i] = a * std::cos(angle) - b * std::sin(angle);
        v[i + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
}

// Logits [T, vocab] of every position of `tokens` processed from position 0.
Mat referenceLogits(const ModelWeights& w, const std::vector<TokenId>& tokens) {
  const ModelConfig& c = w.config;
  const int T = static_cast<int>(tokens.size());
  const int H = c.hidden_size, NH = c.num_heads, KVH = c.num_kv_heads, D = c.head_dim, I = c.intermediate_size;
  Mat x(static_cast<size_t>(T) * H);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < H; ++i) x[static_cast<size_t>(t) * H + i] = w.embed[static_cast<size_t>(tokens[t]) * H + i];
  }
  for (const LayerWeights& l : w.layers) {
    Mat h = rmsNormRef(x, l.attn_norm, T, H, c.rms_norm_eps);
    Mat q = matmulT(h, l.wq, T, H, NH * D);
    Mat k = matmulT(h, l.wk, T, H, KVH * D);
    Mat v = matmulT(h, l.wv, T, H, KVH * D);
    ropeRef(q, T, NH, D, c.rope_theta);
    ropeRef(k, T, KVH, D, c.rope_theta);
    Mat attn(static_cast<size_t>(T) * NH * D, 0.0);
    for (int t = 0; t < T; ++t) {
      for (int head = 0; head < NH; ++head) {
        const int kvh = head / (NH / KVH);
        std::vector<double> p(static_cast<size_t>(t) + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double s = 0;
          for (int d = 0; d < D; ++d) {
            s += q[(static_cast<size_t>(t) * NH + head) * D + d] * k[(static_cast<size_t>(j) * KVH + kvh) * D + d];
          }
          p[j] = s / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (double& s : p) sum += (s = std::exp(s - mx));
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j <= t; ++j) acc += p[j] * v[(static_cast<size_t>(j) * KVH + kvh) * D + d];
          attn[(static_cast<size_t>(t) * NH + head) * D + d] = acc / sum;
        }
      }
    }
    Mat o = matmulT(attn, l.wo, T, NH * D, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    h = rmsNormRef(x, l.ffn_norm, T, H, c.rms_norm_eps);
    Mat gate = matmulT(h, l.w_gate, T, H, I);
    Mat up = matmulT(h, l.w_up, T, H, I);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    Mat down = matmulT(gate, l.w_down, T, I, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  Mat h = rmsNormRef(x, w.final_norm, T, H, c.rms_norm_eps);
  return matmulT(h, w.outputProjection(), T, H, c.vocab_size);
}

// ---- Driving the model like an engine would -----------------------------

TokenId argmax(std::span<const float> logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

struct Mode {
  size_t chunk_size;     // prompt tokens per step
  bool batched;          // all sequences share each step, or each runs alone
  bool shuffled_blocks;  // block tables drawn from a shuffled pool, or contiguous
};

struct SeqResult {
  std::vector<TokenId> generated;
  std::vector<std::vector<float>> logits;  // one [vocab] per generated token
};

// Prefill each prompt in chunks of mode.chunk_size, then greedy-decode
// `num_new` tokens, scheduling like a continuous-batching engine: in batched
// mode a step mixes prefill chunks of some sequences with decodes of others.
std::vector<SeqResult> runGreedy(const std::vector<std::vector<TokenId>>& prompts, int num_new, const Mode& mode,
                                 int32_t block_size = 4) {
  CpuBackend backend;
  auto model = LlamaModel::create(tinyWeights(), backend);
  EXPECT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();

  std::vector<std::vector<BlockId>> tables;
  int32_t total_blocks = 0;
  for (const auto& p : prompts)
    total_blocks += (static_cast<int32_t>(p.size()) + num_new + block_size - 1) / block_size;
  std::vector<int32_t> pool(static_cast<size_t>(total_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  if (mode.shuffled_blocks) std::shuffle(pool.begin(), pool.end(), std::mt19937(5));
  size_t next = 0;
  for (const auto& p : prompts) {
    std::vector<BlockId> t;
    for (int32_t b = 0; b < (static_cast<int32_t>(p.size()) + num_new + block_size - 1) / block_size; ++b) {
      t.push_back(BlockId(pool[next++]));
    }
    tables.push_back(std::move(t));
  }
  KvStorage kv(kvLayoutFor(c, total_blocks, block_size));

  std::vector<SeqResult> results(prompts.size());
  std::vector<size_t> computed(prompts.size(), 0);  // tokens whose KV is cached
  auto done = [&](size_t s) { return results[s].generated.size() == static_cast<size_t>(num_new); };
  std::vector<float> logits;
  while (true) {
    // Batched: every unfinished sequence joins the step; alone: the first one.
    std::vector<size_t> active;
    for (size_t s = 0; s < prompts.size() && (mode.batched || active.empty()); ++s) {
      if (!done(s)) active.push_back(s);
    }
    if (active.empty()) break;
    std::vector<SequenceChunk> batch;
    std::vector<size_t> wants;
    for (size_t s : active) {
      SequenceChunk chunk;
      chunk.start_pos = static_cast<int32_t>(computed[s]);
      chunk.block_table = tables[s];
      if (computed[s] < prompts[s].size()) {
        const size_t n = std::min(mode.chunk_size, prompts[s].size() - computed[s]);
        chunk.tokens = std::span<const TokenId>(prompts[s]).subspan(computed[s], n);
        chunk.want_logits = computed[s] + n == prompts[s].size();
      } else {
        chunk.tokens = std::span<const TokenId>(&results[s].generated.back(), 1);
        chunk.want_logits = true;
      }
      computed[s] += chunk.tokens.size();
      if (chunk.want_logits) wants.push_back(s);
      batch.push_back(chunk);
    }
    const absl::Status st = (*model)->forward(batch, kv, &logits);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) break;
    EXPECT_EQ(logits.size(), wants.size() * static_cast<size_t>(c.vocab_size));
    for (size_t i = 0; i < wants.size(); ++i) {
      std::span<const float> row(logits.data() + i * static_cast<size_t>(c.vocab_size),
                                 static_cast<size_t>(c.vocab_size));
      results[wants[i]].generated.push_back(argmax(row));
      results[wants[i]].logits.emplace_back(row.begin(), row.end());
    }
  }
  return results;
}

void expectBitwiseEqual(const std::vector<SeqResult>& a, const std::vector<SeqResult>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_EQ(a[s].generated, b[s].generated) << what << ", sequence " << s;
    ASSERT_EQ(a[s].logits.size(), b[s].logits.size());
    for (size_t t = 0; t < a[s].logits.size(); ++t) {
      ASSERT_EQ(std::memcmp(a[s].logits[t].data(), b[s].logits[t].data(), a[s].logits[t].size() * sizeof(float)), 0)
          << what << ", sequence " << s << ", token " << t;
    }
  }
}

// ---- Tests ------------------------------------------------------------------

TEST(LlamaModel, MatchesDenseReference) {
  const auto weights = tinyWeights();
  const ModelConfig& c = weights->config;
  // 30-token prompt, then 3 fixed decode tokens (not greedy, so the reference
  // sees exactly the same inputs).
  const auto tokens = randomTokens(33, 1, c.vocab_size);
  const size_t prompt = 30;
  const Mat want = referenceLogits(*weights, tokens);

  CpuBackend backend;
  auto model = LlamaModel::create(weights, backend);
  ASSERT_TRUE(model.ok()) << model.status();
  KvStorage kv(kvLayoutFor(c, 16, 4));
  const auto table = blockRange(0, 16);
  std::vector<float> logits;
  double max_err = 0, max_abs = 0;
  for (size_t pos = prompt; pos <= tokens.size(); ++pos) {
    const size_t start = pos == prompt ? 0 : pos - 1;
    SequenceChunk chunk{.tokens = std::span<const TokenId>(tokens).subspan(start, pos - start),
                        .start_pos = static_cast<int32_t>(start),
                        .block_table = table,
                        .want_logits = true};
    ASSERT_TRUE((*model)->forward(std::span<const SequenceChunk>(&chunk, 1), kv, &logits).ok());
    ASSERT_EQ(logits.size(), static_cast<size_t>(c.vocab_size));
    for (int i = 0; i < c.vocab_size; ++i) {
      const double w = want[(pos - 1) * static_cast<size_t>(c.vocab_size) + static_cast<size_t>(i)];
      max_err = std::max(max_err, std::abs(logits[static_cast<size_t>(i)] - w));
      max_abs = std::max(max_abs, std::abs(w));
    }
  }
  // rtol 1e-4 relative to the logits' scale.
  EXPECT_LT(max_err, 1e-4 * max_abs) << "max |logit| " << max_abs;
  EXPECT_GT(max_abs, 0.1);  // not trivially zero
}

TEST(LlamaModel, ChunkedPrefillIsBitwiseIdenticalToOneShot) {
  const auto weights = tinyWeights();
  const ModelConfig& c = weights->config;
  const auto tokens = randomTokens(37, 2, c.vocab_size);
  const auto table = blockRange(0, 10);

  auto prefill = [&](size_t chunk_size, KvStorage& kv) {
    CpuBackend backend;
    auto model = LlamaModel::create(weights, backend);
    EXPECT_TRUE(model.ok());
    std::vector<float> logits;
    for (size_t start = 0; start < tokens.size(); start += chunk_size) {
      const size_t n = std::min(chunk_size, tokens.size() - start);
      SequenceChunk chunk{.tokens = std::span<const TokenId>(tokens).subspan(start, n),
                          .start_pos = static_cast<int32_t>(start),
                          .block_table = table,
                          .want_logits = start + n == tokens.size()};
      EXPECT_TRUE((*model)->forward(std::span<const SequenceChunk>(&chunk, 1), kv, &logits).ok());
    }
    return logits;
  };
  KvStorage kv_once(kvLayoutFor(c, 10, 4));
  const auto once = prefill(tokens.size(), kv_once);
  ASSERT_EQ(once.size(), static_cast<size_t>(c.vocab_size));
  for (size_t chunk_size : {1, 7, 16}) {
    KvStorage kv(kvLayoutFor(c, 10, 4));
    const auto chunked = prefill(chunk_size, kv);
    ASSERT_EQ(chunked.size(), once.size());
    EXPECT_EQ(std::memcmp(chunked.data(), once.data(), once.size() * sizeof(float)), 0) << "chunk " << chunk_size;
    // The cached K/V are bitwise identical too.
    EXPECT_EQ(std::memcmp(kv.bytes().data(), kv_once.bytes().data(), kv.bytes().size()), 0) << "chunk " << chunk_size;
  }
}

TEST(LlamaModel, BatchOfThreeEqualsEachAlone) {
  const auto weights = tinyWeights();
  const ModelConfig& c = weights->config;
  const std::vector<std::vector<TokenId>> prompts = {
      randomTokens(23, 3, c.vocab_size), randomTokens(9, 4, c.vocab_size), randomTokens(16, 5, c.vocab_size)};
  const std::vector<std::vector<BlockId>> tables = {blockRange(0, 6), blockRange(6, 3), blockRange(9, 4)};
  const size_t vocab = static_cast<size_t>(c.vocab_size);

  CpuBackend backend;
  auto model = LlamaModel::create(weights, backend);
  ASSERT_TRUE(model.ok());
  // Alone: each in its own cache.
  std::vector<std::vector<float>> alone;
  for (size_t s = 0; s < prompts.size(); ++s) {
    KvStorage kv(kvLayoutFor(c, 13, 4));
    SequenceChunk chunk{.tokens = prompts[s], .start_pos = 0, .block_table = tables[s], .want_logits = true};
    std::vector<float> logits;
    ASSERT_TRUE((*model)->forward(std::span<const SequenceChunk>(&chunk, 1), kv, &logits).ok());
    alone.push_back(logits);
  }
  // Together, one step; the middle one does not ask for logits.
  KvStorage kv(kvLayoutFor(c, 13, 4));
  std::vector<SequenceChunk> batch;
  for (size_t s = 0; s < prompts.size(); ++s) {
    batch.push_back({.tokens = prompts[s], .start_pos = 0, .block_table = tables[s], .want_logits = s != 1});
  }
  std::vector<float> logits;
  ASSERT_TRUE((*model)->forward(batch, kv, &logits).ok());
  ASSERT_EQ(logits.size(), 2 * vocab);  // [num_want_logits, vocab] in batch order
  EXPECT_EQ(std::memcmp(logits.data(), alone[0].data(), vocab * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(logits.data() + vocab, alone[2].data(), vocab * sizeof(float)), 0);
  // All three asking.
  for (auto& chunk : batch) chunk.want_logits = true;
  KvStorage kv2(kvLayoutFor(c, 13, 4));
  ASSERT_TRUE((*model)->forward(batch, kv2, &logits).ok());
  ASSERT_EQ(logits.size(), 3 * vocab);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(std::memcmp(logits.data() + s * vocab, alone[s].data(), vocab * sizeof(float)), 0) << s;
  }
}

// One request's prefill chunk and then its decode step, alone and inside
// batches of 2, 7, 32 and 256 rows (at the first, a middle and the last
// place; the other rows are other sequences' one-token chunks): its logits
// and its cached K/V are bitwise the same every time.
TEST(LlamaModel, OneRequestIsBitwiseTheSameAloneAndInBatchesUpTo256) {
  const auto weights = tinyWeights();
  const ModelConfig& c = weights->config;
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  constexpr int32_t kBlockSize = 4;
  constexpr int32_t kProbeBlocks = 11;  // 44 positions: a 40-token prompt and one decode
  constexpr int32_t kMaxBatch = 256;
  const auto prompt = randomTokens(40, 31, c.vocab_size);
  const auto next = randomTokens(1, 32, c.vocab_size);
  const auto filler_tokens = randomTokens(2 * kMaxBatch, 33, c.vocab_size);
  const auto probe_table = blockRange(0, kProbeBlocks);
  std::vector<std::vector<BlockId>> filler_tables;
  for (int32_t f = 0; f < kMaxBatch; ++f) filler_tables.push_back(blockRange(kProbeBlocks + f, 1));
  const int32_t num_blocks = kProbeBlocks + kMaxBatch;

  CpuBackend backend;
  auto model = LlamaModel::create(weights, backend);
  ASSERT_TRUE(model.ok());
  const SequenceChunk probe_prefill{.tokens = prompt, .start_pos = 0, .block_table = probe_table, .want_logits = true};
  const SequenceChunk probe_decode{.tokens = next, .start_pos = 40, .block_table = probe_table, .want_logits = true};

  // Runs the probe's two steps with `batch - 1` other rows around it, the
  // probe at `place`; returns its logits of both steps and its K/V bytes.
  struct Probe {
    std::vector<float> prefill_logits, decode_logits;
    std::vector<std::byte> kv;
  };
  auto run = [&](int batch, int place) {
    KvStorage kv(kvLayoutFor(c, num_blocks, kBlockSize));
    Probe out;
    for (int step = 0; step < 2; ++step) {
      std::vector<SequenceChunk> chunks;
      int filler = 0;
      for (int i = 0; i < batch; ++i) {
        if (i == place) {
          chunks.push_back(step == 0 ? probe_prefill : probe_decode);
          continue;
        }
        chunks.push_back({.tokens = std::span<const TokenId>(filler_tokens).subspan(2 * filler + step, 1),
                          .start_pos = step,
                          .block_table = filler_tables[static_cast<size_t>(filler)],
                          .want_logits = filler % 2 == 0});
        ++filler;
      }
      std::vector<float> logits;
      const absl::Status st = (*model)->forward(chunks, kv, &logits);
      EXPECT_TRUE(st.ok()) << st;
      // The probe's row among the rows that asked for logits, in batch order.
      size_t row = 0;
      for (int i = 0; i < place; ++i) row += chunks[static_cast<size_t>(i)].want_logits ? 1 : 0;
      EXPECT_GE(logits.size(), (row + 1) * vocab);
      if (logits.size() < (row + 1) * vocab) return out;
      std::vector<float>& dst = step == 0 ? out.prefill_logits : out.decode_logits;
      dst.assign(logits.begin() + static_cast<ptrdiff_t>(row * vocab),
                 logits.begin() + static_cast<ptrdiff_t>((row + 1) * vocab));
    }
    // The probe's blocks of every layer.
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      for (int32_t b = 0; b < kProbeBlocks; ++b) {
        const auto* k = reinterpret_cast<const std::byte*>(kv.key(layer, BlockId(b), 0));
        const auto* v = reinterpret_cast<const std::byte*>(kv.value(layer, BlockId(b), 0));
        const size_t bytes = kv.layout().bytesPerToken() * kBlockSize;
        out.kv.insert(out.kv.end(), k, k + bytes);
        out.kv.insert(out.kv.end(), v, v + bytes);
      }
    }
    return out;
  };
  const Probe alone = run(1, 0);
  ASSERT_EQ(alone.prefill_logits.size(), vocab);
  ASSERT_EQ(alone.decode_logits.size(), vocab);
  for (int batch : {2, 7, 32, 256}) {
    for (int place : {0, batch / 2, batch - 1}) {
      const Probe in_batch = run(batch, place);
      const std::string where = strCat("batch ", batch, ", place ", place);
      ASSERT_EQ(in_batch.prefill_logits.size(), vocab) << where;
      ASSERT_EQ(in_batch.decode_logits.size(), vocab) << where;
      EXPECT_EQ(std::memcmp(in_batch.prefill_logits.data(), alone.prefill_logits.data(), vocab * sizeof(float)), 0)
          << "prefill logits, " << where;
      EXPECT_EQ(std::memcmp(in_batch.decode_logits.data(), alone.decode_logits.data(), vocab * sizeof(float)), 0)
          << "decode logits, " << where;
      EXPECT_TRUE(in_batch.kv == alone.kv) << "K/V, " << where;
    }
  }
}

// A 600-token prefill (GEMMs, attention and SwiGLU all split across the
// pool) and a decode step of 32 sequences give the same logits and K/V on
// 1, 2 and 3 threads, and on every SIMD level this CPU runs: the thread
// count and the vector width never change a bit (so neither does the CPU
// model, docs/engine.md).
TEST(LlamaModel, ThreadCountAndSimdLevelDoNotChangeResults) {
  const auto weights = tinyWeights();
  const ModelConfig& c = weights->config;
  constexpr int32_t kBlockSize = 16;
  constexpr int kDecodes = 32;
  const auto prompt = randomTokens(600, 41, c.vocab_size);
  const auto decode_tokens = randomTokens(kDecodes, 42, c.vocab_size);
  struct Result {
    std::vector<float> prefill_logits, decode_logits;
    std::vector<std::byte> kv;
  };
  auto run = [&](const CpuBackendOptions& options) {
    CpuBackend backend(options);
    auto model = LlamaModel::create(weights, backend);
    EXPECT_TRUE(model.ok());
    // The prompt in blocks [0, 38); decode sequence d in block 38 + d at position 5.
    KvStorage kv(kvLayoutFor(c, 38 + kDecodes, kBlockSize));
    const auto table = blockRange(0, 38);
    Result r;
    SequenceChunk chunk{.tokens = prompt, .start_pos = 0, .block_table = table, .want_logits = true};
    EXPECT_TRUE((*model)->forward(std::span<const SequenceChunk>(&chunk, 1), kv, &r.prefill_logits).ok());
    std::vector<std::vector<BlockId>> tables;
    for (int d = 0; d < kDecodes; ++d) tables.push_back(blockRange(38 + d, 1));
    std::vector<SequenceChunk> decodes;
    for (int d = 0; d < kDecodes; ++d) {
      decodes.push_back({.tokens = std::span<const TokenId>(decode_tokens).subspan(static_cast<size_t>(d), 1),
                         .start_pos = 5,
                         .block_table = tables[static_cast<size_t>(d)],
                         .want_logits = true});
    }
    EXPECT_TRUE((*model)->forward(decodes, kv, &r.decode_logits).ok());
    r.kv.assign(kv.bytes().begin(), kv.bytes().end());
    return r;
  };
  const Result reference = run(CpuBackendOptions{.num_threads = 1, .simd = SimdLevel::kPortable});
  ASSERT_EQ(reference.prefill_logits.size(), static_cast<size_t>(c.vocab_size));
  ASSERT_EQ(reference.decode_logits.size(), static_cast<size_t>(kDecodes * c.vocab_size));
  for (SimdLevel level : {SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!simdLevelSupported(level)) {
      std::printf("SIMD level %s: not supported by this CPU, skipped\n", std::string(simdLevelName(level)).c_str());
      continue;
    }
    // (The portable level is slow: its reference run above has 1 thread.)
    for (int threads : level == SimdLevel::kPortable ? std::vector<int>{2} : std::vector<int>{1, 2, 3}) {
      const Result r = run(CpuBackendOptions{.num_threads = threads, .simd = level});
      const std::string what = strCat(simdLevelName(level), ", ", threads, " threads");
      EXPECT_TRUE(r.prefill_logits == reference.prefill_logits) << "prefill logits, " << what;
      EXPECT_TRUE(r.decode_logits == reference.decode_logits) << "decode logits, " << what;
      EXPECT_TRUE(r.kv == reference.kv) << "K/V, " << what;
    }
  }
}

TEST(LlamaModel, BlockPlacementDoesNotChangeResults) {
  const auto weights = tinyWeights();
  const ModelConfig& c = weights->config;
  const auto tokens = randomTokens(29, 6, c.vocab_size);
  CpuBackend backend;
  auto model = LlamaModel::create(weights, backend);
  ASSERT_TRUE(model.ok());
  auto run = [&](const std::vector<BlockId>& table) {
    KvStorage kv(kvLayoutFor(c, 12, 4));
    SequenceChunk chunk{.tokens = tokens, .start_pos = 0, .block_table = table, .want_logits = true};
    std::vector<float> logits;
    EXPECT_TRUE((*model)->forward(std::span<const SequenceChunk>(&chunk, 1), kv, &logits).ok());
    return logits;
  };
  const auto contiguous = run(blockRange(0, 8));
  const auto permuted =
      run({BlockId(11), BlockId(3), BlockId(7), BlockId(0), BlockId(9), BlockId(5), BlockId(2), BlockId(10)});
  ASSERT_EQ(contiguous.size(), permuted.size());
  EXPECT_EQ(std::memcmp(contiguous.data(), permuted.data(), contiguous.size() * sizeof(float)), 0);
}

// The engine's hard requirement: 20 greedy tokens per prompt, bitwise the
// same logits and tokens whatever the chunking, batching and block placement.
TEST(LlamaModel, GreedyDecodeIdenticalAcrossChunkingBatchingAndPlacement) {
  const int vocab = tinyModelConfig().vocab_size;
  const std::vector<std::vector<TokenId>> prompts = {randomTokens(31, 7, vocab), randomTokens(5, 8, vocab),
                                                     randomTokens(18, 9, vocab)};
  const int kNew = 20;
  const auto reference = runGreedy(prompts, kNew, {.chunk_size = 1000, .batched = false, .shuffled_blocks = false});
  for (const SeqResult& r : reference) ASSERT_EQ(r.generated.size(), static_cast<size_t>(kNew));
  expectBitwiseEqual(runGreedy(prompts, kNew, {.chunk_size = 7, .batched = false, .shuffled_blocks = true}), reference,
                     "chunked, alone, shuffled blocks");
  expectBitwiseEqual(runGreedy(prompts, kNew, {.chunk_size = 1000, .batched = true, .shuffled_blocks = false}),
                     reference, "one-shot, batched");
  // Batched with chunks of 7: steps mix prefill chunks of longer prompts with
  // decodes of shorter ones.
  expectBitwiseEqual(runGreedy(prompts, kNew, {.chunk_size = 7, .batched = true, .shuffled_blocks = true}), reference,
                     "chunked, batched, shuffled blocks");
  // A different block size, too (placement inside blocks changes).
  expectBitwiseEqual(
      runGreedy(prompts, kNew, {.chunk_size = 7, .batched = true, .shuffled_blocks = true}, /*block_size=*/16),
      reference, "block size 16");
}

TEST(LlamaModel, LayerObserverCalledOncePerLayerAfterKvWritten) {
  const auto weights = tinyWeights();
  const ModelConfig& c = weights->config;
  CpuBackend backend;
  auto model = LlamaModel::create(weights, backend);
  ASSERT_TRUE(model.ok());
  KvStorage kv(kvLayoutFor(c, 4, 4));
  const auto tokens = randomTokens(6, 10, c.vocab_size);
  const auto table = blockRange(0, 2);
  const auto table2 = blockRange(2, 1);
  const std::vector<SequenceChunk> batch = {
      {.tokens = tokens, .start_pos = 0, .block_table = table, .want_logits = true},
      {.tokens = std::span<const TokenId>(tokens).first(2), .start_pos = 0, .block_table = table2}};
  std::vector<int> seen;
  LayerObserver observer = [&](int layer) {
    seen.push_back(layer);
    // This layer's K/V of both sequences is in the cache; the next layer's is not yet.
    EXPECT_NE(kv.key(layer, BlockId(1), 1)[0], 0.0f) << layer;    // seq 0, position 5
    EXPECT_NE(kv.value(layer, BlockId(2), 1)[0], 0.0f) << layer;  // seq 1, position 1
    if (layer + 1 < c.num_layers) {
      EXPECT_EQ(kv.key(layer + 1, BlockId(1), 1)[0], 0.0f) << layer;
    }
  };
  std::vector<float> logits;
  ASSERT_TRUE((*model)->forward(batch, kv, &logits, &observer).ok());
  std::vector<int> want(static_cast<size_t>(c.num_layers));
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(seen, want);
}

// skipLogits (a tensor-parallel rank other than 0): the same KV bits, no
// logits, and a null logits vector is accepted where chunks want them.
TEST(LlamaModel, SkippingLogitsWritesTheSameKv) {
  const auto weights = tinyWeights();
  const ModelConfig& c = weights->config;
  const auto tokens = randomTokens(6, 11, c.vocab_size);
  const auto table = blockRange(0, 2);
  const std::vector<SequenceChunk> batch = {{.tokens = tokens, .start_pos = 0, .block_table = table, .want_logits = true}};
  CpuBackend backend;
  KvStorage want_kv(kvLayoutFor(c, 2, 4)), got_kv(kvLayoutFor(c, 2, 4));
  auto full = LlamaModel::create(weights, backend);
  auto skipping = LlamaModel::create(weights, backend);
  ASSERT_TRUE(full.ok() && skipping.ok());
  (*skipping)->skipLogits();
  std::vector<float> logits = {1.0f};
  ASSERT_TRUE((*full)->forward(batch, want_kv, &logits).ok());
  EXPECT_EQ(logits.size(), static_cast<size_t>(c.vocab_size));
  ASSERT_TRUE((*skipping)->forward(batch, got_kv, nullptr).ok());
  ASSERT_TRUE((*skipping)->forward(batch, got_kv, &logits).ok());
  EXPECT_TRUE(logits.empty());
  EXPECT_EQ(std::memcmp(got_kv.data(), want_kv.data(), want_kv.layout().totalBytes()), 0);
}

TEST(LlamaModel, RejectsInvalidInputsWithoutTouchingTheCache) {
  ModelConfig config = tinyModelConfig();
  config.max_position_embeddings = 64;
  std::shared_ptr<const ModelWeights> weights = makeRandomWeights(config, kSeed);
  CpuBackend backend;
  auto model = LlamaModel::create(weights, backend);
  ASSERT_TRUE(model.ok());
  KvStorage kv(kvLayoutFor(config, 8, 4));
  const std::vector<TokenId> good = {1, 2, 3, 4, 5};
  const std::vector<TokenId> bad_id = {1, 2, 100};
  const std::vector<TokenId> negative_id = {-1};
  const std::vector<TokenId> empty;
  const auto table = blockRange(0, 2);
  const std::vector<BlockId> short_table = {BlockId(0)};
  const std::vector<BlockId> out_of_range = {BlockId(0), BlockId(8)};
  const auto long_table = blockRange(0, 8);
  const SequenceChunk ok_chunk{.tokens = good, .start_pos = 0, .block_table = table, .want_logits = true};
  std::vector<float> logits;

  struct Case {
    std::vector<SequenceChunk> batch;
    std::string message;
    bool with_logits = true;
  };
  const std::vector<Case> cases = {
      {{{.tokens = empty, .start_pos = 0, .block_table = table}}, "chunk 0: no tokens"},
      {{ok_chunk, {.tokens = bad_id, .start_pos = 0, .block_table = table}},
       "chunk 1: token 2 has id 100, outside the vocabulary [0, 100)"},
      {{{.tokens = negative_id, .start_pos = 0, .block_table = table}}, "has id -1, outside the vocabulary"},
      {{{.tokens = good, .start_pos = -3, .block_table = table}}, "negative start_pos -3"},
      {{{.tokens = good, .start_pos = 60, .block_table = long_table}},
       "position 64 is beyond max_position_embeddings (64)"},
      {{{.tokens = good, .start_pos = 0, .block_table = short_table}},
       "block table has 1 blocks, positions [0, 5) need 2"},
      {{{.tokens = good, .start_pos = 0, .block_table = out_of_range}},
       "block table entry 1 is block 8, outside the cache's [0, 8)"},
      {{ok_chunk}, "wants logits but no logits output was given", /*with_logits=*/false},
  };
  for (const Case& c : cases) {
    const absl::Status st = (*model)->forward(c.batch, kv, c.with_logits ? &logits : nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(toStd(st.message())), HasSubstr(c.message));
  }
  // Nothing was written by the rejected steps.
  const auto bytes = kv.bytes();
  EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; }));

  // A cache shaped for another model.
  KvLayout wrong = kvLayoutFor(config, 8, 4);
  wrong.num_kv_heads = 4;
  KvStorage wrong_kv(wrong);
  const absl::Status st = (*model)->forward(std::span<const SequenceChunk>(&ok_chunk, 1), wrong_kv, &logits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(toStd(st.message())), HasSubstr("does not match the model"));

  // An empty batch is a no-op.
  logits.assign(3, 1.0f);
  EXPECT_TRUE((*model)->forward({}, kv, &logits).ok());
  EXPECT_TRUE(logits.empty());
}

TEST(LlamaModel, CreateRejectsWeightsThatDoNotMatchTheConfig) {
  CpuBackend backend;
  auto truncated = makeRandomWeights(tinyModelConfig(), kSeed);
  truncated->layers[2].wk.pop_back();
  auto model = LlamaModel::create(std::move(truncated), backend);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(toStd(model.status().message())), HasSubstr("layers.2.k_proj"));

  ModelConfig odd_heads = tinyModelConfig();
  odd_heads.num_kv_heads = 3;
  model = LlamaModel::create(makeRandomWeights(odd_heads, kSeed), backend);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(toStd(model.status().message())), HasSubstr("must divide num_attention_heads"));

  EXPECT_FALSE(LlamaModel::create(nullptr, backend).ok());

  // A family's extra tensors are there exactly when its ArchSpec has them.
  auto qwen2 = makeRandomWeights(*smallArchConfig("qwen2"), kSeed);
  qwen2->layers[1].bv.clear();
  model = LlamaModel::create(std::move(qwen2), backend);
  EXPECT_THAT(std::string(toStd(model.status().message())), HasSubstr("layers.1.v_proj.bias has 0 floats"));
  auto llama_with_norm = makeRandomWeights(tinyModelConfig(), kSeed);
  llama_with_norm->layers[0].q_norm.assign(32, 1.0f);
  model = LlamaModel::create(std::move(llama_with_norm), backend);
  EXPECT_THAT(std::string(toStd(model.status().message())),
              HasSubstr("layers.0.q_norm has 32 floats, config implies 0"));
  ModelConfig gpt2 = tinyModelConfig();
  gpt2.architecture = "GPT2LMHeadModel";
  model = LlamaModel::create(makeRandomWeights(gpt2, kSeed), backend);
  EXPECT_THAT(std::string(toStd(model.status().message())), HasSubstr("unsupported architecture GPT2LMHeadModel"));
}

TEST(LlamaModel, KvLayoutForCopiesTheModelShape) {
  const KvLayout layout = kvLayoutFor(tinyModelConfig(), 32, 16);
  EXPECT_EQ(layout.num_layers, 4);
  EXPECT_EQ(layout.num_blocks, 32);
  EXPECT_EQ(layout.block_size, 16);
  EXPECT_EQ(layout.num_kv_heads, 2);
  EXPECT_EQ(layout.head_dim, 32);
}

}  // namespace
}  // namespace tandem::engine
