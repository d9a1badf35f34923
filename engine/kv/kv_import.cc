#include "engine/kv/kv_import.h"

#include "src/common/check.h"
#include "src/common/strings.h"

namespace tandem::engine {

absl::Status completeImport(Sequence& seq, TokenId first_token, int vocab_size, MonoTime now) {
  TANDEM_CHECK(seq.importing(), "completeImport of a sequence that is not importing");
  if (first_token < 0 || first_token >= vocab_size) {
    return absl::InvalidArgumentError(strCat("imported first token ", first_token, " is outside the vocabulary"));
  }
  seq.prompt_kv = PromptKv::kImported;
  seq.num_computed = seq.num_prompt_tokens;
  // The prefill side sampled the first token from the same seeded stream
  // (one draw when not greedy); skip that draw so a seeded request gives the
  // same tokens disaggregated as it does on one engine.
  if (seq.spec.sampling.temperature > 0.0f) seq.rng.next();
  if (!seq.first_scheduled) seq.first_scheduled = now;
  return absl::OkStatus();
}

void computeImportLocally(Sequence& seq) {
  TANDEM_CHECK(seq.importing(), "computeImportLocally of a sequence that is not importing");
  seq.prompt_kv = PromptKv::kDirect;
}

RequestUpdate abortRequested(const Sequence& seq, FinishReason reason, std::string message) {
  RequestUpdate u;
  u.id = seq.id;
  u.import_abort_requested = true;
  u.finish_reason = reason;
  u.message = std::move(message);
  return u;
}

bool kvImported(const Sequence& seq) {
  return (seq.prompt_kv == PromptKv::kImporting || seq.prompt_kv == PromptKv::kImported) && seq.kv_blocks_reported;
}

}  // namespace tandem::engine
