#pragma once
// Structural-schema handling of custom resources (apiextensions.k8s.io/v1
// openAPIV3Schema), in the order the real server applies it: prune unknown
// fields, apply defaults, validate.
//
// Supported keywords: type (object, array, string, integer, number,
// boolean), properties, additionalProperties (schema or bool), items,
// required, enum, minimum/maximum (+ exclusive), minLength/maxLength,
// minItems/maxItems, pattern (ECMAScript regex), nullable, default,
// x-kubernetes-preserve-unknown-fields, x-kubernetes-int-or-string,
// x-kubernetes-embedded-resource (as preserve). Not supported: CEL
// (x-kubernetes-validations), format checks, oneOf/anyOf/allOf/not,
// listType/listMapKeys uniqueness.
//
// apiVersion, kind and metadata at the root are never pruned (the server
// owns metadata). Pure code; thread-safe.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/apiserver/api_error.h"

namespace tandem::apiserver {

// Removes fields the schema does not know; returns their paths
// ("spec.foo"), which fieldValidation=Strict turns into an error.
std::vector<std::string> pruneUnknownFields(const nlohmann::json& schema, nlohmann::json& object);

// Fills in `default`s of absent properties, recursively.
void applyDefaults(const nlohmann::json& schema, nlohmann::json& object);

// Field errors of `object` against `schema` (empty: valid).
std::vector<StatusCause> validateSchema(const nlohmann::json& schema, const nlohmann::json& object);

}  // namespace tandem::apiserver
