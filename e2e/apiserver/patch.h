#pragma once
// The PATCH bodies the emulator accepts, applied to an object's JSON.
//
//   application/merge-patch+json           RFC 7386: objects merge, null deletes, lists replace.
//   application/json-patch+json            RFC 6902 operations.
//   application/strategic-merge-patch+json built-in kinds only. A simplified strategic merge:
//       lists of objects whose elements all carry a merge key ("name",
//       "containerPort", "mountPath", "type", "ip") merge element by element;
//       other lists replace. Directives: "$patch: delete|replace" on maps and
//       list elements, "$retainKeys", "$deleteFromPrimitiveList/<f>";
//       "$setElementOrder/<f>" is accepted and only used to order the merged list.
//       A real server takes merge keys and strategies from the Go types
//       (patchMergeKey / patchStrategy tags).
//
// All functions throw ApiError with the code and reason a real server gives:
// a body that is not a valid patch is 400 BadRequest, a JSON patch whose
// operations do not apply is 422 Invalid.

#include <nlohmann/json.hpp>

namespace tandem::apiserver {

nlohmann::json applyMergePatch(nlohmann::json target, const nlohmann::json& patch);
nlohmann::json applyJsonPatch(const nlohmann::json& target, const nlohmann::json& patch);
nlohmann::json applyStrategicMergePatch(nlohmann::json target, const nlohmann::json& patch);

}  // namespace tandem::apiserver
