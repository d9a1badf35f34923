#pragma once
// tandem-sim's inputs: the Mooncake format (e2e/replay/trace.h; also what
// `tandem-replay generate` writes for agentic sessions) and the Azure LLM
// inference trace CSV, and --load-scale.
//
// Azure CSV (AzurePublicDataset, AzureLLMInferenceTrace_*.csv):
//
//   TIMESTAMP,ContextTokens,GeneratedTokens
//   2023-11-16 18:17:03.9799600,4808,10
//
// The header line is required; timestamps are UTC wall-clock times with up
// to 7 fractional digits, relative to the first row. The file says nothing
// about shared prefixes, so every request's blocks are its own (no cache hits).

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "e2e/replay/trace.h"

namespace tandem::sim {

// Errors name the file, the line (1-based) and the column.
[[nodiscard]] absl::StatusOr<replay::Trace> readAzureTrace(const std::string& path);
[[nodiscard]] absl::StatusOr<replay::Trace> parseAzureTrace(std::istream& in, std::string_view source);

// Each request `k` times: copy i arrives i × stagger_ms after the original,
// with block ids and session ids of its own (copies share nothing but their
// shape and arrival pattern). k = 1 returns the trace as it is.
replay::Trace scaleLoad(const replay::Trace& trace, int k, double stagger_ms = 3);

}  // namespace tandem::sim
