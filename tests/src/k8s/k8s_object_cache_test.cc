#include <gtest/gtest.h>

#include "src/k8s/object_cache.h"
#include "src/k8s/resource.h"

namespace tandem::k8s {
namespace {

nlohmann::json obj(const std::string& ns, const std::string& name, const std::string& rv,
                   nlohmann::json labels = nlohmann::json::object()) {
  return {{"metadata", {{"namespace", ns}, {"name", name}, {"resourceVersion", rv}, {"labels", labels}}}};
}

std::vector<std::string> names(const std::vector<nlohmann::json>& objs) {
  std::vector<std::string> out;
  for (const auto& o : objs) out.push_back(objectKey(o));
  return out;
}

TEST(ObjectCacheTest, ReplaceDiffsAgainstWhatItHolds) {
  ObjectCache cache;
  auto first = cache.replace({obj("a", "x", "1"), obj("a", "y", "2")});
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].type, Delta::Type::kAdded);

  // Relist: x unchanged (no event), y updated, z new, and a vanished object
  // (deleted while we were not watching) reported as deleted.
  auto second = cache.replace({obj("a", "x", "1"), obj("a", "y", "5"), obj("b", "z", "6")});
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].type, Delta::Type::kUpdated);
  EXPECT_EQ(objectResourceVersion(second[0].old), "2");
  EXPECT_EQ(second[1].type, Delta::Type::kAdded);

  auto third = cache.replace({obj("b", "z", "6")});
  ASSERT_EQ(third.size(), 2u);
  EXPECT_EQ(third[0].type, Delta::Type::kDeleted);
  EXPECT_EQ(objectName(third[0].object), "x");
  EXPECT_EQ(third[1].type, Delta::Type::kDeleted);
  EXPECT_EQ(cache.keys(), std::vector<std::string>{"b/z"});
}

TEST(ObjectCacheTest, WatchEventsAreIdempotent) {
  ObjectCache cache;
  ASSERT_TRUE(cache.upsert(obj("a", "x", "1")).has_value());
  EXPECT_FALSE(cache.upsert(obj("a", "x", "1")).has_value());  // replayed ADDED
  auto update = cache.upsert(obj("a", "x", "2"));              // ADDED of a known object
  ASSERT_TRUE(update.has_value());
  EXPECT_EQ(update->type, Delta::Type::kUpdated);
  auto del = cache.erase(obj("a", "x", "3"));
  ASSERT_TRUE(del.has_value());
  EXPECT_EQ(objectResourceVersion(del->object), "3");
  EXPECT_FALSE(cache.erase(obj("a", "x", "3")).has_value());  // replayed DELETED
  EXPECT_EQ(cache.size(), 0u);
}

TEST(ObjectCacheTest, IndexesFollowUpdates) {
  ObjectCache cache;
  cache.replace({obj("a", "p1", "1", {{"role", "decode"}}), obj("a", "p2", "1", {{"role", "prefill"}}),
                 obj("b", "p3", "1", {{"role", "decode"}}), obj("", "node1", "1")});
  EXPECT_EQ(names(cache.listByLabel("role", "decode")), (std::vector<std::string>{"a/p1", "b/p3"}));
  EXPECT_EQ(names(cache.listInNamespace("a")), (std::vector<std::string>{"a/p1", "a/p2"}));
  EXPECT_EQ(names(cache.listInNamespace("")), (std::vector<std::string>{"node1"}));
  ASSERT_TRUE(cache.get("a", "p2").has_value());
  EXPECT_FALSE(cache.get("b", "p2").has_value());

  cache.upsert(obj("a", "p1", "2", {{"role", "prefill"}}));
  EXPECT_EQ(names(cache.listByLabel("role", "decode")), (std::vector<std::string>{"b/p3"}));
  EXPECT_EQ(names(cache.listByLabel("role", "prefill")), (std::vector<std::string>{"a/p1", "a/p2"}));
  cache.erase(obj("b", "p3", "3"));
  EXPECT_TRUE(cache.listByLabel("role", "decode").empty());
  EXPECT_TRUE(cache.listInNamespace("b").empty());
  EXPECT_EQ(cache.list().size(), 3u);
}

}  // namespace
}  // namespace tandem::k8s
