#include "src/common/block_hash.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace tandem {
namespace {

// Golden values computed outside Tandem with `xxhsum -H1` over the byte
// layout the header defines (le64 parent || le32 tokens). If these change,
// every router and engine in a mixed-version cluster disagrees: don't.
TEST(BlockHashTest, MatchesGoldenValuesFromXxhsum) {
  std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6, 7, -1};
  auto hashes = computeBlockHashes(tokens, 4);
  ASSERT_EQ(hashes.size(), 2u);
  EXPECT_EQ(hashes[0].value(), 0x432e7a137a6c5442ULL);
  EXPECT_EQ(hashes[1].value(), 0xf7909719dd0cc136ULL);
}

TEST(BlockHashTest, OnlyFullBlocksAreHashed) {
  std::vector<TokenId> tokens(10);
  std::iota(tokens.begin(), tokens.end(), 0);
  EXPECT_EQ(computeBlockHashes(tokens, 4).size(), 2u);
  EXPECT_EQ(computeBlockHashes(tokens, 16).size(), 0u);
  EXPECT_EQ(computeBlockHashes(tokens, 1).size(), 10u);
}

TEST(BlockHashTest, SharedPrefixSharesHashesAndDivergesAfter) {
  std::vector<TokenId> a(64), b(64);
  std::iota(a.begin(), a.end(), 100);
  b = a;
  b[40] = 7;  // differs in block 2 (block size 16)
  auto ha = computeBlockHashes(a, 16);
  auto hb = computeBlockHashes(b, 16);
  ASSERT_EQ(ha.size(), 4u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_EQ(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);
  // The chain carries the difference forward even where tokens agree again.
  EXPECT_NE(ha[3], hb[3]);
}

TEST(BlockHashTest, SameBlockContentAtDifferentPositionsHashesDifferently) {
  std::vector<TokenId> tokens = {9, 9, 9, 9, 9, 9, 9, 9};
  auto h = computeBlockHashes(tokens, 4);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_NE(h[0], h[1]);
}

TEST(BlockHashTest, IncrementalChainEqualsBatchForAnySplit) {
  std::vector<TokenId> tokens(103);
  std::iota(tokens.begin(), tokens.end(), -50);
  auto expected = computeBlockHashes(tokens, 8);
  for (size_t step : {1u, 3u, 8u, 13u, 103u}) {
    BlockHashChain chain(8);
    for (size_t i = 0; i < tokens.size(); i += step) {
      size_t n = std::min(step, tokens.size() - i);
      chain.append(std::span<const TokenId>(tokens).subspan(i, n));
    }
    EXPECT_EQ(chain.hashes(), expected) << "step " << step;
    EXPECT_EQ(chain.numPendingTokens(), 103u % 8u);
  }
}

TEST(BlockHashTest, ParentSeedsTheChain) {
  std::vector<TokenId> tokens = {1, 2, 3, 4};
  auto from_root = computeBlockHashes(tokens, 4);
  auto from_other = computeBlockHashes(tokens, 4, BlockHash(12345));
  EXPECT_NE(from_root[0], from_other[0]);
  EXPECT_EQ(from_other[0], chainBlockHash(BlockHash(12345), tokens));
}

TEST(BlockHashTest, RootIsKeyedByModelFingerprintAndSalt) {
  const BlockHash root = blockHashRoot(0x1234, "");
  EXPECT_EQ(root, blockHashRoot(0x1234, "")) << "deterministic";
  EXPECT_NE(root, blockHashRoot(0x1235, "")) << "another model";
  EXPECT_NE(root, blockHashRoot(0x1234, "tenant-a")) << "a salt";
  EXPECT_NE(blockHashRoot(0x1234, "tenant-a"), blockHashRoot(0x1234, "tenant-b"));
  EXPECT_NE(root, kBlockHashRoot);
  EXPECT_NE(root.value(), 0u);
}

TEST(BlockHashTest, ChainRootChangesEveryHash) {
  std::vector<TokenId> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 7 + 1);
  const BlockHash a = blockHashRoot(42, "");
  const BlockHash b = blockHashRoot(42, "salt");
  auto ha = computeBlockHashes(tokens, 16, a);
  auto hb = computeBlockHashes(tokens, 16, b);
  ASSERT_EQ(ha.size(), 4u);
  for (size_t i = 0; i < ha.size(); ++i) EXPECT_NE(ha[i], hb[i]) << "block " << i;
  // The incremental chain starts from the same root.
  BlockHashChain chain(16, a);
  chain.append(tokens);
  EXPECT_EQ(chain.hashes(), ha);
  BlockHashChain unkeyed(16);
  unkeyed.append(tokens);
  EXPECT_EQ(unkeyed.hashes(), computeBlockHashes(tokens, 16));
  EXPECT_NE(unkeyed.hashes(), ha);
}

}  // namespace
}  // namespace tandem
