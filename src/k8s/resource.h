#pragma once
// Addressing resources and reading object metadata.
//
// A resource is (group, version, plural); the path follows from it:
//   core:   /api/v1[/namespaces/<ns>]/<plural>[/<name>[/<subresource>]]
//   groups: /apis/<group>/<version>[/namespaces/<ns>]/<plural>[/<name>[/<subresource>]]
// An empty namespace on a namespaced resource addresses all namespaces (list
// and watch only).
//
// Objects are nlohmann::json; the helpers below read the metadata fields the
// library needs and tolerate them missing. Pure functions, thread-safe.

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/common/clock.h"

namespace tandem::k8s {

struct ResourceRef {
  std::string group;  // "" for core
  std::string version;
  std::string resource;  // plural: "pods", "leases", "inferencepools"
  bool namespaced = true;

  // "v1" or "group/version".
  std::string apiVersion() const { return group.empty() ? version : group + "/" + version; }
};

// Well-known resources.
ResourceRef podsResource();
ResourceRef configMapsResource();
ResourceRef servicesResource();
ResourceRef namespacesResource();
ResourceRef deploymentsResource();
ResourceRef leasesResource();
ResourceRef eventsResource();  // events.k8s.io/v1
ResourceRef secretsResource();
ResourceRef endpointSlicesResource();  // discovery.k8s.io/v1

// The collection path ("/api/v1/namespaces/ns/pods"); `ns` is ignored for
// cluster-scoped resources.
std::string collectionPath(const ResourceRef& ref, std::string_view ns);
// The object path, with an optional subresource ("status", "scale").
std::string objectPath(const ResourceRef& ref, std::string_view ns, std::string_view name,
                       std::string_view subresource = "");

// Query parameters in order; values are percent-encoded by encodeQuery().
using QueryParams = std::vector<std::pair<std::string, std::string>>;
std::string percentEncode(std::string_view s);
// "?a=1&b=x%3Dy", or "" when empty.
std::string encodeQuery(const QueryParams& params);

// Equality label selector: {"app":"x","role":"decode"} → "app=x,role=decode"
// (sorted by key, as std::map orders them).
std::string formatLabelSelector(const std::map<std::string, std::string>& labels);
// Field selector from equalities: {"metadata.name":"a"} → "metadata.name=a".
std::string formatFieldSelector(const std::map<std::string, std::string>& fields);
// True when `labels` (an object's metadata.labels) satisfy every term of an
// equality-based selector string ("a=b,c==d,e!=f,g,!h"). Set-based terms
// ("x in (a,b)") are not evaluated here: they return true (the server filters).
bool labelsMatch(std::string_view selector, const nlohmann::json& labels);

// Metadata accessors; "" / empty when absent.
std::string objectName(const nlohmann::json& obj);
std::string objectNamespace(const nlohmann::json& obj);
std::string objectResourceVersion(const nlohmann::json& obj);
std::string objectUid(const nlohmann::json& obj);
const nlohmann::json& objectLabels(const nlohmann::json& obj);  // a map (maybe empty)

// The cache and work-queue key: "ns/name", or "name" when cluster-scoped.
std::string objectKey(std::string_view ns, std::string_view name);
std::string objectKey(const nlohmann::json& obj);
// Splits a key back into (namespace, name).
std::pair<std::string, std::string> splitObjectKey(std::string_view key);

// metav1.MicroTime: "2026-01-01T00:00:00.000000Z" (RFC 3339, microseconds, UTC).
std::string formatMicroTime(WallTime t);
// metav1.Time: "2026-01-01T00:00:00Z" (RFC 3339, seconds, UTC).
std::string formatTime(WallTime t);
// Parses RFC 3339 with or without fractional seconds ("...Z"); false if malformed.
bool parseTime(std::string_view s, WallTime* out);

}  // namespace tandem::k8s
