#include "e2e/apiserver/authn.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "e2e/apiserver/content_types.h"
#include "e2e/apiserver/json_util.h"
#include "e2e/apiserver/object_meta.h"
#include "e2e/apiserver/protobuf.h"
#include "src/auth/pool_key.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

constexpr const char* kHeader = R"({"alg":"HS256","kid":"tandem-apiserver","typ":"JWT"})";
constexpr int64_t kDefaultExpirationSeconds = 3600;
constexpr int64_t kMinExpirationSeconds = 600;            // as kube-apiserver's validation
constexpr int64_t kMaxExpirationSeconds = 1LL << 32;      // as kube-apiserver's validation

int64_t unixSeconds(WallTime t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

std::string serviceAccountName(const std::string& ns, const std::string& name) {
  return strCat("system:serviceaccount:", ns, ":", name);
}

std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

bool UserInfo::inGroup(std::string_view group) const {
  return std::find(groups.begin(), groups.end(), group) != groups.end();
}

UserInfo adminUser() { return {.name = std::string(kAdminToken), .groups = {"system:masters", "system:authenticated"}}; }

UserInfo serviceAccountUser(const std::string& ns, const std::string& name, const std::string& uid) {
  return {.name = serviceAccountName(ns, name),
          .uid = uid,
          .groups = {"system:serviceaccounts", strCat("system:serviceaccounts:", ns), "system:authenticated"}};
}

ApiError unauthorized(const std::string& why) { return ApiError(401, "Unauthorized", strCat("Unauthorized: ", why)); }

json requestObject(const http::Request& req, std::string_view kind, std::string_view apiVersion) {
  if (req.header("Content-Type").value_or("").starts_with(protobuf::kMediaType)) {
    return decodeProtobufBody(req.body(), kind, apiVersion);
  }
  json body = json::parse(req.body().empty() ? std::string("{}") : req.body(), nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) throw badRequest(strCat("the body is not a JSON object (a ", kind, " was expected)"));
  return body;
}

absl::StatusOr<TokenIssuer> TokenIssuer::create() {
  absl::StatusOr<std::string> key = auth::randomBytes(32);
  if (!key.ok()) return key.status();
  return TokenIssuer(std::move(*key));
}

std::string TokenIssuer::issue(const TokenClaims& c) const {
  json sa = {{"name", c.serviceAccount}, {"uid", c.serviceAccountUid}};
  json k8s = {{"namespace", c.ns}, {"serviceaccount", sa}};
  if (!c.podName.empty()) k8s["pod"] = {{"name", c.podName}, {"uid", c.podUid}};
  json payload = {{"aud", c.audiences},
                  {"exp", c.expiresAt},
                  {"iat", c.issuedAt},
                  {"nbf", c.issuedAt},
                  {"iss", kApiAudience},
                  {"sub", serviceAccountName(c.ns, c.serviceAccount)},
                  {"kubernetes.io", k8s}};
  std::string signedPart = strCat(absl::WebSafeBase64Escape(kHeader), ".", absl::WebSafeBase64Escape(payload.dump()));
  return strCat(signedPart, ".", absl::WebSafeBase64Escape(auth::hmacSha256(key_, signedPart)));
}

absl::StatusOr<TokenClaims> TokenIssuer::decode(std::string_view token) const {
  const size_t dot1 = token.find('.');
  const size_t dot2 = dot1 == std::string_view::npos ? dot1 : token.find('.', dot1 + 1);
  if (dot2 == std::string_view::npos || token.find('.', dot2 + 1) != std::string_view::npos) {
    return absl::InvalidArgumentError("the token is not a JWT (three base64url parts separated by dots)");
  }
  std::string signature, payloadText;
  if (!absl::WebSafeBase64Unescape(std::string(token.substr(dot2 + 1)), &signature) ||
      !auth::constantTimeEqual(signature, auth::hmacSha256(key_, token.substr(0, dot2)))) {
    return absl::InvalidArgumentError("the token's signature is not this API server's");
  }
  if (!absl::WebSafeBase64Unescape(std::string(token.substr(dot1 + 1, dot2 - dot1 - 1)), &payloadText)) {
    return absl::InvalidArgumentError("the token's payload is not base64url");
  }
  json p = json::parse(payloadText, nullptr, /*allow_exceptions=*/false);
  const json k8s = p.is_object() ? p.value("kubernetes.io", json::object()) : json();
  if (!k8s.is_object() || !p["exp"].is_number_integer() || !p["iat"].is_number_integer() || !p["aud"].is_array()) {
    return absl::InvalidArgumentError("the token's payload lacks exp, iat, aud or kubernetes.io");
  }
  TokenClaims c;
  c.ns = str(k8s, "namespace");
  const json sa = k8s.value("serviceaccount", json::object());
  const json pod = k8s.value("pod", json::object());
  c.serviceAccount = str(sa, "name");
  c.serviceAccountUid = str(sa, "uid");
  c.podName = str(pod, "name");
  c.podUid = str(pod, "uid");
  c.issuedAt = p["iat"].get<int64_t>();
  c.expiresAt = p["exp"].get<int64_t>();
  for (const json& a : p["aud"]) {
    if (a.is_string()) c.audiences.push_back(a.get<std::string>());
  }
  if (c.ns.empty() || c.serviceAccount.empty()) {
    return absl::InvalidArgumentError("the token names no service account");
  }
  return c;
}

UserInfo authenticate(const http::Request& req, const TokenIssuer& issuer, const Store& store, WallTime now) {
  std::optional<std::string> header = req.header("Authorization");
  if (!header) return adminUser();
  const std::string h(absl::StripAsciiWhitespace(*header));
  const size_t space = h.find(' ');
  if (space == std::string::npos || absl::AsciiStrToLower(h.substr(0, space)) != "bearer") {
    throw unauthorized("only bearer tokens are accepted (Authorization: Bearer <token>)");
  }
  const std::string token(absl::StripAsciiWhitespace(h.substr(space + 1)));
  if (token == kAdminToken) return adminUser();
  absl::StatusOr<TokenClaims> c = issuer.decode(token);
  if (!c.ok()) throw unauthorized(std::string(c.status().message()));
  const std::string who = strCat("service account ", c->ns, "/", c->serviceAccount);
  if (unixSeconds(now) >= c->expiresAt) throw unauthorized(strCat("the token of ", who, " has expired"));
  if (std::find(c->audiences.begin(), c->audiences.end(), kApiAudience) == c->audiences.end()) {
    throw unauthorized(strCat("the token of ", who, " is not meant for this API server (its audiences: ",
                              json(c->audiences).dump(), ")"));
  }
  const json* sa = store.get("/serviceaccounts", c->ns, c->serviceAccount);
  if (sa == nullptr) throw unauthorized(strCat("the token's ", who, " does not exist"));
  if (uidOf(*sa) != c->serviceAccountUid) {
    throw unauthorized(strCat("the token's ", who, " was deleted and created again (uid ", uidOf(*sa),
                              ", the token's ", c->serviceAccountUid, ")"));
  }
  UserInfo user = serviceAccountUser(c->ns, c->serviceAccount, c->serviceAccountUid);
  if (!c->podName.empty()) {
    const json* pod = store.get("/pods", c->ns, c->podName);
    if (pod == nullptr || uidOf(*pod) != c->podUid) {
      throw unauthorized(strCat("the pod ", c->ns, "/", c->podName, " the token of ", who, " is bound to is gone"));
    }
    user.extra = {{"authentication.kubernetes.io/pod-name", {c->podName}},
                  {"authentication.kubernetes.io/pod-uid", {c->podUid}}};
  }
  return user;
}

http::Response tokenRequest(const http::Request& req, const TokenIssuer& issuer, const Store& store, WallTime now,
                            const std::string& ns, const std::string& serviceAccount) {
  json body = requestObject(req, "TokenRequest", "authentication.k8s.io/v1");
  const json* sa = store.get("/serviceaccounts", ns, serviceAccount);
  if (sa == nullptr) throw notFound("serviceaccounts", "", serviceAccount);
  json spec = body.value("spec", json::object());
  if (!spec.is_object()) throw badRequest("the TokenRequest's spec is not an object");
  const json expiration = spec.value("expirationSeconds", json(kDefaultExpirationSeconds));
  if (!expiration.is_number_integer()) {
    throw invalid("TokenRequest", "authentication.k8s.io", serviceAccount,
                  {fieldTypeInvalid("spec.expirationSeconds", expiration, "must be an integer")});
  }
  const int64_t seconds = expiration.get<int64_t>();
  if (seconds < kMinExpirationSeconds || seconds > kMaxExpirationSeconds) {
    throw invalid("TokenRequest", "authentication.k8s.io", serviceAccount,
                  {fieldInvalid("spec.expirationSeconds", seconds,
                                seconds < kMinExpirationSeconds ? "may not specify a duration less than 10 minutes"
                                                                : "may not specify a duration larger than 2^32 seconds")});
  }
  TokenClaims c{.ns = ns, .serviceAccount = serviceAccount, .serviceAccountUid = uidOf(*sa)};
  for (const json& a : spec.value("audiences", json::array())) {
    if (!a.is_string()) throw badRequest("spec.audiences must be a list of strings");
    c.audiences.push_back(a.get<std::string>());
  }
  if (c.audiences.empty()) c.audiences.push_back(std::string(kApiAudience));
  if (const json ref = spec.value("boundObjectRef", json()); ref.is_object()) {
    const std::string kind = str(ref, "kind"), name = str(ref, "name"), uid = str(ref, "uid");
    if (kind != "Pod") {
      throw badRequest(strCat("cannot bind token for serviceaccount \"", serviceAccount, "\" to object of type ",
                              kind.empty() ? "(no kind)" : kind, " (only Pod here)"));
    }
    const json* pod = store.get("/pods", ns, name);
    if (pod == nullptr) throw notFound("pods", "", name);
    if (!uid.empty() && uid != uidOf(*pod)) {
      throw conflict("Pod", "", name,
                     strCat("the UID in the bound object reference (", uid,
                            ") does not match the UID in record. The object might have been deleted and then recreated"));
    }
    c.podName = name;
    c.podUid = uidOf(*pod);
  }
  c.issuedAt = unixSeconds(now);
  c.expiresAt = c.issuedAt + seconds;
  spec["expirationSeconds"] = seconds;
  spec["audiences"] = c.audiences;
  json answer = {{"apiVersion", "authentication.k8s.io/v1"},
                 {"kind", "TokenRequest"},
                 {"metadata", {{"name", serviceAccount}, {"namespace", ns}, {"creationTimestamp", rfc3339(now)}}},
                 {"spec", spec},
                 {"status",
                  {{"token", issuer.issue(c)},
                   {"expirationTimestamp", rfc3339(now + std::chrono::seconds(seconds))}}}};
  return http::Response::json(201, answer);
}

http::Response selfSubjectReview(const http::Request& req, const UserInfo& user) {
  json body = requestObject(req, "SelfSubjectReview", "authentication.k8s.io/v1");
  json info = {{"username", user.name}, {"groups", user.groups}};
  if (!user.uid.empty()) info["uid"] = user.uid;
  if (!user.extra.empty()) info["extra"] = user.extra;
  json answer = {{"apiVersion", "authentication.k8s.io/v1"},
                 {"kind", "SelfSubjectReview"},
                 {"metadata", body.value("metadata", json::object())},
                 {"status", {{"userInfo", info}}}};
  answer["metadata"]["creationTimestamp"] = nullptr;
  return http::Response::json(201, answer);
}

}  // namespace tandem::apiserver
