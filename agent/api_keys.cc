#include "agent/api_keys.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/auth/pool_key.h"
#include "src/common/config.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/common/thread_name.h"

namespace tandem::agent {

namespace {

std::string_view bytesOf(const ApiKeyDigest& d) {
  return std::string_view(reinterpret_cast<const char*>(d.bytes.data()), d.bytes.size());
}

}  // namespace

ApiKeyDigest hashApiKey(std::string_view key) {
  ApiKeyDigest d;
  const std::string digest = auth::sha256(key);
  static_assert(sizeof(d.bytes) == 32);
  std::copy(digest.begin(), digest.end(), d.bytes.begin());
  return d;
}

bool sameDigest(const ApiKeyDigest& a, const ApiKeyDigest& b) { return auth::constantTimeEqual(bytesOf(a), bytesOf(b)); }

std::string digestHex(const ApiKeyDigest& digest) { return hexEncode(bytesOf(digest)); }

absl::StatusOr<ApiKeyDigest> parseDigestHex(std::string_view hex) {
  // The text is never quoted back: a key pasted here by mistake must not
  // reach the logs.
  constexpr std::string_view kWhat =
      "expected the key's SHA-256 as 64 hex digits (tandem-agent hash-api-key prints it)";
  if (hex.size() != 64) return absl::InvalidArgumentError(strCat(kWhat, ", got ", hex.size(), " characters"));
  ApiKeyDigest d;
  for (size_t i = 0; i < d.bytes.size(); ++i) {
    const int hi = hexDigitValue(hex[2 * i]), lo = hexDigitValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::InvalidArgumentError(strCat(kWhat, ", got a character that is not one"));
    d.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return d;
}

absl::Status checkApiKey(std::string_view key) {
  if (key.size() < 16)
    return absl::InvalidArgumentError(strCat("an API key needs at least 16 characters, got ", key.size()));
  if (key.size() > 4096)
    return absl::InvalidArgumentError(strCat("an API key has at most 4096 characters, got ", key.size()));
  for (char c : key) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "an API key holds printable ASCII characters only, no spaces (it is sent in an HTTP header)");
    }
  }
  return absl::OkStatus();
}

absl::Status checkApiKeyName(std::string_view name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(strCat("expected 1 to 128 characters, got ", name.size()));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::string_view("._:@/-").find(c) != std::string_view::npos;
    if (!ok) return absl::InvalidArgumentError(strCat("\"", name, "\" holds a character outside [A-Za-z0-9._:@/-]"));
  }
  return absl::OkStatus();
}

std::string apiKeyFileEntry(std::string_view name, const ApiKeyDigest& digest) {
  // Quoted: a name may start with a character YAML reserves ('@').
  return strCat("- name: \"", name, "\"\n  sha256: ", digestHex(digest), "\n");
}

std::optional<std::string_view> bearerToken(std::string_view authorization) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  std::string_view v = trim(authorization);
  constexpr std::string_view kScheme = "bearer";
  if (v.size() <= kScheme.size() || (v[kScheme.size()] != ' ' && v[kScheme.size()] != '\t')) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(v[i])) != kScheme[i]) return std::nullopt;
  }
  std::string_view token = trim(v.substr(kScheme.size()));
  if (token.empty()) return std::nullopt;
  return token;
}

absl::StatusOr<std::vector<ApiKeyEntry>> parseApiKeysFile(std::string_view text, std::string_view source,
                                                          const ApiKeyLimits& defaults) {
  TANDEM_ASSIGN_OR_RETURN(ConfigDoc doc, ConfigDoc::fromString(text, source));
  std::vector<ApiKeyEntry> out;
  std::vector<ConfigMap> items = doc.root().sectionList("keys", {.required = true});
  for (size_t i = 0; i < items.size(); ++i) {
    ConfigMap& m = items[i];
    ApiKeyEntry e{.limits = defaults};
    if (m.field("name", &e.name, {.required = true})) {
      if (absl::Status s = checkApiKeyName(e.name); !s.ok()) m.fail("name", toStd(s.message()));
      for (size_t j = 0; j < out.size(); ++j) {
        if (out[j].name == e.name) m.fail("name", strCat("\"", e.name, "\" is also the name of keys[", j, "]"));
      }
    }
    std::string hex;
    if (m.field("sha256", &hex, {.required = true})) {
      absl::StatusOr<ApiKeyDigest> d = parseDigestHex(hex);
      if (d.ok()) {
        e.digest = *d;
        for (size_t j = 0; j < out.size(); ++j) {
          if (sameDigest(out[j].digest, e.digest)) m.fail("sha256", strCat("the same key as keys[", j, "]"));
        }
      } else {
        m.fail("sha256", toStd(d.status().message()));
      }
    }
    m.field("requests_per_second", &e.limits.requests_per_second, {.min = 0, .max = 1e6});
    m.field("burst", &e.limits.burst, {.min = 0, .max = 1e6});
    m.field("max_concurrent", &e.limits.max_concurrent, {.min = 0, .max = 1e6});
    out.push_back(std::move(e));
  }
  TANDEM_RETURN_IF_ERROR(doc.finish());
  return out;
}

// ---- TokenBucket ----

namespace {

Duration intervalOf(double rate) {
  return std::max<Duration>(Duration(1), Duration(static_cast<int64_t>(std::llround(1e9 / rate))));
}

}  // namespace

TokenBucket::TokenBucket(double rate, int burst, MonoTime now)
    : burst_(burst), interval_(intervalOf(rate)), tolerance_(interval_ * (burst - 1)), full_at_(now) {}

bool TokenBucket::tryTake(MonoTime now) {
  const MonoTime at = std::max(full_at_, now);
  if (at - now > tolerance_) return false;
  full_at_ = at + interval_;
  return true;
}

Duration TokenBucket::untilNextToken(MonoTime now) const {
  return std::max(Duration(0), std::max(full_at_, now) - now - tolerance_);
}

void TokenBucket::setLimits(double rate, int burst, MonoTime now) {
  // Tokens held = burst - (time until full) / interval.
  const double missing = static_cast<double>(std::max(Duration(0), full_at_ - now).count()) / interval_.count();
  const double held = std::clamp(burst_ - missing, 0.0, static_cast<double>(burst));
  burst_ = burst;
  interval_ = intervalOf(rate);
  tolerance_ = interval_ * (burst - 1);
  full_at_ = now + Duration(std::llround((burst - held) * interval_.count()));
}

std::string_view apiKeyRejectionName(ApiKeyRejection reason) {
  switch (reason) {
    case ApiKeyRejection::kInvalidApiKey:
      return "invalid_api_key";
    case ApiKeyRejection::kRateLimited:
      return "rate_limited";
    case ApiKeyRejection::kConcurrencyLimited:
      return "concurrency_limited";
  }
  return "invalid_api_key";
}

// ---- Keys in force, grants, the gate ----

// One listed key: shared by the gate's set (while the file lists it) and
// the grants of its requests in flight.
struct ApiKeyState {
  explicit ApiKeyState(const ApiKeyDigest& d) : digest(d) {}

  // Takes a slot and a token if the limits allow it; else why not.
  std::optional<ApiKeyRefusal> admit(MonoTime now) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (limits.max_concurrent > 0 && num_in_flight >= limits.max_concurrent) {
      return ApiKeyRefusal{.reason = ApiKeyRejection::kConcurrencyLimited,
                           .message = strCat("API key \"", name, "\" has ", num_in_flight,
                                             " requests in flight, its limit (max_concurrent); retry when one ends"),
                           .key_name = name,
                           .retry_after = std::chrono::seconds(1)};
    }
    if (bucket && !bucket->tryTake(now)) {
      const Duration wait = bucket->untilNextToken(now);
      return ApiKeyRefusal{
          .reason = ApiKeyRejection::kRateLimited,
          .message = strCat("API key \"", name, "\" is over its rate limit of ", limits.requests_per_second,
                            " requests per second (burst ", effectiveBurst(limits), "); retry in ",
                            std::chrono::duration<double>(wait).count(), " s"),
          .key_name = name,
          .retry_after = wait};
    }
    ++num_in_flight;
    return std::nullopt;
  }

  void releaseSlot() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    --num_in_flight;
  }

  // Name and limits from the file (a key that stays across a reload keeps
  // its bucket and its requests in flight).
  void set(const ApiKeyEntry& e, MonoTime now) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    name = e.name;
    limits = e.limits;
    if (limits.requests_per_second <= 0) {
      bucket.reset();
    } else if (bucket) {
      bucket->setLimits(limits.requests_per_second, effectiveBurst(limits), now);
    } else {
      bucket.emplace(limits.requests_per_second, effectiveBurst(limits), now);
    }
  }

  std::string currentName() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    return name;
  }

  static int effectiveBurst(const ApiKeyLimits& l) {
    return l.burst > 0 ? l.burst : std::max(1, static_cast<int>(std::ceil(l.requests_per_second)));
  }

  const ApiKeyDigest digest;
  absl::Mutex mu;
  std::string name ABSL_GUARDED_BY(mu);
  ApiKeyLimits limits ABSL_GUARDED_BY(mu);
  std::optional<TokenBucket> bucket ABSL_GUARDED_BY(mu);  // none: no rate limit
  // Requests holding a slot; counted also without a limit, so a limit that
  // a reload adds applies to the requests already in flight.
  int num_in_flight ABSL_GUARDED_BY(mu) = 0;
};

ApiKeyGrant::ApiKeyGrant(std::string key_name, std::shared_ptr<ApiKeyState> slot)
    : key_name_(std::move(key_name)), slot_(std::move(slot)) {}

ApiKeyGrant::ApiKeyGrant(ApiKeyGrant&& other) noexcept
    : key_name_(std::move(other.key_name_)), slot_(std::exchange(other.slot_, nullptr)) {}

ApiKeyGrant& ApiKeyGrant::operator=(ApiKeyGrant&& other) noexcept {
  if (this != &other) {
    release();
    key_name_ = std::move(other.key_name_);
    slot_ = std::exchange(other.slot_, nullptr);
  }
  return *this;
}

ApiKeyGrant::~ApiKeyGrant() { release(); }

void ApiKeyGrant::release() {
  if (std::shared_ptr<ApiKeyState> slot = std::exchange(slot_, nullptr)) slot->releaseSlot();
}

struct ApiKeyGate::Impl {
  Impl(ApiKeyGateOptions o, metrics::Registry& registry, const metrics::Labels& labels)
      : options(std::move(o)),
        clock(options.clock ? *options.clock : SystemClock::instance()),
        rejected(metrics::buildCounter()
                     .name("tandem_api_requests_rejected_total")
                     .help("Public API requests refused by the API-key gate: invalid_api_key (no key, or one the keys "
                           "file does not list), rate_limited, concurrency_limited.")
                     .labels(labels)
                     .registerOn(registry)),
        num_keys_gauge(metrics::buildGauge()
                           .name("tandem_api_keys")
                           .help("API keys in the keys file in force.")
                           .labels(labels)
                           .registerOn(registry)
                           .add({})),
        reload_failures(metrics::buildCounter()
                            .name("tandem_api_keys_reload_failures_total")
                            .help("Changes of the API keys file that were not applied (unreadable or bad): the keys "
                                  "in force stay; the log names the line and field.")
                            .labels(labels)
                            .registerOn(registry)
                            .add({})) {
    for (ApiKeyRejection r :
         {ApiKeyRejection::kInvalidApiKey, ApiKeyRejection::kRateLimited, ApiKeyRejection::kConcurrencyLimited}) {
      rejected_by[static_cast<int>(r)] = &rejected.add({{"reason", std::string(apiKeyRejectionName(r))}});
    }
  }

  ApiKeyRefusal refuse(ApiKeyRefusal r) {
    rejected_by[static_cast<int>(r.reason)]->increment();
    log.debug("request refused", {{"reason", apiKeyRejectionName(r.reason)}, {"key", r.key_name}});
    return r;
  }

  // The file's content; an error naming the file when it cannot be read.
  absl::StatusOr<std::string> read() const {
    std::ifstream in(options.file, std::ios::binary);
    if (!in) return absl::NotFoundError(strCat(options.file, ": cannot read the API keys file"));
    std::ostringstream s;
    s << in.rdbuf();
    if (in.bad()) return absl::DataLossError(strCat(options.file, ": error reading the API keys file"));
    return s.str();
  }

  // Puts `entries` in force, keeping the state of keys that stay.
  void apply(const std::vector<ApiKeyEntry>& entries) ABSL_LOCKS_EXCLUDED(mu) {
    const MonoTime now = clock.now();
    std::vector<std::shared_ptr<ApiKeyState>> old;
    {
      absl::ReaderMutexLock lock(&mu);
      old = keys;
    }
    std::vector<std::shared_ptr<ApiKeyState>> next;
    std::string added;
    for (const ApiKeyEntry& e : entries) {
      auto it = std::find_if(old.begin(), old.end(), [&](const auto& k) { return sameDigest(k->digest, e.digest); });
      std::shared_ptr<ApiKeyState> k;
      if (it != old.end()) {
        k = std::move(*it);
        old.erase(it);
      } else {
        k = std::make_shared<ApiKeyState>(e.digest);
        added += strCat(added.empty() ? "" : ",", e.name);
      }
      k->set(e, now);
      next.push_back(std::move(k));
    }
    std::string removed;
    for (const auto& k : old) removed += strCat(removed.empty() ? "" : ",", k->currentName());
    {
      absl::MutexLock lock(&mu);
      keys = std::move(next);
    }
    num_keys_gauge.set(static_cast<double>(entries.size()));
    log.info("API keys in force", {{"file", options.file},
                                   {"keys", static_cast<int64_t>(entries.size())},
                                   {"added", added},
                                   {"removed", removed}});
  }

  // The reload loop: every reload_interval on the clock until stopped.
  void poll() ABSL_LOCKS_EXCLUDED(poll_mu) {
    absl::MutexLock lock(&poll_mu);
    MonoTime next = clock.now() + options.reload_interval;
    while (!stopping) {
      if (clock.waitUntil(poll_cv, poll_mu, next) && !stopping) {
        (void)reload();  // logs and counts its own errors
        next = clock.now() + options.reload_interval;
      }
    }
  }

  // Reads the file and applies it if its content changed. `at_start`: the
  // caller fails on an error instead (nothing is in force yet to keep).
  absl::Status reload(bool at_start = false) ABSL_LOCKS_EXCLUDED(reload_mu) {
    absl::MutexLock lock(&reload_mu);
    absl::StatusOr<std::string> content = read();
    std::optional<std::string> seen = content.ok() ? std::optional(*content) : std::nullopt;
    if (seen == last_content && have_read) return last_status;
    have_read = true;
    last_content = std::move(seen);
    absl::StatusOr<std::vector<ApiKeyEntry>> entries =
        content.ok() ? parseApiKeysFile(*content, options.file, options.defaults) : content.status();
    if (!entries.ok()) {
      last_status = entries.status();
      if (at_start) return last_status;
      reload_failures.increment();
      log.error("API keys file not applied; the keys in force stay",
                {{"file", options.file}, {"error", toStd(last_status.message())}});
      return last_status;
    }
    apply(*entries);
    last_status = absl::OkStatus();
    return last_status;
  }

  const ApiKeyGateOptions options;
  const Clock& clock;
  Logger log{"api-keys"};
  metrics::Family<metrics::Counter>& rejected;
  metrics::Counter* rejected_by[3] = {};  // by ApiKeyRejection
  metrics::Gauge& num_keys_gauge;
  metrics::Counter& reload_failures;

  mutable absl::Mutex mu;
  std::vector<std::shared_ptr<ApiKeyState>> keys ABSL_GUARDED_BY(mu);  // the set in force

  absl::Mutex reload_mu;  // one reload at a time
  bool have_read ABSL_GUARDED_BY(reload_mu) = false;
  std::optional<std::string> last_content ABSL_GUARDED_BY(reload_mu);  // nullopt: unreadable
  absl::Status last_status ABSL_GUARDED_BY(reload_mu);

  absl::Mutex poll_mu;
  absl::CondVar poll_cv;
  bool stopping ABSL_GUARDED_BY(poll_mu) = false;
  std::thread poller;
};

absl::StatusOr<std::unique_ptr<ApiKeyGate>> ApiKeyGate::open(ApiKeyGateOptions options, metrics::Registry& registry,
                                                             const metrics::Labels& labels) {
  auto impl = std::make_unique<Impl>(std::move(options), registry, labels);
  if (absl::Status s = impl->reload(/*at_start=*/true); !s.ok()) {
    return absl::InvalidArgumentError(strCat("--api-keys-file: ", toStd(s.message())));
  }
  if (impl->options.reload_interval > Duration(0)) {
    impl->poller = std::thread([impl = impl.get()] {
      nameThisThread("api-keys");
      impl->poll();
    });
  }
  return std::unique_ptr<ApiKeyGate>(new ApiKeyGate(std::move(impl)));
}

ApiKeyGate::ApiKeyGate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ApiKeyGate::~ApiKeyGate() {
  {
    absl::MutexLock lock(&impl_->poll_mu);
    impl_->stopping = true;
    impl_->poll_cv.SignalAll();
  }
  if (impl_->poller.joinable()) impl_->poller.join();
}

std::variant<ApiKeyGrant, ApiKeyRefusal> ApiKeyGate::authorize(std::optional<std::string_view> authorization) {
  if (!authorization) {
    return impl_->refuse({.message = "no API key: send it as \"Authorization: Bearer <key>\""});
  }
  std::optional<std::string_view> token = bearerToken(*authorization);
  if (!token) {
    return impl_->refuse({.message = "the Authorization header must be \"Bearer <key>\""});
  }
  const ApiKeyDigest digest = hashApiKey(*token);
  std::shared_ptr<ApiKeyState> key;
  {
    absl::ReaderMutexLock lock(&impl_->mu);
    for (const auto& k : impl_->keys) {
      if (sameDigest(k->digest, digest)) key = k;  // every entry compared: no early exit
    }
  }
  if (!key) return impl_->refuse({.message = "invalid API key (unknown or revoked)"});
  if (std::optional<ApiKeyRefusal> refused = key->admit(impl_->clock.now())) return impl_->refuse(std::move(*refused));
  return ApiKeyGrant(key->currentName(), key);
}

absl::Status ApiKeyGate::reload() { return impl_->reload(); }

int ApiKeyGate::numKeys() const {
  absl::ReaderMutexLock lock(&impl_->mu);
  return static_cast<int>(impl_->keys.size());
}

}  // namespace tandem::agent
