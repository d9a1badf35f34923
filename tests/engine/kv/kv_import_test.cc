#include "engine/kv/kv_import.h"

#include <gtest/gtest.h>

namespace tandem::engine {
namespace {

const MonoTime kNow = MonoTime(std::chrono::seconds(50));

// An import request of 6 tokens, admitted: its blocks reported, a peer writing them.
Sequence importing(float temperature) {
  RequestSpec spec;
  spec.import_kv = true;
  spec.sampling.temperature = temperature;
  Sequence s(RequestId(4), std::move(spec), 4);
  s.tokens = {5, 6, 7, 8, 9, 10};
  s.num_prompt_tokens = 6;
  s.blocks = {BlockId(0), BlockId(1)};
  s.rng = SamplerRng(77);
  EXPECT_EQ(s.prompt_kv, PromptKv::kImport);
  s.prompt_kv = PromptKv::kImporting;  // what the scheduler does at admission
  s.kv_blocks_reported = true;         // and the engine right after
  return s;
}

TEST(KvImportTest, CompleteMakesAnOrdinaryDecodeThatSkipsThePrefillSidesDraw) {
  Sequence s = importing(0.7f);
  ASSERT_TRUE(s.pinned());
  ASSERT_TRUE(completeImport(s, 42, 100, kNow).ok());
  EXPECT_EQ(s.prompt_kv, PromptKv::kImported);
  EXPECT_FALSE(s.importing());
  EXPECT_FALSE(s.pinned());
  EXPECT_EQ(s.num_computed, 6);
  EXPECT_EQ(s.first_scheduled, kNow);
  SamplerRng ref(77);
  ref.next();  // the prefill side's draw of the first token
  EXPECT_EQ(s.rng.next(), ref.next());
  EXPECT_TRUE(kvImported(s));
}

TEST(KvImportTest, GreedyDrawsNothingToSkip) {
  Sequence s = importing(0.0f);
  ASSERT_TRUE(completeImport(s, 42, 100, kNow).ok());
  SamplerRng ref(77);
  EXPECT_EQ(s.rng.next(), ref.next());
}

TEST(KvImportTest, AFirstTokenOutsideTheVocabularyChangesNothing) {
  Sequence s = importing(0.0f);
  absl::Status st = completeImport(s, 100, 100, kNow);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.prompt_kv, PromptKv::kImporting);
  EXPECT_EQ(s.num_computed, 0);
  EXPECT_FALSE(s.first_scheduled.has_value());
  EXPECT_EQ(completeImport(s, -1, 100, kNow).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvImportTest, AbortRequestedAsksTheImporterToStop) {
  Sequence s = importing(0.0f);
  RequestUpdate u = abortRequested(s, FinishReason::kTimeout, "deadline");
  EXPECT_EQ(u.id, RequestId(4));
  EXPECT_TRUE(u.import_abort_requested);
  EXPECT_FALSE(u.finished) << "only the importer ends it";
  EXPECT_EQ(u.finish_reason, FinishReason::kTimeout);
  EXPECT_EQ(u.message, "deadline");
}

TEST(KvImportTest, KvImportedOnlyWhenThePeersKvWasToLandInReportedBlocks) {
  Sequence s = importing(0.0f);
  EXPECT_TRUE(kvImported(s)) << "aborted while importing: the blocks were the peer's";
  s.kv_blocks_reported = false;
  EXPECT_FALSE(kvImported(s));
  s.prompt_kv = PromptKv::kDirect;
  EXPECT_FALSE(kvImported(s));
  Sequence plain(RequestId(1), RequestSpec{}, 4);
  EXPECT_EQ(plain.prompt_kv, PromptKv::kCompute);
  EXPECT_FALSE(kvImported(plain));
}

}  // namespace
}  // namespace tandem::engine
