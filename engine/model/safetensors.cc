#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "engine/backend/kernel_math.h"
#include "src/common/strings.h"

namespace tandem::engine {
namespace {

// The byte layout on disk is little-endian; reading it with memcpy is only
// correct on a little-endian host.
static_assert(std::endian::native == std::endian::little, "safetensors reader assumes a little-endian host");

using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; a larger value
// is a corrupt length, not a real header.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
    {DType::kF64, "F64", 8},
}};

const DTypeEntry& entryOf(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}

const DTypeEntry* entryNamed(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string errnoText() { return std::strerror(errno); }

uint16_t loadU16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

std::string_view dtypeName(DType dtype) { return entryOf(dtype).name; }
size_t dtypeSize(DType dtype) { return entryOf(dtype).size; }

float bf16ToFloat(uint16_t bits) { return kmath::bf16Value(bits); }

uint16_t floatToBf16(float value) { return kmath::bf16Bits(value); }

float f16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf / NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // ±0
  } else {
    // Subnormal: value = mantissa * 2^-24; normalise it.
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

int64_t TensorInfo::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated not to overflow when the file was opened
  return n;
}

std::string shapeToString(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += strCat(i == 0 ? "" : ", ", shape[i]);
  return out + "]";
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::string why = errnoText();
    if (errno == ENOENT) return absl::NotFoundError(strCat(path, ": cannot open: ", why));
    return absl::FailedPreconditionError(strCat(path, ": cannot open: ", why));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string why = errnoText();
    ::close(fd);
    return absl::FailedPreconditionError(strCat(path, ": cannot stat: ", why));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(
        strCat(path, ": truncated: file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string why = errnoText();
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return absl::FailedPreconditionError(strCat(path, ": cannot mmap: ", why));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, static_cast<const std::byte*>(map), size));
  TANDEM_RETURN_IF_ERROR(file->parseHeader());
  return file;
}

SafetensorsFile::~SafetensorsFile() { ::munmap(const_cast<std::byte*>(map_), map_size_); }

namespace {

// One tensor's header entry: dtype, shape and data_offsets, checked against
// each other and against the data buffer that follows the header.
absl::StatusOr<TensorInfo> parseTensorEntry(const std::string& path, const std::string& name, const Json& entry,
                                            const std::byte* buffer, uint64_t buffer_size) {
  auto fail = [&](std::string_view what) {
    return absl::InvalidArgumentError(strCat(path, ": tensor ", name, ": ", what));
  };
  if (!entry.is_object()) return fail("expected an object with dtype, shape and data_offsets");

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) return fail("dtype: missing or not a string");
  const DTypeEntry* dtype = entryNamed(dtype_it->get_ref<const std::string&>());
  if (dtype == nullptr) return fail(strCat("unknown dtype \"", dtype_it->get_ref<const std::string&>(), "\""));

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) return fail("shape: missing or not a list");
  TensorInfo info;
  info.name = name;
  info.dtype = dtype->dtype;
  uint64_t num_elements = 1;
  for (const Json& d : *shape_it) {
    if (!d.is_number_unsigned()) return fail(strCat("shape: expected non-negative integers, got ", shape_it->dump()));
    const auto dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(num_elements, dim, &num_elements)) {
      return fail(strCat("shape ", shape_it->dump(), " is too large"));
    }
    info.shape.push_back(static_cast<int64_t>(dim));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return fail("data_offsets: expected [begin, end] with non-negative integers");
  }
  const auto begin = (*offsets_it)[0].get<uint64_t>();
  const auto end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) return fail(strCat("data_offsets [", begin, ", ", end, "]: begin is after end"));
  if (end > buffer_size) {
    return fail(strCat("data_offsets [", begin, ", ", end, "] out of range: the data buffer is ", buffer_size,
                       " bytes (file truncated?)"));
  }
  uint64_t expected_bytes;
  if (__builtin_mul_overflow(num_elements, static_cast<uint64_t>(dtype->size), &expected_bytes) ||
      expected_bytes != end - begin) {
    return fail(strCat("shape ", shapeToString(info.shape), " of ", dtype->name, " needs ", num_elements, " x ",
                       dtype->size, " bytes, but data_offsets [", begin, ", ", end, "] hold ", end - begin));
  }
  info.data = std::span<const std::byte>(buffer + begin, static_cast<size_t>(end - begin));
  return info;
}

}  // namespace

absl::Status SafetensorsFile::parseHeader() {
  uint64_t header_len;
  std::memcpy(&header_len, map_, sizeof(header_len));
  const uint64_t after_len = map_size_ - 8;
  if (header_len > after_len) {
    return absl::InvalidArgumentError(strCat(path_, ": truncated or corrupt: header length ", header_len,
                                             " exceeds the ", after_len, " bytes after the length field"));
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        strCat(path_, ": corrupt: header length ", header_len, " is above the ", kMaxHeaderBytes, "-byte limit"));
  }
  const char* header_text = reinterpret_cast<const char*>(map_ + 8);
  Json header;
  try {
    header = Json::parse(header_text, header_text + header_len);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(strCat(path_, ": header: invalid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(strCat(path_, ": header: expected a JSON object, got ", header.type_name()));
  }

  const std::byte* buffer = map_ + 8 + header_len;
  const uint64_t buffer_size = after_len - header_len;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return absl::InvalidArgumentError(strCat(path_, ": __metadata__: expected an object"));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(strCat(path_, ": __metadata__: ", key, ": expected a string value"));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(TensorInfo info, parseTensorEntry(path_, name, entry, buffer, buffer_size));
    tensors_.emplace(name, std::move(info));
  }
  return absl::OkStatus();
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::tensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) names.push_back(name);
  return names;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::readFloat32(std::string_view name,
                                                                std::span<const int64_t> expected_shape) const {
  const TensorInfo* info = find(name);
  if (info == nullptr) return absl::NotFoundError(strCat(path_, ": tensor ", name, ": missing"));
  if (!std::equal(info->shape.begin(), info->shape.end(), expected_shape.begin(), expected_shape.end())) {
    return absl::InvalidArgumentError(strCat(path_, ": tensor ", name, ": expected shape ",
                                             shapeToString(expected_shape), ", got ", shapeToString(info->shape)));
  }
  const auto n = static_cast<size_t>(info->numElements());
  std::vector<float> out(n);
  const std::byte* p = info->data.data();
  switch (info->dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(out.data(), p, n * sizeof(float));
      break;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) out[i] = bf16ToFloat(loadU16(p + 2 * i));
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = f16ToFloat(loadU16(p + 2 * i));
      break;
    default:
      return absl::InvalidArgumentError(strCat(path_, ": tensor ", name, ": dtype ", dtypeName(info->dtype),
                                               " cannot be loaded as floats (supported: F32, BF16, F16)"));
  }
  return out;
}

absl::Status writeSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        strCat(path, ": cannot write dtype ", dtypeName(dtype), " (supported: F32, BF16)"));
  }
  const size_t elem = dtypeSize(dtype);
  // nlohmann::json writes object keys sorted, so the header text depends only
  // on the tensors, never on hash order: same input, same bytes.
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(strCat(path, ": invalid tensor name \"", t.name, "\""));
    }
    if (header.contains(t.name)) return absl::InvalidArgumentError(strCat(path, ": tensor ", t.name, ": duplicate"));
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(strCat(path, ": tensor ", t.name, ": negative dimension"));
      n *= d;
    }
    if (static_cast<size_t>(n) != t.data.size()) {
      return absl::InvalidArgumentError(strCat(path, ": tensor ", t.name, ": shape ", shapeToString(t.shape), " has ",
                                               n, " elements but ", t.data.size(), " values were given"));
    }
    const uint64_t bytes = static_cast<uint64_t>(n) * elem;
    header[t.name] = {{"dtype", dtypeName(dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::FailedPreconditionError(strCat(tmp, ": cannot create: ", errnoText()));
    const uint64_t header_len = header_text.size();
    out.write(reinterpret_cast<const char*>(&header_len), sizeof(header_len));
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    std::vector<uint16_t> narrow;
    for (const TensorToWrite& t : tensors) {
      if (dtype == DType::kF32) {
        out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size_bytes()));
      } else {
        narrow.resize(t.data.size());
        for (size_t i = 0; i < t.data.size(); ++i) narrow[i] = floatToBf16(t.data[i]);
        out.write(reinterpret_cast<const char*>(narrow.data()),
                  static_cast<std::streamsize>(narrow.size() * sizeof(uint16_t)));
      }
    }
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::FailedPreconditionError(strCat(tmp, ": write failed: ", errnoText()));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = errnoText();
    std::remove(tmp.c_str());
    return absl::FailedPreconditionError(strCat(path, ": cannot rename from ", tmp, ": ", why));
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
