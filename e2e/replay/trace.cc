#include "e2e/replay/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <istream>
#include <limits>

#include "nlohmann/json.hpp"
#include "src/common/block_hash.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::replay {
namespace {

using nlohmann::json;

// Where a line came from, for errors: "FILE:LINE: field `name`: what".
struct LineRef {
  std::string_view source;
  int64_t line;
  absl::Status error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(strCat(source, ":", line, ": field `", field, "`: ", what));
  }
};

absl::StatusOr<int64_t> readCount(const json& obj, std::string_view field, const LineRef& at) {
  auto it = obj.find(field);
  if (it == obj.end()) return at.error(field, "missing");
  if (!it->is_number_integer()) return at.error(field, strCat("must be an integer, got ", it->dump()));
  const bool negative = !it->is_number_unsigned() && it->get<int64_t>() < 0;
  if (negative || it->get<uint64_t>() < 1 || it->get<uint64_t>() > uint64_t{std::numeric_limits<int32_t>::max()}) {
    return at.error(field, strCat("must be between 1 and 2^31-1 tokens, got ", it->dump()));
  }
  return it->get<int64_t>();
}

absl::StatusOr<double> readTimestamp(const json& obj, const LineRef& at) {
  auto it = obj.find("timestamp");
  if (it == obj.end()) return at.error("timestamp", "missing");
  if (!it->is_number()) return at.error("timestamp", strCat("must be a number of milliseconds, got ", it->dump()));
  const double ms = it->get<double>();
  if (!(ms >= 0) || !std::isfinite(ms)) return at.error("timestamp", strCat("must be >= 0, got ", it->dump()));
  return ms;
}

absl::StatusOr<std::vector<uint64_t>> readHashIds(const json& obj, int64_t input_length, const LineRef& at) {
  auto it = obj.find("hash_ids");
  if (it == obj.end()) return at.error("hash_ids", "missing");
  if (!it->is_array()) return at.error("hash_ids", strCat("must be an array of integers, got ", it->dump()));
  std::vector<uint64_t> ids;
  ids.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const json& v = (*it)[i];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
      return at.error("hash_ids", strCat("element ", i, " must be an integer >= 0, got ", v.dump()));
    }
    ids.push_back(v.get<uint64_t>());
  }
  const int64_t expected = (input_length + kTraceBlockTokens - 1) / kTraceBlockTokens;
  if (static_cast<int64_t>(ids.size()) != expected) {
    return at.error("hash_ids", strCat("has ", ids.size(), " ids, but input_length ", input_length, " needs ", expected,
                                       " (one per ", kTraceBlockTokens, "-token block)"));
  }
  return ids;
}

absl::StatusOr<std::optional<SessionId>> readSession(const json& obj, const LineRef& at) {
  auto it = obj.find("session_id");
  if (it == obj.end() || it->is_null()) return std::optional<SessionId>();
  if (it->is_string()) {
    if (it->get_ref<const std::string&>().empty()) return at.error("session_id", "must not be empty");
    return std::optional<SessionId>(SessionId(it->get<std::string>()));
  }
  if (it->is_number_integer()) return std::optional<SessionId>(SessionId(it->dump()));
  return at.error("session_id", strCat("must be a string or an integer, got ", it->dump()));
}

absl::StatusOr<TraceRequest> parseLine(std::string_view text, const LineRef& at) {
  json obj = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return absl::InvalidArgumentError(strCat(at.source, ":", at.line, ": not valid JSON"));
  if (!obj.is_object()) return absl::InvalidArgumentError(strCat(at.source, ":", at.line, ": not a JSON object"));
  TraceRequest r;
  TANDEM_ASSIGN_OR_RETURN(r.timestamp_ms, readTimestamp(obj, at));
  TANDEM_ASSIGN_OR_RETURN(r.input_length, readCount(obj, "input_length", at));
  TANDEM_ASSIGN_OR_RETURN(r.output_length, readCount(obj, "output_length", at));
  TANDEM_ASSIGN_OR_RETURN(r.hash_ids, readHashIds(obj, r.input_length, at));
  TANDEM_ASSIGN_OR_RETURN(r.session, readSession(obj, at));
  return r;
}

}  // namespace

absl::StatusOr<Trace> parseTrace(std::istream& in, std::string_view source) {
  Trace trace;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    TANDEM_ASSIGN_OR_RETURN(TraceRequest r, parseLine(text, LineRef{source, line}));
    trace.requests.push_back(std::move(r));
  }
  if (in.bad()) return absl::DataLossError(strCat(source, ": read error"));
  if (trace.requests.empty()) return absl::InvalidArgumentError(strCat(source, ": no requests"));
  std::stable_sort(trace.requests.begin(), trace.requests.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.timestamp_ms < b.timestamp_ms; });
  return trace;
}

absl::StatusOr<Trace> readTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(strCat(path, ": cannot open"));
  return parseTrace(in, path);
}

std::string formatTraceLine(const TraceRequest& r) {
  // The Mooncake files' field order (ordered_json keeps insertion order).
  nlohmann::ordered_json obj = nlohmann::ordered_json::object();
  // Integral milliseconds print without a fraction, as in the Mooncake files.
  if (r.timestamp_ms == std::floor(r.timestamp_ms)) {
    obj["timestamp"] = static_cast<int64_t>(r.timestamp_ms);
  } else {
    obj["timestamp"] = r.timestamp_ms;
  }
  obj["input_length"] = r.input_length;
  obj["output_length"] = r.output_length;
  obj["hash_ids"] = r.hash_ids;
  if (r.session) obj["session_id"] = r.session->value();
  return obj.dump();
}

std::vector<BlockHash> chainTraceHashes(const std::vector<uint64_t>& hash_ids) {
  std::vector<BlockHash> out;
  out.reserve(hash_ids.size());
  BlockHash parent = kBlockHashRoot;
  for (uint64_t id : hash_ids) {
    // The id as two 32-bit "tokens": the engine's own chain function, so a
    // hash stands for the whole id prefix as an engine block hash does.
    const TokenId halves[2] = {static_cast<TokenId>(id & 0xffffffffU), static_cast<TokenId>(id >> 32)};
    parent = chainBlockHash(parent, halves);
    out.push_back(parent);
  }
  return out;
}

}  // namespace tandem::replay
