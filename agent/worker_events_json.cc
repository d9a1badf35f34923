#include "agent/worker_events_json.h"

#include <charconv>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using routing::WorkerDelta;
using routing::WorkerLoad;
using routing::WorkerRole;
using routing::WorkerSnapshot;

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

json hashArray(const std::vector<BlockHash>& hashes) {
  json a = json::array();
  for (BlockHash h : hashes) a.push_back(hex16(h.value()));
  return a;
}

json loadJson(const WorkerLoad& l) {
  return {{"free_blocks", l.free_blocks},
          {"total_blocks", l.total_blocks},
          {"running", l.running},
          {"waiting", l.waiting},
          {"waiting_prompt_tokens", l.waiting_prompt_tokens},
          {"draining", l.draining}};
}

json header(std::string_view type, uint64_t epoch, uint64_t seq) {
  return {{"type", type}, {"epoch", hex16(epoch)}, {"seq", seq}};
}

// Encodes one delta's body into `j` (which holds the header already).
struct BodyEncoder {
  json& j;
  void operator()(const routing::BlocksStored& b) {
    j["type"] = "blocks_stored";
    j["hashes"] = hashArray(b.hashes);
  }
  void operator()(const routing::BlocksRemoved& b) {
    j["type"] = "blocks_removed";
    j["hashes"] = hashArray(b.hashes);
  }
  void operator()(const routing::SessionStored& s) {
    j["type"] = "session_stored";
    j["session"] = s.state.session.value();
    j["num_tokens"] = s.state.num_tokens;
    j["hashes"] = hashArray(s.state.hashes);
  }
  void operator()(const routing::SessionRemoved& s) {
    j["type"] = "session_removed";
    j["session"] = s.session.value();
  }
  void operator()(const WorkerLoad& l) {
    j["type"] = "load";
    j["load"] = loadJson(l);
  }
};

// ---- Decoding: every reader names the field it failed on. ----

absl::Status fieldError(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(strCat("worker event field '", field, "': ", what));
}

std::string typeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_float:
      return "a fractional number";
    default:
      return "a number";
  }
}

absl::StatusOr<const json*> member(const json& obj, std::string_view prefix, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return fieldError(strCat(prefix, key), "missing");
  return &*it;
}

absl::StatusOr<int64_t> readInt(const json& obj, std::string_view prefix, const char* key) {
  TANDEM_ASSIGN_OR_RETURN(const json* v, member(obj, prefix, key));
  if (!v->is_number_integer())
    return fieldError(strCat(prefix, key), strCat("expected an integer, got ", typeName(*v)));
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return fieldError(strCat(prefix, key), "too large");
  }
  const int64_t n = v->get<int64_t>();
  if (n < 0) return fieldError(strCat(prefix, key), strCat("must not be negative, got ", n));
  return n;
}

absl::StatusOr<bool> readBool(const json& obj, std::string_view prefix, const char* key) {
  TANDEM_ASSIGN_OR_RETURN(const json* v, member(obj, prefix, key));
  if (!v->is_boolean()) return fieldError(strCat(prefix, key), strCat("expected a boolean, got ", typeName(*v)));
  return v->get<bool>();
}

absl::StatusOr<std::string> readString(const json& obj, std::string_view prefix, const char* key) {
  TANDEM_ASSIGN_OR_RETURN(const json* v, member(obj, prefix, key));
  if (!v->is_string()) return fieldError(strCat(prefix, key), strCat("expected a string, got ", typeName(*v)));
  return v->get<std::string>();
}

absl::StatusOr<uint64_t> parseHex16(const json& v, std::string_view field) {
  if (!v.is_string()) return fieldError(field, strCat("expected 16 hex digits in a string, got ", typeName(v)));
  const std::string& s = v.get_ref<const std::string&>();
  uint64_t out = 0;
  auto res = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  if (s.size() != 16 || res.ec != std::errc() || res.ptr != s.data() + s.size()) {
    return fieldError(field, strCat("expected 16 hex digits, got \"", s, "\""));
  }
  return out;
}

absl::StatusOr<uint64_t> readHex(const json& obj, std::string_view prefix, const char* key) {
  TANDEM_ASSIGN_OR_RETURN(const json* v, member(obj, prefix, key));
  return parseHex16(*v, strCat(prefix, key));
}

absl::StatusOr<std::vector<BlockHash>> readHashes(const json& obj, std::string_view prefix, const char* key) {
  TANDEM_ASSIGN_OR_RETURN(const json* v, member(obj, prefix, key));
  if (!v->is_array()) return fieldError(strCat(prefix, key), strCat("expected an array, got ", typeName(*v)));
  std::vector<BlockHash> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(uint64_t h, parseHex16((*v)[i], strCat(prefix, key, "[", i, "]")));
    out.emplace_back(h);
  }
  return out;
}

absl::StatusOr<WorkerLoad> readLoad(const json& obj, std::string_view prefix) {
  TANDEM_ASSIGN_OR_RETURN(const json* v, member(obj, prefix, "load"));
  const std::string p = strCat(prefix, "load.");
  if (!v->is_object()) return fieldError(strCat(prefix, "load"), strCat("expected an object, got ", typeName(*v)));
  WorkerLoad l;
  TANDEM_ASSIGN_OR_RETURN(l.free_blocks, readInt(*v, p, "free_blocks"));
  TANDEM_ASSIGN_OR_RETURN(l.total_blocks, readInt(*v, p, "total_blocks"));
  TANDEM_ASSIGN_OR_RETURN(l.running, readInt(*v, p, "running"));
  TANDEM_ASSIGN_OR_RETURN(l.waiting, readInt(*v, p, "waiting"));
  TANDEM_ASSIGN_OR_RETURN(l.waiting_prompt_tokens, readInt(*v, p, "waiting_prompt_tokens"));
  TANDEM_ASSIGN_OR_RETURN(l.draining, readBool(*v, p, "draining"));
  return l;
}

absl::StatusOr<WorkerRole> readRole(const json& obj) {
  TANDEM_ASSIGN_OR_RETURN(std::string name, readString(obj, "", "role"));
  for (WorkerRole r : {WorkerRole::kPrefill, WorkerRole::kDecode, WorkerRole::kBoth}) {
    if (workerRoleName(r) == name) return r;
  }
  return fieldError("role", strCat("expected prefill, decode or both, got \"", name, "\""));
}

absl::StatusOr<routing::ResidentSessionBlocks> readSession(const json& obj, std::string_view prefix) {
  routing::ResidentSessionBlocks s;
  TANDEM_ASSIGN_OR_RETURN(std::string id, readString(obj, prefix, "session"));
  s.session = SessionId(std::move(id));
  TANDEM_ASSIGN_OR_RETURN(s.num_tokens, readInt(obj, prefix, "num_tokens"));
  TANDEM_ASSIGN_OR_RETURN(s.hashes, readHashes(obj, prefix, "hashes"));
  return s;
}

absl::StatusOr<WorkerSnapshot> readSnapshot(const json& j, uint64_t epoch, uint64_t seq) {
  WorkerSnapshot s{.epoch = epoch, .seq = seq};
  TANDEM_ASSIGN_OR_RETURN(s.worker, readString(j, "", "worker"));
  if (j.contains("kv_address")) {  // optional: older workers do not send it
    TANDEM_ASSIGN_OR_RETURN(s.kv_address, readString(j, "", "kv_address"));
  }
  TANDEM_ASSIGN_OR_RETURN(s.role, readRole(j));
  TANDEM_ASSIGN_OR_RETURN(int64_t block_size, readInt(j, "", "block_size"));
  if (block_size < 1 || block_size > (1 << 20)) return fieldError("block_size", strCat("out of range: ", block_size));
  s.block_size = static_cast<int>(block_size);
  TANDEM_ASSIGN_OR_RETURN(uint64_t root, readHex(j, "", "hash_root"));
  s.hash_root = BlockHash(root);
  TANDEM_ASSIGN_OR_RETURN(s.max_context_tokens, readInt(j, "", "max_context_tokens"));
  TANDEM_ASSIGN_OR_RETURN(s.load, readLoad(j, ""));
  TANDEM_ASSIGN_OR_RETURN(s.cached, readHashes(j, "", "cached"));
  TANDEM_ASSIGN_OR_RETURN(const json* sessions, member(j, "", "sessions"));
  if (!sessions->is_array()) return fieldError("sessions", strCat("expected an array, got ", typeName(*sessions)));
  for (size_t i = 0; i < sessions->size(); ++i) {
    const json& e = (*sessions)[i];
    if (!e.is_object()) return fieldError(strCat("sessions[", i, "]"), strCat("expected an object, got ", typeName(e)));
    TANDEM_ASSIGN_OR_RETURN(routing::ResidentSessionBlocks r, readSession(e, strCat("sessions[", i, "].")));
    s.sessions.push_back(std::move(r));
  }
  return s;
}

absl::StatusOr<routing::WorkerDeltaBody> readDeltaBody(const json& j, std::string_view type) {
  if (type == "blocks_stored" || type == "blocks_removed") {
    TANDEM_ASSIGN_OR_RETURN(std::vector<BlockHash> hashes, readHashes(j, "", "hashes"));
    if (type == "blocks_stored") return routing::BlocksStored{std::move(hashes)};
    return routing::BlocksRemoved{std::move(hashes)};
  }
  if (type == "session_stored") {
    TANDEM_ASSIGN_OR_RETURN(routing::ResidentSessionBlocks s, readSession(j, ""));
    return routing::SessionStored{std::move(s)};
  }
  if (type == "session_removed") {
    TANDEM_ASSIGN_OR_RETURN(std::string id, readString(j, "", "session"));
    return routing::SessionRemoved{SessionId(std::move(id))};
  }
  if (type == "load") {
    TANDEM_ASSIGN_OR_RETURN(WorkerLoad l, readLoad(j, ""));
    return l;
  }
  return fieldError("type", strCat("unknown message type \"", type, "\""));
}

}  // namespace

std::string_view workerRoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill:
      return "prefill";
    case WorkerRole::kDecode:
      return "decode";
    case WorkerRole::kBoth:
      return "both";
  }
  return "both";
}

std::string encodeWorkerSnapshot(const WorkerSnapshot& s) {
  json j = header("snapshot", s.epoch, s.seq);
  j["worker"] = s.worker;
  j["kv_address"] = s.kv_address;
  j["role"] = workerRoleName(s.role);
  j["block_size"] = s.block_size;
  j["hash_root"] = hex16(s.hash_root.value());
  j["max_context_tokens"] = s.max_context_tokens;
  j["load"] = loadJson(s.load);
  j["cached"] = hashArray(s.cached);
  json sessions = json::array();
  for (const auto& r : s.sessions) {
    sessions.push_back({{"session", r.session.value()}, {"num_tokens", r.num_tokens}, {"hashes", hashArray(r.hashes)}});
  }
  j["sessions"] = std::move(sessions);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string encodeWorkerDelta(const WorkerDelta& d) {
  json j = header("", d.epoch, d.seq);
  std::visit(BodyEncoder{j}, d.body);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string encodeWorkerHeartbeat(const WorkerHeartbeat& h) { return header("heartbeat", h.epoch, h.seq).dump(); }

absl::StatusOr<WorkerEvent> decodeWorkerEvent(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("worker event: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError(strCat("worker event: expected an object, got ", typeName(j)));
  TANDEM_ASSIGN_OR_RETURN(std::string type, readString(j, "", "type"));
  TANDEM_ASSIGN_OR_RETURN(uint64_t epoch, readHex(j, "", "epoch"));
  TANDEM_ASSIGN_OR_RETURN(int64_t seq, readInt(j, "", "seq"));
  if (type == "snapshot") {
    TANDEM_ASSIGN_OR_RETURN(WorkerSnapshot s, readSnapshot(j, epoch, static_cast<uint64_t>(seq)));
    return s;
  }
  if (type == "heartbeat") return WorkerHeartbeat{.epoch = epoch, .seq = static_cast<uint64_t>(seq)};
  TANDEM_ASSIGN_OR_RETURN(routing::WorkerDeltaBody body, readDeltaBody(j, type));
  return WorkerDelta{.epoch = epoch, .seq = static_cast<uint64_t>(seq), .body = std::move(body)};
}

}  // namespace tandem::agent
