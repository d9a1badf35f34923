// The emulator's per-type hooks (e2e/apiserver/type_hooks.h) as pure code:
// defaults from an object, a context and a FakeClock's time; the CRD hooks
// against a Cluster with no server around it.

#include "e2e/apiserver/type_hooks.h"

#include <gtest/gtest.h>

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/cluster.h"

namespace tandem::apiserver {
namespace {

using nlohmann::json;

class TypeHooksTest : public ::testing::Test {
 protected:
  // Runs the defaults hook of `storageKey` on `obj`.
  json defaulted(const std::string& storageKey, json obj, const json* current = nullptr, uint64_t rv = 1) {
    const TypeHooks& h = hooks_.of(storageKey);
    EXPECT_TRUE(h.defaults) << storageKey;
    h.defaults(obj, {.current = current, .currentRv = rv, .now = clock_.wallNow()});
    return obj;
  }

  FakeClock clock_;  // wall time 2026-01-01T00:00:01Z
  const TypeHookRegistry hooks_ = TypeHookRegistry::builtins();
};

json crd() {
  json version = {{"name", "v1alpha1"},
                  {"served", true},
                  {"storage", true},
                  {"schema", {{"openAPIV3Schema", {{"type", "object"}}}}}};
  return {{"apiVersion", "apiextensions.k8s.io/v1"},
          {"kind", "CustomResourceDefinition"},
          {"metadata", {{"name", "inferencepools.serving.tandem.dev"}}},
          {"spec",
           {{"group", "serving.tandem.dev"},
            {"scope", "Namespaced"},
            {"names", {{"plural", "inferencepools"}, {"kind", "InferencePool"}}},
            {"versions", {version}}}}};
}

TEST_F(TypeHooksTest, KindsWithoutHooksGetNone) {
  const TypeHooks& h = hooks_.of("/configmaps");
  EXPECT_EQ(h.nameRule, NameRule::kDnsSubdomain);
  EXPECT_FALSE(h.specOnCreate);
  EXPECT_FALSE(h.keptUntilEmpty);
  EXPECT_FALSE(h.defaults || h.validate || h.stored || h.erased);
  // Keyed by group too: a custom resource named "services" is not a Service.
  EXPECT_FALSE(hooks_.of("example.com/services").defaults);
}

TEST_F(TypeHooksTest, NamespaceIsALabelKeptUntilEmptyAndActiveOnCreate) {
  const TypeHooks& h = hooks_.of("/namespaces");
  EXPECT_EQ(h.nameRule, NameRule::kDnsLabel);
  EXPECT_TRUE(h.keptUntilEmpty);
  json created = defaulted("/namespaces", {{"spec", json::object()}});
  EXPECT_EQ(created["spec"]["finalizers"], json::array({"kubernetes"}));
  EXPECT_EQ(created["status"]["phase"], "Active");
  json current = {{"status", {{"phase", "Terminating"}}}};
  json updated = defaulted("/namespaces", {{"spec", json::object()}, {"status", {{"phase", "Terminating"}}}}, &current);
  EXPECT_EQ(updated["status"]["phase"], "Terminating");
}

TEST_F(TypeHooksTest, ServiceGetsATypeAndAClusterIpThatUpdatesKeep) {
  EXPECT_EQ(hooks_.of("/services").nameRule, NameRule::kDnsLabel);
  json created = defaulted("/services", {{"spec", json::object()}}, nullptr, 251);
  EXPECT_EQ(created["spec"]["type"], "ClusterIP");
  EXPECT_EQ(created["spec"]["clusterIP"], "10.96.1.2");
  json updated = defaulted("/services", {{"spec", {{"type", "NodePort"}}}}, &created, 900);
  EXPECT_EQ(updated["spec"]["type"], "NodePort");
  EXPECT_EQ(updated["spec"]["clusterIP"], "10.96.1.2");
}

TEST_F(TypeHooksTest, SecretStringDataBecomesBase64Data) {
  json s = defaulted("/secrets", {{"stringData", {{"user", "admin"}}}, {"data", {{"x", "eA=="}}}});
  EXPECT_EQ(s["data"]["user"], "YWRtaW4=");
  EXPECT_EQ(s["data"]["x"], "eA==");
  EXPECT_FALSE(s.contains("stringData"));
  EXPECT_EQ(s["type"], "Opaque");
  EXPECT_EQ(defaulted("/secrets", {{"type", "kubernetes.io/tls"}})["type"], "kubernetes.io/tls");
}

TEST_F(TypeHooksTest, DeploymentDefaultsToOneReplica) {
  EXPECT_TRUE(hooks_.of("apps/deployments").specOnCreate);
  EXPECT_EQ(defaulted("apps/deployments", {{"spec", json::object()}})["spec"]["replicas"], 1);
  EXPECT_EQ(defaulted("apps/deployments", {{"spec", {{"replicas", 0}}}})["spec"]["replicas"], 0);
}

TEST_F(TypeHooksTest, CrdNamesAndConditionsAtTheClocksTime) {
  const std::string key = "apiextensions.k8s.io/customresourcedefinitions";
  json c = defaulted(key, crd());
  EXPECT_EQ(c["spec"]["names"]["singular"], "inferencepool");
  EXPECT_EQ(c["spec"]["names"]["listKind"], "InferencePoolList");
  EXPECT_EQ(c["status"]["storedVersions"], json::array({"v1alpha1"}));
  ASSERT_EQ(c["status"]["conditions"].size(), 2u);
  EXPECT_EQ(c["status"]["conditions"][1]["type"], "Established");
  EXPECT_EQ(c["status"]["conditions"][1]["lastTransitionTime"], "2026-01-01T00:00:01Z");
  // An update keeps the conditions (their transition times) it had.
  clock_.advance(std::chrono::hours(1));
  json updated = defaulted(key, crd(), &c);
  EXPECT_EQ(updated["status"]["conditions"], c["status"]["conditions"]);
}

TEST_F(TypeHooksTest, CrdValidatesAsACrd) {
  const TypeHooks& h = hooks_.of("apiextensions.k8s.io/customresourcedefinitions");
  ASSERT_TRUE(h.validate);
  EXPECT_NO_THROW(h.validate(crd()));
  json bad = crd();
  bad["spec"].erase("group");
  try {
    h.validate(bad);
    FAIL() << "a CRD without spec.group passed";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), 422);
  }
}

TEST_F(TypeHooksTest, StoringACrdServesItsTypesAndErasingItRemovesThemAndTheirObjects) {
  Cluster cluster(100, clock_);
  const TypeHooks& h = cluster.hooks.of("apiextensions.k8s.io/customresourcedefinitions");
  h.stored(crd(), cluster);
  const ResourceType* t = cluster.types.find("serving.tandem.dev", "v1alpha1", "inferencepools");
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->custom);
  cluster.store.put(t->storageKey(), {{"metadata", {{"name", "p"}, {"namespace", "default"}, {"uid", "u1"}}}});
  ASSERT_NE(cluster.store.get("serving.tandem.dev/inferencepools", "default", "p"), nullptr);

  h.erased(crd(), cluster);
  EXPECT_EQ(cluster.types.find("serving.tandem.dev", "v1alpha1", "inferencepools"), nullptr);
  EXPECT_EQ(cluster.store.get("serving.tandem.dev/inferencepools", "default", "p"), nullptr);
}

}  // namespace
}  // namespace tandem::apiserver
