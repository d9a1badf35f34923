#pragma once
// Reader and writer for the safetensors checkpoint format.
//
// File layout (all integers little-endian):
//
//   [0, 8)        uint64 N: length of the header in bytes
//   [8, 8+N)      header: a UTF-8 JSON object, possibly padded with trailing spaces
//                   {
//                     "<tensor name>": {"dtype": "BF16", "shape": [688, 256],
//                                       "data_offsets": [begin, end]},
//                     ...,
//                     "__metadata__": {"format": "pt"}      (optional, string -> string)
//                   }
//   [8+N, EOF)    data buffer. A tensor's bytes are buffer[begin, end), row-major,
//                 little-endian, with no padding between elements; offsets are
//                 relative to the start of the buffer, not of the file.
//
// dtype is one of BOOL U8 I8 F8_E4M3 F8_E5M2 I16 U16 F16 BF16 I32 U32 F32 I64 U64 F64.
// The reader checks that every entry is well formed: dtype known, shape
// non-negative, product(shape) * sizeof(dtype) == end - begin, and
// begin <= end <= buffer size. Overlapping tensors are not rejected.
// Only F32, BF16 and F16 can be read as floats; other dtypes may be present
// (and are validated) but reading them is an error.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/status.h"

namespace tandem::engine {

enum class DType { kBool, kU8, kI8, kF8E4M3, kF8E5M2, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kI64, kU64, kF64 };

// "BF16" and friends, as written in a safetensors header.
std::string_view dtypeName(DType dtype);
// Size of one element in bytes.
size_t dtypeSize(DType dtype);

// Conversions used by the reader and writer. floatToBf16 rounds to nearest,
// ties to even (what PyTorch does); NaN stays NaN.
float bf16ToFloat(uint16_t bits);
uint16_t floatToBf16(float value);
float f16ToFloat(uint16_t bits);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // The tensor's bytes inside the mapped file; valid while the file is open.
  std::span<const std::byte> data;

  int64_t numElements() const;
};

// "[688, 256]"
std::string shapeToString(std::span<const int64_t> shape);

// An open, validated safetensors file. The file is memory-mapped read-only
// for the lifetime of the object. Const methods are thread-safe.
class SafetensorsFile {
 public:
  // Maps and validates `path`; every error names the path and, where there
  // is one, the tensor.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  // Names in sorted order.
  std::vector<std::string> tensorNames() const;
  // The "__metadata__" object (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's values widened to fp32 (F32, BF16 or F16 on disk), after
  // checking its shape:
  //   "model.safetensors: tensor model.layers.3.mlp.up_proj.weight: expected shape [688, 256], got [688, 255]"
  // NotFound when the tensor is absent.
  [[nodiscard]] absl::StatusOr<std::vector<float>> readFloat32(std::string_view name,
                                                               std::span<const int64_t> expected_shape) const;

 private:
  SafetensorsFile(std::string path, const std::byte* map, size_t map_size)
      : path_(std::move(path)), map_(map), map_size_(map_size) {}
  absl::Status parseHeader();

  std::string path_;
  const std::byte* map_;  // whole file, read-only
  size_t map_size_;
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;  // product(shape) values, row-major
};

// Writes `tensors` (in the given order) as `dtype` (kF32 or kBF16) with
// metadata {"format": "pt"}. The header is padded to a multiple of 8 bytes so
// the data buffer is aligned. Deterministic: the same input gives the same
// bytes. Written to a temporary file and renamed, so a reader never sees a
// half-written file.
[[nodiscard]] absl::Status writeSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                            DType dtype);

}  // namespace tandem::engine
