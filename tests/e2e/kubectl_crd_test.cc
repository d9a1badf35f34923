// The real kubectl against tandem-apiserver with a CustomResourceDefinition
// like the operator's InferencePool: apply (client- and server-side),
// printer columns, -o yaml, get -w, merge patch, scale, delete with and
// without finalizers, and schema errors shown with their field.

#include <regex>

#include <gtest/gtest.h>

#include "tests/e2e/apiserver_fixture.h"

namespace tandem::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

class KubectlCrdTest : public ApiServerFixture {
 protected:
  void SetUp() override {
    ApiServerFixture::SetUp();
    auto r = kubectl("apply -f " + testdata("inferencepool_crd.yaml"));
    ASSERT_EQ(r.rc, 0) << r.output;
    ASSERT_THAT(r.output,
                HasSubstr("customresourcedefinition.apiextensions.k8s.io/inferencepools.serving.tandem.dev created"));
  }
};

TEST_F(KubectlCrdTest, ClientSideApplyGetPatchScale) {
  auto r = kubectl("apply -f " + testdata("pool.yaml"));
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("inferencepool.serving.tandem.dev/llama created"));
  r = kubectl("apply -f " + testdata("pool.yaml"));
  EXPECT_THAT(r.output, HasSubstr("inferencepool.serving.tandem.dev/llama unchanged"));

  // Printer columns through the server-side Table, by short name and category.
  r = kubectl("get tpool");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, MatchesRegex("NAME +MODEL +DECODE +READY +AGE\nllama +llama-3-8b +2 +[0-9]+s\n"));
  EXPECT_THAT(kubectl("get tandem").output, HasSubstr("llama"));

  r = kubectl("get inferencepool llama -o yaml");
  EXPECT_THAT(r.output, HasSubstr("apiVersion: serving.tandem.dev/v1alpha1"));
  EXPECT_THAT(r.output, HasSubstr("mode: aggregated")) << "schema default applied";
  EXPECT_THAT(r.output, HasSubstr("generation: 1"));

  r = kubectl("patch tpool llama --type=merge -p '{\"spec\":{\"model\":\"qwen\"}}'");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(kubectl("get tpool llama -o jsonpath={.spec.model},{.metadata.generation}").output, "qwen,2");

  r = kubectl("scale tpool llama --replicas=5");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("scaled"));
  EXPECT_EQ(kubectl("get tpool llama -o jsonpath={.spec.decode.replicas}").output, "5");

  // A status write does not bump generation and is kept by main-endpoint writes.
  r = kubectl(
      "patch tpool llama --subresource=status --type=merge -p "
      "'{\"status\":{\"decode\":{\"readyReplicas\":4},\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}'");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(kubectl("get tpool llama -o jsonpath={.status.decode.readyReplicas},{.metadata.generation}").output, "4,3");
  EXPECT_THAT(kubectl("get tpool").output, MatchesRegex("(.|\n)*llama +qwen +5 +True +[0-9]+s\n"));
}

TEST_F(KubectlCrdTest, ServerSideApplyCreatesUpdatesAndReportsConflicts) {
  auto r = kubectl("apply --server-side -f " + testdata("pool.yaml"));
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("serverside-applied"));
  std::string changed = writeTemp("pool2.yaml", R"(apiVersion: serving.tandem.dev/v1alpha1
kind: InferencePool
metadata:
  name: llama
spec:
  model: llama-3-70b
)");
  r = kubectl("apply --server-side -f " + changed);
  ASSERT_EQ(r.rc, 0) << r.output;
  // The manager no longer applies spec.decode.replicas, so it is removed, then defaulted again.
  EXPECT_EQ(kubectl("get tpool llama -o jsonpath={.spec.model},{.spec.decode.replicas}").output, "llama-3-70b,1");

  std::string other = writeTemp("pool3.yaml", R"(apiVersion: serving.tandem.dev/v1alpha1
kind: InferencePool
metadata:
  name: llama
spec:
  model: mistral
)");
  r = kubectl("apply --server-side --field-manager=intruder -f " + other);
  EXPECT_NE(r.rc, 0);
  EXPECT_THAT(r.output, HasSubstr("conflict with \"kubectl\""));
  EXPECT_THAT(r.output, HasSubstr(".spec.model"));
  r = kubectl("apply --server-side --force-conflicts --field-manager=intruder -f " + other);
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(kubectl("get tpool llama -o jsonpath={.spec.model}").output, "mistral");
}

TEST_F(KubectlCrdTest, GetWatchSeesUpdates) {
  ASSERT_EQ(kubectl("apply -f " + testdata("pool.yaml")).rc, 0);
  std::string out = dir_ + "/watch.out";
  // In the background, bounded by `timeout`; the shell returns at once.
  ASSERT_EQ(shell("(timeout 15 " + kubectlPrefix() + "get tpool llama -w > " + out + " 2>&1) > /dev/null 2>&1 &").rc,
            0);
  ASSERT_TRUE(waitFor([&] { return readFile(out).find("llama-3-8b") != std::string::npos; }, std::chrono::seconds(10)))
      << readFile(out);
  ASSERT_EQ(kubectl("patch tpool llama --type=merge -p '{\"spec\":{\"model\":\"watched-model\"}}'").rc, 0);
  EXPECT_TRUE(
      waitFor([&] { return readFile(out).find("watched-model") != std::string::npos; }, std::chrono::seconds(10)))
      << readFile(out);
}

TEST_F(KubectlCrdTest, DeleteWaitsForFinalizers) {
  ASSERT_EQ(kubectl("apply -f " + testdata("pool.yaml")).rc, 0);
  auto r = kubectl("delete tpool llama --timeout=10s");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("deleted"));

  ASSERT_EQ(kubectl("apply -f " + testdata("pool.yaml")).rc, 0);
  ASSERT_EQ(
      kubectl("patch tpool llama --type=merge -p '{\"metadata\":{\"finalizers\":[\"serving.tandem.dev/cleanup\"]}}'")
          .rc,
      0);
  std::string out = dir_ + "/delete.out";
  ASSERT_EQ(shell("(timeout 15 " + kubectlPrefix() + "delete tpool llama > " + out + " 2>&1; echo rc=$? >> " + out +
                  ") > /dev/null 2>&1 &")
                .rc,
            0);
  ASSERT_TRUE(
      waitFor([&] { return !kubectl("get tpool llama -o jsonpath={.metadata.deletionTimestamp}").output.empty(); },
              std::chrono::seconds(10)));
  EXPECT_THAT(readFile(out), Not(HasSubstr("rc="))) << "kubectl delete returned before the finalizer was removed";
  // A new finalizer is refused while deleting.
  r = kubectl(
      "patch tpool llama --type=merge -p '{\"metadata\":{\"finalizers\":[\"serving.tandem.dev/cleanup\",\"x/y\"]}}'");
  EXPECT_THAT(r.output, HasSubstr("no new finalizers can be added if the object is being deleted"));
  ASSERT_EQ(kubectl("patch tpool llama --type=merge -p '{\"metadata\":{\"finalizers\":null}}'").rc, 0);
  EXPECT_TRUE(waitFor([&] { return readFile(out).find("rc=0") != std::string::npos; }, std::chrono::seconds(10)))
      << readFile(out);
  EXPECT_THAT(kubectl("get tpool llama").output, HasSubstr("NotFound"));
}

TEST_F(KubectlCrdTest, InvalidObjectsAreRefusedWithTheFieldError) {
  struct Case {
    std::string spec;
    std::string expected;
  } cases[] = {
      {"{decode: {replicas: -1}, model: m}",
       "spec.decode.replicas: Invalid value: -1: spec.decode.replicas in body should be greater than or equal to 0"},
      {"{decode: {replicas: 2}}", "spec.model: Required value"},
      {"{model: m, mode: sideways}",
       "spec.mode: Unsupported value: \"sideways\": supported values: \"aggregated\", \"disaggregated\""},
      {"{model: 7}", "spec.model: Invalid value: \"integer\": spec.model in body must be of type string: \"integer\""},
      {"{model: m, colour: red}", "is invalid: spec.colour: unknown field \"spec.colour\""},
  };
  for (const auto& c : cases) {
    std::string f = writeTemp("bad.yaml",
                              "apiVersion: serving.tandem.dev/v1alpha1\nkind: InferencePool\nmetadata:\n"
                              "  name: bad\nspec: " +
                                  c.spec + "\n");
    auto r = kubectl("apply -f " + f);
    EXPECT_NE(r.rc, 0) << c.spec;
    EXPECT_THAT(r.output, HasSubstr(c.expected)) << c.spec;
  }
  EXPECT_THAT(kubectl("get tpool bad").output, HasSubstr("NotFound"));
}

}  // namespace
// CEL rules: one outside the emulator's subset refuses the CRD, naming it;
// a rule that fails refuses the object with the rule's message.
TEST_F(KubectlCrdTest, CelRulesAreEnforcedAndAnUnsupportedOneRefusesTheCrd) {
  const std::string crd = R"(apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.dev}
spec:
  group: example.dev
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              min: {type: integer}
              max: {type: integer}
              sizes: {type: array, items: {type: integer}}
            x-kubernetes-validations:
            - {rule: "!has(self.min) || !has(self.max) || self.min <= self.max", message: "min must not exceed max"}
            - {rule: "RULE2"}
)";
  auto refused = kubectl("apply -f " + writeTemp("bad_crd.yaml", std::regex_replace(crd, std::regex("RULE2"),
                                                                                    "self.sizes.all(s, s > 0)")));
  EXPECT_NE(refused.rc, 0);
  EXPECT_THAT(refused.output, HasSubstr("x-kubernetes-validations[1].rule"));
  EXPECT_THAT(refused.output, HasSubstr("method calls (.all()) are not supported here"));

  auto ok = kubectl("apply -f " + writeTemp("crd.yaml", std::regex_replace(crd, std::regex("RULE2"), "size(self) < 4")));
  ASSERT_EQ(ok.rc, 0) << ok.output;
  ASSERT_TRUE(waitFor([&] { return kubectl("get widgets").rc == 0; }, std::chrono::seconds(10)));
  auto bad = kubectl("apply -f " + writeTemp("w.yaml", "apiVersion: example.dev/v1\nkind: Widget\nmetadata: {name: w}\n"
                                                         "spec: {min: 3, max: 2}\n"));
  EXPECT_NE(bad.rc, 0);
  EXPECT_THAT(bad.output, HasSubstr("spec: Invalid value: \"object\": min must not exceed max"));
  auto good = kubectl("apply -f " + writeTemp("w2.yaml", "apiVersion: example.dev/v1\nkind: Widget\nmetadata: {name: w}\n"
                                                           "spec: {min: 1, max: 2}\n"));
  EXPECT_EQ(good.rc, 0) << good.output;
}

}  // namespace tandem::e2e
