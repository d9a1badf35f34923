// The public API's key gate (agent/api_keys.h) and its HTTP answers
// (authorizePublic, agent/openai_http.h): hashing, the keys file and its
// errors, reload and revocation, the token bucket and the concurrency
// slots, all on a FakeClock; no sleeps, no sockets.

#include "agent/api_keys.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "agent/openai_http.h"
#include "src/common/log.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

namespace tandem::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Keys and their SHA-256 (sha256sum of the key's bytes).
constexpr std::string_view kKeyA = "sk-team-a-0123456789abcdef";
constexpr std::string_view kKeyB = "sk-team-b-0123456789abcdef";
std::string hexOf(std::string_view key) { return digestHex(hashApiKey(key)); }

std::string entry(std::string_view name, std::string_view key, std::string_view extra = "") {
  return std::string("- name: ") + std::string(name) + "\n  sha256: " + hexOf(key) + "\n" + std::string(extra);
}

std::string bearer(std::string_view key) { return "Bearer " + std::string(key); }

class ApiKeysFile {
 public:
  explicit ApiKeysFile(const std::string& name) : path_(::testing::TempDir() + "/" + name) {}
  ~ApiKeysFile() { std::filesystem::remove(path_); }
  // Replaces the file as Kubernetes does: a new file renamed over the old.
  void write(const std::string& text) const {
    std::ofstream(path_ + ".tmp") << text;
    std::filesystem::rename(path_ + ".tmp", path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Log lines at warn and above, for checking what a bad reload says.
class LogCapture {
 public:
  LogCapture() {
    EXPECT_TRUE(configureLogging({.spec = "warn",
                                  .sink =
                                      [this](std::string_view line) {
                                        std::lock_guard l(mu_);
                                        text_ += std::string(line) + "\n";
                                      }})
                    .ok());
  }
  ~LogCapture() { EXPECT_TRUE(configureLogging({.spec = "warn"}).ok()); }
  std::string text() {
    std::lock_guard l(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::string text_;
};

double counterValue(metrics::Registry& r, const std::string& series) {
  const std::string text = metrics::serializeText(r);
  const size_t at = text.find(series);
  if (at == std::string::npos) return -1;
  const size_t space = text.find(' ', at + series.size());
  return std::stod(text.substr(space + 1));
}

struct Fixture {
  explicit Fixture(const std::string& text, ApiKeyLimits defaults = {}) : file("keys-" + std::to_string(counter++)) {
    file.write(text);
    auto g =
        ApiKeyGate::open({.file = file.path(), .defaults = defaults, .reload_interval = Duration(0), .clock = &clock},
                         registry, {{"pool", "p"}, {"role", "both"}});
    EXPECT_TRUE(g.ok()) << g.status();
    if (g.ok()) gate = std::move(*g);
  }

  std::variant<ApiKeyGrant, ApiKeyRefusal> authorize(std::string_view key) { return gate->authorize(bearer(key)); }

  static inline int counter = 0;
  FakeClock clock;
  metrics::Registry registry;
  ApiKeysFile file;
  std::unique_ptr<ApiKeyGate> gate;
};

const ApiKeyRefusal* refusal(const std::variant<ApiKeyGrant, ApiKeyRefusal>& d) {
  return std::get_if<ApiKeyRefusal>(&d);
}

TEST(ApiKeyHashTest, Sha256OfTheKeysBytes) {
  // FIPS 180-2's test vector, and sha256sum of a key.
  EXPECT_EQ(digestHex(hashApiKey("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hexOf(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  auto parsed = parseDigestHex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(sameDigest(*parsed, hashApiKey("abc")));
}

TEST(ApiKeyHashTest, DigestsCompareEqualOnlyWhenEveryByteIs) {
  const ApiKeyDigest a = hashApiKey(kKeyA);
  EXPECT_TRUE(sameDigest(a, hashApiKey(kKeyA)));
  EXPECT_FALSE(sameDigest(a, hashApiKey(kKeyB)));
  for (size_t i : {size_t{0}, size_t{15}, size_t{31}}) {
    ApiKeyDigest b = a;
    b.bytes[i] ^= 1;
    EXPECT_FALSE(sameDigest(a, b)) << "byte " << i;
  }
}

TEST(ApiKeyHashTest, ABadHashSaysWhatIsWrongWithoutQuotingIt) {
  const std::string pasted_key(kKeyA);  // a key pasted where its hash belongs
  auto r = parseDigestHex(pasted_key);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("64 hex digits"), std::string::npos) << r.status();
  EXPECT_EQ(std::string(r.status().message()).find(pasted_key), std::string::npos) << "the key must not reach the logs";
  EXPECT_FALSE(parseDigestHex(std::string(63, 'a') + "g").ok());
}

TEST(ApiKeyHashTest, KeysAndNamesThatCanBeUsed) {
  EXPECT_TRUE(checkApiKey(kKeyA).ok());
  EXPECT_FALSE(checkApiKey("short").ok());
  EXPECT_FALSE(checkApiKey("sk-with a-space-0123456789").ok());
  EXPECT_FALSE(checkApiKey("sk-with-a-newline\n0123456789").ok());
  EXPECT_TRUE(checkApiKeyName("team-a").ok());
  EXPECT_TRUE(checkApiKeyName("@ops/ci:main_1.2").ok());
  EXPECT_FALSE(checkApiKeyName("").ok());
  EXPECT_FALSE(checkApiKeyName("team a").ok());
  EXPECT_FALSE(checkApiKeyName("team\"a").ok());
}

TEST(ApiKeyHashTest, TheFileEntryParsesBackToTheKey) {
  const std::string text = "keys:\n" + apiKeyFileEntry("@team-a", hashApiKey(kKeyA));
  EXPECT_EQ(apiKeyFileEntry("team-a", hashApiKey("abc")),
            "- name: \"team-a\"\n  sha256: ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n");
  auto entries = parseApiKeysFile(text, "keys.yaml", {});
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].name, "@team-a");
  EXPECT_TRUE(sameDigest((*entries)[0].digest, hashApiKey(kKeyA)));
}

TEST(ApiKeyHashTest, BearerTokens) {
  EXPECT_EQ(bearerToken("Bearer abc"), "abc");
  EXPECT_EQ(bearerToken("bearer   abc  "), "abc");
  EXPECT_EQ(bearerToken("BEARER\tabc"), "abc");
  EXPECT_EQ(bearerToken("Basic dXNlcjpwYXNz"), std::nullopt);
  EXPECT_EQ(bearerToken("Bearer"), std::nullopt);
  EXPECT_EQ(bearerToken("Bearer   "), std::nullopt);
  EXPECT_EQ(bearerToken("Bearerabc"), std::nullopt);
  EXPECT_EQ(bearerToken(""), std::nullopt);
}

TEST(ApiKeysFileTest, LimitsFromTheEntryElseTheDefaults) {
  const std::string text = "keys:\n" +
                           entry("a", kKeyA, "  requests_per_second: 2.5\n  burst: 4\n  max_concurrent: 3\n") +
                           entry("b", kKeyB);
  auto entries = parseApiKeysFile(text, "keys.yaml", {.requests_per_second = 10, .burst = 20, .max_concurrent = 7});
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].limits.requests_per_second, 2.5);
  EXPECT_EQ((*entries)[0].limits.burst, 4);
  EXPECT_EQ((*entries)[0].limits.max_concurrent, 3);
  EXPECT_EQ((*entries)[1].limits.requests_per_second, 10);
  EXPECT_EQ((*entries)[1].limits.burst, 20);
  EXPECT_EQ((*entries)[1].limits.max_concurrent, 7);
  auto none = parseApiKeysFile("keys: []\n", "keys.yaml", {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST(ApiKeysFileTest, EveryProblemIsNamedByLineAndField) {
  struct Case {
    std::string text;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"", "keys.yaml: keys: required key is missing"},
      {"keys: {}\n", "keys.yaml:1:7: keys: expected a sequence of mappings"},
      {"keys:\n- name: a\n", "keys[0].sha256: required key is missing"},
      {"keys:\n- sha256: " + hexOf(kKeyA) + "\n", "keys[0].name: required key is missing"},
      {"keys:\n- name: a\n  sha256: abc\n",
       "keys.yaml:3:11: keys[0].sha256: expected the key's SHA-256 as 64 hex digits"},
      {"keys:\n- name: a b\n  sha256: " + hexOf(kKeyA) + "\n",
       "keys.yaml:2:9: keys[0].name: \"a b\" holds a character"},
      {"keys:\n" + entry("a", kKeyA) + entry("a", kKeyB),
       "keys.yaml:4:9: keys[1].name: \"a\" is also the name of keys[0]"},
      {"keys:\n" + entry("a", kKeyA) + entry("b", kKeyA), "keys.yaml:5:11: keys[1].sha256: the same key as keys[0]"},
      {"keys:\n" + entry("a", kKeyA, "  burts: 3\n"), "keys.yaml:4:3: keys[0].burts: unknown key"},
      {"keys:\n" + entry("a", kKeyA, "  requests_per_second: -1\n"), "keys[0].requests_per_second"},
      {"keys:\n" + entry("a", kKeyA, "  max_concurrent: many\n"), "keys.yaml:4:19: keys[0].max_concurrent: expected"},
      {"keys:\n- name: a\n  sha256: [\n", "keys.yaml:"},  // not YAML
  };
  for (const Case& c : cases) {
    auto r = parseApiKeysFile(c.text, "keys.yaml", {});
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.error), std::string::npos)
        << "file:\n"
        << c.text << "\nwanted: " << c.error << "\ngot: " << r.status().message();
  }
  // A plaintext key pasted into the file (as `key:` or as the hash) is never quoted back.
  for (const std::string& text : {"keys:\n- name: a\n  key: " + std::string(kKeyA) + "\n",
                                  "keys:\n- name: a\n  sha256: " + std::string(kKeyA) + "\n"}) {
    auto r = parseApiKeysFile(text, "keys.yaml", {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(std::string(r.status().message()).find(kKeyA), std::string::npos) << r.status();
  }
}

TEST(ApiKeyGateTest, ListedKeysPassOthersAreRefusedAsInvalid) {
  Fixture f("keys:\n" + entry("team-a", kKeyA) + entry("team-b", kKeyB));
  ASSERT_TRUE(f.gate);
  EXPECT_EQ(f.gate->numKeys(), 2);
  auto a = f.authorize(kKeyA);
  ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(a));
  EXPECT_EQ(std::get<ApiKeyGrant>(a).keyName(), "team-a");
  auto b = f.gate->authorize("bearer " + std::string(kKeyB));
  ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(b));
  EXPECT_EQ(std::get<ApiKeyGrant>(b).keyName(), "team-b");

  for (const std::optional<std::string_view>& header :
       {std::optional<std::string_view>(), std::optional<std::string_view>("Bearer sk-nobody-0123456789abcdef"),
        std::optional<std::string_view>("Basic dGVhbS1hOnNlY3JldA=="), std::optional<std::string_view>("Bearer ")}) {
    auto d = f.gate->authorize(header);
    ASSERT_NE(refusal(d), nullptr) << header.value_or("(none)");
    EXPECT_EQ(refusal(d)->reason, ApiKeyRejection::kInvalidApiKey);
    EXPECT_TRUE(refusal(d)->key_name.empty());
  }
  EXPECT_EQ(counterValue(f.registry,
                         "tandem_api_requests_rejected_total{pool=\"p\",reason=\"invalid_api_key\",role=\"both\"}"),
            4);
  EXPECT_EQ(
      counterValue(f.registry, "tandem_api_requests_rejected_total{pool=\"p\",reason=\"rate_limited\",role=\"both\"}"),
      0);
  EXPECT_EQ(counterValue(f.registry, "tandem_api_keys{pool=\"p\",role=\"both\"}"), 2);
}

TEST(ApiKeyGateTest, ABadFileAtOpenIsAnErrorNamingTheFileLineAndField) {
  ApiKeysFile file("bad-at-open");
  file.write("keys:\n- name: a\n  sha256: 1234\n");
  metrics::Registry registry;
  FakeClock clock;
  auto g = ApiKeyGate::open({.file = file.path(), .reload_interval = Duration(0), .clock = &clock}, registry, {});
  ASSERT_FALSE(g.ok());
  const std::string msg(g.status().message());
  EXPECT_NE(msg.find("--api-keys-file: " + file.path() + ":3:11: keys[0].sha256: expected"), std::string::npos) << msg;
  auto missing = ApiKeyGate::open({.file = file.path() + ".missing", .reload_interval = Duration(0), .clock = &clock},
                                  registry, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(".missing: cannot read"), std::string::npos) << missing.status();
}

TEST(ApiKeyGateTest, AKeyRemovedFromTheFileIsRevokedAtTheNextReload) {
  Fixture f("keys:\n" + entry("team-a", kKeyA) + entry("team-b", kKeyB));
  ASSERT_TRUE(f.gate);
  auto held = f.authorize(kKeyA);  // in flight across the revocation
  ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(held));
  f.file.write("keys:\n" + entry("team-b", kKeyB));
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyA))) << "nothing changes before the reload";
  ASSERT_TRUE(f.gate->reload().ok());
  EXPECT_EQ(f.gate->numKeys(), 1);
  auto d = f.authorize(kKeyA);
  ASSERT_NE(refusal(d), nullptr);
  EXPECT_EQ(refusal(d)->reason, ApiKeyRejection::kInvalidApiKey);
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyB)));
  std::get<ApiKeyGrant>(held).release();  // a revoked key's request still ends cleanly
  // And back: a key added again is accepted again.
  f.file.write("keys:\n" + entry("team-b", kKeyB) + entry("team-a-again", kKeyA));
  ASSERT_TRUE(f.gate->reload().ok());
  auto again = f.authorize(kKeyA);
  ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(again));
  EXPECT_EQ(std::get<ApiKeyGrant>(again).keyName(), "team-a-again");
}

TEST(ApiKeyGateTest, ABadFileOnReloadKeepsTheKeysInForceAndIsLoggedOnce) {
  Fixture f("keys:\n" + entry("team-a", kKeyA));
  ASSERT_TRUE(f.gate);
  LogCapture logs;
  f.file.write("keys:\n" + entry("team-a", kKeyA) + "- name: team-b\n  sha256: not-a-hash\n");
  absl::Status s = f.gate->reload();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(f.file.path() + ":5:11: keys[1].sha256: expected"), std::string::npos) << s;
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyA))) << "the last good set stays";
  EXPECT_EQ(f.gate->numKeys(), 1);
  EXPECT_FALSE(f.gate->reload().ok()) << "the same bad content is still bad";
  const std::string log = logs.text();
  EXPECT_NE(log.find("keys[1].sha256"), std::string::npos) << log;
  EXPECT_EQ(log.find("keys[1].sha256"), log.rfind("keys[1].sha256")) << "logged once per content:\n" << log;
  EXPECT_EQ(counterValue(f.registry, "tandem_api_keys_reload_failures_total{pool=\"p\",role=\"both\"}"), 1);
  // A file that disappears keeps the set too; a good one is applied again.
  std::filesystem::remove(f.file.path());
  EXPECT_FALSE(f.gate->reload().ok());
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyA)));
  f.file.write("keys:\n" + entry("team-b", kKeyB));
  ASSERT_TRUE(f.gate->reload().ok());
  EXPECT_NE(refusal(f.authorize(kKeyA)), nullptr);
}

TEST(ApiKeyGateTest, ThePollerAppliesAChangedFileOnTheClock) {
  ApiKeysFile file("polled");
  file.write("keys:\n" + entry("team-a", kKeyA));
  FakeClock clock;
  metrics::Registry registry;
  auto g = ApiKeyGate::open({.file = file.path(), .reload_interval = seconds(5), .clock = &clock}, registry, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ApiKeyGate& gate = **g;
  file.write("keys:\n" + entry("team-a", kKeyA) + entry("team-b", kKeyB));
  // Advance in steps until the poller, parked on its deadline, has run.
  ASSERT_TRUE(testutil::waitFor([&] {
    if (gate.numKeys() == 2) return true;
    clock.advance(seconds(5));
    return false;
  }));
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(gate.authorize(bearer(kKeyB))));
}

TEST(TokenBucketTest, BurstThenOneTokenPerInterval) {
  FakeClock clock;
  TokenBucket bucket(/*rate=*/2, /*burst=*/3, clock.now());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bucket.tryTake(clock.now())) << i;
  EXPECT_FALSE(bucket.tryTake(clock.now()));
  EXPECT_EQ(bucket.untilNextToken(clock.now()), milliseconds(500));
  clock.advance(milliseconds(499));
  EXPECT_FALSE(bucket.tryTake(clock.now()));
  EXPECT_EQ(bucket.untilNextToken(clock.now()), milliseconds(1));
  clock.advance(milliseconds(1));
  EXPECT_EQ(bucket.untilNextToken(clock.now()), Duration(0));
  EXPECT_TRUE(bucket.tryTake(clock.now())) << "waiting untilNextToken() always finds the token";
  EXPECT_FALSE(bucket.tryTake(clock.now()));
  // Idle long enough, it is full again, never fuller.
  clock.advance(seconds(60));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bucket.tryTake(clock.now())) << i;
  EXPECT_FALSE(bucket.tryTake(clock.now()));
}

TEST(TokenBucketTest, FractionalRatesAndNewLimitsKeepTheTokensHeld) {
  FakeClock clock;
  TokenBucket bucket(/*rate=*/0.5, /*burst=*/1, clock.now());
  EXPECT_TRUE(bucket.tryTake(clock.now()));
  EXPECT_EQ(bucket.untilNextToken(clock.now()), seconds(2));
  // Raised to 10 per second with a burst of 5: it held no token, so it
  // gains them from now at the new rate.
  bucket.setLimits(10, 5, clock.now());
  EXPECT_FALSE(bucket.tryTake(clock.now()));
  EXPECT_EQ(bucket.untilNextToken(clock.now()), milliseconds(100));
  clock.advance(seconds(1));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(bucket.tryTake(clock.now())) << i;
  EXPECT_FALSE(bucket.tryTake(clock.now()));
  // Full (5), then cut to a burst of 2: it holds 2.
  clock.advance(seconds(1));
  bucket.setLimits(10, 2, clock.now());
  EXPECT_TRUE(bucket.tryTake(clock.now()));
  EXPECT_TRUE(bucket.tryTake(clock.now()));
  EXPECT_FALSE(bucket.tryTake(clock.now()));
}

TEST(ApiKeyGateTest, RateLimitedKeysAreToldWhenTheirNextTokenComes) {
  Fixture f("keys:\n" + entry("slow", kKeyA, "  requests_per_second: 1\n  burst: 2\n") + entry("free", kKeyB));
  ASSERT_TRUE(f.gate);
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyA)));
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyA)));
  f.clock.advance(milliseconds(300));
  auto d = f.authorize(kKeyA);
  ASSERT_NE(refusal(d), nullptr);
  EXPECT_EQ(refusal(d)->reason, ApiKeyRejection::kRateLimited);
  EXPECT_EQ(refusal(d)->key_name, "slow");
  EXPECT_EQ(refusal(d)->retry_after, milliseconds(700));
  EXPECT_NE(refusal(d)->message.find("1 requests per second (burst 2)"), std::string::npos) << refusal(d)->message;
  // Its 429: Retry-After rounded up to whole seconds.
  const ApiError e = apiKeyError(*refusal(d));
  EXPECT_EQ(e.status, 429);
  EXPECT_EQ(e.type, "rate_limit_error");
  EXPECT_EQ(e.code, "rate_limit_exceeded");
  ASSERT_EQ(e.headers.size(), 1u);
  EXPECT_EQ(e.headers[0], (std::pair<std::string, std::string>("Retry-After", "1")));
  // Other keys have their own buckets; unlimited ones none.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyB))) << i;
  f.clock.advance(milliseconds(700));
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyA)));
  EXPECT_EQ(
      counterValue(f.registry, "tandem_api_requests_rejected_total{pool=\"p\",reason=\"rate_limited\",role=\"both\"}"),
      1);
}

TEST(ApiKeyGateTest, TheFlagsLimitsApplyToKeysThatSetNone) {
  Fixture f("keys:\n" + entry("default", kKeyA) + entry("own", kKeyB, "  requests_per_second: 0\n"),
            {.requests_per_second = 0.5, .burst = 0, .max_concurrent = 0});
  ASSERT_TRUE(f.gate);
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyA)));  // burst 0: max(1, 0.5) = 1
  auto d = f.authorize(kKeyA);
  ASSERT_NE(refusal(d), nullptr);
  EXPECT_EQ(refusal(d)->retry_after, seconds(2));
  EXPECT_EQ(apiKeyError(*refusal(d)).headers[0].second, "2");
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyB))) << "0: unlimited";
}

TEST(ApiKeyGateTest, ConcurrencySlotsAreReleasedExactlyOnce) {
  Fixture f("keys:\n" + entry("two", kKeyA, "  max_concurrent: 2\n"));
  ASSERT_TRUE(f.gate);
  auto first = f.authorize(kKeyA);
  auto second = f.authorize(kKeyA);
  ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(first) && std::holds_alternative<ApiKeyGrant>(second));
  auto third = f.authorize(kKeyA);
  ASSERT_NE(refusal(third), nullptr);
  EXPECT_EQ(refusal(third)->reason, ApiKeyRejection::kConcurrencyLimited);
  EXPECT_EQ(refusal(third)->retry_after, seconds(1));
  const ApiError e = apiKeyError(*refusal(third));
  EXPECT_EQ(e.status, 429);
  EXPECT_EQ(e.code, "concurrency_limit_exceeded");
  EXPECT_EQ(e.headers[0].second, "1");

  // Released twice (explicitly, then by the destructor): one slot comes back.
  ApiKeyGrant g1 = std::get<ApiKeyGrant>(std::move(first));
  g1.release();
  g1.release();
  ApiKeyGrant next = std::get<ApiKeyGrant>(f.authorize(kKeyA));
  EXPECT_NE(refusal(f.authorize(kKeyA)), nullptr) << "two in flight again";
  // Moved grants hold the one slot between them.
  ApiKeyGrant moved = std::move(next);
  { ApiKeyGrant moved_again = std::move(moved); }
  auto refill = f.authorize(kKeyA);
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(refill)) << "freed once by the last owner";
  EXPECT_NE(refusal(f.authorize(kKeyA)), nullptr);
  // A grant that outlives the gate still releases into its key.
  f.gate.reset();
}

TEST(ApiKeyGateTest, AConcurrencyRefusalSpendsNoToken) {
  Fixture f("keys:\n" + entry("k", kKeyA, "  max_concurrent: 1\n  requests_per_second: 1\n  burst: 2\n"));
  ASSERT_TRUE(f.gate);
  auto held = f.authorize(kKeyA);
  ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(held));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(refusal(f.authorize(kKeyA))->reason, ApiKeyRejection::kConcurrencyLimited);
  std::get<ApiKeyGrant>(held).release();
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyA))) << "the second token of the burst is there";
}

TEST(ApiKeyGateTest, AReloadKeepsAKeysBucketAndItsRequestsInFlight) {
  Fixture f("keys:\n" + entry("k", kKeyA, "  requests_per_second: 1\n  burst: 1\n"));
  ASSERT_TRUE(f.gate);
  auto held = f.authorize(kKeyA);
  ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(held));
  // Renamed, and a concurrency limit added: the request in flight counts.
  f.file.write("keys:\n" + entry("k-renamed", kKeyA, "  requests_per_second: 1\n  burst: 1\n  max_concurrent: 1\n"));
  ASSERT_TRUE(f.gate->reload().ok());
  f.clock.advance(seconds(1));
  auto d = f.authorize(kKeyA);
  ASSERT_NE(refusal(d), nullptr);
  EXPECT_EQ(refusal(d)->reason, ApiKeyRejection::kConcurrencyLimited);
  EXPECT_EQ(refusal(d)->key_name, "k-renamed");
  std::get<ApiKeyGrant>(held).release();
  EXPECT_TRUE(std::holds_alternative<ApiKeyGrant>(f.authorize(kKeyA)));
  auto empty = f.authorize(kKeyA);
  ASSERT_NE(refusal(empty), nullptr);
  EXPECT_EQ(refusal(empty)->reason, ApiKeyRejection::kRateLimited) << "the bucket was not refilled by the reload";
}

http::Request requestWith(std::optional<std::string> authorization) {
  http::Headers h;
  if (authorization) h["Authorization"] = *authorization;
  return http::Request("POST", "/v1/completions", {}, h, "{}", std::make_shared<http::CallContext>(MonoTime::max()));
}

TEST(AuthorizePublicTest, WithoutKeysEveryRequestPasses) {
  auto d = authorizePublic({}, requestWith(std::nullopt));
  ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(d));
  EXPECT_EQ(std::get<ApiKeyGrant>(d).keyName(), "");
}

TEST(AuthorizePublicTest, RefusalsInOpenAisShape) {
  Fixture f("keys:\n" + entry("team-a", kKeyA, "  requests_per_second: 1\n  burst: 1\n"));
  ASSERT_TRUE(f.gate);
  const PublicApiAuth auth{.api_keys = f.gate.get()};
  for (const std::optional<std::string>& header :
       {std::optional<std::string>(), std::optional<std::string>(bearer(kKeyB))}) {
    auto d = authorizePublic(auth, requestWith(header));
    ASSERT_TRUE(std::holds_alternative<http::Response>(d));
    const http::Response& r = std::get<http::Response>(d);
    EXPECT_EQ(r.status(), 401);
    const nlohmann::json body = nlohmann::json::parse(r.body());
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(body["error"]["code"], "invalid_api_key");
    EXPECT_TRUE(body["error"]["param"].is_null());
    EXPECT_TRUE(body["error"]["message"].is_string());
    EXPECT_EQ(r.body().find(kKeyB), std::string::npos) << "the key is never echoed";
    EXPECT_EQ(r.headers().at("WWW-Authenticate"), "Bearer");
  }
  auto ok = authorizePublic(auth, requestWith(bearer(kKeyA)));
  ASSERT_TRUE(std::holds_alternative<ApiKeyGrant>(ok));
  EXPECT_EQ(std::get<ApiKeyGrant>(ok).keyName(), "team-a");
  auto limited = authorizePublic(auth, requestWith(bearer(kKeyA)));
  ASSERT_TRUE(std::holds_alternative<http::Response>(limited));
  const http::Response& r = std::get<http::Response>(limited);
  EXPECT_EQ(r.status(), 429);
  EXPECT_EQ(nlohmann::json::parse(r.body())["error"]["code"], "rate_limit_exceeded");
  EXPECT_EQ(r.headers().at("Retry-After"), "1");
}

}  // namespace
}  // namespace tandem::agent
