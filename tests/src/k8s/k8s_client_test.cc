// Request building: paths, query strings, content types and bodies, checked
// through a recording fake transport.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "src/common/strings.h"
#include "src/k8s/client.h"
#include "src/k8s/errors.h"
#include "src/k8s/retry.h"
#include "tests/src/k8s/fake_api.h"

namespace tandem::k8s {
namespace {

using testing::FakeApi;
using testing::FakeTransport;

const ResourceRef kPools{"serving.tandem.dev", "v1alpha1", "inferencepools", true};

class ClientTest : public ::testing::Test {
 protected:
  ClientTest() : client_(Client::createWithTransport(std::make_unique<FakeTransport>(api_), "team-a")) {}
  const HttpRequest& last() { return api_.requests.back(); }

  FakeApi api_;
  std::unique_ptr<Client> client_;
};

TEST(ResourceTest, Paths) {
  EXPECT_EQ(collectionPath(podsResource(), "ns1"), "/api/v1/namespaces/ns1/pods");
  EXPECT_EQ(collectionPath(podsResource(), ""), "/api/v1/pods");
  EXPECT_EQ(collectionPath(namespacesResource(), "ignored"), "/api/v1/namespaces");
  EXPECT_EQ(objectPath(kPools, "ns", "p", "status"),
            "/apis/serving.tandem.dev/v1alpha1/namespaces/ns/inferencepools/p/status");
  EXPECT_EQ(objectPath(leasesResource(), "kube-system", "op"),
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/op");
  EXPECT_EQ(kPools.apiVersion(), "serving.tandem.dev/v1alpha1");
  EXPECT_EQ(podsResource().apiVersion(), "v1");
}

TEST(ResourceTest, Selectors) {
  EXPECT_EQ(formatLabelSelector({{"serving.tandem.dev/role", "decode"}, {"app.kubernetes.io/name", "tandem"}}),
            "app.kubernetes.io/name=tandem,serving.tandem.dev/role=decode");
  EXPECT_EQ(formatFieldSelector({{"metadata.name", "p0"}}), "metadata.name=p0");
  EXPECT_EQ(encodeQuery({{"labelSelector", "a=b,c in (x,y)"}, {"watch", "true"}}),
            "?labelSelector=a%3Db%2Cc%20in%20%28x%2Cy%29&watch=true");
  nlohmann::json labels = {{"app", "tandem"}, {"role", "decode"}};
  EXPECT_TRUE(labelsMatch("app=tandem,role==decode", labels));
  EXPECT_TRUE(labelsMatch("app,!missing,role!=prefill", labels));
  EXPECT_FALSE(labelsMatch("app=other", labels));
  EXPECT_FALSE(labelsMatch("missing", labels));
  EXPECT_FALSE(labelsMatch("!app", labels));
  EXPECT_TRUE(labelsMatch("", labels));
  EXPECT_TRUE(labelsMatch("role in (decode,prefill),app=tandem", labels));  // set terms left to the server
}

TEST(ResourceTest, MicroTime) {
  WallTime t = WallTime(std::chrono::seconds(1767225600) + std::chrono::microseconds(42));
  EXPECT_EQ(formatMicroTime(t), "2026-01-01T00:00:00.000042Z");
  WallTime parsed;
  ASSERT_TRUE(parseTime("2026-01-01T00:00:00.000042Z", &parsed));
  EXPECT_EQ(parsed, t);
  ASSERT_TRUE(parseTime("2026-01-01T00:00:00Z", &parsed));
  EXPECT_FALSE(parseTime("yesterday", &parsed));
  EXPECT_EQ(splitObjectKey("ns/name"), std::make_pair(std::string("ns"), std::string("name")));
  EXPECT_EQ(splitObjectKey("node1"), std::make_pair(std::string(""), std::string("node1")));
}

TEST_F(ClientTest, GetUsesDefaultNamespaceAndTypedErrors) {
  auto missing = client_->get(podsResource(), "", "p0");
  EXPECT_TRUE(isNotFound(missing.status()));
  EXPECT_EQ(last().method, "GET");
  EXPECT_EQ(last().path, "/api/v1/namespaces/team-a/pods/p0");
  api_.objects["/api/v1/namespaces/x/pods/p0"] = {{"metadata", {{"name", "p0"}}}};
  auto found = client_->get(podsResource(), "x", "p0");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(objectName(*found), "p0");
}

TEST_F(ClientTest, ListFollowsContinueAndSendsSelectors) {
  // A transport that pages: the first page carries a continue token.
  struct Paging final : Transport {
    std::vector<HttpRequest> seen;
    absl::StatusOr<HttpResponse> send(const HttpRequest& r) override {
      seen.push_back(r);
      if (r.path.find("continue=") == std::string::npos) {
        return HttpResponse{
            200, R"({"items":[{"metadata":{"name":"a"}}],"metadata":{"continue":"t1","resourceVersion":"5"}})"};
      }
      return HttpResponse{200, R"({"items":[{"metadata":{"name":"b"}}],"metadata":{"resourceVersion":"7"}})"};
    }
    absl::StatusOr<StreamResponse> stream(const HttpRequest&) override { return absl::UnimplementedError(""); }
  };
  auto transport = std::make_unique<Paging>();
  Paging* paging = transport.get();
  auto client = Client::createWithTransport(std::move(transport));
  auto list =
      client->list(podsResource(), "", {.labelSelector = "app=x", .fieldSelector = "metadata.name=a", .limit = 1});
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->items.size(), 2u);
  EXPECT_EQ(list->resourceVersion, "7");
  ASSERT_EQ(paging->seen.size(), 2u);
  EXPECT_EQ(paging->seen[0].path, "/api/v1/pods?labelSelector=app%3Dx&fieldSelector=metadata.name%3Da&limit=1");
  EXPECT_THAT(paging->seen[1].path, ::testing::HasSubstr("continue=t1"));
}

TEST_F(ClientTest, WriteVerbs) {
  nlohmann::json pool = {{"apiVersion", "serving.tandem.dev/v1alpha1"},
                         {"kind", "InferencePool"},
                         {"metadata", {{"name", "p"}, {"namespace", "ns"}}},
                         {"spec", {{"replicas", 1}}}};
  auto created = client_->create(kPools, "ns", pool, {.fieldManager = "op"});
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(last().method, "POST");
  EXPECT_EQ(last().path, "/apis/serving.tandem.dev/v1alpha1/namespaces/ns/inferencepools?fieldManager=op");
  EXPECT_EQ(last().contentType, "application/json");
  EXPECT_TRUE(isAlreadyExists(client_->create(kPools, "ns", pool).status()));

  nlohmann::json stale = *created;
  (*created)["spec"]["replicas"] = 2;
  ASSERT_TRUE(client_->update(kPools, "ns", *created).ok());
  EXPECT_EQ(last().method, "PUT");
  EXPECT_EQ(last().path, "/apis/serving.tandem.dev/v1alpha1/namespaces/ns/inferencepools/p");
  EXPECT_TRUE(isConflict(client_->update(kPools, "ns", stale).status()));

  (void)client_->updateStatus(kPools, "ns", stale);
  EXPECT_EQ(last().path, "/apis/serving.tandem.dev/v1alpha1/namespaces/ns/inferencepools/p/status");

  ASSERT_TRUE(client_->mergePatch(kPools, "ns", "p", {{"spec", {{"replicas", nullptr}}}}).ok());
  EXPECT_EQ(last().method, "PATCH");
  EXPECT_EQ(last().contentType, "application/merge-patch+json");
  EXPECT_EQ(last().body, R"({"spec":{"replicas":null}})");
  (void)client_->mergePatchStatus(kPools, "ns", "p", {{"status", {{"ready", true}}}});
  EXPECT_EQ(last().path, "/apis/serving.tandem.dev/v1alpha1/namespaces/ns/inferencepools/p/status");

  (void)client_->apply(kPools, "ns", pool, {.fieldManager = "tandem-operator", .force = true});
  EXPECT_EQ(last().method, "PATCH");
  EXPECT_EQ(last().contentType, "application/apply-patch+yaml");
  EXPECT_EQ(last().path,
            "/apis/serving.tandem.dev/v1alpha1/namespaces/ns/inferencepools/p?fieldManager=tandem-operator&force=true");
  EXPECT_EQ(client_->apply(kPools, "ns", pool, {}).status().code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(client_
                  ->remove(kPools, "ns", "p",
                           {.propagationPolicy = PropagationPolicy::kForeground, .preconditionResourceVersion = "9"})
                  .ok());
  EXPECT_EQ(last().method, "DELETE");
  nlohmann::json body = nlohmann::json::parse(last().body);
  EXPECT_EQ(body["propagationPolicy"], "Foreground");
  EXPECT_EQ(body["preconditions"]["resourceVersion"], "9");
  EXPECT_EQ(body["kind"], "DeleteOptions");
}

TEST_F(ClientTest, WatchRequestAndEvents) {
  api_.watchScripts.push_back({R"({"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"3"}}})",
                               R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}})",
                               R"({"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}})"});
  auto watch =
      client_->watch(podsResource(), "ns", {.labelSelector = "a=b", .resourceVersion = "2", .timeoutSeconds = 60});
  ASSERT_TRUE(watch.ok());
  EXPECT_EQ(last().path,
            "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=2&allowWatchBookmarks=true&timeoutSeconds=60&"
            "labelSelector=a%3Db");
  auto e1 = (*watch)->next();
  ASSERT_TRUE(e1.ok() && e1->has_value());
  EXPECT_EQ((*e1)->type, WatchEventType::kAdded);
  auto e2 = (*watch)->next();
  EXPECT_EQ((*e2)->type, WatchEventType::kBookmark);
  auto e3 = (*watch)->next();
  EXPECT_EQ((*e3)->type, WatchEventType::kError);
  EXPECT_EQ(parseStatusObject((*e3)->object).reason, K8sErrorReason::kExpired);
  auto end = (*watch)->next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
  EXPECT_FALSE(parseWatchEvent("not json").ok());
  EXPECT_FALSE(parseWatchEvent(R"({"type":"WEIRD","object":{}})").ok());
}

TEST_F(ClientTest, RetryOnConflictRereadsUntilItWins) {
  api_.objects["/api/v1/namespaces/ns/configmaps/c"] = {{"metadata", {{"name", "c"}, {"resourceVersion", "1"}}},
                                                        {"data", {{"n", "0"}}}};
  // Another writer sneaks in before each of our first two updates.
  int sneaks = 2;
  api_.beforeRequest = [&](const HttpRequest& r) {
    if (r.method == "PUT" && sneaks > 0) {
      --sneaks;
      api_.objects["/api/v1/namespaces/ns/configmaps/c"]["metadata"]["resourceVersion"] =
          std::to_string(++api_.resourceVersion);
    }
    return 0;
  };
  int attempts = 0;
  std::vector<Duration> sleeps;
  absl::Status s = retryOnConflict(
      [&]() -> absl::Status {
        ++attempts;
        auto cm = client_->get(configMapsResource(), "ns", "c");
        if (!cm.ok()) return cm.status();
        (*cm)["data"]["n"] = "1";
        return client_->update(configMapsResource(), "ns", *cm).status();
      },
      {.sleep = [&](Duration d) { sleeps.push_back(d); }});
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(attempts, 3);
  EXPECT_EQ(sleeps.size(), 2u);
  EXPECT_EQ(api_.objects["/api/v1/namespaces/ns/configmaps/c"]["data"]["n"], "1");

  // Always conflicting: gives up after `steps` with the Conflict.
  attempts = 0;
  s = retryOnConflict(
      [&]() -> absl::Status {
        ++attempts;
        return statusFromResponse(409, R"({"kind":"Status","reason":"Conflict","code":409})", "");
      },
      {.steps = 4, .sleep = [](Duration) {}});
  EXPECT_TRUE(isConflict(s));
  EXPECT_EQ(attempts, 4);
  // Other errors are not retried.
  attempts = 0;
  s = retryOnConflict([&]() -> absl::Status {
    ++attempts;
    return absl::UnavailableError("down");
  });
  EXPECT_EQ(attempts, 1);
}

TEST(HttpTransportTest, RejectsBadServerAndTlsMaterial) {
  EXPECT_EQ(Client::create({.server = "ftp://x"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::create({.server = "https://127.0.0.1:1", .caData = "not a pem"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Client::create({.server = "http://127.0.0.1:1"}).ok());
  // Nothing listens on port 1: a transport error, not a K8sError.
  auto client = Client::create({.server = "http://127.0.0.1:1"});
  auto r = (*client)->get(podsResource(), "x", "y");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(k8sReason(r.status()), K8sErrorReason::kUnknown);
}

}  // namespace
}  // namespace tandem::k8s
