// Each supported family's forward pass against an independent PyTorch one.
//
// For Llama 3.x (rope_scaling llama3, tied embeddings), Qwen2 (q/k/v biases)
// and Qwen3 (q/k norms, head_dim != hidden / heads), a small random
// checkpoint is written in the family's real tensor names, loaded with
// loadModelWeights() and run through LlamaModel::forward() on the CPU backend
// and a paged KV cache -- the path the engine's step takes -- for: one prompt
// then greedy decodes, a batch of prompts of different lengths then batched
// decodes of fixed tokens, and a prompt prefilled in chunks (each chunk's
// logits checked) then greedy decodes. tests/engine/model/hf_reference.py
// (Debian's PyTorch 1.13, /usr/bin/python3; written from Hugging Face's
// modelling code, see its header) computes the same sequences' logits from
// the same files; every engine logit row must match within 1e-4 of the
// row's largest |logit| (both fp32).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/llama.h"
#include "engine/model/model_loader.h"
#include "engine/model/weights.h"
#include "src/common/strings.h"
#include "tests/engine/model/random_tokens.h"
#include "tests/engine/model/scratch_dir.h"

namespace tandem::engine {
namespace {

using testing::randomTokens;
using testing::ScratchDir;

constexpr uint64_t kSeed = 77;
constexpr int32_t kBlockSize = 4;
constexpr int32_t kBlocksPerSequence = 16;  // 64 positions
constexpr int kMaxSequences = 8;
// fp32 against fp32 with different summation orders (blocked GEMM and
// online softmax here, BLAS and a full softmax there).
constexpr double kRelTolerance = 1e-4;

TokenId argmax(const std::vector<float>& v) {
  return static_cast<TokenId>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Drives the model like the engine: sequences with block tables drawn from
// a shuffled pool of one KV cache, steps that feed some tokens of several
// sequences at once, each fed chunk returning its last token's logits.
class Driver {
 public:
  explicit Driver(std::shared_ptr<const ModelWeights> weights) {
    auto model = LlamaModel::create(std::move(weights), backend_);
    EXPECT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value();
    kv_ = std::make_unique<KvStorage>(kvLayoutFor(model_->config(), kMaxSequences * kBlocksPerSequence, kBlockSize));
    pool_.resize(kMaxSequences * kBlocksPerSequence);
    std::iota(pool_.begin(), pool_.end(), 0);
    std::shuffle(pool_.begin(), pool_.end(), std::mt19937(3));
  }

  struct Sequence {
    std::vector<TokenId> tokens;  // fed and still to feed
    size_t computed = 0;          // tokens whose KV is in the cache
    std::vector<BlockId> table;
  };
  // The logits the engine returned for position `pos` of sequence `seq`.
  struct Probe {
    size_t seq;
    size_t pos;
    std::vector<float> logits;
    std::string what;
  };

  size_t add(std::vector<TokenId> prompt) {
    Sequence s;
    s.tokens = std::move(prompt);
    for (int b = 0; b < kBlocksPerSequence; ++b) s.table.push_back(BlockId(pool_[next_block_++]));
    seqs_.push_back(std::move(s));
    return seqs_.size() - 1;
  }

  // One forward(): the next `count` unfed tokens of each listed sequence.
  void step(const std::vector<std::pair<size_t, size_t>>& feeds, const std::string& what) {
    std::vector<SequenceChunk> batch;
    for (auto [seq, count] : feeds) {
      Sequence& s = seqs_[seq];
      ASSERT_LE(s.computed + count, s.tokens.size());
      batch.push_back({.tokens = std::span<const TokenId>(s.tokens).subspan(s.computed, count),
                       .start_pos = static_cast<int32_t>(s.computed),
                       .block_table = s.table,
                       .want_logits = true});
    }
    std::vector<float> logits;
    const absl::Status st = model_->forward(batch, *kv_, &logits);
    ASSERT_TRUE(st.ok()) << st;
    const auto vocab = static_cast<size_t>(model_->config().vocab_size);
    ASSERT_EQ(logits.size(), feeds.size() * vocab);
    for (size_t i = 0; i < feeds.size(); ++i) {
      Sequence& s = seqs_[feeds[i].first];
      s.computed += feeds[i].second;
      probes_.push_back({feeds[i].first, s.computed - 1,
                         std::vector<float>(logits.begin() + static_cast<ptrdiff_t>(i * vocab),
                                            logits.begin() + static_cast<ptrdiff_t>((i + 1) * vocab)),
                         what});
    }
  }

  // Appends the argmax of the sequence's latest logits (greedy decoding).
  void appendArgmax(size_t seq) {
    for (auto it = probes_.rbegin(); it != probes_.rend(); ++it) {
      if (it->seq == seq) {
        seqs_[seq].tokens.push_back(argmax(it->logits));
        return;
      }
    }
    ADD_FAILURE() << "no logits yet for sequence " << seq;
  }
  void append(size_t seq, TokenId token) { seqs_[seq].tokens.push_back(token); }

  const std::vector<Sequence>& sequences() const { return seqs_; }
  const std::vector<Probe>& probes() const { return probes_; }

 private:
  CpuBackend backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvStorage> kv_;
  std::vector<int32_t> pool_;
  size_t next_block_ = 0;
  std::vector<Sequence> seqs_;
  std::vector<Probe> probes_;
};

// Runs hf_reference.py on `dir` for the fed tokens of each sequence;
// returns logits[seq][pos][vocab].
std::vector<std::vector<std::vector<double>>> referenceLogits(const std::string& dir,
                                                              const std::vector<Driver::Sequence>& seqs,
                                                              const ScratchDir& scratch) {
  const char* script = std::getenv("TANDEM_HF_REFERENCE");
  EXPECT_NE(script, nullptr) << "TANDEM_HF_REFERENCE is not set (run through ctest)";
  if (script == nullptr) return {};
  nlohmann::json request;
  request["sequences"] = nlohmann::json::array();
  for (const auto& s : seqs) {
    request["sequences"].push_back(std::vector<TokenId>(s.tokens.begin(), s.tokens.begin() + s.computed));
  }
  testing::writeText(scratch.file("request.json"), request.dump());
  const std::string out = scratch.file("reference.json");
  const std::string log = scratch.file("reference.log");
  const std::string command =
      strCat("/usr/bin/python3 ", script, " ", dir, " <", scratch.file("request.json"), " >", out, " 2>", log);
  const int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << command << " failed:\n"
      << testing::readBytes(log) << "\n(PyTorch is Debian's python3-torch, installed by ./tandem)";
  auto reply = nlohmann::json::parse(testing::readBytes(out), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(reply.is_discarded()) << "reference output is not JSON";
  if (reply.is_discarded()) return {};
  return reply["logits"].get<std::vector<std::vector<std::vector<double>>>>();
}

struct Comparison {
  double max_rel_error = 0;  // max over rows of max|engine - ref| / max|ref|
  int greedy_agreements = 0;
};

Comparison compare(const Driver& driver, const std::vector<std::vector<std::vector<double>>>& want) {
  Comparison result;
  EXPECT_EQ(want.size(), driver.sequences().size());
  if (want.size() != driver.sequences().size()) return result;
  for (const Driver::Probe& p : driver.probes()) {
    const std::vector<double>& ref = want[p.seq][p.pos];
    EXPECT_EQ(ref.size(), p.logits.size());
    if (ref.size() != p.logits.size()) continue;
    double max_abs = 0, max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(ref[i]));
      max_err = std::max(max_err, std::abs(static_cast<double>(p.logits[i]) - ref[i]));
    }
    const double rel = max_err / max_abs;
    result.max_rel_error = std::max(result.max_rel_error, rel);
    EXPECT_LT(rel, kRelTolerance) << p.what << ": sequence " << p.seq << ", position " << p.pos << ", max |logit| "
                                  << max_abs;
    EXPECT_GT(max_abs, 0.1) << "logits trivially small";
    // The same greedy choice, unless the reference's top two are a near tie.
    std::vector<double> sorted = ref;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] > 1e-3 * max_abs) {
      const auto ref_arg = std::max_element(ref.begin(), ref.end()) - ref.begin();
      EXPECT_EQ(argmax(p.logits), ref_arg) << p.what << ": sequence " << p.seq << ", position " << p.pos;
      ++result.greedy_agreements;
    }
  }
  return result;
}

class HfReferenceTest : public ::testing::TestWithParam<std::string_view> {};

TEST_P(HfReferenceTest, LogitsMatchPyTorch) {
  const std::string_view family = GetParam();
  const ModelConfig config = *smallArchConfig(family);
  ScratchDir scratch;
  const std::string dir = scratch.file("model");
  ASSERT_TRUE(writeModelDir(dir, *makeRandomWeights(config, kSeed, {.random_norm_gains = true}), DType::kF32).ok());
  auto loaded = loadModelWeights(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::shared_ptr<const ModelWeights> weights = std::move(loaded).value();
  const int vocab = config.vocab_size;

  Driver driver(weights);
  // One prompt, prefilled at once, then 6 greedy decodes.
  const size_t alone = driver.add(randomTokens(23, 1, vocab));
  driver.step({{alone, 23}}, "one prompt");
  for (int i = 0; i < 6; ++i) {
    driver.appendArgmax(alone);
    driver.step({{alone, 1}}, "greedy decode");
  }
  // Three prompts of different lengths in one step, then 4 batched decode
  // steps of fixed tokens.
  const size_t a = driver.add(randomTokens(5, 2, vocab));
  const size_t b = driver.add(randomTokens(17, 3, vocab));
  const size_t c = driver.add(randomTokens(30, 4, vocab));
  driver.step({{a, 5}, {b, 17}, {c, 30}}, "batch prefill");
  const auto fixed = randomTokens(12, 5, vocab);
  for (size_t i = 0; i < 4; ++i) {
    driver.append(a, fixed[3 * i]);
    driver.append(b, fixed[3 * i + 1]);
    driver.append(c, fixed[3 * i + 2]);
    driver.step({{a, 1}, {b, 1}, {c, 1}}, "batched decode");
  }
  // A 37-token prompt in chunks of 8 (7, 8, ... straddle the 4-token
  // blocks), each chunk's logits checked, then 3 greedy decodes.
  const size_t chunked = driver.add(randomTokens(37, 6, vocab));
  for (size_t done = 0; done < 37; done += 8) driver.step({{chunked, std::min<size_t>(8, 37 - done)}}, "chunk");
  for (int i = 0; i < 3; ++i) {
    driver.appendArgmax(chunked);
    driver.step({{chunked, 1}}, "greedy decode after chunks");
  }

  const auto want = referenceLogits(dir, driver.sequences(), scratch);
  ASSERT_FALSE(want.empty());
  const Comparison result = compare(driver, want);
  std::printf("%s: %zu logit rows, max relative error %.3g (tolerance %.0e), %d greedy choices compared\n",
              std::string(family).c_str(), driver.probes().size(), result.max_rel_error, kRelTolerance,
              result.greedy_agreements);
  EXPECT_GT(result.greedy_agreements, 10);

  if (config.rope_scaling.type == RopeScaling::Type::kLlama3) {
    // The check sees the scaling: the same weights with plain RoPE are far off.
    auto plain = std::make_shared<ModelWeights>(*weights);
    plain->config.rope_scaling = {};
    Driver unscaled(plain);
    const size_t s = unscaled.add(driver.sequences()[chunked].tokens);
    unscaled.step({{s, 37}}, "plain RoPE");
    const auto& got = unscaled.probes().back().logits;
    const auto& ref = want[chunked][36];
    double max_abs = 0, max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(ref[i]));
      max_err = std::max(max_err, std::abs(got[i] - ref[i]));
    }
    EXPECT_GT(max_err / max_abs, 100 * kRelTolerance) << "without llama3 scaling the logits should differ";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfReferenceTest, ::testing::Values("llama3", "qwen2", "qwen3"),
                         [](const ::testing::TestParamInfo<std::string_view>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace tandem::engine
