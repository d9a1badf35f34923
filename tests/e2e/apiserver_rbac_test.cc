// The emulator's authentication and RBAC (e2e/apiserver/authn.h, rbac.h):
//   - pure: the verb and attributes kube-apiserver derives from each kind of
//     request, and RBAC's decision over Roles and bindings in a Store;
//   - in process on a FakeClock through src/k8s's client: service-account
//     tokens valid, tampered, expired, for a deleted or recreated
//     ServiceAccount, for a deleted pod; TokenRequest's bad inputs;
//   - the real kubectl over TLS (kubectl sends a bearer token only over
//     https): `create token`, get/delete/auth can-i/auth whoami with a
//     service account's token, the 403 wording, escalation refused, the
//     admin unaffected.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "e2e/apiserver/api_server.h"
#include "e2e/apiserver/authn.h"
#include "e2e/apiserver/json_util.h"
#include "e2e/apiserver/rbac.h"
#include "src/k8s/client.h"
#include "src/common/strings.h"
#include "tests/e2e/apiserver_fixture.h"
#include "tests/testing/quiet_logs.h"

namespace tandem::apiserver {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

k8s::ResourceRef serviceAccounts() { return {"", "v1", "serviceaccounts", true}; }

http::Request request(const std::string& method, const std::string& path, http::QueryParams query = {},
                      const std::string& body = "", const std::string& contentType = "application/json") {
  http::Headers headers;
  if (!body.empty()) headers["Content-Type"] = contentType;
  return http::Request(method, path, std::move(query), std::move(headers), body,
                       std::make_shared<http::CallContext>(MonoTime::max()));
}

std::string attrs(const std::string& method, const std::string& path, http::QueryParams query = {}) {
  const RequestAttributes a = requestAttributes(request(method, path, std::move(query)));
  if (!a.resourceRequest) return strCat(a.verb, " path ", a.path);
  return strCat(a.verb, " ", a.apiGroup.empty() ? "core" : a.apiGroup, "/", a.apiVersion, " ", a.resource,
                a.subresource.empty() ? "" : "/" + a.subresource, " ns=", a.ns, " name=", a.name);
}

TEST(RbacAttributesTest, VerbsAndAttributesAreKubeApiserversOwn) {
  const std::string pods = "/api/v1/namespaces/ns/pods";
  EXPECT_EQ(attrs("GET", pods + "/p"), "get core/v1 pods ns=ns name=p");
  EXPECT_EQ(attrs("GET", pods), "list core/v1 pods ns=ns name=");
  EXPECT_EQ(attrs("GET", pods, {{"watch", "true"}}), "watch core/v1 pods ns=ns name=");
  EXPECT_EQ(attrs("GET", pods, {{"watch", "1"}}), "watch core/v1 pods ns=ns name=");
  EXPECT_EQ(attrs("GET", pods, {{"fieldSelector", "metadata.name=p"}}), "list core/v1 pods ns=ns name=p")
      << "a list pinned to one name carries it (resourceNames rules apply)";
  EXPECT_EQ(attrs("GET", pods, {{"watch", "true"}, {"fieldSelector", "status.phase=Running,metadata.name==p"}}),
            "watch core/v1 pods ns=ns name=p");
  EXPECT_EQ(attrs("GET", "/api/v1/pods"), "list core/v1 pods ns= name=");
  EXPECT_EQ(attrs("POST", pods), "create core/v1 pods ns=ns name=");
  EXPECT_EQ(attrs("PUT", pods + "/p"), "update core/v1 pods ns=ns name=p");
  EXPECT_EQ(attrs("PATCH", pods + "/p"), "patch core/v1 pods ns=ns name=p") << "server-side apply is a PATCH too";
  EXPECT_EQ(attrs("DELETE", pods + "/p"), "delete core/v1 pods ns=ns name=p");
  EXPECT_EQ(attrs("DELETE", pods), "deletecollection core/v1 pods ns=ns name=");
  EXPECT_EQ(attrs("GET", pods + "/p/log"), "get core/v1 pods/log ns=ns name=p");
  EXPECT_EQ(attrs("PUT", "/apis/serving.tandem.dev/v1alpha1/namespaces/ns/inferencepools/x/status"),
            "update serving.tandem.dev/v1alpha1 inferencepools/status ns=ns name=x");
  EXPECT_EQ(attrs("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale"),
            "patch apps/v1 deployments/scale ns=ns name=d");
  EXPECT_EQ(attrs("POST", "/api/v1/namespaces/ns/serviceaccounts/sa/token"),
            "create core/v1 serviceaccounts/token ns=ns name=sa");
  EXPECT_EQ(attrs("GET", "/api/v1/namespaces/ns"), "get core/v1 namespaces ns=ns name=ns")
      << "a namespace is in itself, as kube-apiserver has it";
  EXPECT_EQ(attrs("GET", "/api/v1/namespaces"), "list core/v1 namespaces ns= name=");
  EXPECT_EQ(attrs("GET", "/api/v1/watch/namespaces/ns/pods"), "watch core/v1 pods ns=ns name=");
  EXPECT_EQ(attrs("GET", "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"),
            "list discovery.k8s.io/v1 endpointslices ns=ns name=");
  for (const char* path : {"/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1", "/version", "/openapi/v3"}) {
    EXPECT_EQ(attrs("GET", path), strCat("get path ", path)) << "discovery is not a resource request";
  }
  EXPECT_EQ(attrs("PUT", "/tandem/faults"), "put path /tandem/faults");
}

class RbacDecisionTest : public ::testing::Test {
 protected:
  void add(const std::string& yaml) {
    json o = yamlToJson(yaml);
    const std::string kind = o["kind"];
    const std::string plural = kind == "Role"               ? "roles"
                               : kind == "ClusterRole"      ? "clusterroles"
                               : kind == "RoleBinding"      ? "rolebindings"
                                                            : "clusterrolebindings";
    store_.put(strCat("rbac.authorization.k8s.io/", plural), o);
  }
  Decision can(const std::string& method, const std::string& path, http::QueryParams query = {},
               const UserInfo& user = serviceAccountUser("ns", "agent", "u1")) {
    return authorize(store_, user, requestAttributes(request(method, path, std::move(query))));
  }
  bool allowed(const std::string& method, const std::string& path, http::QueryParams query = {}) {
    return can(method, path, std::move(query)).allowed;
  }

  Store store_{100};
};

TEST_F(RbacDecisionTest, NothingIsAllowedWithoutABindingButDiscoveryAndSelfReviews) {
  EXPECT_FALSE(allowed("GET", "/api/v1/namespaces/ns/pods"));
  EXPECT_FALSE(allowed("GET", "/api/v1/namespaces/ns/pods/p"));
  EXPECT_FALSE(allowed("PUT", "/tandem/faults"));
  for (const char* path : {"/api", "/api/v1", "/apis", "/apis/apps/v1", "/version", "/openapi/v3", "/healthz"}) {
    EXPECT_TRUE(allowed("GET", path)) << path;
  }
  EXPECT_TRUE(allowed("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"));
  EXPECT_TRUE(allowed("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews"));
  EXPECT_TRUE(can("DELETE", "/api/v1/namespaces/ns/pods", {}, adminUser()).allowed) << "system:masters may do anything";
}

TEST_F(RbacDecisionTest, ARoleBindingGrantsItsRolesRulesInItsNamespaceOnly) {
  add(R"({kind: Role, metadata: {name: discovery, namespace: ns},
          rules: [{apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}]})");
  EXPECT_FALSE(allowed("GET", "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices")) << "not bound yet";
  add(R"({kind: RoleBinding, metadata: {name: discovery, namespace: ns},
          roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: discovery},
          subjects: [{kind: ServiceAccount, name: agent, namespace: ns}]})");
  const Decision d = can("GET", "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.reason, "RBAC: allowed by RoleBinding \"discovery\" of Role \"discovery\" to ServiceAccount \"agent/ns\"");
  EXPECT_TRUE(allowed("GET", "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices", {{"watch", "true"}}));
  EXPECT_TRUE(allowed("GET", "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices/s"));
  EXPECT_FALSE(allowed("DELETE", "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices/s")) << "verb not granted";
  EXPECT_FALSE(allowed("GET", "/apis/discovery.k8s.io/v1/namespaces/other/endpointslices")) << "another namespace";
  EXPECT_FALSE(allowed("GET", "/apis/discovery.k8s.io/v1/endpointslices")) << "across namespaces";
  EXPECT_FALSE(allowed("GET", "/apis/other.k8s.io/v1/namespaces/ns/endpointslices")) << "another group";
  EXPECT_FALSE(can("GET", "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices", {},
                   serviceAccountUser("ns", "someone-else", "u2"))
                   .allowed)
      << "another service account";
}

TEST_F(RbacDecisionTest, SubjectsByUserGroupAndServiceAccountWithoutNamespace) {
  add(R"({kind: ClusterRole, metadata: {name: reader}, rules: [{apiGroups: [""], resources: [configmaps], verbs: [get]}]})");
  add(R"({kind: RoleBinding, metadata: {name: by-group, namespace: ns},
          roleRef: {kind: ClusterRole, name: reader}, subjects: [{kind: Group, name: "system:serviceaccounts:ns"}]})");
  EXPECT_TRUE(allowed("GET", "/api/v1/namespaces/ns/configmaps/c")) << "a RoleBinding to a ClusterRole, by group";
  EXPECT_FALSE(allowed("GET", "/api/v1/namespaces/other/configmaps/c"));
  add(R"({kind: RoleBinding, metadata: {name: by-sa, namespace: other},
          roleRef: {kind: ClusterRole, name: reader}, subjects: [{kind: ServiceAccount, name: agent}]})");
  EXPECT_FALSE(allowed("GET", "/api/v1/namespaces/other/configmaps/c"))
      << "a subject without namespace is of the binding's namespace: other:agent, not ns:agent";
  add(R"({kind: ClusterRoleBinding, metadata: {name: by-user},
          roleRef: {kind: ClusterRole, name: reader}, subjects: [{kind: User, name: "system:serviceaccount:ns:agent"}]})");
  EXPECT_TRUE(allowed("GET", "/api/v1/namespaces/other/configmaps/c")) << "a ClusterRoleBinding grants everywhere";
  EXPECT_TRUE(allowed("GET", "/api/v1/configmaps", {{"fieldSelector", "metadata.name=c"}}) == false)
      << "get does not grant list";
}

TEST_F(RbacDecisionTest, ResourceNamesSubresourcesAndWildcards) {
  add(R"({kind: Role, metadata: {name: r, namespace: ns}, rules: [
          {apiGroups: [""], resources: [configmaps], resourceNames: [allowed], verbs: [get, list, watch, create, update]},
          {apiGroups: [serving.tandem.dev], resources: [inferencepools/status], verbs: [update, patch]},
          {apiGroups: ["*"], resources: ["*/scale"], verbs: [patch]},
          {apiGroups: [apps], resources: ["*"], verbs: ["*"], resourceNames: [web]}]})");
  add(R"({kind: RoleBinding, metadata: {name: r, namespace: ns}, roleRef: {kind: Role, name: r},
          subjects: [{kind: ServiceAccount, name: agent, namespace: ns}]})");
  const std::string cms = "/api/v1/namespaces/ns/configmaps";
  EXPECT_TRUE(allowed("GET", cms + "/allowed"));
  EXPECT_FALSE(allowed("GET", cms + "/other")) << "another name";
  EXPECT_FALSE(allowed("GET", cms)) << "an unnamed list is not one of the names";
  EXPECT_TRUE(allowed("GET", cms, {{"fieldSelector", "metadata.name=allowed"}})) << "a list pinned to the name is";
  EXPECT_TRUE(allowed("GET", cms, {{"watch", "true"}, {"fieldSelector", "metadata.name=allowed"}}));
  EXPECT_FALSE(allowed("POST", cms)) << "a create has no name: a rule with resourceNames never matches it";
  const std::string pools = "/apis/serving.tandem.dev/v1alpha1/namespaces/ns/inferencepools/x";
  EXPECT_TRUE(allowed("PATCH", pools + "/status"));
  EXPECT_FALSE(allowed("PATCH", pools)) << "the subresource does not grant the object";
  EXPECT_FALSE(allowed("GET", pools + "/status")) << "verb";
  EXPECT_TRUE(allowed("PATCH", "/apis/apps/v1/namespaces/ns/deployments/any/scale")) << "*/scale";
  EXPECT_TRUE(allowed("PATCH", "/apis/serving.tandem.dev/v1alpha1/namespaces/ns/inferencepools/x/scale"));
  EXPECT_FALSE(allowed("PUT", "/apis/apps/v1/namespaces/ns/deployments/any/scale"));
  EXPECT_TRUE(allowed("DELETE", "/apis/apps/v1/namespaces/ns/deployments/web"));
  EXPECT_TRUE(allowed("GET", "/apis/apps/v1/namespaces/ns/replicasets/web/status")) << "* covers subresources";
  EXPECT_FALSE(allowed("DELETE", "/apis/apps/v1/namespaces/ns/deployments/other"));
  EXPECT_FALSE(allowed("GET", "/api/v1/namespaces/ns/pods/web")) << "apps/* is not core";
}

TEST_F(RbacDecisionTest, NonResourceUrls) {
  add(R"({kind: ClusterRole, metadata: {name: metrics}, rules: [
          {nonResourceURLs: ["/metrics", "/tandem/*"], verbs: [get]}]})");
  add(R"({kind: ClusterRoleBinding, metadata: {name: metrics}, roleRef: {kind: ClusterRole, name: metrics},
          subjects: [{kind: ServiceAccount, name: agent, namespace: ns}]})");
  EXPECT_TRUE(allowed("GET", "/metrics"));
  EXPECT_TRUE(allowed("GET", "/tandem/faults")) << "prefix with *";
  EXPECT_FALSE(allowed("PUT", "/tandem/faults")) << "verb";
  EXPECT_FALSE(allowed("GET", "/metricsx"));
}

TEST_F(RbacDecisionTest, ABindingWhoseRoleIsMissingGrantsNothingAndSaysSo) {
  add(R"({kind: RoleBinding, metadata: {name: dangling, namespace: ns}, roleRef: {kind: Role, name: missing},
          subjects: [{kind: ServiceAccount, name: agent, namespace: ns}]})");
  add(R"({kind: ClusterRoleBinding, metadata: {name: dangling}, roleRef: {kind: ClusterRole, name: gone},
          subjects: [{kind: Group, name: "system:serviceaccounts"}]})");
  const Decision d = can("GET", "/api/v1/namespaces/ns/pods");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason,
            "RBAC: [clusterrole.rbac.authorization.k8s.io \"gone\" not found, role.rbac.authorization.k8s.io \"missing\" "
            "not found]");
  add(R"({kind: ClusterRoleBinding, metadata: {name: to-a-role}, roleRef: {kind: Role, name: r},
          subjects: [{kind: ServiceAccount, name: agent, namespace: ns}]})");
  add(R"({kind: Role, metadata: {name: r, namespace: ns}, rules: [{apiGroups: [""], resources: [pods], verbs: [list]}]})");
  EXPECT_FALSE(can("GET", "/api/v1/pods").allowed) << "a ClusterRoleBinding cannot grant a Role";
  EXPECT_THAT(can("GET", "/api/v1/pods").reason,
              HasSubstr("ClusterRoleBinding \"to-a-role\" refers to a Role (only a ClusterRole can be)"));
}

TEST_F(RbacDecisionTest, TheForbiddenMessageIsKubeApiserversWording) {
  const UserInfo sa = serviceAccountUser("ns", "agent", "u1");
  auto message = [&](const std::string& method, const std::string& path, const std::string& reason = "") {
    ApiError e = forbiddenError(sa, requestAttributes(request(method, path)), reason);
    EXPECT_EQ(e.code(), 403);
    EXPECT_EQ(e.reason(), "Forbidden");
    return e.message();
  };
  EXPECT_EQ(message("GET", "/apis/apps/v1/namespaces/ns/deployments/web"),
            "deployments.apps \"web\" is forbidden: User \"system:serviceaccount:ns:agent\" cannot get resource "
            "\"deployments\" in API group \"apps\" in the namespace \"ns\"");
  EXPECT_EQ(message("GET", "/api/v1/namespaces/ns/pods"),
            "pods is forbidden: User \"system:serviceaccount:ns:agent\" cannot list resource \"pods\" in API group "
            "\"\" in the namespace \"ns\"");
  EXPECT_EQ(message("GET", "/api/v1/nodes"),
            "nodes is forbidden: User \"system:serviceaccount:ns:agent\" cannot list resource \"nodes\" in API group "
            "\"\" at the cluster scope");
  EXPECT_EQ(message("GET", "/api/v1/namespaces/ns/pods/p/log", "RBAC: role.rbac.authorization.k8s.io \"x\" not found"),
            "pods \"p\" is forbidden: User \"system:serviceaccount:ns:agent\" cannot get resource \"pods/log\" in API "
            "group \"\" in the namespace \"ns\": RBAC: role.rbac.authorization.k8s.io \"x\" not found");
  EXPECT_EQ(message("PUT", "/tandem/faults"),
            "forbidden: User \"system:serviceaccount:ns:agent\" cannot put path \"/tandem/faults\"");
}

TEST_F(RbacDecisionTest, EscalationNeedsThePermissionsOrTheEscalateAndBindVerbs) {
  add(R"({kind: Role, metadata: {name: operator, namespace: ns}, rules: [
          {apiGroups: [rbac.authorization.k8s.io], resources: [roles, rolebindings], verbs: [create, update, patch]},
          {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list]}]})");
  add(R"({kind: RoleBinding, metadata: {name: operator, namespace: ns}, roleRef: {kind: Role, name: operator},
          subjects: [{kind: ServiceAccount, name: agent, namespace: ns}]})");
  const UserInfo sa = serviceAccountUser("ns", "agent", "u1");
  auto write = [&](const std::string& method, const std::string& path, const std::string& body,
                   const std::string& type = "application/json") {
    const http::Request req = request(method, path, {}, body, type);
    checkEscalation(store_, sa, requestAttributes(req), req);
  };
  const std::string roles = "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/roles";
  const std::string held = R"({"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"d"},
      "rules":[{"apiGroups":["discovery.k8s.io"],"resources":["endpointslices"],"verbs":["get","list"]}]})";
  EXPECT_NO_THROW(write("POST", roles, held)) << "every permission it grants is held";
  const std::string more = R"({"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"d"},
      "rules":[{"apiGroups":["discovery.k8s.io"],"resources":["endpointslices"],"verbs":["get","watch"]}]})";
  try {
    write("POST", roles, more);
    ADD_FAILURE() << "a Role granting watch was created by a user who cannot watch";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 403);
    EXPECT_EQ(e.message(),
              "roles.rbac.authorization.k8s.io \"d\" is forbidden: user \"system:serviceaccount:ns:agent\" "
              "(groups=[\"system:serviceaccounts\" \"system:serviceaccounts:ns\" \"system:authenticated\"]) is "
              "attempting to grant RBAC permissions not currently held:\n"
              "{APIGroups:[\"discovery.k8s.io\"], Resources:[\"endpointslices\"], Verbs:[\"watch\"]}");
  }
  EXPECT_THROW(write("PATCH", roles + "/d", more, "application/apply-patch+yaml"), ApiError) << "server-side apply";
  store_.put("rbac.authorization.k8s.io/roles", yamlToJson(R"({kind: Role, metadata: {name: d, namespace: ns},
      rules: [{apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get]}]})"));
  EXPECT_THROW(write("PATCH", roles + "/d", R"({"rules":[{"apiGroups":["*"],"resources":["*"],"verbs":["*"]}]})",
                     "application/merge-patch+json"),
               ApiError)
      << "a merge patch is applied to the stored Role first";
  const std::string bindings = "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/rolebindings";
  EXPECT_NO_THROW(write("POST", bindings, R"({"kind":"RoleBinding","metadata":{"name":"b"},
      "roleRef":{"kind":"Role","name":"d"},"subjects":[{"kind":"ServiceAccount","name":"x"}]})"));
  add(R"({kind: Role, metadata: {name: admin, namespace: ns}, rules: [{apiGroups: ["*"], resources: ["*"], verbs: ["*"]}]})");
  const std::string toAdmin = R"({"kind":"RoleBinding","metadata":{"name":"b"},
      "roleRef":{"kind":"Role","name":"admin"},"subjects":[{"kind":"ServiceAccount","name":"x"}]})";
  EXPECT_THROW(write("POST", bindings, toAdmin), ApiError) << "binding a role whose permissions are not held";
  try {
    write("POST", bindings, R"({"kind":"RoleBinding","metadata":{"name":"b"},"roleRef":{"kind":"Role","name":"nope"}})");
    ADD_FAILURE() << "a binding to a missing role was let through";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 404);
    EXPECT_EQ(e.message(), "role.rbac.authorization.k8s.io \"nope\" not found");
  }
  add(R"({kind: Role, metadata: {name: binder, namespace: ns}, rules: [
          {apiGroups: [rbac.authorization.k8s.io], resources: [roles], resourceNames: [admin], verbs: [bind]},
          {apiGroups: [rbac.authorization.k8s.io], resources: [roles], verbs: [escalate]}]})");
  add(R"({kind: RoleBinding, metadata: {name: binder, namespace: ns}, roleRef: {kind: Role, name: binder},
          subjects: [{kind: ServiceAccount, name: agent, namespace: ns}]})");
  EXPECT_NO_THROW(write("POST", bindings, toAdmin)) << "bind on that role";
  EXPECT_NO_THROW(write("POST", roles, more)) << "escalate on roles";
  EXPECT_NO_THROW(checkEscalation(store_, adminUser(), requestAttributes(request("POST", roles, {}, more)),
                                  request("POST", roles, {}, more)));
}

// In process, on a FakeClock: the tokens.
class ApiServerTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = ApiServer::start({.port = 0}, clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    admin_ = client("");
    ASSERT_TRUE(admin_->create(serviceAccounts(), "default", sa("agent")).ok());
    ASSERT_TRUE(admin_->create(k8s::configMapsResource(), "default", {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
                                                                      {"metadata", {{"name", "c"}}}})
                    .ok());
    ASSERT_TRUE(admin_->apply(k8s::ResourceRef{"rbac.authorization.k8s.io", "v1", "roles", true}, "default",
                              yamlToJson(R"({apiVersion: rbac.authorization.k8s.io/v1, kind: Role, metadata: {name: r},
                                 rules: [{apiGroups: [""], resources: [configmaps], verbs: [get]}]})"),
                              {.fieldManager = "test"})
                    .ok());
    ASSERT_TRUE(admin_->apply(k8s::ResourceRef{"rbac.authorization.k8s.io", "v1", "rolebindings", true}, "default",
                              yamlToJson(R"({apiVersion: rbac.authorization.k8s.io/v1, kind: RoleBinding,
                                 metadata: {name: r}, roleRef: {kind: Role, name: r},
                                 subjects: [{kind: ServiceAccount, name: agent, namespace: default}]})"),
                              {.fieldManager = "test"})
                    .ok());
  }

  static json sa(const std::string& name) {
    return {{"apiVersion", "v1"}, {"kind", "ServiceAccount"}, {"metadata", {{"name", name}}}};
  }
  std::unique_ptr<k8s::Client> client(const std::string& token) {
    auto c = k8s::Client::create({.server = server_->baseUrl(), .token = token});
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }
  absl::StatusOr<json> tokenRequest(const std::string& name, json spec = json::object(), const std::string& ns = "default") {
    return admin_->send({.method = "POST",
                         .path = strCat("/api/v1/namespaces/", ns, "/serviceaccounts/", name, "/token"),
                         .contentType = "application/json",
                         .body = json{{"apiVersion", "authentication.k8s.io/v1"}, {"kind", "TokenRequest"}, {"spec", spec}}
                                     .dump()});
  }
  std::string token(const std::string& name, json spec = json::object()) {
    auto r = tokenRequest(name, std::move(spec));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)["status"].value("token", "") : "";
  }
  // The status of reading the ConfigMap the Role grants with `token`.
  absl::Status read(const std::string& token) { return client(token)->get(k8s::configMapsResource(), "default", "c").status(); }

  FakeClock clock_;
  std::unique_ptr<ApiServer> server_;
  std::unique_ptr<k8s::Client> admin_;
};

TEST_F(ApiServerTokenTest, AValidTokenIsItsServiceAccountWithItsRolesPermissions) {
  auto r = tokenRequest("agent");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["kind"], "TokenRequest");
  EXPECT_EQ((*r)["spec"]["expirationSeconds"], 3600) << "the default life";
  EXPECT_EQ((*r)["spec"]["audiences"], json::array({"https://kubernetes.default.svc.cluster.local"}));
  EXPECT_EQ((*r)["status"]["expirationTimestamp"], rfc3339(clock_.wallNow() + std::chrono::hours(1)));
  const std::string t = (*r)["status"]["token"];
  EXPECT_TRUE(read(t).ok()) << read(t);
  auto denied = client(t)->get(k8s::secretsResource(), "default", "s");
  EXPECT_TRUE(absl::IsPermissionDenied(denied.status())) << denied.status();
  EXPECT_THAT(denied.status().message(), HasSubstr("User \"system:serviceaccount:default:agent\" cannot get resource "
                                                   "\"secrets\" in API group \"\" in the namespace \"default\""));
  EXPECT_TRUE(client("")->get(k8s::secretsResource(), "default", "s").status().code() == absl::StatusCode::kNotFound)
      << "no credentials: the admin, as before";
  EXPECT_TRUE(absl::IsNotFound(client("tandem-local-admin")->get(k8s::secretsResource(), "default", "s").status()));
}

// Server-side apply is a patch; one that creates the object is a create too,
// as kube-apiserver authorizes it (the operator's RBAC lists both).
TEST_F(ApiServerTokenTest, AnApplyThatCreatesNeedsCreateAndOneThatUpdatesOnlyPatch) {
  ASSERT_TRUE(admin_->apply(k8s::ResourceRef{"rbac.authorization.k8s.io", "v1", "roles", true}, "default",
                            yamlToJson(R"({apiVersion: rbac.authorization.k8s.io/v1, kind: Role, metadata: {name: r},
                               rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, patch]}]})"),
                            {.fieldManager = "test"})
                  .ok());
  auto writer = client(token("agent"));
  auto cm = [](const std::string& name) {
    return json{{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", name}}}, {"data", {{"k", "v"}}}};
  };
  // "c" exists: patch is enough.
  auto updated = writer->apply(k8s::configMapsResource(), "default", cm("c"), {.fieldManager = "agent"});
  EXPECT_TRUE(updated.ok()) << updated.status();
  // "new" does not: the apply would create it, and create is not granted.
  auto created = writer->apply(k8s::configMapsResource(), "default", cm("new"), {.fieldManager = "agent"});
  EXPECT_TRUE(absl::IsPermissionDenied(created.status())) << created.status();
  EXPECT_THAT(created.status().message(), HasSubstr("cannot create resource \"configmaps\""));
  EXPECT_TRUE(absl::IsNotFound(admin_->get(k8s::configMapsResource(), "default", "new").status()));
  ASSERT_TRUE(admin_->apply(k8s::ResourceRef{"rbac.authorization.k8s.io", "v1", "roles", true}, "default",
                            yamlToJson(R"({apiVersion: rbac.authorization.k8s.io/v1, kind: Role, metadata: {name: r},
                               rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, patch, create]}]})"),
                            {.fieldManager = "test"})
                  .ok());
  created = writer->apply(k8s::configMapsResource(), "default", cm("new"), {.fieldManager = "agent"});
  EXPECT_TRUE(created.ok()) << created.status();
}

TEST_F(ApiServerTokenTest, TamperedMalformedAndForeignTokensAre401) {
  const std::string t = token("agent");
  ASSERT_FALSE(t.empty());
  std::string tampered = t;
  tampered[tampered.find('.') + 5] ^= 1;  // a byte of the payload
  for (const auto& [bad, why] : std::vector<std::pair<std::string, std::string>>{
           {tampered, "the token's signature is not this API server's"},
           {t.substr(0, t.size() - 2), "the token's signature is not this API server's"},
           {"tandem-local:default:agent", "the token is not a JWT (three base64url parts separated by dots)"},
           {"a.b.c.d", "the token is not a JWT (three base64url parts separated by dots)"}}) {
    absl::Status s = read(bad);
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << bad << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(why)) << bad;
  }
  // A token another emulator (another key) issued.
  TokenIssuer other(std::string(32, 'k'));
  absl::Status s = read(other.issue({.ns = "default", .serviceAccount = "agent", .audiences = {std::string(kApiAudience)},
                                     .expiresAt = 4102444800}));
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  auto basic = admin_->send({.method = "GET", .path = "/api/v1/namespaces/default/configmaps/c"});
  EXPECT_TRUE(basic.ok()) << basic.status();
}

TEST_F(ApiServerTokenTest, AnExpiredTokenIs401) {
  const std::string t = token("agent", {{"expirationSeconds", 600}});
  clock_.advance(std::chrono::seconds(599));
  EXPECT_TRUE(read(t).ok()) << read(t);
  clock_.advance(std::chrono::seconds(1));
  absl::Status s = read(t);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("the token of service account default/agent has expired"));
}

TEST_F(ApiServerTokenTest, ATokenDiesWithItsServiceAccountAndItsPod) {
  const std::string t = token("agent");
  ASSERT_TRUE(admin_->remove(serviceAccounts(), "default", "agent").ok());
  absl::Status s = read(t);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("the token's service account default/agent does not exist"));
  ASSERT_TRUE(admin_->create(serviceAccounts(), "default", sa("agent")).ok());
  s = read(t);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("was deleted and created again"));
  EXPECT_TRUE(read(token("agent")).ok()) << "a new token for the new ServiceAccount works";

  auto pod = admin_->create(k8s::podsResource(), "default",
                            {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", {{"name", "p"}}},
                             {"spec", {{"containers", {{{"name", "c"}, {"image", "tandem"}}}}}}});
  ASSERT_TRUE(pod.ok()) << pod.status();
  const std::string bound = token("agent", {{"boundObjectRef", {{"kind", "Pod"}, {"apiVersion", "v1"}, {"name", "p"},
                                                                {"uid", (*pod)["metadata"]["uid"]}}}});
  EXPECT_TRUE(read(bound).ok());
  ASSERT_TRUE(admin_->remove(k8s::podsResource(), "default", "p").ok());
  s = read(bound);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("the pod default/p the token of service account default/agent is bound to is gone"));
}

TEST_F(ApiServerTokenTest, EachBadTokenRequestIsRefusedNamingWhatIsWrong) {
  auto missing = tokenRequest("nobody");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("serviceaccounts \"nobody\" not found"));
  auto shortLived = tokenRequest("agent", {{"expirationSeconds", 599}});
  EXPECT_TRUE(absl::IsInvalidArgument(shortLived.status())) << shortLived.status();
  EXPECT_THAT(shortLived.status().message(), HasSubstr("may not specify a duration less than 10 minutes"));
  auto notPod = tokenRequest("agent", {{"boundObjectRef", {{"kind", "Node"}, {"name", "n"}}}});
  EXPECT_THAT(notPod.status().message(), HasSubstr("cannot bind token for serviceaccount \"agent\" to object of type Node"));
  auto noPod = tokenRequest("agent", {{"boundObjectRef", {{"kind", "Pod"}, {"name", "gone"}}}});
  EXPECT_TRUE(absl::IsNotFound(noPod.status())) << noPod.status();
  auto otherAudience = token("agent", {{"audiences", {"vault"}}});
  absl::Status s = read(otherAudience);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("is not meant for this API server"));
  // A service account cannot mint tokens for another one unless granted serviceaccounts/token create.
  auto minted = client(token("agent"))->send({.method = "POST",
                                              .path = "/api/v1/namespaces/default/serviceaccounts/default/token",
                                              .contentType = "application/json",
                                              .body = "{}"});
  EXPECT_TRUE(absl::IsPermissionDenied(minted.status())) << minted.status();
}

TEST_F(ApiServerTokenTest, AnInClusterClientReadsItsTokenFromTheFileTheKubeletRotates) {
  char dir[] = "/tmp/tandem-token-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string file = std::string(dir) + "/token";
  std::ofstream(file) << token("agent") << "\n";
  auto c = k8s::Client::create({.server = server_->baseUrl(), .token = "an-old-token", .tokenFile = file});
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = (*c)->get(k8s::configMapsResource(), "default", "c");
  EXPECT_TRUE(r.ok()) << "the file's token, not the one read at start: " << r.status();
  std::filesystem::remove_all(dir);
}

TEST_F(ApiServerTokenTest, EveryNamespaceHasADefaultServiceAccount) {
  ASSERT_TRUE(admin_->create(k8s::namespacesResource(), "", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                                             {"metadata", {{"name", "fresh"}}}})
                  .ok());
  auto d = admin_->get(serviceAccounts(), "fresh", "default");
  ASSERT_TRUE(d.ok()) << d.status();
  for (const char* ns : {"default", "kube-system"}) {
    EXPECT_TRUE(admin_->get(serviceAccounts(), ns, "default").ok()) << ns;
  }
  ASSERT_TRUE(admin_->remove(serviceAccounts(), "fresh", "default").ok());
  auto again = admin_->get(serviceAccounts(), "fresh", "default");
  ASSERT_TRUE(again.ok()) << "made again, as kube-controller-manager does: " << again.status();
  EXPECT_NE((*again)["metadata"]["uid"], (*d)["metadata"]["uid"]);
  ASSERT_TRUE(admin_->remove(k8s::namespacesResource(), "", "fresh").ok());
  EXPECT_TRUE(absl::IsNotFound(admin_->get(k8s::namespacesResource(), "", "fresh").status()))
      << "a deleted namespace is not held up by its default ServiceAccount";
}

// The real kubectl, over TLS (kubectl sends bearer tokens only over https).
class KubectlRbacTest : public e2e::ApiServerFixture {
 protected:
  std::vector<std::string> extraArgs() const override { return tlsArgs("IP:127.0.0.1"); }
  e2e::CommandResult as(const std::string& token, const std::string& args) const {
    return kubectl("--token " + token + " " + args);
  }
};

TEST_F(KubectlRbacTest, APodsTokenIsAllowedWhatItsRoleGrantsAndRefusedTheRest) {
  const std::string objects = writeTemp("rbac.yaml", R"(apiVersion: v1
kind: ServiceAccount
metadata: {name: agent, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: discovery, namespace: default}
rules: [{apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: discovery, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: discovery}
subjects: [{kind: ServiceAccount, name: agent, namespace: default}]
)");
  ASSERT_EQ(kubectl("apply -f " + objects).rc, 0);
  auto created = kubectl("create token agent --duration 20m");
  ASSERT_EQ(created.rc, 0) << created.output;
  const std::string token = created.output.substr(0, created.output.find_first_of("\r\n"));

  auto list = as(token, "get endpointslices");
  EXPECT_EQ(list.rc, 0) << list.output;
  auto yes = as(token, "auth can-i watch endpointslices.discovery.k8s.io");
  EXPECT_EQ(yes.rc, 0) << yes.output;
  EXPECT_THAT(yes.output, HasSubstr("yes"));
  auto no = as(token, "auth can-i delete endpointslices.discovery.k8s.io");
  EXPECT_NE(no.rc, 0) << no.output;
  EXPECT_THAT(no.output, HasSubstr("no"));
  auto pods = as(token, "get pods");
  EXPECT_NE(pods.rc, 0);
  EXPECT_THAT(pods.output, HasSubstr("Error from server (Forbidden): pods is forbidden: User "
                                     "\"system:serviceaccount:default:agent\" cannot list resource \"pods\" in API "
                                     "group \"\" in the namespace \"default\""));
  auto whoami = as(token, "auth whoami");
  EXPECT_EQ(whoami.rc, 0) << whoami.output;
  EXPECT_THAT(whoami.output, HasSubstr("system:serviceaccount:default:agent"));
  EXPECT_THAT(whoami.output, HasSubstr("system:serviceaccounts:default"));
  auto escalate = as(token, "create role more --verb=delete --resource=endpointslices.discovery.k8s.io");
  EXPECT_NE(escalate.rc, 0) << escalate.output;
  EXPECT_THAT(escalate.output, HasSubstr("cannot create resource \"roles\""));

  auto bad = as("not-a-token", "get endpointslices");
  EXPECT_NE(bad.rc, 0);
  EXPECT_THAT(bad.output, HasSubstr("Unauthorized"));

  ASSERT_EQ(kubectl("delete sa agent").rc, 0);
  auto gone = as(token, "get endpointslices");
  EXPECT_NE(gone.rc, 0);
  EXPECT_THAT(gone.output, HasSubstr("Unauthorized: the token's service account default/agent does not exist"));
  auto missing = kubectl("create token agent");
  EXPECT_NE(missing.rc, 0);
  EXPECT_THAT(missing.output, HasSubstr("serviceaccounts \"agent\" not found"));
}

TEST_F(KubectlRbacTest, TheAdminIsUnaffected) {
  auto whoami = kubectl("auth whoami");
  EXPECT_EQ(whoami.rc, 0) << whoami.output;
  EXPECT_THAT(whoami.output, HasSubstr("system:masters"));
  EXPECT_EQ(kubectl("auth can-i '*' '*' --all-namespaces").rc, 0);
  auto sa = kubectl("get serviceaccount default -o name");
  EXPECT_EQ(sa.rc, 0) << sa.output;
  EXPECT_THAT(sa.output, HasSubstr("serviceaccount/default"));
  EXPECT_EQ(kubectl("create configmap c --from-literal=a=b").rc, 0);
  EXPECT_EQ(kubectl("delete configmap c").rc, 0);
}

}  // namespace
}  // namespace tandem::apiserver
