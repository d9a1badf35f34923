#pragma once
// What the emulator serves: one ResourceType per group/version/resource,
// the built-in ones fixed at start and custom ones added and removed as
// CustomResourceDefinitions come and go. Discovery, routing, tables and
// validation all read from here.
//
// Objects are stored once per group/resource (storageKey) whatever version
// they were written in; reading them through another served version only
// rewrites apiVersion (a CRD's "None" conversion strategy).

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::apiserver {

struct PrinterColumn {
  std::string name;  // "Replicas"
  std::string type;  // string, integer, number, boolean, date
  std::string format;
  std::string description;
  std::string jsonPath;  // ".spec.decode.replicas"
  int priority = 0;
};

// Where the scale subresource reads and writes replica counts.
struct ScalePaths {
  std::string specReplicasPath = ".spec.replicas";
  std::string statusReplicasPath = ".status.replicas";
  std::string labelSelectorPath;  // optional; a string field, or a LabelSelector for built-ins
};

struct ResourceType {
  std::string group;  // "" for the core group
  std::string version;
  std::string kind;
  std::string listKind;
  std::string plural;
  std::string singular;
  bool namespaced = true;
  std::vector<std::string> shortNames;
  std::vector<std::string> categories;
  bool hasStatus = false;                // a status subresource: the main endpoint keeps status
  std::optional<ScalePaths> scale;       // a scale subresource
  std::vector<PrinterColumn> columns;    // after Name; empty: Name and Age
  std::optional<nlohmann::json> schema;  // openAPIV3Schema; built-ins have none
  bool custom = false;                   // defined by a CRD
  bool hasGeneration = false;            // metadata.generation maintained
  // Pods only: pods/binding (POST, the scheduler's) and pods/log (GET, from the node's kubelet).
  bool podSubresources = false;

  std::string apiVersion() const { return group.empty() ? version : group + "/" + version; }
  std::string storageKey() const { return group + "/" + plural; }
};

// The built-in kinds (core/v1, apps/v1, discovery.k8s.io/v1,
// coordination.k8s.io/v1, events.k8s.io/v1, apiextensions.k8s.io/v1).
std::vector<ResourceType> builtinResourceTypes();

// The types a CustomResourceDefinition defines (one per served version).
// Throws ApiError (422 Invalid with field causes) for a malformed CRD.
std::vector<ResourceType> typesFromCrd(const nlohmann::json& crd);

// The types served now: the built-ins, then every CRD's. Pointers it hands
// out stay valid until that CRD is set again or erased. Not thread-safe (the
// emulator's mutex guards it).
class TypeRegistry {
 public:
  TypeRegistry() : builtins_(builtinResourceTypes()) {}

  std::vector<const ResourceType*> all() const;
  const ResourceType* find(const std::string& group, const std::string& version, const std::string& plural) const;
  // The first served version of a storage key ("apps/deployments"); null if none.
  const ResourceType* byStorageKey(const std::string& storageKey) const;
  // A built-in type; aborts if there is none (a typo in the emulator).
  const ResourceType& builtin(const std::string& group, const std::string& plural) const;

  // Serves (or re-serves) the types of the CRD named `crdName`.
  void setCrd(const std::string& crdName, std::vector<ResourceType> types);
  // Stops serving a CRD's types; returns their storage key ("" if it served none).
  std::string eraseCrd(const std::string& crdName);

 private:
  const std::vector<ResourceType> builtins_;
  std::map<std::string, std::vector<ResourceType>> crds_;  // CRD name -> served versions
};

}  // namespace tandem::apiserver
