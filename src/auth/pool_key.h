#pragma once
// The pool key: a random secret shared by every agent of one InferencePool
// (the operator's Secret `<pool>-pool-key`, mounted into each pod; the local
// stack's `.tandem/pool-key/`). It authenticates the KV channel between
// prefill and decode agents (kv_handshake.h) and, as a derived bearer token,
// the internal HTTP API and routed requests (docs/security.md).
//
// Key directory (what a mounted Secret looks like):
//   DIR/key            the key this agent proves itself with; required
//   DIR/previous-key   also accepted (optional): the key before a rotation
//   DIR/next-key       also accepted (optional): the key after a rotation
// Each file holds the key as text (surrounding whitespace ignored), at least
// kMinKeyBytes bytes, e.g. 64 hex digits of 32 random bytes. Rotation
// (docs/security.md): add next-key everywhere; then make it `key` and the
// old one `previous-key`; then drop previous-key. At every step each pair of
// agents shares a key both accept.
//
// Without a key directory an agent runs *insecure*: it uses the empty key,
// which every other insecure agent also holds, so unconfigured agents still
// work together (local use, tests) and an insecure agent never
// authenticates to one with a real key, nor the other way round.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"
#include "src/common/log.h"
#include "src/common/status.h"

namespace tandem::auth {

inline constexpr size_t kMinKeyBytes = 32;
inline constexpr size_t kMaxKeyBytes = 4096;

// HMAC-SHA-256 of `data` under `key` (32 raw bytes).
std::string hmacSha256(std::string_view key, std::string_view data);
// SHA-256 of `data` (32 raw bytes).
std::string sha256(std::string_view data);
// `n` bytes from OpenSSL's CSPRNG; fails only if it cannot be seeded.
absl::StatusOr<std::string> randomBytes(size_t n);
// Equal length and bytes, in time independent of where they differ.
bool constantTimeEqual(std::string_view a, std::string_view b);
// A fresh key for a pool: 64 hex digits of 32 random bytes.
absl::StatusOr<std::string> generatePoolKey();

// A key's public id, sent in the handshake to say which key a side holds:
// the first 8 bytes of SHA-256("tandem-pool-key-id\0" + key).
uint64_t poolKeyId(std::string_view key);
// "k-<16 hex digits>", or "insecure" for the empty key's id.
std::string poolKeyIdName(uint64_t id);

// An immutable set of keys: the first is the one this side proves with;
// all are accepted.
class PoolKeys {
 public:
  struct Key {
    std::string secret;
    uint64_t id = 0;
  };

  // The empty key alone (no key directory).
  static std::shared_ptr<const PoolKeys> insecure();
  // `secrets[0]` proves; all are accepted. Each must be kMinKeyBytes to
  // kMaxKeyBytes long; `names` (parallel, e.g. the file paths) name a bad one.
  static absl::StatusOr<std::shared_ptr<const PoolKeys>> of(const std::vector<std::string>& secrets,
                                                           const std::vector<std::string>& names);

  bool secure() const { return secure_; }
  const Key& primary() const { return keys_.front(); }
  const std::vector<Key>& all() const { return keys_; }
  const Key* find(uint64_t id) const;
  std::vector<uint64_t> ids() const;
  // "[k-…, k-…]" for log and error messages.
  std::string idNames() const;

  // The bearer token for /internal/v1/ and for requests a router forwards:
  // "tandem-pool.<key id>.<HMAC(key, purpose) in hex>" from the primary key.
  // Empty when insecure.
  std::string internalToken() const;
  // Whether `token` is the internal token of any accepted key (constant
  // time in the token's bytes). Always true when insecure.
  bool acceptsInternalToken(std::string_view token) const;

 private:
  PoolKeys(std::vector<Key> keys, bool secure) : keys_(std::move(keys)), secure_(secure) {}
  std::vector<Key> keys_;
  bool secure_ = false;
};

// Where an agent gets its keys: a key directory re-read as it changes (a
// Secret's mounted files are swapped when the Secret is edited), or the
// insecure key. Thread-safe.
class PoolKeySource {
 public:
  // Reads DIR now; fails naming the file and what is wrong with it. Later
  // reads happen in keys() at most every `reload_interval`; a directory that
  // turned bad keeps the last good keys, logged once per distinct error.
  static absl::StatusOr<std::unique_ptr<PoolKeySource>> open(std::string dir, const Clock& clock,
                                                             Duration reload_interval = std::chrono::seconds(5));
  static std::unique_ptr<PoolKeySource> insecure();

  std::shared_ptr<const PoolKeys> keys();
  bool secure() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

 private:
  PoolKeySource(std::string dir, const Clock* clock, Duration interval, std::shared_ptr<const PoolKeys> keys)
      : dir_(std::move(dir)), clock_(clock), interval_(interval), keys_(std::move(keys)) {}
  const std::string dir_;  // empty: insecure
  const Clock* clock_;
  const Duration interval_;
  Logger log_{"auth"};
  absl::Mutex mu_;
  std::shared_ptr<const PoolKeys> keys_ ABSL_GUARDED_BY(mu_);
  MonoTime next_read_ ABSL_GUARDED_BY(mu_){};
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

// Reads a key directory (see the top).
absl::StatusOr<std::shared_ptr<const PoolKeys>> readPoolKeyDir(const std::string& dir);

}  // namespace tandem::auth
