#include "engine/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/engine/model/scratch_dir.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ScratchDir;

// A file made by hand: 8-byte length, `header` verbatim, then `buffer`.
std::string rawFile(std::string_view header, std::string_view buffer, uint64_t header_len_override = 0) {
  uint64_t len = header_len_override != 0 ? header_len_override : header.size();
  std::string bytes(reinterpret_cast<const char*>(&len), sizeof(len));
  bytes += header;
  bytes += buffer;
  return bytes;
}

std::string errorOpening(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  if (file.ok()) return "(opened without error)";
  return std::string(file.status().message());
}

uint64_t headerLength(const std::string& bytes) {
  uint64_t len;
  std::memcpy(&len, bytes.data(), sizeof(len));
  return len;
}

TEST(SafetensorsTest, RoundTripF32) {
  ScratchDir dir;
  const std::string path = dir.file("model.safetensors");
  std::vector<float> a = {1.5f, -2.25f, 3e-8f, 1e30f, 0.0f, -0.0f};
  std::vector<float> b = {42.0f};
  std::vector<float> empty;
  ASSERT_TRUE(
      writeSafetensors(path, {{"layer.a", {2, 3}, a}, {"b", {1}, b}, {"empty", {0, 4}, empty}}, DType::kF32).ok());

  // The header is padded so the data buffer starts 8-byte aligned.
  std::string bytes = testing::readBytes(path);
  EXPECT_EQ(headerLength(bytes) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + headerLength(bytes) + (6 + 1) * sizeof(float));

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->tensorNames(), ElementsAre("b", "empty", "layer.a"));
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const TensorInfo* info = (*file)->find("layer.a");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->dtype, DType::kF32);
  EXPECT_THAT(info->shape, ElementsAre(2, 3));
  EXPECT_EQ(info->data.size(), 24u);
  EXPECT_EQ((*file)->find("nope"), nullptr);

  const int64_t shape_a[] = {2, 3};
  auto read_a = (*file)->readFloat32("layer.a", shape_a);
  ASSERT_TRUE(read_a.ok()) << read_a.status();
  ASSERT_EQ(read_a->size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::memcmp(&(*read_a)[i], &a[i], sizeof(float)), 0) << "bit-exact at " << i;
  }
  const int64_t shape_empty[] = {0, 4};
  auto read_empty = (*file)->readFloat32("empty", shape_empty);
  ASSERT_TRUE(read_empty.ok()) << read_empty.status();
  EXPECT_TRUE(read_empty->empty());
}

TEST(SafetensorsTest, WriterIsDeterministic) {
  ScratchDir dir;
  std::vector<float> v = {1, 2, 3, 4};
  ASSERT_TRUE(writeSafetensors(dir.file("a"), {{"x", {4}, v}, {"y", {2, 2}, v}}, DType::kBF16).ok());
  ASSERT_TRUE(writeSafetensors(dir.file("b"), {{"x", {4}, v}, {"y", {2, 2}, v}}, DType::kBF16).ok());
  EXPECT_EQ(testing::readBytes(dir.file("a")), testing::readBytes(dir.file("b")));
}

TEST(SafetensorsTest, Bf16RoundsToNearestEven) {
  // bf16 keeps 7 mantissa bits: around 1.0 representable values are 2^-7 apart.
  const float half_ulp = std::ldexp(1.0f, -8);
  EXPECT_EQ(floatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(floatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f + half_ulp)), 1.0f);                     // tie -> even (down)
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f + 3 * half_ulp)), 1.0f + 4 * half_ulp);  // tie -> even (up)
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f + half_ulp + std::ldexp(1.0f, -20))), 1.0f + 2 * half_ulp);  // above tie
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f + half_ulp - std::ldexp(1.0f, -20))), 1.0f);                 // below tie
  EXPECT_EQ(bf16ToFloat(floatToBf16(3.14159265f)), 3.140625f);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload is only in the low bits must not round to infinity.
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(std::bit_cast<float>(0x7F800001u)))));
  // The largest finite float rounds up to infinity, as in PyTorch.
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7F80);
}

TEST(SafetensorsTest, RoundTripBf16) {
  ScratchDir dir;
  const std::string path = dir.file("m.safetensors");
  const float half_ulp = std::ldexp(1.0f, -8);
  std::vector<float> values = {1.0f, 1.0f + half_ulp, 1.0f + 3 * half_ulp, 3.14159265f, -0.5f, 65504.0f};
  ASSERT_TRUE(writeSafetensors(path, {{"w", {2, 3}, values}}, DType::kBF16).ok());
  EXPECT_EQ(testing::readBytes(path).size(), 8 + headerLength(testing::readBytes(path)) + 6 * 2);
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->find("w")->dtype, DType::kBF16);
  const int64_t shape[] = {2, 3};
  auto read = (*file)->readFloat32("w", shape);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(*read, ElementsAre(1.0f, 1.0f, 1.0f + 4 * half_ulp, 3.140625f, -0.5f, 65536.0f));
}

TEST(SafetensorsTest, ReadsF16) {
  EXPECT_EQ(f16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(f16ToFloat(0xC000), -2.0f);
  EXPECT_EQ(f16ToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(f16ToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(f16ToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(f16ToFloat(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16ToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16ToFloat(0x7E00)));
  EXPECT_TRUE(std::signbit(f16ToFloat(0x8000)));

  ScratchDir dir;
  const std::string path = dir.file("half.safetensors");
  const uint16_t halves[] = {0x3C00, 0xC000, 0x3555, 0x0001};
  testing::writeText(path, rawFile(R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})",
                                   std::string_view(reinterpret_cast<const char*>(halves), sizeof(halves))));
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const int64_t shape[] = {4};
  auto read = (*file)->readFloat32("h", shape);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(*read, ElementsAre(1.0f, -2.0f, 0.333251953125f, std::ldexp(1.0f, -24)));
}

TEST(SafetensorsTest, WrongShapeAndMissingTensorNameIt) {
  ScratchDir dir;
  const std::string path = dir.file("model.safetensors");
  std::vector<float> v(688 * 255, 0.5f);
  ASSERT_TRUE(writeSafetensors(path, {{"model.layers.3.mlp.up_proj.weight", {688, 255}, v}}, DType::kF32).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const int64_t expected[] = {688, 256};
  auto read = (*file)->readFloat32("model.layers.3.mlp.up_proj.weight", expected);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(std::string(read.status().message()),
            path + ": tensor model.layers.3.mlp.up_proj.weight: expected shape [688, 256], got [688, 255]");
  const int64_t rank1[] = {688 * 255};
  EXPECT_FALSE((*file)->readFloat32("model.layers.3.mlp.up_proj.weight", rank1).ok()) << "rank is part of the shape";

  auto missing = (*file)->readFloat32("model.norm.weight", expected);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("tensor model.norm.weight: missing"));
}

TEST(SafetensorsTest, NonFloatDtypeOpensButCannotBeReadAsFloats) {
  ScratchDir dir;
  const std::string path = dir.file("ints.safetensors");
  testing::writeText(path,
                     rawFile(R"({"steps":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", std::string(16, '\0')));
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const int64_t shape[] = {2};
  auto read = (*file)->readFloat32("steps", shape);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("tensor steps: dtype I64 cannot be loaded as floats (supported: F32, BF16, F16)"));
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  ScratchDir dir;
  std::vector<float> v = {1, 2, 3};
  auto status = writeSafetensors(dir.file("x"), {{"t", {2, 2}, v}}, DType::kF32);
  EXPECT_THAT(std::string(status.message()), HasSubstr("tensor t: shape [2, 2] has 4 elements but 3 values"));
  status = writeSafetensors(dir.file("x"), {{"t", {3}, v}, {"t", {3}, v}}, DType::kF32);
  EXPECT_THAT(std::string(status.message()), HasSubstr("tensor t: duplicate"));
  status = writeSafetensors(dir.file("x"), {{"t", {3}, v}}, DType::kF16);
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot write dtype F16"));
  status = writeSafetensors(dir.path() + "/no/such/dir/x", {{"t", {3}, v}}, DType::kF32);
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot create"));
}

TEST(SafetensorsTest, MissingFile) {
  ScratchDir dir;
  auto file = SafetensorsFile::open(dir.file("absent.safetensors"));
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(absl::IsNotFound(file.status()));
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("absent.safetensors: cannot open"));
}

// Each malformed file must fail to open, with a message naming the problem
// (and the tensor, where there is one).
TEST(SafetensorsTest, MalformedFiles) {
  ScratchDir dir;
  const std::string good_path = dir.file("good.safetensors");
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(writeSafetensors(good_path, {{"w", {2, 3}, v}}, DType::kF32).ok());
  const std::string good = testing::readBytes(good_path);
  const std::string buf24(24, '\0');

  struct Case {
    const char* name;
    std::string bytes;
    std::string expected;
  };
  const Case cases[] = {
      {"empty file", "", "truncated: file is 0 bytes, shorter than the 8-byte header length"},
      {"cut inside the length", good.substr(0, 5), "truncated: file is 5 bytes"},
      {"cut inside the header", good.substr(0, 20), "truncated or corrupt: header length"},
      {"cut inside the data", good.substr(0, good.size() - 4),
       "tensor w: data_offsets [0, 24] out of range: the data buffer is 20 bytes (file truncated?)"},
      {"header length past the end", rawFile(R"({})", "", 1000), "header length 1000 exceeds the 2 bytes"},
      {"bad JSON", rawFile(R"({"w": {"dtype": )", ""), "header: invalid JSON: [json.exception.parse_error"},
      {"header not an object", rawFile(R"([1,2])", ""), "header: expected a JSON object, got array"},
      {"unknown dtype", rawFile(R"({"w":{"dtype":"Q4_K","shape":[2,3],"data_offsets":[0,24]}})", buf24),
       "tensor w: unknown dtype \"Q4_K\""},
      {"missing dtype", rawFile(R"({"w":{"shape":[2,3],"data_offsets":[0,24]}})", buf24), "tensor w: dtype: missing"},
      {"shape/size mismatch", rawFile(R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[0,24]}})", buf24),
       "tensor w: shape [2, 4] of F32 needs 8 x 4 bytes, but data_offsets [0, 24] hold 24"},
      {"bf16 size mismatch", rawFile(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,24]}})", buf24),
       "tensor w: shape [2, 3] of BF16 needs 6 x 2 bytes"},
      {"negative dim", rawFile(R"({"w":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]}})", buf24),
       "tensor w: shape: expected non-negative integers"},
      {"offsets out of range", rawFile(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}})", buf24),
       "tensor w: data_offsets [8, 32] out of range: the data buffer is 24 bytes"},
      {"begin after end", rawFile(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[16,8]}})", buf24),
       "tensor w: data_offsets [16, 8]: begin is after end"},
      {"offsets not a pair", rawFile(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0]}})", buf24),
       "tensor w: data_offsets: expected [begin, end]"},
      {"shape overflows",
       rawFile(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,24]}})", buf24),
       "tensor w: shape [4294967296,4294967296] is too large"},
      {"entry not an object", rawFile(R"({"w":[1]})", ""), "tensor w: expected an object"},
      {"metadata not strings", rawFile(R"({"__metadata__":{"format":1}})", ""),
       "__metadata__: format: expected a string"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.file("bad.safetensors");
    testing::writeText(path, c.bytes);
    const std::string error = errorOpening(path);
    EXPECT_THAT(error, HasSubstr(c.expected)) << c.name;
    EXPECT_THAT(error, HasSubstr(path)) << c.name << ": errors name the file";
  }
}

}  // namespace
}  // namespace tandem::engine
