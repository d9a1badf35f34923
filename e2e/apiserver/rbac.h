#pragma once
// The emulator's authorization: Kubernetes' RBAC over the Roles,
// ClusterRoles, RoleBindings and ClusterRoleBindings in the store, decided
// for a request's attributes the way kube-apiserver derives them
// (docs/testing.md "Authentication and authorization").
//
// Attributes (k8s.io/apiserver RequestInfoFactory):
//   /api/<v>/..., /apis/<g>/<v>/...  a resource request: [namespaces/<ns>/]<resource>[/<name>[/<subresource>]]
//       GET on a name get; GET on a collection list, with ?watch=true watch; POST create;
//       PUT update; PATCH patch (server-side apply too); DELETE on a name delete, on a
//       collection deletecollection. A list or watch whose fieldSelector pins
//       metadata.name has that name (resourceNames rules apply). /api/v1/namespaces/<n>
//       has namespace <n>.
//   anything else (/api, /apis/<g>/<v>, /version, /openapi/v3, /healthz, /tandem/...)
//       a non-resource request: the lower-case method is the verb, the path is matched
//       against nonResourceURLs ("/apis/*" matches by prefix).
//
// Decision (rbac.authorizer): the group system:masters may do anything; every
// authenticated user may do what Kubernetes' default system:discovery,
// system:public-info-viewer and system:basic-user ClusterRoles grant
// (discovery, /version, /healthz, the self reviews), which are built in here
// rather than stored; else a request is allowed when a rule of a role bound to
// the user allows it: ClusterRoleBindings (to ClusterRoles) everywhere,
// RoleBindings of the request's namespace (to a Role of that namespace or a
// ClusterRole). A rule matches on verbs, apiGroups, resources ("pods",
// "pods/log", "*", "*/scale"), resourceNames (any name when empty; a rule with
// names never matches a create or an unnamed list) and nonResourceURLs; "*"
// matches any. A binding whose role does not exist grants nothing, and the 403
// names it ("RBAC: role.rbac.authorization.k8s.io \"x\" not found").
// ClusterRole aggregationRule is not evaluated.
//
// Escalation prevention (as the RBAC registry does): creating or changing a
// Role or ClusterRole needs the verb `escalate` on it or every permission it
// grants; creating or changing a (Cluster)RoleBinding needs the verb `bind` on
// the role it names or every permission of that role. Otherwise 403.
//
// Pure functions over the Store; the Router calls them under its mutex.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/authn.h"
#include "e2e/apiserver/store.h"
#include "src/http/server.h"

namespace tandem::apiserver {

// authorizer.Attributes of one request.
struct RequestAttributes {
  std::string verb;  // get list watch create update patch delete deletecollection; non-resource: the method
  bool resourceRequest = false;
  std::string apiGroup, apiVersion, resource, subresource, ns, name;
  std::string path;  // the whole path (what nonResourceURLs match)
};

// The attributes kube-apiserver derives from a request's method, path and query.
RequestAttributes requestAttributes(const http::Request& req);

// One PolicyRule (JSON) against a request's attributes.
bool ruleAllows(const nlohmann::json& rule, const RequestAttributes& a);

struct Decision {
  bool allowed = false;
  // Allowed: what allowed it ("RBAC: allowed by RoleBinding ..."). Denied:
  // the bindings that could not be evaluated ("RBAC: role... not found"), or "".
  std::string reason;
};

Decision authorize(const Store& store, const UserInfo& user, const RequestAttributes& a);

// 403 Forbidden as kube-apiserver words it:
//   deployments.apps "web" is forbidden: User "system:serviceaccount:ns:sa" cannot
//   get resource "deployments" in API group "apps" in the namespace "ns"[: <reason>]
ApiError forbiddenError(const UserInfo& user, const RequestAttributes& a, const std::string& reason);

// Escalation prevention for a write of an RBAC object (any other request:
// nothing to check). `req` is the write (a PATCH applies to the stored
// object). Throws 403 Forbidden naming the permissions not held, 404 when a
// binding's role does not exist.
void checkEscalation(const Store& store, const UserInfo& user, const RequestAttributes& a, const http::Request& req);

// POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews (`kubectl auth can-i`):
// the review with status.allowed and status.reason; 201. 400 for a spec with
// neither resourceAttributes nor nonResourceAttributes.
http::Response selfSubjectAccessReview(const http::Request& req, const Store& store, const UserInfo& user);

}  // namespace tandem::apiserver
