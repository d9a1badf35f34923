// The CEL subset of CRD validation rules (e2e/apiserver/cel.h) and the
// rules in a schema: every rule of crds/inferencepool.yaml, oldSelf on
// updates only, and what does not compile named.

#include "e2e/apiserver/cel.h"

#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "e2e/apiserver/schema.h"

namespace tandem::apiserver {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

absl::StatusOr<bool> run(const std::string& rule, const json& self, const json* old = nullptr) {
  auto p = CelProgram::compile(rule);
  if (!p.ok()) return p.status();
  return p->evaluate(self, old);
}

TEST(CelTest, ComparisonsPresenceSizeAndLogic) {
  const json self = json::parse(R"({"min": 1, "max": 3, "name": "tiny", "list": [1, 2], "ratio": 0.5, "on": true})");
  EXPECT_TRUE(*run("self.min <= self.max", self));
  EXPECT_FALSE(*run("self.min > self.max", self));
  EXPECT_TRUE(*run("has(self.min) && !has(self.absent)", self));
  EXPECT_TRUE(*run("size(self.name) == 4 && size(self.list) == 2 && size(self) == 6", self));
  EXPECT_TRUE(*run("self.ratio < 1 && self.ratio >= 0.5", self)) << "int and double compare by value";
  EXPECT_TRUE(*run("self.max - self.min == 2 && self.min + 1 == 2", self));
  EXPECT_TRUE(*run("self.name == 'tiny' && self.name != \"other\"", self));
  EXPECT_TRUE(*run("!(self.on && false) || self.absent > 1", self)) << "a deciding side absorbs an error";
  EXPECT_TRUE(*run("(self.min == 1) == true", self));
  EXPECT_EQ(*run("size(self.name) <= 3", json{{"name", "na\xc3\xafve"}}), false) << "code points, not bytes";
}

TEST(CelTest, AnAbsentFieldIsAnErrorUnlessGuarded) {
  auto r = run("self.max >= 1", json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no such key: max"));
  EXPECT_TRUE(*run("!has(self.max) || self.max >= 1", json::object()));
}

TEST(CelTest, OldSelfOnlyOnUpdates) {
  auto p = CelProgram::compile("self.replicas >= oldSelf.replicas");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->usesOldSelf());
  const json old = {{"replicas", 2}};
  EXPECT_TRUE(*p->evaluate(json{{"replicas", 3}}, &old));
  EXPECT_FALSE(*p->evaluate(json{{"replicas", 1}}, &old));
  EXPECT_FALSE(CelProgram::compile("self.a == 1")->usesOldSelf());
}

TEST(CelTest, WhatIsNotSupportedFailsToCompileSayingWhat) {
  auto msg = [](const std::string& rule) { return std::string(CelProgram::compile(rule).status().message()); };
  EXPECT_THAT(msg("self.list.all(x, x > 0)"), HasSubstr("method calls (.all()) are not supported here"));
  EXPECT_THAT(msg("self.list[0] > 1"), HasSubstr("indexing ([...]) is not supported here"));
  EXPECT_THAT(msg("matches(self.name, 'a')"), HasSubstr("the function matches() is not supported here"));
  EXPECT_THAT(msg("other.x == 1"), HasSubstr("undeclared reference to \"other\""));
  EXPECT_THAT(msg("self.a == "), HasSubstr("unexpected end of the rule"));
  EXPECT_THAT(msg("has(self)"), HasSubstr("has() takes a field selection"));
  EXPECT_THAT(msg("self.a ? 1 : 2"), HasSubstr("unexpected \"?"));
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json toJson(const YAML::Node& n) {
  if (n.IsMap()) {
    json o = json::object();
    for (const auto& kv : n) o[kv.first.as<std::string>()] = toJson(kv.second);
    return o;
  }
  if (n.IsSequence()) {
    json a = json::array();
    for (const auto& e : n) a.push_back(toJson(e));
    return a;
  }
  if (n.IsNull()) return nullptr;
  const std::string s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted
  if (s == "true" || s == "false") return s == "true";
  try {
    size_t used = 0;
    const long long i = std::stoll(s, &used);
    if (used == s.size()) return i;
    const double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (...) {
  }
  return s;
}

// Every rule of the InferencePool CRD, against pools that keep and break it.
TEST(CelTest, TheInferencePoolRulesHold) {
  const json crd = toJson(YAML::Load(slurp(std::string(TANDEM_SOURCE_DIR) + "/crds/inferencepool.yaml")));
  const json& schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
  EXPECT_TRUE(compileValidationRules(schema, "schema").empty()) << "every rule compiles here";
  auto causes = [&](json spec, std::string name = "tiny") {
    json pool = {{"apiVersion", "serving.tandem.dev/v1alpha1"},
                 {"kind", "InferencePool"},
                 {"metadata", {{"name", name}}},
                 {"spec", std::move(spec)}};
    std::string out;
    for (const StatusCause& c : validateSchema(schema, pool)) out += c.field + ": " + c.message + "\n";
    return out;
  };
  EXPECT_EQ(causes({{"model", {{"name", "tiny"}}}}), "");
  EXPECT_THAT(causes({{"model", {{"name", "tiny"}, {"path", "/m"}, {"pvc", "m"}}}}),
              HasSubstr("spec.model: Invalid value: \"object\": give model.path or model.pvc, not both"));
  EXPECT_THAT(causes({{"model", {{"name", "tiny"}}}, {"autoscaling", {{"enabled", true}, {"decode", {{"min", 3}, {"max", 2}}}}}}),
              HasSubstr("spec.autoscaling.decode: Invalid value: \"object\": min must not exceed max"));
  EXPECT_THAT(causes({{"model", {{"name", "tiny"}}}, {"decode", {{"replicas", 5}}},
                      {"autoscaling", {{"enabled", true}, {"decode", {{"max", 4}}}}}}),
              HasSubstr("decode.replicas must be within autoscaling.decode bounds"));
  EXPECT_EQ(causes({{"model", {{"name", "tiny"}}}, {"decode", {{"replicas", 5}}},
                    {"autoscaling", {{"enabled", false}, {"decode", {{"max", 4}}}}}}),
            "")
      << "bounds apply only when autoscaling is on";
  EXPECT_THAT(causes({{"model", {{"name", "tiny"}}}}, std::string(41, 'a')),
              HasSubstr("the pool's name must be at most 40 characters"));
}

// The example pools a user applies (examples/*.yaml) keep the CRD's schema
// and rules: the GPU one is applied by no end-to-end test (no GPU here).
TEST(CelTest, TheExamplePoolsAreValid) {
  const json crd = toJson(YAML::Load(slurp(std::string(TANDEM_SOURCE_DIR) + "/crds/inferencepool.yaml")));
  const json& schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
  for (const char* name : {"inferencepool-tiny.yaml", "inferencepool-llama-gpu.yaml"}) {
    const json pool = toJson(YAML::Load(slurp(std::string(TANDEM_SOURCE_DIR) + "/examples/" + name)));
    ASSERT_EQ(pool.value("kind", ""), "InferencePool") << name;
    std::string out;
    for (const StatusCause& c : validateSchema(schema, pool)) out += c.field + ": " + c.message + "\n";
    EXPECT_EQ(out, "") << name;
    json pruned = pool;
    std::string unknown;
    for (const std::string& f : pruneUnknownFields(schema, pruned)) unknown += f + " ";
    EXPECT_EQ(unknown, "") << name << ": fields the CRD does not know (kubectl would warn and drop them)";
  }
}

TEST(CelTest, ASchemaWithARuleOutsideTheSubsetIsNamed) {
  const json schema = json::parse(R"json({"type": "object", "properties": {"spec": {"type": "object",
      "x-kubernetes-validations": [{"rule": "self.x.exists(y, y > 1)"}]}}})json");
  auto errors = compileValidationRules(schema, "spec.versions[0].schema.openAPIV3Schema");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].field, "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule");
  EXPECT_THAT(errors[0].message, HasSubstr("method calls (.exists()) are not supported here"));
}

}  // namespace
}  // namespace tandem::apiserver
