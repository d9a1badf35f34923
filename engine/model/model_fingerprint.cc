#include "engine/model/model_fingerprint.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <xxhash.h>

#include "src/common/strings.h"

namespace tandem::engine {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kFingerprintFiles[] = {
    "chat_template.jinja",     "chat_template.json", "config.json",     "model.safetensors.index.json",
    "special_tokens_map.json", "tokenizer.json",     "tokenizer.model", "tokenizer_config.json",
};

bool isFingerprinted(const std::string& name) {
  if (name.ends_with(".safetensors")) return true;
  return std::find(std::begin(kFingerprintFiles), std::end(kFingerprintFiles), name) != std::end(kFingerprintFiles);
}

struct StateFree {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
struct FileClose {
  void operator()(FILE* f) const { std::fclose(f); }
};

void putU64(XXH3_state_t* s, uint64_t v) { XXH3_64bits_update(s, &v, sizeof(v)); }

// Streams one file into the hash in 4 MiB reads.
absl::Status hashFile(XXH3_state_t* s, const fs::path& path, std::vector<char>& buf) {
  std::unique_ptr<FILE, FileClose> f(std::fopen(path.c_str(), "rb"));
  if (!f) return absl::NotFoundError(strCat(path.string(), ": cannot open for the model fingerprint"));
  const std::string name = path.filename().string();
  putU64(s, name.size());
  XXH3_64bits_update(s, name.data(), name.size());
  std::error_code ec;
  putU64(s, static_cast<uint64_t>(fs::file_size(path, ec)));
  if (ec) return absl::InternalError(strCat(path.string(), ": ", ec.message()));
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) XXH3_64bits_update(s, buf.data(), n);
  if (std::ferror(f.get())) return absl::InternalError(strCat(path.string(), ": read error"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> modelFingerprint(const std::string& model_dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(model_dir, ec)) {
    if (e.is_regular_file() && isFingerprinted(e.path().filename().string())) files.push_back(e.path());
  }
  if (ec) return absl::NotFoundError(strCat(model_dir, ": ", ec.message()));
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  std::unique_ptr<XXH3_state_t, StateFree> state(XXH3_createState());
  XXH3_64bits_reset(state.get());
  std::vector<char> buf(4u << 20);
  for (const fs::path& p : files) TANDEM_RETURN_IF_ERROR(hashFile(state.get(), p, buf));
  return XXH3_64bits_digest(state.get());
}

absl::StatusOr<uint64_t> parseModelFingerprint(std::string_view what, std::string_view v) {
  std::string_view digits = v;
  if (digits.starts_with("0x") || digits.starts_with("0X")) digits.remove_prefix(2);
  const bool hex = !digits.empty() && digits.size() <= 16 && std::all_of(digits.begin(), digits.end(), [](char c) {
    return std::isxdigit(static_cast<unsigned char>(c));
  });
  if (!hex) return absl::InvalidArgumentError(strCat(what, ": expected 1 to 16 hex digits, got \"", v, "\""));
  return std::stoull(std::string(digits), nullptr, 16);
}

std::string fingerprintHex(uint64_t fingerprint) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fingerprint));
  return buf;
}

uint64_t bf16Fingerprint(uint64_t checkpoint) {
  // "embedding=bfloat16": since the embedding table is kept in bf16 too,
  // agents of before (an fp32 table) never share KV with these.
  constexpr std::string_view kDtype = "dtype=bfloat16;embedding=bfloat16";
  unsigned char bytes[sizeof(uint64_t) + kDtype.size()];
  for (size_t i = 0; i < sizeof(uint64_t); ++i) bytes[i] = static_cast<unsigned char>(checkpoint >> (8 * i));
  std::memcpy(bytes + sizeof(uint64_t), kDtype.data(), kDtype.size());
  return XXH3_64bits(bytes, sizeof(bytes));
}

}  // namespace tandem::engine
