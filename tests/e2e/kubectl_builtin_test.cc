// The real kubectl against tandem-apiserver with built-in kinds: create,
// get, delete, namespaces, and garbage collection by ownerReferences.

#include <gtest/gtest.h>

#include "tests/e2e/apiserver_fixture.h"

namespace tandem::e2e {
namespace {

using ::testing::HasSubstr;

class KubectlBuiltinTest : public ApiServerFixture {};

TEST_F(KubectlBuiltinTest, CreateGetDeleteNamespaceConfigMapDeployment) {
  std::string objects = writeTemp("objects.yaml", R"(apiVersion: v1
kind: Namespace
metadata:
  name: team
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: team
  labels: {app: web}
data:
  a: b
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: team
spec:
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx
)");
  auto r = kubectl("create -f " + objects);
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("namespace/team created"));
  EXPECT_THAT(r.output, HasSubstr("configmap/settings created"));
  EXPECT_THAT(r.output, HasSubstr("deployment.apps/web created"));

  r = kubectl("get ns");
  EXPECT_THAT(r.output, HasSubstr("team"));
  r = kubectl("-n team get cm -l app=web -o jsonpath={.items[*].data.a}");
  EXPECT_EQ(r.output, "b");
  r = kubectl("-n team get deploy web -o jsonpath={.spec.replicas}");
  EXPECT_EQ(r.output, "1") << "replicas defaults to 1";

  // Creating again: AlreadyExists, as from a real server.
  r = kubectl("create -f " + objects);
  EXPECT_NE(r.rc, 0);
  EXPECT_THAT(r.output, HasSubstr("Error from server (AlreadyExists)"));

  r = kubectl("-n team scale deploy web --replicas=3");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(kubectl("-n team get deploy web -o jsonpath={.spec.replicas}").output, "3");

  r = kubectl("-n team delete cm settings");
  ASSERT_EQ(r.rc, 0) << r.output;
  r = kubectl("-n team get cm settings");
  EXPECT_THAT(r.output, HasSubstr("Error from server (NotFound): configmaps \"settings\" not found"));

  // Deleting the namespace removes what is in it.
  r = kubectl("delete ns team --timeout=10s");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(kubectl("-n team get deploy web").output, HasSubstr("NotFound"));
}

// RBAC objects are stored and listed (the operator and the chart make them;
// nothing enforces them yet).
TEST_F(KubectlBuiltinTest, RbacObjectsAreStored) {
  auto r = kubectl("apply -f " + writeTemp("rbac.yaml", R"(apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: discovery}
rules: [{apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: discovery}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: discovery}
subjects: [{kind: ServiceAccount, name: agent, namespace: default}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tandem-operator}
rules: [{apiGroups: [apps], resources: [deployments], verbs: [get, list, watch, patch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: tandem-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: tandem-operator}
subjects: [{kind: ServiceAccount, name: operator, namespace: tandem-system}]
)"));
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(kubectl("get role discovery -o jsonpath={.rules[0].resources[0]}").output, "endpointslices");
  EXPECT_EQ(kubectl("get rolebinding discovery -o jsonpath={.subjects[0].name}").output, "agent");
  EXPECT_EQ(kubectl("get clusterrole tandem-operator -o jsonpath={.rules[0].verbs[3]}").output, "patch");
  EXPECT_EQ(kubectl("get clusterrolebinding tandem-operator -o jsonpath={.roleRef.name}").output, "tandem-operator");
}

TEST_F(KubectlBuiltinTest, GarbageCollectorDeletesDependentsOfDeletedOwner) {
  std::string deploy = writeTemp("deploy.yaml", R"(apiVersion: apps/v1
kind: Deployment
metadata:
  name: owner
spec:
  selector: {matchLabels: {app: owner}}
  template:
    metadata: {labels: {app: owner}}
    spec: {containers: [{name: c, image: busybox}]}
)");
  ASSERT_EQ(kubectl("apply -f " + deploy).rc, 0);
  std::string uid = kubectl("get deploy owner -o jsonpath={.metadata.uid}").output;
  ASSERT_FALSE(uid.empty());
  std::string cm = writeTemp("cm.yaml",
                             "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\n  ownerReferences:\n"
                             "  - {apiVersion: apps/v1, kind: Deployment, name: owner, uid: " +
                                 uid + ", controller: true, blockOwnerDeletion: true}\ndata: {x: y}\n");
  auto r = kubectl("apply -f " + cm);
  ASSERT_EQ(r.rc, 0) << r.output;
  ASSERT_EQ(kubectl("get cm owned -o name").output, "configmap/owned\n");

  r = kubectl("delete deploy owner");
  ASSERT_EQ(r.rc, 0) << r.output;
  r = kubectl("get cm owned");
  EXPECT_THAT(r.output, HasSubstr("NotFound")) << "the dependent configmap was not collected";
}

}  // namespace
}  // namespace tandem::e2e
