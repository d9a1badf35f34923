#include "src/auth/pool_key.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <filesystem>

#include "src/common/strings.h"

namespace tandem::auth {
namespace {

constexpr std::string_view kInternalTokenPurpose = "tandem-internal-api/1";
constexpr std::string_view kTokenPrefix = "tandem-pool.";

}  // namespace

std::string hmacSha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // HMAC() with an empty key needs a non-null pointer.
  static const unsigned char kEmpty = 0;
  HMAC(EVP_sha256(), key.empty() ? static_cast<const void*>(&kEmpty) : key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string sha256(std::string_view data) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
  return std::string(reinterpret_cast<const char*>(out), sizeof(out));
}

absl::StatusOr<std::string> randomBytes(size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError("the system's random number generator (OpenSSL RAND_bytes) failed");
  }
  return out;
}

bool constantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> generatePoolKey() {
  TANDEM_ASSIGN_OR_RETURN(std::string raw, randomBytes(32));
  return hexEncode(raw);
}

uint64_t poolKeyId(std::string_view key) {
  std::string digest = sha256(strCat(std::string_view("tandem-pool-key-id\0", 19), key));
  uint64_t id = 0;
  std::memcpy(&id, digest.data(), sizeof(id));
  return id;
}

std::string poolKeyIdName(uint64_t id) {
  if (id == poolKeyId("")) return "insecure";
  std::string raw(reinterpret_cast<const char*>(&id), sizeof(id));
  return "k-" + hexEncode(raw);
}

std::shared_ptr<const PoolKeys> PoolKeys::insecure() {
  static const std::shared_ptr<const PoolKeys> kInsecure(new PoolKeys({Key{"", poolKeyId("")}}, false));
  return kInsecure;
}

absl::StatusOr<std::shared_ptr<const PoolKeys>> PoolKeys::of(const std::vector<std::string>& secrets,
                                                            const std::vector<std::string>& names) {
  if (secrets.empty()) return absl::InvalidArgumentError("no pool key");
  std::vector<Key> keys;
  for (size_t i = 0; i < secrets.size(); ++i) {
    const std::string& name = i < names.size() ? names[i] : strCat("key ", i);
    if (secrets[i].size() < kMinKeyBytes || secrets[i].size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(
          strCat("the pool key in ", name, " is ", secrets[i].size(), " bytes; it must be ", kMinKeyBytes, " to ",
                 kMaxKeyBytes, " (generate one with: head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')"));
    }
    keys.push_back({secrets[i], poolKeyId(secrets[i])});
  }
  return std::shared_ptr<const PoolKeys>(new PoolKeys(std::move(keys), true));
}

const PoolKeys::Key* PoolKeys::find(uint64_t id) const {
  for (const Key& k : keys_) {
    if (k.id == id) return &k;
  }
  return nullptr;
}

std::vector<uint64_t> PoolKeys::ids() const {
  std::vector<uint64_t> out;
  for (const Key& k : keys_) out.push_back(k.id);
  return out;
}

std::string PoolKeys::idNames() const {
  std::string out = "[";
  for (const Key& k : keys_) {
    if (out.size() > 1) out += ", ";
    out += poolKeyIdName(k.id);
  }
  return out + "]";
}

namespace {
std::string tokenFor(const PoolKeys::Key& k) {
  return strCat(kTokenPrefix, poolKeyIdName(k.id), ".", hexEncode(hmacSha256(k.secret, kInternalTokenPurpose)));
}
}  // namespace

std::string PoolKeys::internalToken() const { return secure_ ? tokenFor(primary()) : std::string(); }

bool PoolKeys::acceptsInternalToken(std::string_view token) const {
  if (!secure_) return true;
  bool ok = false;
  // Every key is compared (no early exit), each in constant time.
  for (const Key& k : keys_) ok |= constantTimeEqual(token, tokenFor(k));
  return ok;
}

namespace {

// The key in `path`, trimmed; NotFound when the file does not exist.
absl::StatusOr<std::string> readKeyFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::NotFoundError(strCat(path, " does not exist"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(strCat("cannot read the pool key file ", path));
  std::string s;
  char buf[1024];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    s.append(buf, static_cast<size_t>(in.gcount()));
    if (s.size() > kMaxKeyBytes + 64) break;  // too long; reported below
  }
  const size_t b = s.find_first_not_of(" \t\r\n");
  const size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const PoolKeys>> readPoolKeyDir(const std::string& dir) {
  std::vector<std::string> secrets;
  std::vector<std::string> names;
  // A mounted Secret's files are links into DIR/..data, a link the kubelet
  // swaps to a new directory on an edit: read all three through one
  // resolution of it, so one read never mixes two versions.
  std::string from = dir;
  std::error_code ec;
  if (std::filesystem::is_symlink(dir + "/..data", ec)) {
    const std::filesystem::path target = std::filesystem::read_symlink(dir + "/..data", ec);
    if (!ec) from = (target.is_absolute() ? target : std::filesystem::path(dir) / target).string();
  }
  for (std::string_view file : {"key", "previous-key", "next-key"}) {
    const std::string path = strCat(from, "/", file);
    absl::StatusOr<std::string> k = readKeyFile(path);
    if (absl::IsNotFound(k.status())) {
      if (file == "key") {
        return absl::InvalidArgumentError(
            strCat("the pool key directory ", dir, " has no file `key` (the pool's Secret mounts key, and "
                   "optionally previous-key and next-key)"));
      }
      continue;
    }
    if (!k.ok()) return k.status();
    secrets.push_back(std::move(*k));
    names.push_back(path);
  }
  return PoolKeys::of(secrets, names);
}

absl::StatusOr<std::unique_ptr<PoolKeySource>> PoolKeySource::open(std::string dir, const Clock& clock,
                                                                   Duration reload_interval) {
  if (dir.empty()) return absl::InvalidArgumentError("empty pool key directory");
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<const PoolKeys> keys, readPoolKeyDir(dir));
  std::unique_ptr<PoolKeySource> s(new PoolKeySource(std::move(dir), &clock, reload_interval, std::move(keys)));
  absl::MutexLock lock(&s->mu_);
  s->next_read_ = clock.now() + reload_interval;
  return s;
}

std::unique_ptr<PoolKeySource> PoolKeySource::insecure() {
  return std::unique_ptr<PoolKeySource>(new PoolKeySource("", nullptr, Duration::zero(), PoolKeys::insecure()));
}

std::shared_ptr<const PoolKeys> PoolKeySource::keys() {
  absl::MutexLock lock(&mu_);
  if (dir_.empty()) return keys_;
  const MonoTime now = clock_->now();
  if (now < next_read_) return keys_;
  next_read_ = now + interval_;
  absl::StatusOr<std::shared_ptr<const PoolKeys>> fresh = readPoolKeyDir(dir_);
  if (!fresh.ok()) {
    std::string error(fresh.status().message());
    if (error != last_error_) {
      log_.error("cannot reload the pool keys; still using the last good ones",
                 {{"dir", dir_}, {"error", error}, {"keys", keys_->idNames()}});
      last_error_ = std::move(error);
    }
    return keys_;
  }
  last_error_.clear();
  if ((*fresh)->ids() != keys_->ids()) {
    log_.info("pool keys changed", {{"dir", dir_}, {"proves_with", poolKeyIdName((*fresh)->primary().id)},
                                    {"accepts", (*fresh)->idNames()}});
    keys_ = std::move(*fresh);
  }
  return keys_;
}

}  // namespace tandem::auth
