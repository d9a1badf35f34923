#include "engine/model/model_fingerprint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/model/files.h"
#include "engine/model/model_loader.h"
#include "tests/engine/model/scratch_dir.h"
#include "tests/engine/model/small_model.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::smallConfig;
using testing::writeText;

void writeModel(const ScratchDir& dir, uint64_t seed) {
  ASSERT_TRUE(writeModelDir(dir.path(), *makeRandomWeights(smallConfig(), seed), DType::kF32).ok());
}

uint64_t fingerprintOf(const ScratchDir& dir) {
  auto f = modelFingerprint(dir.path());
  EXPECT_TRUE(f.ok()) << f.status();
  return f.value_or(0);
}

TEST(ModelFingerprintTest, SameFilesSameFingerprintWherever) {
  ScratchDir a, b;
  writeModel(a, 7);
  writeModel(b, 7);
  EXPECT_EQ(fingerprintOf(a), fingerprintOf(b));
  // Files that do not decide the KV leave it alone.
  writeText(b.file("README.md"), "a model card");
  EXPECT_EQ(fingerprintOf(a), fingerprintOf(b));
}

TEST(ModelFingerprintTest, WeightsTokenizerTemplateAndConfigEachChangeIt) {
  ScratchDir base;
  writeModel(base, 7);
  const uint64_t f = fingerprintOf(base);

  ScratchDir weights;
  writeModel(weights, 8);
  EXPECT_NE(fingerprintOf(weights), f) << "other weights";

  for (const char* file : {"tokenizer_config.json", "config.json"}) {
    ScratchDir d;
    writeModel(d, 7);
    auto text = readFile(d.file(file));
    ASSERT_TRUE(text.ok());
    writeText(d.file(file), *text + " ");
    EXPECT_NE(fingerprintOf(d), f) << file;
  }
  for (const char* file : {"chat_template.jinja", "tokenizer.json", "tokenizer.model"}) {
    ScratchDir d;
    writeModel(d, 7);
    writeText(d.file(file), "x");
    EXPECT_NE(fingerprintOf(d), f) << file;
  }
}

// --dtype bfloat16's fingerprint: a function of the checkpoint's alone,
// never the checkpoint's own, and different for different checkpoints.
TEST(ModelFingerprintTest, Bf16ProjectionsHaveAFingerprintOfTheirOwn) {
  for (uint64_t f : {uint64_t{0}, uint64_t{1}, uint64_t{0x0123456789abcdef}}) {
    EXPECT_NE(bf16Fingerprint(f), f);
    EXPECT_EQ(bf16Fingerprint(f), bf16Fingerprint(f));
  }
  EXPECT_NE(bf16Fingerprint(1), bf16Fingerprint(2));
}

TEST(ModelFingerprintTest, MissingDirectoryIsNamed) {
  auto f = modelFingerprint("/nonexistent/model");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("/nonexistent/model"));
}

TEST(ModelFingerprintTest, ParsesAnOperatorsValue) {
  EXPECT_EQ(parseModelFingerprint("--model-fingerprint", "0x00ff").value_or(0), 0xffu);
  EXPECT_EQ(parseModelFingerprint("--model-fingerprint", "DEADbeef01234567").value_or(0), 0xdeadbeef01234567u);
  for (const char* bad : {"", "0x", "12345678901234567", "xyz", "-1", "0x 1"}) {
    auto f = parseModelFingerprint("--model-fingerprint", bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("--model-fingerprint"));
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(std::string("\"") + bad + "\""));
  }
  EXPECT_EQ(fingerprintHex(0xff), "00000000000000ff");
}

}  // namespace
}  // namespace tandem::engine
