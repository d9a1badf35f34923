#pragma once
// API keys of the public OpenAI API (/v1/...; docs/api-keys.md) and each
// key's limits. Off unless the agent is given --api-keys-file; then every
// request to /v1/completions, /v1/chat/completions and /v1/models must carry
// `Authorization: Bearer <key>` with a key the file lists.
//
// The keys file (what a Kubernetes Secret holds, mounted as a file) lists
// the keys' SHA-256, never the keys:
//
//   keys:
//   - name: team-a              # in logs; never the key. [A-Za-z0-9._:@/-], 1 to 128 characters
//     sha256: 9f86d081...       # 64 hex digits: SHA-256 of the key's bytes (`tandem-agent hash-api-key`)
//     requests_per_second: 5    # optional; default --api-key-requests-per-second; 0: unlimited
//     burst: 10                 # optional; default --api-key-burst; 0: max(1, requests_per_second)
//     max_concurrent: 4         # optional; default --api-key-max-concurrent; 0: unlimited
//
// Names and hashes are unique. `keys: []` lets no request through.
//
// Decisions, in this order: a missing or unknown key is refused
// (kInvalidApiKey); a key with max_concurrent requests in flight is refused
// (kConcurrencyLimited) without spending a token; a key whose token bucket is
// empty is refused (kRateLimited) with the time until its next token. Each
// refusal counts in tandem_api_requests_rejected_total{reason}.
//
// Reload. The gate re-reads the file every reload_interval and applies it
// when its content changed (Kubernetes updates a mounted Secret by swapping
// a symlink, so the content is compared, not file events). A key that left
// the file is refused from then on (revocation; requests it has in flight
// run to their end). A key that stays keeps its bucket and its requests in
// flight, with the new limits. A bad file keeps the set in force and is
// logged (once per content) naming the line and the field; at open() it is
// an error.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "src/common/clock.h"
#include "src/common/status.h"
#include "src/metrics/metrics.h"

namespace tandem::agent {

// SHA-256 of an API key: what the keys file holds and what a request's key
// is compared with.
struct ApiKeyDigest {
  std::array<uint8_t, 32> bytes{};
};

ApiKeyDigest hashApiKey(std::string_view key);
// Equal digests, compared in time independent of where they differ
// (CRYPTO_memcmp), so response times do not reveal how much of a stored
// hash a guess matched.
bool sameDigest(const ApiKeyDigest& a, const ApiKeyDigest& b);
std::string digestHex(const ApiKeyDigest& digest);  // 64 lower-case hex digits
// 64 hex digits (either case); InvalidArgument saying what is wrong otherwise.
absl::StatusOr<ApiKeyDigest> parseDigestHex(std::string_view hex);

// What an API key may be: 16 to 4096 printable ASCII characters, no spaces
// (it travels in an HTTP header). InvalidArgument saying what is wrong.
absl::Status checkApiKey(std::string_view key);
// What a key's name may be (it appears in logs): 1 to 128 of [A-Za-z0-9._:@/-].
absl::Status checkApiKeyName(std::string_view name);
// The keys file's entry for a key (what `tandem-agent hash-api-key` prints):
//   - name: <name>
//     sha256: <64 hex digits>
std::string apiKeyFileEntry(std::string_view name, const ApiKeyDigest& digest);

// The key from an Authorization header's value: "Bearer <key>" (the scheme
// in any case, spaces around the key ignored). nullopt for another scheme
// or no key.
std::optional<std::string_view> bearerToken(std::string_view authorization);

struct ApiKeyLimits {
  double requests_per_second = 0;  // the bucket's refill rate; 0: unlimited
  int burst = 0;                   // the bucket's size; 0: max(1, requests_per_second)
  int max_concurrent = 0;          // requests in flight (open streams included); 0: unlimited
};

struct ApiKeyEntry {
  std::string name;
  ApiKeyDigest digest;
  ApiKeyLimits limits;
};

// The keys file's entries; a limit an entry does not set is `defaults`'.
// InvalidArgument listing every problem, each as
// "<source>:<line>:<column>: keys[<i>].<field>: <what>".
absl::StatusOr<std::vector<ApiKeyEntry>> parseApiKeysFile(std::string_view text, std::string_view source,
                                                          const ApiKeyLimits& defaults);

// A token bucket of `burst` tokens that refills at `rate` per second and
// starts full; a request takes one token. Kept as the time at which the
// bucket would be full again (the generic cell rate algorithm, the same
// decisions as counting tokens), so it is exact in integer nanoseconds and
// a client that waits untilNextToken() always finds its token. Not
// thread-safe.
class TokenBucket {
 public:
  // Precondition: rate > 0, burst >= 1.
  TokenBucket(double rate, int burst, MonoTime now);

  // Takes a token if the bucket holds one at `now`.
  bool tryTake(MonoTime now);
  // How long after `now` the bucket holds a token (zero if it does).
  Duration untilNextToken(MonoTime now) const;
  // New rate and size; the tokens it holds at `now` stay (at most the new burst).
  void setLimits(double rate, int burst, MonoTime now);

 private:
  int burst_;
  Duration interval_;   // time to regain one token: 1 / rate
  Duration tolerance_;  // (burst - 1) × interval: how far ahead of now full_at_ may be and still hold a token
  MonoTime full_at_;    // when the bucket is full again; <= now: full
};

enum class ApiKeyRejection {
  kInvalidApiKey,       // no key, not a Bearer key, or a key the file does not list (revoked included)
  kRateLimited,         // the key's token bucket is empty
  kConcurrencyLimited,  // the key has max_concurrent requests in flight
};
// "invalid_api_key", "rate_limited", "concurrency_limited": the `reason`
// label of tandem_api_requests_rejected_total.
std::string_view apiKeyRejectionName(ApiKeyRejection reason);

// Why the gate refused a request.
struct ApiKeyRefusal {
  ApiKeyRejection reason = ApiKeyRejection::kInvalidApiKey;
  std::string message;     // for the client; never holds the key
  std::string key_name;    // the limited key's name; empty for kInvalidApiKey
  Duration retry_after{};  // kRateLimited: until the key's next token; kConcurrencyLimited: 1 s
};

struct ApiKeyState;  // a listed key's limiter state (api_keys.cc)

// A request the gate let through: its key's name and the key's concurrency
// slot, held until release() or destruction, whichever comes first (moving
// a grant moves the slot). Release the grant when the request ends, on
// every path (finish, error, client gone, deadline); before the last byte
// of the answer goes out, so that the client's next request finds the slot
// free. A default-constructed grant holds nothing (API keys off).
// Not thread-safe: one owner at a time; it may outlive the gate.
class ApiKeyGrant {
 public:
  ApiKeyGrant() = default;
  ApiKeyGrant(std::string key_name, std::shared_ptr<ApiKeyState> slot);
  ApiKeyGrant(ApiKeyGrant&& other) noexcept;
  ApiKeyGrant& operator=(ApiKeyGrant&& other) noexcept;
  ~ApiKeyGrant();

  // The key's name from the file; empty when API keys are off.
  const std::string& keyName() const { return key_name_; }
  // Frees the concurrency slot now (no-op if it was freed or moved).
  void release();

 private:
  std::string key_name_;
  std::shared_ptr<ApiKeyState> slot_;  // null: no slot held
};

struct ApiKeyGateOptions {
  std::string file;       // the keys file (format at the top)
  ApiKeyLimits defaults;  // for keys that do not set their own
  // How often the file is re-read. Zero: never (reload() only).
  Duration reload_interval = std::chrono::seconds(5);
  const Clock* clock = nullptr;  // not owned; must outlive the gate. Null: SystemClock::instance()
};

// The public API's keys and limits. Thread-safe.
class ApiKeyGate {
 public:
  // Reads the file (an error naming the file, line and field if it cannot be
  // read or is bad), registers tandem_api_requests_rejected_total,
  // tandem_api_keys and tandem_api_keys_reload_failures_total on `registry`
  // with `labels` (pool, role), and starts re-reading the file.
  static absl::StatusOr<std::unique_ptr<ApiKeyGate>> open(ApiKeyGateOptions options, metrics::Registry& registry,
                                                          const metrics::Labels& labels);
  ~ApiKeyGate();  // stops re-reading; grants still held stay valid
  ApiKeyGate(const ApiKeyGate&) = delete;
  ApiKeyGate& operator=(const ApiKeyGate&) = delete;

  // The decision on one request. `authorization`: its Authorization
  // header, if it has one.
  std::variant<ApiKeyGrant, ApiKeyRefusal> authorize(std::optional<std::string_view> authorization);

  // Re-reads the file and applies it if its content changed since the last
  // read: what the gate does every reload_interval. The error of a file
  // that cannot be read or is bad (the set in force stays).
  absl::Status reload();

  // Keys in the set in force.
  int numKeys() const;

 private:
  struct Impl;
  explicit ApiKeyGate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::agent
