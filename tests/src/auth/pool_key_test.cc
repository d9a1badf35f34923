#include "src/auth/pool_key.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "src/common/clock.h"
#include "src/common/strings.h"

namespace tandem::auth {
namespace {

const std::string kKeyA(64, 'a');
const std::string kKeyB(64, 'b');

class KeyDir {
 public:
  KeyDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("pool_key_test." + std::to_string(::getpid()) + "." + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~KeyDir() { std::filesystem::remove_all(path_); }
  void write(const std::string& file, const std::string& content) { std::ofstream(path_ / file) << content; }
  void remove(const std::string& file) { std::filesystem::remove(path_ / file); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(PoolKeyTest, HmacMatchesTheRfc4231Vector) {
  // RFC 4231 test case 2.
  EXPECT_EQ(hexEncode(hmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(PoolKeyTest, ConstantTimeEqualComparesLengthAndBytes) {
  EXPECT_TRUE(constantTimeEqual("abc", "abc"));
  EXPECT_TRUE(constantTimeEqual("", ""));
  EXPECT_FALSE(constantTimeEqual("abc", "abd"));
  EXPECT_FALSE(constantTimeEqual("abc", "abcd"));
}

TEST(PoolKeyTest, GeneratedKeysAreLongEnoughAndDiffer) {
  auto a = generatePoolKey();
  auto b = generatePoolKey();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(PoolKeys::of({*a}, {"a"}).ok());
}

TEST(PoolKeyTest, ShortKeysAreRefusedByName) {
  auto k = PoolKeys::of({"short"}, {"/keys/key"});
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("the pool key in /keys/key is 5 bytes; it must be 32 to 4096"),
            std::string::npos)
      << k.status();
}

TEST(PoolKeyTest, InternalTokenIsAcceptedByEveryHolderOfItsKeyOnly) {
  auto a = *PoolKeys::of({kKeyA}, {"a"});
  auto ab = *PoolKeys::of({kKeyB, kKeyA}, {"b", "a"});
  auto b = *PoolKeys::of({kKeyB}, {"b"});
  EXPECT_TRUE(a->acceptsInternalToken(a->internalToken()));
  EXPECT_TRUE(ab->acceptsInternalToken(a->internalToken()));  // the previous key is still accepted
  EXPECT_TRUE(a->acceptsInternalToken(ab->internalToken()) == false);  // ab proves with B
  EXPECT_FALSE(b->acceptsInternalToken(a->internalToken()));
  EXPECT_FALSE(a->acceptsInternalToken(""));
  EXPECT_FALSE(a->acceptsInternalToken(a->internalToken() + "0"));
  EXPECT_EQ(a->internalToken().rfind("tandem-pool.k-", 0), 0u);
  EXPECT_EQ(a->internalToken().find(kKeyA), std::string::npos);  // never the key itself
  // Insecure: no token, and any is accepted (nothing to check against).
  EXPECT_EQ(PoolKeys::insecure()->internalToken(), "");
  EXPECT_TRUE(PoolKeys::insecure()->acceptsInternalToken("anything"));
  EXPECT_EQ(poolKeyIdName(PoolKeys::insecure()->primary().id), "insecure");
}

TEST(PoolKeyTest, DirectoryWithoutKeyIsRefused) {
  KeyDir d;
  auto k = readPoolKeyDir(d.path());
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("has no file `key`"), std::string::npos) << k.status();
  d.write("key", "too-short\n");
  k = readPoolKeyDir(d.path());
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("/key is 9 bytes"), std::string::npos) << k.status();
}

TEST(PoolKeyTest, DirectoryOrderIsKeyThenPreviousThenNext) {
  KeyDir d;
  d.write("key", kKeyA + "\n");
  d.write("next-key", kKeyB);
  auto k = readPoolKeyDir(d.path());
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_EQ((*k)->all().size(), 2u);
  EXPECT_EQ((*k)->primary().secret, kKeyA);  // trailing newline trimmed
  EXPECT_EQ((*k)->all()[1].secret, kKeyB);
  EXPECT_TRUE((*k)->secure());
}

TEST(PoolKeyTest, SourceReloadsChangesAndKeepsTheLastGoodKeys) {
  KeyDir d;
  d.write("key", kKeyA);
  FakeClock clock;
  auto src = PoolKeySource::open(d.path(), clock, std::chrono::seconds(5));
  ASSERT_TRUE(src.ok()) << src.status();
  const uint64_t a = poolKeyId(kKeyA);
  const uint64_t b = poolKeyId(kKeyB);
  EXPECT_EQ((*src)->keys()->primary().id, a);
  d.write("key", kKeyB);
  d.write("previous-key", kKeyA);
  EXPECT_EQ((*src)->keys()->primary().id, a);  // not before the interval
  clock.advance(std::chrono::seconds(5));
  EXPECT_EQ((*src)->keys()->primary().id, b);
  EXPECT_NE((*src)->keys()->find(a), nullptr);
  d.write("key", "bad");  // a broken edit: the last good keys stay
  clock.advance(std::chrono::seconds(5));
  EXPECT_EQ((*src)->keys()->primary().id, b);
  d.write("key", kKeyB);
  d.remove("previous-key");
  clock.advance(std::chrono::seconds(5));
  EXPECT_EQ((*src)->keys()->find(a), nullptr);
}

// A mounted Secret: files are links into ..data, which the kubelet points
// at a fresh directory on each edit. Reads follow ..data once per reload.
TEST(PoolKeyTest, MountedSecretLayoutIsReadThroughItsDataLink) {
  KeyDir d;
  namespace fs = std::filesystem;
  const fs::path root = d.path();
  fs::create_directories(root / "..v1");
  std::ofstream(root / "..v1" / "key") << kKeyA;
  fs::create_directory_symlink("..v1", root / "..data");
  fs::create_symlink("..data/key", root / "key");
  fs::create_symlink("..data/previous-key", root / "previous-key");
  auto k = readPoolKeyDir(d.path());
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ((*k)->primary().secret, kKeyA);
  EXPECT_EQ((*k)->all().size(), 1u);  // previous-key's link is dangling: absent
  // The edit: a new directory, then ..data swapped to it.
  fs::create_directories(root / "..v2");
  std::ofstream(root / "..v2" / "key") << kKeyB;
  std::ofstream(root / "..v2" / "previous-key") << kKeyA;
  fs::create_directory_symlink("..v2", root / "..data_tmp");
  fs::rename(root / "..data_tmp", root / "..data");
  k = readPoolKeyDir(d.path());
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ((*k)->primary().secret, kKeyB);
  EXPECT_EQ((*k)->all().size(), 2u);
}

TEST(PoolKeyTest, OpeningABadDirectoryFails) {
  FakeClock clock;
  EXPECT_FALSE(PoolKeySource::open("/nonexistent/pool-key", clock).ok());
  EXPECT_FALSE(PoolKeySource::insecure()->secure());
}

}  // namespace
}  // namespace tandem::auth
