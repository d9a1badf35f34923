#pragma once
// Who sent a request: the emulator's authentication, as kube-apiserver's
// bearer-token authenticators do it (docs/testing.md "Authentication and
// authorization").
//
//   no Authorization header           the admin (see below)
//   Bearer tandem-local-admin         the admin: user "tandem-local-admin", groups
//                                     system:masters, system:authenticated
//   Bearer <service-account token>    system:serviceaccount:<ns>:<sa>, groups
//                                     system:serviceaccounts, system:serviceaccounts:<ns>,
//                                     system:authenticated
//   anything else                     401 Unauthorized (a metav1.Status, reason Unauthorized)
//
// A real server makes a request without credentials system:anonymous; here it
// is the admin, so the kubeconfig the emulator writes for plain HTTP (no
// user credentials) and every existing client keep full access.
//
// Service-account tokens are issued by the TokenRequest API
// (POST /api/v1/namespaces/<ns>/serviceaccounts/<sa>/token, what the kubelet
// and `kubectl create token` call). A token is a JWT signed with HMAC-SHA-256
// under a key drawn when the emulator starts (so no token outlives it):
//
//   base64url({"alg":"HS256","kid":"tandem-apiserver","typ":"JWT"}) "."
//   base64url({"aud":["https://kubernetes.default.svc.cluster.local"],
//              "exp":<unix s>,"iat":<unix s>,"nbf":<unix s>,
//              "iss":"https://kubernetes.default.svc.cluster.local",
//              "sub":"system:serviceaccount:<ns>:<sa>",
//              "kubernetes.io":{"namespace":<ns>,
//                               "serviceaccount":{"name":<sa>,"uid":<uid>},
//                               "pod":{"name":<pod>,"uid":<uid>}}}) "."     (pod: only when bound to one)
//   base64url(HMAC-SHA-256(key, <the two parts before, with their dot>))
//
// It authenticates only while its signature checks, it has not expired, its
// audience includes the API server's, its ServiceAccount exists with the uid
// it names, and the pod it is bound to (if any) exists with its uid, as
// kube-apiserver's service-account token validator decides (which also
// accepts a bound pod's token for 60 s after its deletion time; here it
// holds until the pod is gone).
//
// Not thread-safe where it reads the Store: the Router calls it under its mutex.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/store.h"
#include "src/common/clock.h"
#include "src/http/server.h"

namespace tandem::apiserver {

// The admin's bearer token (in the kubeconfig the emulator writes for https).
inline constexpr std::string_view kAdminToken = "tandem-local-admin";
// The audience and issuer of the tokens this server issues and accepts.
inline constexpr std::string_view kApiAudience = "https://kubernetes.default.svc.cluster.local";

struct UserInfo {
  std::string name;  // "system:serviceaccount:default:agent"
  std::string uid;   // the ServiceAccount's uid; "" for the admin
  std::vector<std::string> groups;
  // authentication.k8s.io/v1 UserInfo.extra (the bound pod's name and uid).
  nlohmann::json extra = nlohmann::json::object();

  bool inGroup(std::string_view group) const;
};

UserInfo adminUser();
// "system:serviceaccount:<ns>:<name>" with its three groups.
UserInfo serviceAccountUser(const std::string& ns, const std::string& name, const std::string& uid);

// What a service-account token says.
struct TokenClaims {
  std::string ns, serviceAccount, serviceAccountUid;
  std::string podName, podUid;  // empty: not bound to a pod
  std::vector<std::string> audiences;
  int64_t issuedAt = 0, expiresAt = 0;  // unix seconds
};

// Issues and checks service-account tokens under one key. Immutable once
// made: thread-safe.
class TokenIssuer {
 public:
  // A fresh random key; fails only if the system's random generator does.
  static absl::StatusOr<TokenIssuer> create();
  // `key` of at least 32 bytes (tests give their own).
  explicit TokenIssuer(std::string key) : key_(std::move(key)) {}

  std::string issue(const TokenClaims& claims) const;
  // The claims of a token this issuer signed; InvalidArgument naming what is
  // wrong (not a JWT, a bad signature, a malformed payload). Expiry and the
  // objects it names are checked by authenticate().
  absl::StatusOr<TokenClaims> decode(std::string_view token) const;

 private:
  std::string key_;
};

// The user of `req` (table above); throws ApiError 401 Unauthorized whose
// message says why a token was refused.
UserInfo authenticate(const http::Request& req, const TokenIssuer& issuer, const Store& store, WallTime now);

// POST .../serviceaccounts/<name>/token: the TokenRequest (authentication.k8s.io/v1)
// answered with status.token and status.expirationTimestamp; 201. Throws
// 404 when the ServiceAccount (or the bound pod) does not exist, 400/422 for
// a malformed request (expirationSeconds under 600, a boundObjectRef that is
// not a Pod or whose uid does not match).
http::Response tokenRequest(const http::Request& req, const TokenIssuer& issuer, const Store& store, WallTime now,
                            const std::string& ns, const std::string& serviceAccount);

// POST /apis/authentication.k8s.io/v1/selfsubjectreviews (`kubectl auth whoami`).
http::Response selfSubjectReview(const http::Request& req, const UserInfo& user);

// The body of a request about identities (TokenRequest, the reviews) as a
// JSON object: JSON, or protobuf when the Content-Type says so. An empty body
// is {}. Throws 400 for a malformed one, 415 for protobuf of another kind.
nlohmann::json requestObject(const http::Request& req, std::string_view kind, std::string_view apiVersion);

// 401 Unauthorized as kube-apiserver sends it, with `why` after "Unauthorized: ".
ApiError unauthorized(const std::string& why);

}  // namespace tandem::apiserver
