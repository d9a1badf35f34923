// Bad input to tandem-apiserver over plain HTTP: each answer must carry the
// status code, reason and details a real API server gives (metav1.Status).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "src/http/client.h"
#include "tests/e2e/apiserver_fixture.h"

namespace tandem::e2e {
namespace {

using nlohmann::json;

class ApiServerBadInputTest : public ApiServerFixture {
 protected:
  void SetUp() override {
    ApiServerFixture::SetUp();
    ASSERT_EQ(kubectl("apply -f " + testdata("inferencepool_crd.yaml")).rc, 0);
  }

  // Sends a request and returns {code, body as JSON}.
  std::pair<int, json> send(const std::string& method, const std::string& path, const std::string& body = "",
                            const std::string& contentType = "application/json") {
    http::ClientRequest req{.method = method, .url = baseUrl() + path, .body = body};
    if (!body.empty()) req.headers["Content-Type"] = contentType;
    auto r = http::httpSend(req);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {0, nullptr};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  static void expectStatus(const std::pair<int, json>& r, int code, const std::string& reason) {
    EXPECT_EQ(r.first, code) << r.second.dump();
    EXPECT_EQ(r.second.value("kind", ""), "Status") << r.second.dump();
    EXPECT_EQ(r.second.value("status", ""), "Failure");
    EXPECT_EQ(r.second.value("code", 0), code);
    EXPECT_EQ(r.second.value("reason", ""), reason) << r.second.dump();
  }

  const std::string pools_ = "/apis/serving.tandem.dev/v1alpha1/namespaces/default/inferencepools";
  const std::string pool_ = R"({"apiVersion":"serving.tandem.dev/v1alpha1","kind":"InferencePool",
                                "metadata":{"name":"p"},"spec":{"model":"m"}})";
};

TEST_F(ApiServerBadInputTest, MalformedBodies) {
  expectStatus(send("POST", pools_, "{not json"), 400, "BadRequest");
  expectStatus(send("POST", pools_, "spec: [unclosed", "application/yaml"), 400, "BadRequest");
  expectStatus(send("POST", pools_, pool_, "application/vnd.kubernetes.protobuf"), 415, "UnsupportedMediaType");
  expectStatus(send("POST", pools_, R"({"apiVersion":"serving.tandem.dev/v1alpha1","metadata":{"name":"p"}})"), 400,
               "BadRequest");
}

TEST_F(ApiServerBadInputTest, UnknownKindsAndWrongApiVersion) {
  auto r = send("GET", "/apis/serving.tandem.dev/v1alpha1/namespaces/default/widgets");
  expectStatus(r, 404, "NotFound");
  EXPECT_EQ(r.second.value("message", ""), "the server could not find the requested resource");
  expectStatus(send("GET", "/apis/nothing.example.com/v1/things"), 404, "NotFound");
  r = send(
      "POST", pools_,
      R"({"apiVersion":"serving.tandem.dev/v9","kind":"InferencePool","metadata":{"name":"p"},"spec":{"model":"m"}})");
  expectStatus(r, 400, "BadRequest");
  EXPECT_EQ(r.second.value("message", ""),
            "the API version in the data (serving.tandem.dev/v9) does not match the expected API version "
            "(serving.tandem.dev/v1alpha1)");
  expectStatus(send("POST", "/api/v1/namespaces/nope/configmaps",
                    R"({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}})"),
               404, "NotFound");
  expectStatus(send("POST", pools_ + "/p"), 405, "MethodNotAllowed");
}

TEST_F(ApiServerBadInputTest, SchemaViolationsAndNames) {
  auto r = send("POST", pools_, R"({"apiVersion":"serving.tandem.dev/v1alpha1","kind":"InferencePool",
                                    "metadata":{"name":"p"},"spec":{"decode":{"replicas":100}}})");
  expectStatus(r, 422, "Invalid");
  EXPECT_EQ(r.second["details"].value("kind", ""), "InferencePool");
  EXPECT_EQ(r.second["details"].value("group", ""), "serving.tandem.dev");
  ASSERT_EQ(r.second["details"]["causes"].size(), 2u) << r.second.dump();
  std::set<std::string> fields;
  for (const auto& c : r.second["details"]["causes"]) fields.insert(c.value("field", ""));
  EXPECT_EQ(fields, (std::set<std::string>{"spec.model", "spec.decode.replicas"}));

  r = send("POST", pools_, R"({"apiVersion":"serving.tandem.dev/v1alpha1","kind":"InferencePool",
                               "metadata":{"name":"Bad_Name"},"spec":{"model":"m"}})");
  expectStatus(r, 422, "Invalid");
  EXPECT_EQ(r.second["details"]["causes"][0].value("field", ""), "metadata.name");

  r = send("POST", pools_ + "?fieldValidation=Strict",
           R"({"apiVersion":"serving.tandem.dev/v1alpha1","kind":"InferencePool",
                               "metadata":{"name":"p"},"spec":{"model":"m","extra":1}})");
  expectStatus(r, 422, "Invalid");
  EXPECT_EQ(r.second["details"]["causes"][0].value("field", ""), "spec.extra") << r.second.dump();
}

TEST_F(ApiServerBadInputTest, ConflictsAndPatchesThatDoNotApply) {
  auto created = send("POST", pools_, pool_);
  ASSERT_EQ(created.first, 201) << created.second.dump();
  expectStatus(send("POST", pools_, pool_), 409, "AlreadyExists");

  json stale = created.second;
  stale["spec"]["model"] = "n";
  ASSERT_EQ(send("PUT", pools_ + "/p", stale.dump()).first, 200);
  expectStatus(send("PUT", pools_ + "/p", stale.dump()), 409, "Conflict");  // same resourceVersion again
  stale["metadata"].erase("resourceVersion");
  expectStatus(send("PUT", pools_ + "/p", stale.dump()), 422, "Invalid");

  expectStatus(send("PATCH", pools_ + "/p", R"([{"op":"replace","path":"/spec/nothing/here","value":1}])",
                    "application/json-patch+json"),
               422, "Invalid");
  expectStatus(send("PATCH", pools_ + "/p", R"({"spec":{"model":"x"}})", "application/strategic-merge-patch+json"), 415,
               "UnsupportedMediaType");
  expectStatus(send("PATCH", pools_ + "/p", "{bad", "application/merge-patch+json"), 400, "BadRequest");
  expectStatus(send("PATCH", pools_ + "/p", R"({"spec":{"decode":{"replicas":-3}}})", "application/merge-patch+json"),
               422, "Invalid");
  expectStatus(send("PATCH", pools_ + "/missing", R"({"spec":{}})", "application/merge-patch+json"), 404, "NotFound");
  expectStatus(send("DELETE", pools_ + "/missing"), 404, "NotFound");
}

TEST_F(ApiServerBadInputTest, WatchFromCompactedHistoryIsExpired) {
  auto created = send("POST", pools_, pool_);
  ASSERT_EQ(created.first, 201);
  std::string rv = created.second["metadata"]["resourceVersion"];
  ASSERT_EQ(send("PATCH", pools_ + "/p", R"({"spec":{"model":"x"}})", "application/merge-patch+json").first, 200);
  ASSERT_EQ(send("POST", "/tandem/compact", "{}").first, 200);
  http::ClientRequest req{.url = baseUrl() + pools_ + "?watch=true&resourceVersion=" + rv};
  auto r = http::httpSend(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  json event = json::parse(r->body.substr(0, r->body.find('\n')));
  EXPECT_EQ(event.value("type", ""), "ERROR");
  EXPECT_EQ(event["object"].value("code", 0), 410);
  EXPECT_EQ(event["object"].value("reason", ""), "Expired");
}

TEST_F(ApiServerBadInputTest, WatchReplaysFromResourceVersionAndSendsBookmarks) {
  auto created = send("POST", pools_, pool_);
  ASSERT_EQ(created.first, 201);
  std::string rv = created.second["metadata"]["resourceVersion"];
  ASSERT_EQ(send("PATCH", pools_ + "/p", R"({"spec":{"model":"x"}})", "application/merge-patch+json").first, 200);
  http::ClientRequest req{.url = baseUrl() + pools_ +
                                 "?watch=true&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion=" + rv};
  auto r = http::httpSend(req);  // ends after timeoutSeconds
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> types;
  size_t pos = 0;
  while (pos < r->body.size()) {
    size_t nl = r->body.find('\n', pos);
    types.push_back(json::parse(r->body.substr(pos, nl - pos)).value("type", ""));
    pos = nl + 1;
  }
  ASSERT_GE(types.size(), 2u) << r->body;
  EXPECT_EQ(types[0], "MODIFIED");
  EXPECT_EQ(types.back(), "BOOKMARK");
}

}  // namespace
}  // namespace tandem::e2e
