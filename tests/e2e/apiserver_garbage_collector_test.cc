// The emulator's garbage collector as pure code (e2e/apiserver/garbage_collector.h):
// snapshots of objects in, the planned store changes out. No store, no HTTP.

#include "e2e/apiserver/garbage_collector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::apiserver {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;

constexpr const char* kPods = "/pods";
constexpr const char* kDeploys = "apps/deployments";

GcObject object(const std::string& key, const std::string& name, std::vector<std::string> owners = {},
                std::vector<std::string> finalizers = {}) {
  GcObject o{.storageKey = key, .ns = "t", .name = name, .uid = "uid-" + name, .namespaced = true};
  for (const auto& owner : owners) {
    o.ownerReferences.push_back({{"uid", "uid-" + owner}, {"name", owner}, {"controller", true}});
  }
  o.finalizers = std::move(finalizers);
  return o;
}

GcObject namespaceObject(const std::string& name) {
  return {.storageKey = "/namespaces", .name = name, .uid = "uid-" + name, .keptUntilEmpty = true};
}

// "erase b", "mark a [foregroundDeletion]", "refs c []", "finalizers a [x]".
std::vector<std::string> describe(const std::vector<GcAction>& actions) {
  std::vector<std::string> out;
  for (const auto& a : actions) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
      return "[" + s + "]";
    };
    switch (a.type) {
      case GcActionType::kErase:
        out.push_back("erase " + a.name);
        break;
      case GcActionType::kMarkDeleting:
        out.push_back("mark " + a.name + " " + list(a.finalizers));
        break;
      case GcActionType::kSetFinalizers:
        out.push_back("finalizers " + a.name + " " + list(a.finalizers));
        break;
      case GcActionType::kSetOwnerReferences: {
        std::vector<std::string> owners;
        for (const auto& r : a.ownerReferences) owners.push_back(r["name"]);
        out.push_back("refs " + a.name + " " + list(owners));
        break;
      }
    }
  }
  return out;
}

TEST(GarbageCollectorTest, NothingToCollectPlansNothing) {
  GcPlanner plan({object(kDeploys, "a"), object(kPods, "b", {"a"}), namespaceObject("t")});
  plan.collect();
  EXPECT_TRUE(plan.actions().empty());
}

TEST(GarbageCollectorTest, BackgroundDeletionCascadesThroughGenerations) {
  GcPlanner plan({object(kDeploys, "a"), object("apps/replicasets", "b", {"a"}), object(kPods, "c", {"b"}),
                  object(kPods, "other")});
  EXPECT_TRUE(plan.requestDeletion("uid-a", DeletionPolicy::kBackground));
  plan.collect();
  EXPECT_THAT(describe(plan.actions()), ElementsAre("erase a", "erase b", "erase c"));
}

TEST(GarbageCollectorTest, DependentWhoseOwnerIsMissingIsDeletedWithoutARequest) {
  GcPlanner plan({object(kPods, "orphan", {"gone"}), object(kPods, "kept", {"gone"}, {"example.com/hold"})});
  plan.collect();
  EXPECT_THAT(describe(plan.actions()), ElementsAre("erase orphan", "mark kept [example.com/hold]"));
}

TEST(GarbageCollectorTest, ForegroundOwnerWaitsForItsDependentsFinalizers) {
  std::vector<GcObject> objects = {object(kDeploys, "a"), object(kPods, "b", {"a"}),
                                   object(kPods, "c", {"a"}, {"example.com/hold"})};
  GcPlanner plan(objects);
  EXPECT_FALSE(plan.requestDeletion("uid-a", DeletionPolicy::kForeground));
  plan.collect();
  EXPECT_THAT(describe(plan.actions()),
              ElementsAre("mark a [foregroundDeletion]", "erase b", "mark c [example.com/hold]"));

  // Later the dependent's finalizer is removed: it goes, then its owner.
  objects[0].deleting = true;
  objects[0].finalizers = {"foregroundDeletion"};
  objects[2].deleting = true;
  objects[2].finalizers = {};
  objects.erase(objects.begin() + 1);
  GcPlanner later(objects);
  later.collect();
  EXPECT_THAT(describe(later.actions()), ElementsAre("erase c", "erase a"));
}

TEST(GarbageCollectorTest, ForegroundKeepsTheOwnersOtherFinalizers) {
  GcPlanner plan({object(kDeploys, "a", {}, {"example.com/hold"}), object(kPods, "b", {"a"})});
  EXPECT_FALSE(plan.requestDeletion("uid-a", DeletionPolicy::kForeground));
  plan.collect();
  EXPECT_THAT(describe(plan.actions()), ElementsAre("mark a [example.com/hold,foregroundDeletion]", "erase b",
                                                    "finalizers a [example.com/hold]"));
}

TEST(GarbageCollectorTest, OrphanReleasesDependentsBeforeTheOwnerGoes) {
  GcPlanner plan({object(kDeploys, "a"), object(kDeploys, "d"), object(kPods, "only-a", {"a"}),
                  object(kPods, "a-and-d", {"a", "d"})});
  EXPECT_FALSE(plan.requestDeletion("uid-a", DeletionPolicy::kOrphan));
  plan.collect();
  EXPECT_THAT(describe(plan.actions()),
              ElementsAre("mark a [orphan]", "refs only-a []", "refs a-and-d [d]", "erase a"));
}

TEST(GarbageCollectorTest, PolicyFinalizersOnlyForOwnersWithDependents) {
  GcPlanner plan({object(kDeploys, "lonely")});
  EXPECT_TRUE(plan.requestDeletion("uid-lonely", DeletionPolicy::kForeground));
  plan.collect();
  EXPECT_THAT(describe(plan.actions()), ElementsAre("erase lonely"));
}

TEST(GarbageCollectorTest, NamespaceIsEmptiedThenErased) {
  GcObject clusterScoped{.storageKey = "/nodes", .name = "n", .uid = "uid-n"};
  std::vector<GcObject> objects = {namespaceObject("t"), object(kPods, "p"),
                                   object(kPods, "held", {}, {"example.com/hold"}), clusterScoped};
  GcPlanner plan(objects);
  EXPECT_FALSE(plan.requestDeletion("uid-t", DeletionPolicy::kBackground));
  plan.collect();
  EXPECT_THAT(describe(plan.actions()), ElementsAre("mark t []", "erase p", "mark held [example.com/hold]"));

  // The held object's finalizer is removed: it goes, and so does the namespace.
  objects[0].deleting = true;
  objects[2].deleting = true;
  objects[2].finalizers = {};
  objects.erase(objects.begin() + 1);
  GcPlanner later(objects);
  later.collect();
  EXPECT_THAT(describe(later.actions()), ElementsAre("erase held", "erase t"));
}

TEST(GarbageCollectorTest, DeletingObjectWithoutFinalizersIsErased) {
  GcObject o = object(kPods, "p");
  o.deleting = true;
  GcPlanner plan({o});
  plan.collect();
  EXPECT_THAT(describe(plan.actions()), ElementsAre("erase p"));
}

// One pass handles a long chain: each object is examined again only when a
// neighbour changed, so the plan has exactly one action per object.
TEST(GarbageCollectorTest, LongChainInOnePass) {
  constexpr int kLength = 5000;
  std::vector<GcObject> objects = {object(kPods, "p0")};
  for (int i = 1; i < kLength; ++i)
    objects.push_back(object(kPods, "p" + std::to_string(i), {"p" + std::to_string(i - 1)}));
  GcPlanner plan(std::move(objects));
  EXPECT_TRUE(plan.requestDeletion("uid-p0", DeletionPolicy::kBackground));
  plan.collect();
  ASSERT_EQ(plan.actions().size(), static_cast<size_t>(kLength));
  EXPECT_EQ(plan.actions().back().name, "p" + std::to_string(kLength - 1));
}

TEST(GarbageCollectorTest, UnknownUidIsNoDeletion) {
  GcPlanner plan({object(kPods, "p")});
  EXPECT_FALSE(plan.requestDeletion("uid-nope", DeletionPolicy::kBackground));
  plan.collect();
  EXPECT_TRUE(plan.actions().empty());
}

}  // namespace
}  // namespace tandem::apiserver
