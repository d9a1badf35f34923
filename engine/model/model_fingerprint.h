#pragma once
// The model's fingerprint: 64 bits that differ between checkpoints, so KV of
// one model is never matched or pulled by another (it roots the block-hash
// chain, src/common/block_hash.h, and P and D compare it in their Hello).
//
// It is XXH3-64 over the files that decide what a prompt's KV is, in name
// order: config.json, the weights (every *.safetensors file and
// model.safetensors.index.json), the tokenizer (tokenizer.model,
// tokenizer.json, tokenizer_config.json, special_tokens_map.json) and the
// chat template (chat_template.jinja, chat_template.json; or inside
// tokenizer_config.json). Each file contributes le64(name length), its
// name, le64(size) and its bytes; files that do not exist are skipped. A
// directory moved or copied elsewhere keeps its fingerprint.
//
// Cost: every weight byte is read once at load (XXH3 runs at memory speed;
// the read is what costs, about 1-3 s per 10 GB from the page cache or a fast
// NVMe disk). Operators who pin the fingerprint from a model revision skip
// it (--model-fingerprint).

#include <cstdint>
#include <string>
#include <string_view>

#include "src/common/status.h"

namespace tandem::engine {

// Errors name the file that could not be read.
[[nodiscard]] absl::StatusOr<uint64_t> modelFingerprint(const std::string& model_dir);

// Parses an operator's fingerprint: 1 to 16 hex digits, optionally after
// "0x". InvalidArgument naming `what` (the flag) and the value otherwise.
[[nodiscard]] absl::StatusOr<uint64_t> parseModelFingerprint(std::string_view what, std::string_view v);

// The fingerprint of `checkpoint` (a file's or a pinned one) computed with
// bf16 projections (--dtype bfloat16, GemmDtype): their KV differs from
// fp32's, so agents of different dtypes never share KV or pair for P/D.
// XXH3-64 of le64(checkpoint) and "dtype=bfloat16;embedding=bfloat16" (the
// embedding table is bf16 too); float32 keeps the checkpoint's own
// fingerprint.
uint64_t bf16Fingerprint(uint64_t checkpoint);

// The fingerprint as 16 lower-case hex digits (how logs, messages and flags spell it).
std::string fingerprintHex(uint64_t fingerprint);

}  // namespace tandem::engine
