#pragma once
// The read-only documents the emulator derives from its resource types:
// discovery (/api, /apis, /api/v1, /apis/<g>/<v>), the minimal OpenAPI v3
// kubectl needs for validation and patch-type choice (K8S_API_NOTES.md), and
// server-side Tables (Accept: application/json;as=Table;v=v1;g=meta.k8s.io).
//
// Discovery is the legacy (unaggregated) form: kubectl asks for aggregated
// discovery v2 first but accepts plain application/json. Pure code.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/apiserver/resource_types.h"
#include "src/common/clock.h"

namespace tandem::apiserver {

nlohmann::json apiVersionsDoc(const std::string& serverAddress);
nlohmann::json apiGroupListDoc(const std::vector<const ResourceType*>& types);
// null when no type has that group.
nlohmann::json apiGroupDoc(const std::vector<const ResourceType*>& types, const std::string& group);
// The APIResourceList of one group/version, with <plural>/status and <plural>/scale entries.
nlohmann::json apiResourceListDoc(const std::vector<const ResourceType*>& types, const std::string& group,
                                  const std::string& version);

// {"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=..."}, "apis/<g>/<v>":...}}
nlohmann::json openapiV3Index(const std::vector<const ResourceType*>& types);
// The document of one group/version ("api/v1", "apis/g/v"); null if unknown.
nlohmann::json openapiV3Doc(const std::vector<const ResourceType*>& types, const std::string& gvPath);

// A meta.k8s.io/v1 Table of `objects` (full objects when includeObject is
// "Object", else PartialObjectMetadata). Date columns show ages as of `now`.
nlohmann::json tableDoc(const ResourceType& type, const std::vector<nlohmann::json>& objects,
                        const std::string& resourceVersion, const std::string& includeObject, bool withHeaders,
                        WallTime now);

}  // namespace tandem::apiserver
