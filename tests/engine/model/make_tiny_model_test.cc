// Runs the built tandem-make-model binary ($TANDEM_BIN_DIR/tandem-make-model).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "engine/model/model_loader.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"
#include "src/common/strings.h"
#include "tests/engine/model/scratch_dir.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

class MakeTinyModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
    ASSERT_NE(bin_dir, nullptr) << "TANDEM_BIN_DIR is not set (run through ctest)";
    binary_ = std::string(bin_dir) + "/tandem-make-model";
    ASSERT_TRUE(std::filesystem::exists(binary_)) << binary_ << " was not built";
  }

  RunResult run(const std::string& args) {
    const std::string log = scratch_.file("log.txt");
    const std::string command = binary_ + " " + args + " >" + log + " 2>&1";
    const int status = std::system(command.c_str());
    RunResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.output = testing::readBytes(log);
    return result;
  }

  std::string binary_;
  ScratchDir scratch_;
};

constexpr const char* kFiles[] = {"config.json", "model.safetensors", "tokenizer_config.json"};

TEST_F(MakeTinyModelTest, SameSeedGivesIdenticalFilesThatLoad) {
  ScratchDir a, b;
  RunResult first = run("--out " + a.path());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  RunResult second = run("--out=" + b.path() + " --seed 1234");  // the default, spelled out
  ASSERT_EQ(second.exit_code, 0) << second.output;
  for (const char* name : kFiles) {
    const std::string bytes = testing::readBytes(a.file(name));
    EXPECT_FALSE(bytes.empty()) << name;
    EXPECT_TRUE(bytes == testing::readBytes(b.file(name))) << name << " differs between runs";
  }

  auto loaded = loadModelWeights(a.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto expected = makeRandomWeights(tinyModelConfig(), 1234);
  EXPECT_EQ((*loaded)->config.hidden_size, 256);
  EXPECT_EQ((*loaded)->config.num_kv_heads, 2);
  EXPECT_EQ((*loaded)->config.max_position_embeddings, tinyModelConfig().max_position_embeddings);
  EXPECT_TRUE((*loaded)->embed == expected->embed);
  EXPECT_TRUE((*loaded)->layers[3].w_down == expected->layers[3].w_down);
  EXPECT_TRUE((*loaded)->lm_head == expected->lm_head);

  auto tokenizer = loadTokenizer(a.path(), (*loaded)->config);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->decode((*tokenizer)->encode("Hello, tiny model!")), "Hello, tiny model!");
}

TEST_F(MakeTinyModelTest, SeedAndDtypeChangeTheOutput) {
  ScratchDir f32, other_seed, bf16;
  ASSERT_EQ(run("--out " + f32.path() + " --seed 5").exit_code, 0);
  ASSERT_EQ(run("--out " + other_seed.path() + " --seed 6").exit_code, 0);
  ASSERT_EQ(run("--out " + bf16.path() + " --seed 5 --dtype bfloat16").exit_code, 0);
  EXPECT_FALSE(testing::readBytes(f32.file("model.safetensors")) ==
               testing::readBytes(other_seed.file("model.safetensors")));

  const auto f32_size = std::filesystem::file_size(f32.file("model.safetensors"));
  const auto bf16_size = std::filesystem::file_size(bf16.file("model.safetensors"));
  EXPECT_LT(bf16_size, f32_size / 2 + 4096) << "bf16 is half the size";
  auto loaded = loadModelWeights(bf16.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config.torch_dtype, "bfloat16");
  auto expected = makeRandomWeights(tinyModelConfig(), 5);
  ASSERT_EQ((*loaded)->embed.size(), expected->embed.size());
  for (size_t i = 0; i < 1000; ++i) {
    EXPECT_EQ((*loaded)->embed[i], bf16ToFloat(floatToBf16(expected->embed[i]))) << i;
  }
}

// --arch writes each family's checkpoint in its real tensor names, loadable
// and deterministic.
TEST_F(MakeTinyModelTest, ArchFamiliesWriteLoadableCheckpoints) {
  for (std::string_view family : {"llama3", "qwen2", "qwen3"}) {
    ScratchDir a, b;
    const std::string args = strCat(" --seed 9 --arch ", family);
    RunResult first = run("--out " + a.path() + args);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    EXPECT_THAT(first.output, HasSubstr(strCat("wrote the ", family, " model")));
    ASSERT_EQ(run("--out " + b.path() + args).exit_code, 0);
    for (const char* file : kFiles) {
      EXPECT_EQ(testing::readBytes(a.file(file)), testing::readBytes(b.file(file))) << family << " " << file;
    }
    auto weights = loadModelWeights(a.path());
    ASSERT_TRUE(weights.ok()) << family << ": " << weights.status();
    const ModelConfig want = *smallArchConfig(family);
    EXPECT_EQ((*weights)->config.architecture, want.architecture);
    EXPECT_EQ((*weights)->config.rope_scaling.type, want.rope_scaling.type);
    EXPECT_EQ((*weights)->layers[0].bq.size(), want.arch().qkv_bias ? static_cast<size_t>(want.qDim()) : 0u);
    EXPECT_EQ((*weights)->layers[1].k_norm.size(), want.arch().qk_norm ? static_cast<size_t>(want.head_dim) : 0u);
    EXPECT_TRUE(loadTokenizer(a.path(), (*weights)->config).ok()) << family;
  }
}

TEST_F(MakeTinyModelTest, BadFlagsExitNonZeroWithAMessage) {
  struct Case {
    std::string args;
    std::string expected;
  };
  const Case cases[] = {
      {"", "--out is required"},
      {"--out " + scratch_.path() + " --seed abc", "--seed: expected an unsigned integer, got \"abc\""},
      {"--out " + scratch_.path() + " --seed -1", "--seed: expected an unsigned integer"},
      {"--out " + scratch_.path() + " --dtype int8", "--dtype: expected float32 or bfloat16, got \"int8\""},
      {"--out " + scratch_.path() + " --sed 3", "unknown flag --sed"},
      {"--out " + scratch_.path() + " --arch gemma", "--arch: expected tiny, llama3, qwen2, qwen3, got \"gemma\""},
      {"--out", "--out needs a value"},
  };
  for (const Case& c : cases) {
    RunResult r = run(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args;
    EXPECT_THAT(r.output, HasSubstr(c.expected)) << c.args;
    EXPECT_THAT(r.output, HasSubstr("usage: tandem-make-model")) << c.args;
  }
  RunResult help = run("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("usage:"));

  // A path that cannot be a directory fails at write time, exit 1.
  testing::writeText(scratch_.file("plain_file"), "x");
  RunResult blocked = run("--out " + scratch_.file("plain_file") + "/model");
  EXPECT_EQ(blocked.exit_code, 1) << blocked.output;
  EXPECT_THAT(blocked.output, HasSubstr("cannot create directory"));
}

}  // namespace
}  // namespace tandem::engine
