#pragma once
// The Kubernetes protobuf wire format (`application/vnd.kubernetes.protobuf`)
// for the few kinds the emulator speaks it in, to and from the JSON objects
// the store keeps. Hand-written: no protobuf library, no generated code.
//
//   body       = "k8s\0" Unknown
//   Unknown    = 1: TypeMeta {1: apiVersion, 2: kind}            (runtime)
//                2: raw       the object's own message (no TypeMeta in it)
//                3: contentEncoding   only "" is accepted
//                4: contentType       "" or the protobuf media type
//   each field = tag (field number << 3 | wire type) then its value; wire
//                types 0 varint, 1 fixed 8 bytes, 2 varint length + bytes,
//                5 fixed 4 bytes (3 and 4, groups, are refused)
//   map<k, v>  = a repeated entry message {1: key, 2: value}
//   bytes      = a base64 string in JSON (Secret.data, ConfigMap.binaryData)
//   Time       = {1: seconds int64, 2: nanos int32} <-> "2024-05-01T12:00:00Z"
//                (seconds, as metav1.Time writes JSON; nanos are dropped)
//   FieldsV1   = {1: Raw bytes} <-> the JSON value those bytes hold
//
// Field numbers are those of the generated.proto files of k8s.io/api
// (core/v1) and k8s.io/apimachinery (pkg/apis/meta/v1, pkg/runtime).
// Kinds with a codec (hasCodec): v1 Secret, SecretList, ConfigMap,
// ConfigMapList, Status, and DeleteOptions (in any group version);
// authentication.k8s.io/v1 TokenRequest and SelfSubjectReview (its
// userInfo without extra), authorization.k8s.io/v1 SelfSubjectAccessReview
// (resourceAttributes without its selectors). Messages
// inside them: ObjectMeta (all fields: labels, annotations, ownerReferences,
// finalizers, managedFields, timestamps, ...), OwnerReference,
// ManagedFieldsEntry, ListMeta, StatusDetails, StatusCause, Preconditions.
//
// JSON -> protobuf: keys the message does not have are dropped, as a real
// server's typed decoding drops them; null values are left out.
// protobuf -> JSON: unknown field numbers are skipped (the proto3 rule);
// zero values are left out as Go's `omitempty` leaves them out, except where
// the Go field is a pointer (`gracePeriodSeconds: 0`, `immutable: false`
// stay) or has no omitempty (`metadata`, `items`, an owner reference's
// `apiVersion`/`kind`/`name`/`uid`).
//
// Errors are Status values whose message names what was wrong and where:
//   InvalidArgument  bad magic, truncated varint, a length past the end, the
//                    wrong wire type for a known field, a string that is not
//                    UTF-8, fieldsV1 that is not JSON, an envelope without a
//                    kind, a JSON value of the wrong type or a bad timestamp
//                    or base64 string (encode)
//   Unimplemented    a kind without a codec
// Pure functions; thread-safe.

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace tandem::apiserver::protobuf {

inline constexpr std::string_view kMediaType = "application/vnd.kubernetes.protobuf";

// The envelope taken apart; `raw` is the object's message.
struct Envelope {
  std::string apiVersion;
  std::string kind;
  std::string raw;
  size_t rawOffset = 0;  // where raw starts in the body: errors inside it count bytes from the body's start
};

bool hasCodec(std::string_view apiVersion, std::string_view kind);

// The magic bytes and the runtime.Unknown around an object.
absl::StatusOr<Envelope> unwrap(std::string_view body);
// The object in an envelope as JSON, with its apiVersion and kind.
absl::StatusOr<nlohmann::json> decodeObject(const Envelope& envelope);
// unwrap + decodeObject.
absl::StatusOr<nlohmann::json> decode(std::string_view body);
// A JSON object with apiVersion and kind of a kind that has a codec, as a
// whole protobuf body (magic and envelope included).
absl::StatusOr<std::string> encode(const nlohmann::json& object);

}  // namespace tandem::apiserver::protobuf
