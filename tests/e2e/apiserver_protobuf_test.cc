// The emulator's protobuf: the codec (e2e/apiserver/protobuf.h) on round
// trips, on bytes built by hand and on malformed input; content negotiation
// (content_types.h); protobuf requests over HTTP; and the real Helm 3, whose
// release storage speaks protobuf, through install, upgrade, history,
// rollback and uninstall.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/content_types.h"
#include "e2e/apiserver/protobuf.h"
#include "src/http/client.h"
#include "tests/e2e/apiserver_fixture.h"

namespace tandem::e2e {
namespace {

using apiserver::ApiError;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

namespace pb = apiserver::protobuf;

// ------------------------------------------------------------ hand-built bytes

const std::string kMagic("k8s\0", 4);

std::string varint(uint64_t v) {
  std::string out;
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  return out + static_cast<char>(v);
}
// One length-delimited field, one varint field.
std::string ld(int field, const std::string& value) { return varint(field << 3 | 2) + varint(value.size()) + value; }
std::string vi(int field, uint64_t value) { return varint(field << 3) + varint(value); }

std::string envelope(const std::string& apiVersion, const std::string& kind, const std::string& raw) {
  return kMagic + ld(1, ld(1, apiVersion) + ld(2, kind)) + ld(2, raw) + ld(3, "") + ld(4, "");
}

std::string b64(const std::string& bytes) { return absl::Base64Escape(bytes); }

json mustDecode(const std::string& bytes) {
  auto obj = pb::decode(bytes);
  EXPECT_TRUE(obj.ok()) << obj.status();
  return obj.ok() ? *obj : json();
}

std::string mustEncode(const json& obj) {
  auto bytes = pb::encode(obj);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : "";
}

std::string decodeError(const std::string& bytes) {
  auto obj = pb::decode(bytes);
  EXPECT_FALSE(obj.ok()) << "decoded to " << (obj.ok() ? obj->dump() : "");
  return obj.ok() ? "" : std::string(obj.status().message());
}

// ------------------------------------------------------------ round trips

json fullMetadata() {
  return json::parse(R"({
    "name": "release", "generateName": "rel-", "namespace": "team", "selfLink": "/x",
    "uid": "0b6a7e4c-1111-2222-3333-444455556666", "resourceVersion": "42", "generation": 3,
    "creationTimestamp": "2024-05-01T12:00:00Z", "deletionTimestamp": "2024-05-02T00:00:01Z",
    "deletionGracePeriodSeconds": 0,
    "labels": {"owner": "helm", "name": "demo", "empty": ""},
    "annotations": {"note": "ünïcode and \"quotes\""},
    "ownerReferences": [
      {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u-1", "controller": true,
       "blockOwnerDeletion": false},
      {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-2"}],
    "finalizers": ["example.com/a", "example.com/b"],
    "managedFields": [
      {"manager": "helm", "operation": "Update", "apiVersion": "v1", "time": "2024-05-01T12:00:00Z",
       "fieldsType": "FieldsV1",
       "fieldsV1": {"f:data": {".": {}, "f:release": {}}, "f:metadata": {"f:labels": {"f:owner": {}}}}},
      {"manager": "kubelet", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1",
       "fieldsV1": {"f:type": {}}, "subresource": "status"}]
  })");
}

TEST(ProtobufCodecTest, SecretRoundTripKeepsBinaryDataAndFullMetadata) {
  std::string binary("\x00\xff\x80\x01 binary\n", 12);
  json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata", fullMetadata()},
                 {"type", "helm.sh/release.v1"},
                 {"data", {{"release", b64(binary)}, {"empty", ""}}},
                 {"stringData", {{"plain", "text"}}},
                 {"immutable", false}};
  std::string bytes = mustEncode(secret);
  EXPECT_EQ(bytes.substr(0, 4), kMagic);
  json back = mustDecode(bytes);
  EXPECT_EQ(back, secret) << back.dump(2);
  std::string data;
  ASSERT_TRUE(absl::Base64Unescape(back["data"]["release"].get<std::string>(), &data));
  EXPECT_EQ(data, binary);
}

TEST(ProtobufCodecTest, ConfigMapListsStatusAndDeleteOptionsRoundTrip) {
  json configMap = {{"apiVersion", "v1"},
                    {"kind", "ConfigMap"},
                    {"metadata", {{"name", "settings"}, {"namespace", "default"}}},
                    {"data", {{"a", "b"}, {"multi", "line\none"}}},
                    {"binaryData", {{"blob", b64(std::string("\x01\x02\x00", 3))}}},
                    {"immutable", true}};
  json item = configMap;
  item.erase("apiVersion");
  item.erase("kind");  // items carry no TypeMeta in protobuf, as in Go's typed lists
  json secretItem = {{"metadata", fullMetadata()}, {"data", {{"k", "dg=="}}}};
  std::vector<json> objects = {
      configMap,
      {{"apiVersion", "v1"},
       {"kind", "ConfigMapList"},
       {"metadata", {{"resourceVersion", "7"}, {"continue", "next"}, {"remainingItemCount", 0}}},
       {"items", {item, item}}},
      {{"apiVersion", "v1"}, {"kind", "SecretList"}, {"metadata", json::object()}, {"items", {secretItem}}},
      {{"apiVersion", "v1"},
       {"kind", "SecretList"},
       {"metadata", {{"resourceVersion", "9"}}},
       {"items", json::array()}},
      {{"apiVersion", "v1"},
       {"kind", "Status"},
       {"metadata", json::object()},
       {"status", "Failure"},
       {"message", "secrets \"x\" is invalid"},
       {"reason", "Invalid"},
       {"details",
        {{"name", "x"},
         {"kind", "secrets"},
         {"uid", "u"},
         {"retryAfterSeconds", 3},
         {"causes", {{{"reason", "FieldValueInvalid"}, {"message", "bad"}, {"field", "data.k"}}}}}},
       {"code", 422}},
      {{"apiVersion", "v1"},
       {"kind", "DeleteOptions"},
       {"gracePeriodSeconds", 0},
       {"preconditions", {{"uid", "u-1"}, {"resourceVersion", "5"}}},
       {"orphanDependents", false},
       {"propagationPolicy", "Foreground"},
       {"dryRun", {"All"}}},
      {{"apiVersion", "apps/v1"}, {"kind", "DeleteOptions"}, {"propagationPolicy", "Orphan"}},
  };
  for (const json& obj : objects) {
    json back = mustDecode(mustEncode(obj));
    EXPECT_EQ(back, obj) << "sent " << obj.dump() << "\ngot  " << back.dump();
  }
}

// ------------------------------------------------------------ the wire form

TEST(ProtobufCodecTest, EncodesTheWireFormByteForByte) {
  json cm = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "a"}}}, {"data", {{"k", "v"}}}};
  // ConfigMap{1: ObjectMeta{1: "a"}, 2: entry{1: "k", 2: "v"}}
  EXPECT_EQ(mustEncode(cm), envelope("v1", "ConfigMap", ld(1, ld(1, "a")) + ld(2, ld(1, "k") + ld(2, "v"))));

  // Time{1: 1714564800, 2: 0} as creationTimestamp (field 8 of ObjectMeta);
  // 1714564800 = 0x6632_2EC0 as a varint: c0 dd c8 b1 06.
  json withTime = {
      {"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"creationTimestamp", "2024-05-01T12:00:00Z"}}}};
  std::string time = std::string("\x08\xc0\xdd\xc8\xb1\x06", 6) + vi(2, 0);
  EXPECT_EQ(mustEncode(withTime), envelope("v1", "ConfigMap", ld(1, ld(8, time))));
  // Other zones and fractions arrive in UTC; nanos do not show in JSON.
  json fromOffset = mustDecode(mustEncode({{"apiVersion", "v1"},
                                           {"kind", "ConfigMap"},
                                           {"metadata", {{"creationTimestamp", "2024-05-01T14:00:00.5+02:00"}}}}));
  EXPECT_EQ(fromOffset["metadata"]["creationTimestamp"], "2024-05-01T12:00:00Z");

  // A negative int32 (Status.code) is a sign-extended 10-byte varint.
  std::string status = mustEncode({{"apiVersion", "v1"}, {"kind", "Status"}, {"code", -1}});
  EXPECT_THAT(status, HasSubstr(std::string("\x30\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11)));
  EXPECT_EQ(mustDecode(status)["code"], -1);
}

// Every field by its number in the generated.proto files (round trips cannot
// tell a wrong number: both directions would share it).
TEST(ProtobufCodecTest, FieldNumbersAreThoseOfTheGeneratedProtoFiles) {
  std::string time = vi(1, 1714564800) + vi(2, 5);  // Time{seconds, nanos}
  std::string owner = ld(1, "Deployment") + ld(3, "web") + ld(4, "u-1") + ld(5, "apps/v1") + vi(6, 1) + vi(7, 1);
  std::string managed = ld(1, "helm") + ld(2, "Update") + ld(3, "v1") + ld(4, time) + ld(6, "FieldsV1") +
                        ld(7, ld(1, R"({"f:data":{}})")) + ld(8, "status");
  std::string meta = ld(1, "n") + ld(2, "g-") + ld(3, "ns") + ld(4, "/self") + ld(5, "uid") + ld(6, "12") + vi(7, 2) +
                     ld(8, time) + ld(9, time) + vi(10, 30) + ld(11, ld(1, "l") + ld(2, "1")) +
                     ld(12, ld(1, "a") + ld(2, "2")) + ld(13, owner) + ld(14, "f/1") + ld(14, "f/2") + ld(17, managed);
  std::string secret =
      ld(1, meta) + ld(2, ld(1, "d") + ld(2, "hi")) + ld(3, "Opaque") + ld(4, ld(1, "s") + ld(2, "str")) + vi(5, 1);
  json expectedMeta = json::parse(R"({
    "name": "n", "generateName": "g-", "namespace": "ns", "selfLink": "/self", "uid": "uid",
    "resourceVersion": "12", "generation": 2, "creationTimestamp": "2024-05-01T12:00:00Z",
    "deletionTimestamp": "2024-05-01T12:00:00Z", "deletionGracePeriodSeconds": 30,
    "labels": {"l": "1"}, "annotations": {"a": "2"},
    "ownerReferences": [{"kind": "Deployment", "name": "web", "uid": "u-1", "apiVersion": "apps/v1",
                         "controller": true, "blockOwnerDeletion": true}],
    "finalizers": ["f/1", "f/2"],
    "managedFields": [{"manager": "helm", "operation": "Update", "apiVersion": "v1",
                       "time": "2024-05-01T12:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {}},
                       "subresource": "status"}]})");
  EXPECT_EQ(mustDecode(envelope("v1", "Secret", secret)), json({{"apiVersion", "v1"},
                                                                {"kind", "Secret"},
                                                                {"metadata", expectedMeta},
                                                                {"data", {{"d", "aGk="}}},
                                                                {"type", "Opaque"},
                                                                {"stringData", {{"s", "str"}}},
                                                                {"immutable", true}}));

  std::string configMap =
      ld(1, ld(1, "c")) + ld(2, ld(1, "k") + ld(2, "v")) + ld(3, ld(1, "b") + ld(2, "\x01")) + vi(4, 1);
  std::string listMeta = ld(1, "/l") + ld(2, "77") + ld(3, "more") + vi(4, 4);
  EXPECT_EQ(mustDecode(envelope("v1", "ConfigMapList", ld(1, listMeta) + ld(2, configMap))),
            json::parse(R"({"apiVersion": "v1", "kind": "ConfigMapList",
              "metadata": {"selfLink": "/l", "resourceVersion": "77", "continue": "more", "remainingItemCount": 4},
              "items": [{"metadata": {"name": "c"}, "data": {"k": "v"}, "binaryData": {"b": "AQ=="},
                         "immutable": true}]})"));
  EXPECT_EQ(mustDecode(envelope("v1", "SecretList", ld(1, "") + ld(2, ld(3, "t")))),
            json::parse(R"({"apiVersion": "v1", "kind": "SecretList", "metadata": {},
                            "items": [{"metadata": {}, "type": "t"}]})"));

  std::string details = ld(1, "x") + ld(2, "apps") + ld(3, "deployments") +
                        ld(4, ld(1, "R") + ld(2, "M") + ld(3, "F")) + vi(5, 9) + ld(6, "u");
  std::string status =
      ld(1, ld(2, "3")) + ld(2, "Failure") + ld(3, "msg") + ld(4, "Conflict") + ld(5, details) + vi(6, 109);
  EXPECT_EQ(mustDecode(envelope("v1", "Status", status)), json::parse(R"({"apiVersion": "v1", "kind": "Status",
              "metadata": {"resourceVersion": "3"}, "status": "Failure", "message": "msg", "reason": "Conflict",
              "details": {"name": "x", "group": "apps", "kind": "deployments", "uid": "u", "retryAfterSeconds": 9,
                          "causes": [{"reason": "R", "message": "M", "field": "F"}]},
              "code": 109})"));

  std::string options = vi(1, 7) + ld(2, ld(1, "u") + ld(2, "rv")) + vi(3, 1) + ld(4, "Orphan") + ld(5, "All");
  EXPECT_EQ(mustDecode(envelope("v1", "DeleteOptions", options)), json::parse(R"({"apiVersion": "v1",
              "kind": "DeleteOptions", "gracePeriodSeconds": 7, "preconditions": {"uid": "u", "resourceVersion": "rv"},
              "orphanDependents": true, "propagationPolicy": "Orphan", "dryRun": ["All"]})"));
}

TEST(ProtobufCodecTest, DecodesWhatGoWritesAndSkipsUnknownFields) {
  // Go writes every non-pointer field, empty strings and an empty Time
  // included; JSON leaves them out (omitempty), as a real server's would.
  std::string meta = ld(1, "n") + ld(2, "") + ld(3, "") + ld(4, "") + ld(5, "") + ld(6, "") + vi(7, 0) + ld(8, "") +
                     ld(11, ld(1, "owner") + ld(2, "helm"));
  // Unknown fields of every wire type, in the object and in the envelope.
  std::string unknown = std::string("\xf8\x01\x05", 3)                          // field 31 varint
                        + std::string("\xf9\x01", 2) + std::string(8, '\x07')   // field 31 fixed64
                        + ld(15, "zzz")                                         // field 15 length-delimited
                        + std::string("\xfd\x01", 2) + std::string(4, '\x09');  // field 31 fixed32
  std::string raw = ld(1, meta) + unknown + ld(3, "Opaque") + ld(2, ld(1, "k") + ld(2, std::string("\x00\x01", 2)));
  json secret = mustDecode(envelope("v1", "Secret", raw) + ld(9, "extra"));
  EXPECT_EQ(secret, json::parse(R"({"apiVersion":"v1","kind":"Secret","type":"Opaque",
                                    "metadata":{"name":"n","labels":{"owner":"helm"}},"data":{"k":"AAE="}})"))
      << secret.dump();
  // A DeleteOptions' pointer fields keep their zero values.
  json options = mustDecode(envelope("v1", "DeleteOptions", vi(1, 0) + vi(3, 0) + ld(4, "")));
  EXPECT_EQ(options, json::parse(R"({"apiVersion":"v1","kind":"DeleteOptions","gracePeriodSeconds":0,
                                     "orphanDependents":false,"propagationPolicy":""})"));
}

// ------------------------------------------------------------ malformed input

TEST(ProtobufCodecTest, MalformedInputIsRefusedNamingWhatIsWrong) {
  EXPECT_THAT(decodeError(""), HasSubstr("must start with the 4 magic bytes 6b 38 73 00 (\"k8s\\0\"), got nothing"));
  EXPECT_THAT(decodeError(std::string("k8x\0", 4) + ld(2, "")), HasSubstr("got 6b387800"));
  EXPECT_THAT(decodeError("{\"kind\":\"Secret\"}"), HasSubstr("got 7b226b69"));
  // The envelope's typeMeta length is a varint cut off after its first byte.
  EXPECT_THAT(decodeError(kMagic + std::string("\x0a\x80", 2)),
              HasSubstr("truncated varint (length of Unknown.typeMeta) at byte 5"));
  EXPECT_THAT(decodeError(kMagic + std::string("\x0a", 1)), HasSubstr("truncated varint (length of Unknown.typeMeta)"));
  EXPECT_THAT(decodeError(kMagic + std::string("\x80", 1)),
              HasSubstr("truncated varint (field tag in Unknown) at byte 4"));
  EXPECT_THAT(decodeError(kMagic + std::string(11, '\xff')), HasSubstr("is longer than 10 bytes"));
  // raw says 5 bytes, one follows.
  EXPECT_THAT(decodeError(kMagic + std::string("\x12\x05", 2) + "a"),
              HasSubstr("length 5 of Unknown.raw at byte 5 runs past the end of its message (1 bytes left)"));
  // Inside the object: the map entry's value runs past the entry.
  std::string shortEntry = ld(2, ld(1, "k") + std::string("\x12\x09v", 3));
  EXPECT_THAT(decodeError(envelope("v1", "ConfigMap", shortEntry)),
              HasSubstr("length 9 of ConfigMap.data.value at byte"));
  // metadata (field 1) as a varint: a known field with the wrong wire type.
  EXPECT_THAT(decodeError(envelope("v1", "ConfigMap", vi(1, 1))),
              HasSubstr("ConfigMap.metadata (field 1 of ConfigMap) at byte 23 has wire type 0 (varint), "
                        "expected 2 (length-delimited)"));
  EXPECT_THAT(decodeError(envelope("v1", "Secret", ld(5, ""))),
              HasSubstr("Secret.immutable (field 5 of Secret) at byte 20 has wire type 2 (length-delimited), "
                        "expected 0 (varint)"));
  EXPECT_THAT(decodeError(kMagic + vi(1, 1)), HasSubstr("Unknown.typeMeta (field 1 of Unknown)"));
  EXPECT_THAT(decodeError(envelope("v1", "ConfigMap", std::string("\x4b", 1))),  // unknown field 9, a group
              HasSubstr("ConfigMap field 9 at byte 24 has wire type 3 (group), which is not supported"));
  EXPECT_THAT(decodeError(envelope("v1", "ConfigMap", std::string("\x00\x01", 2))),
              HasSubstr("ConfigMap: invalid field number 0 at byte 23"));
  EXPECT_THAT(decodeError(envelope("v1", "ConfigMap", ld(1, ld(1, "\xff\xfe")))),
              HasSubstr("ConfigMap.metadata.name at byte 27 is not valid UTF-8"));
  std::string badFields = ld(1, ld(17, ld(7, ld(1, "{not json"))));
  EXPECT_THAT(decodeError(envelope("v1", "ConfigMap", badFields)),
              HasSubstr("ConfigMap.metadata.managedFields.fieldsV1: Raw is not JSON"));
  EXPECT_THAT(decodeError(kMagic + ld(1, ld(1, "v1")) + ld(2, "")), HasSubstr("names no kind"));
  EXPECT_THAT(decodeError(kMagic + ld(1, ld(1, "v1") + ld(2, "Secret")) + ld(3, "gzip")),
              HasSubstr("content encoding \"gzip\" of the envelope is not supported"));
  auto pod = pb::decode(envelope("v1", "Pod", ""));
  EXPECT_EQ(pod.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(pod.status().message(), HasSubstr("no protobuf codec for v1 Pod"));

  // Encoding: values the typed message cannot hold.
  auto bad = pb::encode({{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"data", {{"n", 5}}}});
  EXPECT_THAT(bad.status().message(), HasSubstr("ConfigMap.data.n: expected a string, got number"));
  bad = pb::encode({{"apiVersion", "v1"}, {"kind", "Secret"}, {"data", {{"k", "not base64!"}}}});
  EXPECT_THAT(bad.status().message(), HasSubstr("Secret.data.k: not a base64 string"));
  bad = pb::encode({{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"creationTimestamp", "yesterday"}}}});
  EXPECT_THAT(bad.status().message(), HasSubstr("\"yesterday\" is not an RFC 3339 time"));
  bad = pb::encode({{"apiVersion", "apps/v1"}, {"kind", "Deployment"}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnimplemented);
}

// What a request handler makes of a protobuf body: the ApiError a client sees.
ApiError requestError(const std::string& body, const std::string& kind, const std::string& apiVersion) {
  try {
    apiserver::decodeProtobufBody(body, kind, apiVersion);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "decoded without an error";
  return ApiError(0, "", "");
}

TEST(ProtobufRequestTest, KindMismatchIs400AndKindsWithoutCodecAre415) {
  ApiError e = requestError(envelope("v1", "ConfigMap", ""), "Secret", "v1");
  EXPECT_EQ(e.code(), 400);
  EXPECT_EQ(e.message(),
            "the object provided is unrecognized (must be of type Secret): the protobuf envelope names "
            "v1 ConfigMap");
  e = requestError(envelope("apps/v1", "Secret", ""), "Secret", "v1");
  EXPECT_EQ(e.code(), 400);
  EXPECT_THAT(e.message(), HasSubstr("names apps/v1 Secret"));
  e = requestError(envelope("v1", "Pod", ""), "Pod", "v1");
  EXPECT_EQ(e.code(), 415);
  EXPECT_EQ(e.reason(), "UnsupportedMediaType");
  EXPECT_THAT(e.message(), HasSubstr("this server cannot decode v1 Pod from application/vnd.kubernetes.protobuf"));
  e = requestError("{}", "Scale", "autoscaling/v1");
  EXPECT_EQ(e.code(), 415) << "refused before its bytes are read";
  e = requestError("garbage", "Secret", "v1");
  EXPECT_EQ(e.code(), 400);
  EXPECT_THAT(e.message(), HasSubstr("error decoding the protobuf body: not a Kubernetes protobuf body"));
  e = requestError(envelope("v1", "Secret", vi(1, 1)), "Secret", "v1");
  EXPECT_EQ(e.code(), 400);
  EXPECT_THAT(e.message(), HasSubstr("error decoding the protobuf Secret: Secret.metadata (field 1 of Secret)"));
  // DeleteOptions come in the group version of the resource deleted.
  json options =
      apiserver::decodeProtobufBody(envelope("apps/v1", "DeleteOptions", ld(4, "Orphan")), "DeleteOptions", "");
  EXPECT_EQ(options["propagationPolicy"], "Orphan");
}

// ------------------------------------------------------------ negotiation

http::Request requestAccepting(const std::string& accept) {
  http::Headers headers;
  if (!accept.empty()) headers["Accept"] = accept;
  return http::Request("GET", "/api/v1/namespaces/default/secrets/s", {}, headers, "",
                       std::make_shared<http::CallContext>(MonoTime::max()));
}

const json kSecret = {{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "s"}}}, {"type", "Opaque"}};
const json kPod = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", {{"name", "p"}}}};
constexpr char kClientGo[] = "application/vnd.kubernetes.protobuf,application/json";

TEST(ProtobufNegotiationTest, TheClientsFirstServableTypeWins) {
  http::Response r = apiserver::negotiate(requestAccepting(kClientGo),
                                          http::Response::json(201, kSecret).setHeader("Warning", "299 - \"w\""));
  EXPECT_EQ(r.status(), 201);
  EXPECT_EQ(r.headers().at("Content-Type"), "application/vnd.kubernetes.protobuf");
  EXPECT_EQ(r.headers().at("Warning"), "299 - \"w\"");
  EXPECT_EQ(mustDecode(r.body()), kSecret);

  for (const std::string accept :
       {"", "application/json", "application/json, application/vnd.kubernetes.protobuf", "*/*", "application/yaml"}) {
    r = apiserver::negotiate(requestAccepting(accept), http::Response::json(200, kSecret));
    EXPECT_EQ(r.headers().at("Content-Type"), "application/json") << accept;
  }
  // A kind without a codec: JSON when the client also takes JSON, else 406.
  r = apiserver::negotiate(requestAccepting(kClientGo), http::Response::json(200, kPod));
  EXPECT_EQ(json::parse(r.body()), kPod);
  r = apiserver::negotiate(requestAccepting("application/vnd.kubernetes.protobuf"), http::Response::json(200, kPod));
  EXPECT_EQ(r.status(), 406);
  json status = json::parse(r.body());
  EXPECT_EQ(status["reason"], "NotAcceptable");
  EXPECT_THAT(status["message"].get<std::string>(),
              HasSubstr("cannot send a v1 Pod as application/vnd.kubernetes.protobuf and the request's Accept header "
                        "(application/vnd.kubernetes.protobuf) allows nothing else"));
  // Tables are JSON only.
  r = apiserver::negotiate(
      requestAccepting("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json"),
      http::Response::json(200, kSecret));
  EXPECT_EQ(r.headers().at("Content-Type"), "application/json");
  // Errors: a protobuf Status.
  ApiError notFound = apiserver::notFound("secrets", "", "s");
  r = apiserver::negotiate(requestAccepting(kClientGo), http::Response::json(404, notFound.toStatus()));
  EXPECT_EQ(r.status(), 404);
  EXPECT_EQ(mustDecode(r.body()), notFound.toStatus());
  // Watches stream JSON when JSON is allowed.
  auto watch = [] { return http::Response::sse([](std::shared_ptr<http::SseWriter>) {}); };
  EXPECT_EQ(apiserver::negotiate(requestAccepting(kClientGo), watch()).kind(), http::Response::Kind::kSse);
  EXPECT_EQ(
      apiserver::negotiate(requestAccepting("application/vnd.kubernetes.protobuf;stream=watch"), watch()).status(),
      406);
  // A stored object the typed message cannot hold: 500 naming the field.
  json odd = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"data", {{"n", 1}}}};
  r = apiserver::negotiate(requestAccepting(kClientGo), http::Response::json(200, odd));
  EXPECT_EQ(r.status(), 500);
  EXPECT_THAT(mustDecode(r.body())["message"].get<std::string>(),
              HasSubstr("cannot encode the ConfigMap as protobuf: ConfigMap.data.n: expected a string"));
}

// ------------------------------------------------------------ over HTTP

class ProtobufServerTest : public ApiServerFixture {
 protected:
  http::ClientResponse send(const std::string& method, const std::string& path, const std::string& body,
                            const std::string& accept = kClientGo) {
    http::ClientRequest req{.method = method, .url = baseUrl() + path, .body = body};
    req.headers["Accept"] = accept;
    if (!body.empty()) req.headers["Content-Type"] = "application/vnd.kubernetes.protobuf";
    auto r = http::httpSend(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : http::ClientResponse{};
  }
  const std::string secrets_ = "/api/v1/namespaces/default/secrets";
};

TEST_F(ProtobufServerTest, CreateGetListReplaceDeleteInProtobuf) {
  std::string binary("\x00\x01\xfe\xff", 4);
  json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata", {{"name", "s"}, {"labels", {{"owner", "helm"}}}}},
                 {"data", {{"bin", b64(binary)}}}};
  auto r = send("POST", secrets_, mustEncode(secret));
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(r.headers["Content-Type"], "application/vnd.kubernetes.protobuf");
  json created = mustDecode(r.body);
  EXPECT_EQ(created["data"]["bin"], b64(binary));
  EXPECT_FALSE(created["metadata"].value("uid", "").empty());
  EXPECT_FALSE(created["metadata"].value("creationTimestamp", "").empty());

  // JSON clients see the same object.
  r = send("GET", secrets_ + "/s", "", "application/json");
  EXPECT_EQ(json::parse(r.body)["data"]["bin"], b64(binary));

  r = send("GET", secrets_ + "?labelSelector=owner%3Dhelm", "");
  json list = mustDecode(r.body);
  EXPECT_EQ(list["kind"], "SecretList");
  ASSERT_EQ(list["items"].size(), 1u);
  EXPECT_FALSE(list["metadata"].value("resourceVersion", "").empty());

  created["data"]["more"] = "eA==";
  r = send("PUT", secrets_ + "/s", mustEncode(created));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(mustDecode(r.body)["data"]["more"], "eA==");

  // Stale resourceVersion: the 409 arrives as a protobuf Status.
  r = send("PUT", secrets_ + "/s", mustEncode(created));
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(mustDecode(r.body)["reason"], "Conflict");

  r = send("DELETE", secrets_ + "/s", envelope("v1", "DeleteOptions", ld(4, "Background")));
  ASSERT_EQ(r.status, 200) << r.body;
  json status = mustDecode(r.body);
  EXPECT_EQ(status["status"], "Success");
  r = send("GET", secrets_ + "/s", "");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(mustDecode(r.body)["message"], "secrets \"s\" not found");
}

TEST_F(ProtobufServerTest, MalformedBodiesStoreNothing) {
  // metadata as a varint, a ConfigMap posted to secrets, a cut-off body.
  for (const std::string& body :
       {envelope("v1", "Secret", vi(1, 1)), envelope("v1", "ConfigMap", ld(1, ld(1, "s"))),
        mustEncode({{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "s"}}}}).substr(0, 20)}) {
    auto r = send("POST", secrets_, body, "application/json");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(json::parse(r.body)["reason"], "BadRequest");
  }
  EXPECT_EQ(send("GET", secrets_, "", "application/json").body.find("\"name\":\"s\""), std::string::npos);
  // Pods have no codec: 415, and a protobuf-only client cannot read them.
  auto r = send("POST", "/api/v1/namespaces/default/pods", envelope("v1", "Pod", ""));
  EXPECT_EQ(r.status, 415);
  EXPECT_EQ(mustDecode(r.body)["reason"], "UnsupportedMediaType");
  r = send("GET", "/api/v1/namespaces/default/pods", "", "application/vnd.kubernetes.protobuf");
  EXPECT_EQ(r.status, 406);
  r = send("GET", "/api/v1/namespaces/default/pods", "");
  EXPECT_EQ(json::parse(r.body)["kind"], "PodList");
}

// ------------------------------------------------------------ the real Helm

class HelmTest : public ApiServerFixture {
 protected:
  void SetUp() override {
    ApiServerFixture::SetUp();
    const char* helm = std::getenv("TANDEM_HELM");
    ASSERT_NE(helm, nullptr) << "TANDEM_HELM is not set (CMake sets it)";
    if (!std::filesystem::exists(helm)) {
      GTEST_SKIP() << "no helm binary at " << helm << ": `./tandem setup` installs it";
    }
    helm_ = helm;
    // A chart of a ConfigMap and a Service.
    std::filesystem::create_directories(dir_ + "/chart/templates");
    writeTemp("chart/Chart.yaml", "apiVersion: v2\nname: tiny\nversion: 0.1.0\n");
    writeTemp("chart/values.yaml", "greeting: hello\n");
    writeTemp("chart/templates/configmap.yaml", R"(apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-config
data:
  greeting: {{ .Values.greeting | quote }}
)");
    writeTemp("chart/templates/service.yaml", R"(apiVersion: v1
kind: Service
metadata:
  name: {{ .Release.Name }}-svc
spec:
  selector: {app: tiny}
  ports:
  - port: 80
)");
  }

  // Helm's own state (cache, config, data) stays in the test's directory.
  CommandResult helm(const std::string& args) const {
    return shell("HELM_CACHE_HOME=" + dir_ + "/helm-cache HELM_CONFIG_HOME=" + dir_ + "/helm-config HELM_DATA_HOME=" +
                 dir_ + "/helm-data " + helm_ + " --kubeconfig " + kubeconfig_ + " --namespace default " + args);
  }

  std::string greeting() const { return kubectl("get cm rel-config -o jsonpath={.data.greeting}").output; }
  std::string releaseSecrets() const {
    return kubectl("get secrets -l owner=helm,name=rel -o jsonpath={.items[*].metadata.name}").output;
  }

  std::string helm_;
};

TEST_F(HelmTest, InstallUpgradeHistoryRollbackUninstall) {
  auto r = helm("install rel " + dir_ + "/chart");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("STATUS: deployed"));
  r = helm("list");
  EXPECT_THAT(r.output, HasSubstr("rel"));
  EXPECT_THAT(r.output, HasSubstr("deployed"));
  EXPECT_EQ(greeting(), "hello");
  EXPECT_EQ(kubectl("get svc rel-svc -o jsonpath={.spec.ports[0].port}").output, "80");
  EXPECT_EQ(releaseSecrets(), "sh.helm.release.v1.rel.v1");

  r = helm("upgrade rel " + dir_ + "/chart --set greeting=bye");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(greeting(), "bye");
  EXPECT_EQ(releaseSecrets(), "sh.helm.release.v1.rel.v1 sh.helm.release.v1.rel.v2");
  r = helm("history rel");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, testing::ContainsRegex("1 .*superseded.*Install complete"));
  EXPECT_THAT(r.output, testing::ContainsRegex("2 .*deployed.*Upgrade complete"));

  r = helm("rollback rel 1");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(greeting(), "hello");
  r = helm("history rel");
  EXPECT_THAT(r.output, testing::ContainsRegex("3 .*deployed.*Rollback to 1"));

  r = helm("uninstall rel");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("release \"rel\" uninstalled"));
  EXPECT_THAT(kubectl("get cm rel-config").output, HasSubstr("NotFound"));
  EXPECT_THAT(kubectl("get svc rel-svc").output, HasSubstr("NotFound"));
  EXPECT_EQ(releaseSecrets(), "");
  r = helm("list --all");
  EXPECT_THAT(r.output, Not(HasSubstr("rel")));
}

}  // namespace
}  // namespace tandem::e2e
