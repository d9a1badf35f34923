// The protobuf codec of protobuf.h: each message is a table of fields
// (number, JSON key, type, how Go's JSON shows it) read by one decoder and
// one encoder. Field numbers as in protobuf.h's generated.proto files.

#include "e2e/apiserver/protobuf.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "e2e/apiserver/json_util.h"
#include "src/common/strings.h"

namespace tandem::apiserver::protobuf {

using nlohmann::json;

namespace {

constexpr std::string_view kMagic{"k8s\0", 4};

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// What a field holds, on the wire and in JSON.
enum class Type {
  kString,     // length-delimited UTF-8 <-> string
  kBytes,      // length-delimited <-> base64 string
  kOpaque,     // length-delimited -> {"bytes": as they are, "offset": where they start} (the envelope's raw)
  kInt64,      // varint, two's complement
  kInt32,      // varint, negative values sign-extended to 10 bytes
  kBool,       // varint 0 / 1
  kMessage,    // length-delimited nested message <-> object
  kStringMap,  // one length-delimited {1: key, 2: value} per entry <-> object of strings
  kBytesMap,   // the same with bytes values <-> object of base64 strings
  kTime,       // length-delimited Time <-> RFC 3339 string
  kFieldsV1,   // length-delimited FieldsV1 {1: Raw} <-> the JSON value Raw holds
};

// When a field decoded from protobuf shows in JSON (Go's JSON rules).
enum class Presence {
  kOmitEmpty,  // only when not zero (`omitempty`)
  kPointer,    // whenever on the wire, zero included (a Go pointer)
  kAlways,     // always: its zero value when not on the wire (no `omitempty`)
};

struct Message;

struct Field {
  uint32_t number;
  const char* name;  // the JSON key
  Type type;
  bool repeated = false;
  Presence presence = Presence::kOmitEmpty;
  const Message* message = nullptr;  // kMessage only
};

struct Message {
  const char* name;
  std::vector<Field> fields;

  const Field* find(uint32_t number) const {
    for (const Field& f : fields) {
      if (f.number == number) return &f;
    }
    return nullptr;
  }
};

constexpr Type kString = Type::kString, kBytes = Type::kBytes, kOpaque = Type::kOpaque, kInt64 = Type::kInt64,
               kInt32 = Type::kInt32, kBool = Type::kBool, kMessage = Type::kMessage, kStringMap = Type::kStringMap,
               kBytesMap = Type::kBytesMap, kTime = Type::kTime, kFieldsV1 = Type::kFieldsV1;
constexpr Presence kOmitEmpty = Presence::kOmitEmpty, kPointer = Presence::kPointer, kAlways = Presence::kAlways;

// runtime
const Message kTypeMeta{"TypeMeta", {{1, "apiVersion", kString}, {2, "kind", kString}}};
const Message kUnknown{"Unknown",
                       {{1, "typeMeta", kMessage, false, kAlways, &kTypeMeta},
                        {2, "raw", kOpaque},
                        {3, "contentEncoding", kString},
                        {4, "contentType", kString}}};

// meta/v1. Time and FieldsV1, and map entries, are read as messages too.
const Message kTimeMessage{"Time", {{1, "seconds", kInt64, false, kPointer}, {2, "nanos", kInt32, false, kPointer}}};
const Message kFieldsV1Message{"FieldsV1", {{1, "Raw", kString, false, kPointer}}};
const Message kStringEntry{"map entry", {{1, "key", kString, false, kAlways}, {2, "value", kString, false, kAlways}}};
const Message kBytesEntry{"map entry", {{1, "key", kString, false, kAlways}, {2, "value", kBytes, false, kAlways}}};

const Message kOwnerReference{"OwnerReference",
                              {{1, "kind", kString, false, kAlways},
                               {3, "name", kString, false, kAlways},
                               {4, "uid", kString, false, kAlways},
                               {5, "apiVersion", kString, false, kAlways},
                               {6, "controller", kBool, false, kPointer},
                               {7, "blockOwnerDeletion", kBool, false, kPointer}}};
const Message kManagedFieldsEntry{"ManagedFieldsEntry",
                                  {{1, "manager", kString},
                                   {2, "operation", kString},
                                   {3, "apiVersion", kString},
                                   {4, "time", kTime, false, kPointer},
                                   {6, "fieldsType", kString},
                                   {7, "fieldsV1", kFieldsV1, false, kPointer},
                                   {8, "subresource", kString}}};
const Message kObjectMeta{"ObjectMeta",
                          {{1, "name", kString},
                           {2, "generateName", kString},
                           {3, "namespace", kString},
                           {4, "selfLink", kString},
                           {5, "uid", kString},
                           {6, "resourceVersion", kString},
                           {7, "generation", kInt64},
                           {8, "creationTimestamp", kTime},
                           {9, "deletionTimestamp", kTime, false, kPointer},
                           {10, "deletionGracePeriodSeconds", kInt64, false, kPointer},
                           {11, "labels", kStringMap},
                           {12, "annotations", kStringMap},
                           {13, "ownerReferences", kMessage, true, kOmitEmpty, &kOwnerReference},
                           {14, "finalizers", kString, true},
                           {17, "managedFields", kMessage, true, kOmitEmpty, &kManagedFieldsEntry}}};
const Message kListMeta{"ListMeta",
                        {{1, "selfLink", kString},
                         {2, "resourceVersion", kString},
                         {3, "continue", kString},
                         {4, "remainingItemCount", kInt64, false, kPointer}}};
const Message kStatusCause{"StatusCause", {{1, "reason", kString}, {2, "message", kString}, {3, "field", kString}}};
const Message kStatusDetails{"StatusDetails",
                             {{1, "name", kString},
                              {2, "group", kString},
                              {3, "kind", kString},
                              {4, "causes", kMessage, true, kOmitEmpty, &kStatusCause},
                              {5, "retryAfterSeconds", kInt32},
                              {6, "uid", kString}}};
const Message kStatus{"Status",
                      {{1, "metadata", kMessage, false, kAlways, &kListMeta},
                       {2, "status", kString},
                       {3, "message", kString},
                       {4, "reason", kString},
                       {5, "details", kMessage, false, kPointer, &kStatusDetails},
                       {6, "code", kInt32}}};
const Message kPreconditions{"Preconditions",
                             {{1, "uid", kString, false, kPointer}, {2, "resourceVersion", kString, false, kPointer}}};
// Field 6 (ignoreStoreReadErrorWithClusterBreakingPotential, newer servers)
// is skipped as unknown: the emulator has no store that can fail to read.
const Message kDeleteOptions{"DeleteOptions",
                             {{1, "gracePeriodSeconds", kInt64, false, kPointer},
                              {2, "preconditions", kMessage, false, kPointer, &kPreconditions},
                              {3, "orphanDependents", kBool, false, kPointer},
                              {4, "propagationPolicy", kString, false, kPointer},
                              {5, "dryRun", kString, true}}};

// core/v1
const Message kSecret{"Secret",
                      {{1, "metadata", kMessage, false, kAlways, &kObjectMeta},
                       {2, "data", kBytesMap},
                       {3, "type", kString},
                       {4, "stringData", kStringMap},
                       {5, "immutable", kBool, false, kPointer}}};
const Message kSecretList{
    "SecretList",
    {{1, "metadata", kMessage, false, kAlways, &kListMeta}, {2, "items", kMessage, true, kAlways, &kSecret}}};
const Message kConfigMap{"ConfigMap",
                         {{1, "metadata", kMessage, false, kAlways, &kObjectMeta},
                          {2, "data", kStringMap},
                          {3, "binaryData", kBytesMap},
                          {4, "immutable", kBool, false, kPointer}}};
const Message kConfigMapList{
    "ConfigMapList",
    {{1, "metadata", kMessage, false, kAlways, &kListMeta}, {2, "items", kMessage, true, kAlways, &kConfigMap}}};

// authentication.k8s.io/v1 and authorization.k8s.io/v1: what `kubectl create
// token`, `kubectl auth can-i` and `kubectl auth whoami` send (authn.h, rbac.h).
const Message kBoundObjectReference{
    "BoundObjectReference",
    {{1, "kind", kString}, {2, "apiVersion", kString}, {3, "name", kString}, {4, "uid", kString}}};
const Message kTokenRequestSpec{"TokenRequestSpec",
                                {{1, "audiences", kString, true, kAlways},
                                 {3, "boundObjectRef", kMessage, false, kPointer, &kBoundObjectReference},
                                 {4, "expirationSeconds", kInt64, false, kPointer}}};
const Message kTokenRequestStatus{
    "TokenRequestStatus", {{1, "token", kString, false, kAlways}, {2, "expirationTimestamp", kTime, false, kAlways}}};
const Message kTokenRequest{"TokenRequest",
                            {{1, "metadata", kMessage, false, kAlways, &kObjectMeta},
                             {2, "spec", kMessage, false, kAlways, &kTokenRequestSpec},
                             {3, "status", kMessage, false, kAlways, &kTokenRequestStatus}}};
const Message kResourceAttributes{"ResourceAttributes",
                                  {{1, "namespace", kString},
                                   {2, "verb", kString},
                                   {3, "group", kString},
                                   {4, "version", kString},
                                   {5, "resource", kString},
                                   {6, "subresource", kString},
                                   {7, "name", kString}}};
const Message kNonResourceAttributes{"NonResourceAttributes", {{1, "path", kString}, {2, "verb", kString}}};
const Message kSelfSubjectAccessReviewSpec{
    "SelfSubjectAccessReviewSpec",
    {{1, "resourceAttributes", kMessage, false, kPointer, &kResourceAttributes},
     {2, "nonResourceAttributes", kMessage, false, kPointer, &kNonResourceAttributes}}};
const Message kSubjectAccessReviewStatus{"SubjectAccessReviewStatus",
                                         {{1, "allowed", kBool, false, kAlways},
                                          {2, "reason", kString},
                                          {3, "evaluationError", kString},
                                          {4, "denied", kBool}}};
const Message kSelfSubjectAccessReview{"SelfSubjectAccessReview",
                                       {{1, "metadata", kMessage, false, kAlways, &kObjectMeta},
                                        {2, "spec", kMessage, false, kAlways, &kSelfSubjectAccessReviewSpec},
                                        {3, "status", kMessage, false, kOmitEmpty, &kSubjectAccessReviewStatus}}};
// UserInfo.extra (map<string, ExtraValue>) is left out: not a string map.
const Message kUserInfo{"UserInfo", {{1, "username", kString}, {2, "uid", kString}, {3, "groups", kString, true}}};
const Message kSelfSubjectReviewStatus{"SelfSubjectReviewStatus",
                                       {{1, "userInfo", kMessage, false, kOmitEmpty, &kUserInfo}}};
const Message kSelfSubjectReview{"SelfSubjectReview",
                                 {{1, "metadata", kMessage, false, kAlways, &kObjectMeta},
                                  {2, "status", kMessage, false, kOmitEmpty, &kSelfSubjectReviewStatus}}};

struct Codec {
  std::string_view apiVersion;
  std::string_view kind;
  const Message* message;
};

const Codec kCodecs[] = {
    {"v1", "Secret", &kSecret},
    {"v1", "SecretList", &kSecretList},
    {"v1", "ConfigMap", &kConfigMap},
    {"v1", "ConfigMapList", &kConfigMapList},
    {"v1", "Status", &kStatus},
    // client-go sends DeleteOptions in the group version of the resource it
    // deletes (v1 for core; every group version registers the options types).
    {"*", "DeleteOptions", &kDeleteOptions},
    {"authentication.k8s.io/v1", "TokenRequest", &kTokenRequest},
    {"authentication.k8s.io/v1", "SelfSubjectReview", &kSelfSubjectReview},
    {"authorization.k8s.io/v1", "SelfSubjectAccessReview", &kSelfSubjectAccessReview},
};

const Codec* findCodec(std::string_view apiVersion, std::string_view kind) {
  for (const Codec& c : kCodecs) {
    if ((c.apiVersion == "*" || c.apiVersion == apiVersion) && c.kind == kind) return &c;
  }
  return nullptr;
}

// Thrown inside this file only; decode() and encode() turn it into a Status.
class CodecError : public std::exception {
 public:
  explicit CodecError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

[[noreturn]] void fail(std::string message) { throw CodecError(std::move(message)); }

std::string_view wireTypeName(uint32_t wire) {
  switch (wire) {
    case kVarint:
      return "varint";
    case kFixed64:
      return "64-bit";
    case kLengthDelimited:
      return "length-delimited";
    case kFixed32:
      return "32-bit";
    default:
      return "group";
  }
}

uint32_t wireTypeOf(Type type) {
  return type == kInt64 || type == kInt32 || type == kBool ? kVarint : kLengthDelimited;
}

// ---------------------------------------------------------------- decoding

// The bytes of one message; offsets are counted from the start of the body.
class Reader {
 public:
  Reader(std::string_view bytes, size_t base) : bytes_(bytes), base_(base) {}

  bool done() const { return pos_ >= bytes_.size(); }
  size_t offset() const { return base_ + pos_; }

  uint64_t varint(std::string_view what) {
    size_t start = offset();
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) fail(strCat("truncated varint (", what, ") at byte ", start));
      auto b = static_cast<uint8_t>(bytes_[pos_++]);
      value |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return value;
    }
    fail(strCat("varint (", what, ") at byte ", start, " is longer than 10 bytes"));
  }

  // A length-delimited value; `start` is where its bytes begin in the body.
  std::string_view lengthDelimited(std::string_view what, size_t& start) {
    size_t at = offset();
    uint64_t n = varint(strCat("length of ", what));
    size_t left = bytes_.size() - pos_;
    if (n > left) {
      fail(strCat("length ", n, " of ", what, " at byte ", at, " runs past the end of its message (", left,
                  " bytes left)"));
    }
    start = offset();
    std::string_view value = bytes_.substr(pos_, n);
    pos_ += n;
    return value;
  }

  // Steps over the value of a field this decoder does not know.
  void skip(uint32_t wire, std::string_view what) {
    size_t start = 0;
    switch (wire) {
      case kVarint:
        varint(what);
        return;
      case kLengthDelimited:
        lengthDelimited(what, start);
        return;
      case kFixed64:
      case kFixed32: {
        size_t n = wire == kFixed64 ? 8 : 4;
        if (bytes_.size() - pos_ < n) fail(strCat("truncated ", wireTypeName(wire), " value (", what, ")"));
        pos_ += n;
        return;
      }
      default:
        fail(strCat(what, " at byte ", offset(), " has wire type ", wire, " (", wireTypeName(wire),
                    "), which is not supported"));
    }
  }

 private:
  std::string_view bytes_;
  size_t base_;
  size_t pos_ = 0;
};

bool isZero(const json& v) {
  return (v.is_string() && v.get_ref<const std::string&>().empty()) || (v.is_number() && v == 0) ||
         (v.is_boolean() && !v.get<bool>());
}

json zeroOf(const Field& f) {
  if (f.repeated) return json::array();
  switch (f.type) {
    case kInt64:
    case kInt32:
      return 0;
    case kBool:
      return false;
    case kMessage:
    case kStringMap:
    case kBytesMap:
      return json::object();
    default:
      return "";
  }
}

json decodeMessage(const Message& m, std::string_view bytes, size_t base, const std::string& path);

// A Time's RFC 3339 form; null for the zero time (no bytes: Go writes it so).
// gmtime_r on the seconds as they are: any int64 a client sends is a time.
json decodeTime(std::string_view bytes, size_t base, const std::string& path) {
  if (bytes.empty()) return nullptr;
  json t = decodeMessage(kTimeMessage, bytes, base, path);
  std::time_t seconds = t.value("seconds", int64_t{0});
  std::tm tm{};
  if (gmtime_r(&seconds, &tm) == nullptr) fail(strCat(path, ": ", seconds, " seconds is not a time"));
  char text[64];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

json decodeFieldsV1(std::string_view bytes, size_t base, const std::string& path) {
  json f = decodeMessage(kFieldsV1Message, bytes, base, path);
  const std::string raw = f.value("Raw", "");
  if (raw.empty()) return json::object();
  try {
    return json::parse(raw);
  } catch (const json::parse_error& e) {
    fail(strCat(path, ": Raw is not JSON: ", e.what()));
  }
}

// Puts a decoded value at its key (appended, for a repeated field).
void store(const Field& f, json& out, json value) {
  if (f.repeated) {
    out[f.name].push_back(std::move(value));
  } else if (value.is_null() || (f.presence == kOmitEmpty && isZero(value))) {
    out.erase(f.name);
  } else {
    out[f.name] = std::move(value);
  }
}

void decodeField(const Field& f, Reader& r, json& out, const std::string& path) {
  if (wireTypeOf(f.type) == kVarint) {
    uint64_t v = r.varint(path);
    if (f.type == kBool) return store(f, out, v != 0);
    if (f.type == kInt32) return store(f, out, static_cast<int32_t>(static_cast<uint32_t>(v)));
    return store(f, out, static_cast<int64_t>(v));
  }
  size_t start = 0;
  std::string_view bytes = r.lengthDelimited(path, start);
  switch (f.type) {
    case kString:
      if (!isValidUtf8(bytes)) fail(strCat(path, " at byte ", start, " is not valid UTF-8"));
      return store(f, out, std::string(bytes));
    case kBytes:
      return store(f, out, base64Encode(bytes));
    case kOpaque:
      return store(f, out, {{"bytes", std::string(bytes)}, {"offset", start}});
    case kMessage:
      return store(f, out, decodeMessage(*f.message, bytes, start, path));
    case kStringMap:
    case kBytesMap: {
      json entry = decodeMessage(f.type == kStringMap ? kStringEntry : kBytesEntry, bytes, start, path);
      out[f.name][entry["key"].get<std::string>()] = std::move(entry["value"]);
      return;
    }
    case kTime:
      return store(f, out, decodeTime(bytes, start, path));
    case kFieldsV1:
      return store(f, out, decodeFieldsV1(bytes, start, path));
    default:
      fail(strCat(path, ": no decoder for this field"));  // unreachable: varints handled above
  }
}

// `path` names the message in errors ("Secret.metadata").
json decodeMessage(const Message& m, std::string_view bytes, size_t base, const std::string& path) {
  json out = json::object();
  Reader r(bytes, base);
  while (!r.done()) {
    size_t at = r.offset();
    uint64_t tag = r.varint(strCat("field tag in ", path));
    auto number = static_cast<uint32_t>(tag >> 3);
    auto wire = static_cast<uint32_t>(tag & 7);
    if (number == 0 || (tag >> 3) > 0x1fffffff)
      fail(strCat(path, ": invalid field number ", tag >> 3, " at byte ", at));
    const Field* f = m.find(number);
    if (f == nullptr) {
      r.skip(wire, strCat(path, " field ", number));
      continue;
    }
    std::string fieldPath = strCat(path, ".", f->name);
    if (wire != wireTypeOf(f->type)) {
      fail(strCat(fieldPath, " (field ", number, " of ", m.name, ") at byte ", at, " has wire type ", wire, " (",
                  wireTypeName(wire), "), expected ", wireTypeOf(f->type), " (", wireTypeName(wireTypeOf(f->type)),
                  ")"));
    }
    decodeField(*f, r, out, fieldPath);
  }
  for (const Field& f : m.fields) {
    if (f.presence == kAlways && !out.contains(f.name)) out[f.name] = zeroOf(f);
  }
  return out;
}

// ---------------------------------------------------------------- encoding

void putVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void putVarintField(std::string& out, uint32_t number, uint64_t v) {
  putVarint(out, (static_cast<uint64_t>(number) << 3) | kVarint);
  putVarint(out, v);
}

void putBytesField(std::string& out, uint32_t number, std::string_view bytes) {
  putVarint(out, (static_cast<uint64_t>(number) << 3) | kLengthDelimited);
  putVarint(out, bytes.size());
  out.append(bytes);
}

const std::string& stringAt(const json& v, const std::string& path) {
  if (!v.is_string()) fail(strCat(path, ": expected a string, got ", v.type_name()));
  return v.get_ref<const std::string&>();
}

std::string unbase64(const json& v, const std::string& path) {
  const std::string& text = stringAt(v, path);
  std::string bytes;
  if (!absl::Base64Unescape(absl::string_view(text.data(), text.size()), &bytes)) {
    fail(strCat(path, ": not a base64 string"));
  }
  return bytes;
}

int64_t integerAt(const json& v, const std::string& path) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail(strCat(path, ": ", v.dump(), " does not fit in 64 bits"));
  }
  if (!v.is_number_integer()) fail(strCat(path, ": expected an integer, got ", v.type_name()));
  return v.get<int64_t>();
}

// "2024-05-01T12:00:00Z", "...:00.123Z", "...:00+02:00" -> {seconds, nanos}.
std::string encodeTime(const json& v, const std::string& path) {
  const std::string& text = stringAt(v, path);
  std::tm tm{};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (rest == nullptr) fail(strCat(path, ": \"", text, "\" is not an RFC 3339 time"));
  int64_t nanos = 0;
  if (*rest == '.') {
    int64_t scale = 100000000;
    for (++rest; *rest >= '0' && *rest <= '9'; ++rest, scale /= 10) nanos += (*rest - '0') * scale;
  }
  int64_t offset = 0;
  if ((*rest == '+' || *rest == '-') && std::strlen(rest) == 6 && rest[3] == ':') {
    int hh = std::atoi(std::string(rest + 1, 2).c_str()), mm = std::atoi(rest + 4);
    offset = (*rest == '+' ? 1 : -1) * (hh * 3600 + mm * 60);
  } else if (std::string_view(rest) != "Z") {
    fail(strCat(path, ": \"", text, "\" is not an RFC 3339 time (zone)"));
  }
  int64_t seconds = static_cast<int64_t>(timegm(&tm)) - offset;
  std::string t;
  putVarintField(t, 1, static_cast<uint64_t>(seconds));
  putVarintField(t, 2, static_cast<uint64_t>(nanos));
  return t;
}

std::string encodeMessage(const Message& m, const json& obj, const std::string& path);

void encodeValue(const Field& f, const json& v, const std::string& path, std::string& out) {
  switch (f.type) {
    case kString:
      return putBytesField(out, f.number, stringAt(v, path));
    case kOpaque:
      return putBytesField(out, f.number, stringAt(v.value("bytes", json()), path));
    case kBytes:
      return putBytesField(out, f.number, unbase64(v, path));
    case kInt64:
      return putVarintField(out, f.number, static_cast<uint64_t>(integerAt(v, path)));
    case kInt32: {
      int64_t n = integerAt(v, path);
      if (n < std::numeric_limits<int32_t>::min() || n > std::numeric_limits<int32_t>::max()) {
        fail(strCat(path, ": ", n, " does not fit in 32 bits"));
      }
      return putVarintField(out, f.number, static_cast<uint64_t>(n));
    }
    case kBool:
      if (!v.is_boolean()) fail(strCat(path, ": expected a boolean, got ", v.type_name()));
      return putVarintField(out, f.number, v.get<bool>() ? 1 : 0);
    case kMessage:
      return putBytesField(out, f.number, encodeMessage(*f.message, v, path));
    case kStringMap:
    case kBytesMap:
      if (!v.is_object()) fail(strCat(path, ": expected an object, got ", v.type_name()));
      for (const auto& [key, value] : v.items()) {
        std::string entry;
        std::string valuePath = strCat(path, ".", key);
        putBytesField(entry, 1, key);
        putBytesField(entry, 2, f.type == kStringMap ? stringAt(value, valuePath) : unbase64(value, valuePath));
        putBytesField(out, f.number, entry);
      }
      return;
    case kTime:
      return putBytesField(out, f.number, encodeTime(v, path));
    case kFieldsV1: {
      std::string fields;
      putBytesField(fields, 1, v.dump());
      return putBytesField(out, f.number, fields);
    }
  }
}

std::string encodeMessage(const Message& m, const json& obj, const std::string& path) {
  if (!obj.is_object()) fail(strCat(path, ": expected an object, got ", obj.type_name()));
  std::string out;
  for (const Field& f : m.fields) {
    auto it = obj.find(f.name);
    if (it == obj.end() || it->is_null()) continue;
    std::string fieldPath = strCat(path, ".", f.name);
    if (!f.repeated) {
      encodeValue(f, *it, fieldPath, out);
      continue;
    }
    if (!it->is_array()) fail(strCat(fieldPath, ": expected an array, got ", it->type_name()));
    for (size_t i = 0; i < it->size(); ++i) encodeValue(f, (*it)[i], strCat(fieldPath, "[", i, "]"), out);
  }
  return out;
}

}  // namespace

bool hasCodec(std::string_view apiVersion, std::string_view kind) { return findCodec(apiVersion, kind) != nullptr; }

absl::StatusOr<Envelope> unwrap(std::string_view body) {
  if (body.size() < kMagic.size() || body.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError(
        strCat("not a Kubernetes protobuf body: it must start with the 4 magic bytes 6b 38 73 00 (\"k8s\\0\"), got ",
               body.empty() ? "nothing" : hexEncode(body.substr(0, kMagic.size()))));
  }
  try {
    json u = decodeMessage(kUnknown, body.substr(kMagic.size()), kMagic.size(), "Unknown");
    std::string encoding = u.value("contentEncoding", "");
    std::string contentType = u.value("contentType", "");
    if (!encoding.empty()) fail(strCat("content encoding \"", encoding, "\" of the envelope is not supported"));
    if (!contentType.empty() && contentType != kMediaType) {
      fail(strCat("content type \"", contentType, "\" of the envelope is not ", kMediaType));
    }
    json raw = u.value("raw", json{{"bytes", ""}, {"offset", body.size()}});
    Envelope e{u["typeMeta"].value("apiVersion", ""), u["typeMeta"].value("kind", ""), raw["bytes"].get<std::string>(),
               raw["offset"].get<size_t>()};
    if (e.kind.empty()) fail("the envelope (runtime.Unknown) names no kind in its typeMeta");
    return e;
  } catch (const CodecError& err) {
    return absl::InvalidArgumentError(err.what());
  }
}

absl::StatusOr<json> decodeObject(const Envelope& envelope) {
  const Codec* codec = findCodec(envelope.apiVersion, envelope.kind);
  if (codec == nullptr) {
    return absl::UnimplementedError(
        strCat("no protobuf codec for ", envelope.apiVersion, " ", envelope.kind, " in this server"));
  }
  try {
    json obj = decodeMessage(*codec->message, envelope.raw, envelope.rawOffset, envelope.kind);
    obj["apiVersion"] = envelope.apiVersion;
    obj["kind"] = envelope.kind;
    return obj;
  } catch (const CodecError& err) {
    return absl::InvalidArgumentError(err.what());
  }
}

absl::StatusOr<json> decode(std::string_view body) {
  absl::StatusOr<Envelope> envelope = unwrap(body);
  if (!envelope.ok()) return envelope.status();
  return decodeObject(*envelope);
}

absl::StatusOr<std::string> encode(const json& object) {
  std::string apiVersion = object.is_object() ? object.value("apiVersion", "") : "";
  std::string kind = object.is_object() ? object.value("kind", "") : "";
  const Codec* codec = findCodec(apiVersion, kind);
  if (codec == nullptr) return absl::UnimplementedError(strCat("no protobuf codec for ", apiVersion, " ", kind));
  try {
    std::string typeMeta;
    putBytesField(typeMeta, 1, apiVersion);
    putBytesField(typeMeta, 2, kind);
    std::string out(kMagic);
    putBytesField(out, 1, typeMeta);
    putBytesField(out, 2, encodeMessage(*codec->message, object, kind));
    putBytesField(out, 3, "");  // contentEncoding, contentType: empty, as a real server writes them
    putBytesField(out, 4, "");
    return out;
  } catch (const CodecError& err) {
    return absl::InvalidArgumentError(err.what());
  }
}

}  // namespace tandem::apiserver::protobuf
