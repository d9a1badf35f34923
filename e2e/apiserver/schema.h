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
// x-kubernetes-embedded-resource (as preserve), and x-kubernetes-validations
// rules in the CEL subset of cel.h (self, oldSelf on updates). Not
// supported: format checks, oneOf/anyOf/allOf/not, listType/listMapKeys
// uniqueness.
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

// Field errors of `object` against `schema` (empty: valid); the CEL rules
// run once the structure is valid, transition rules only with `old` (the
// object before an update).
std::vector<StatusCause> validateSchema(const nlohmann::json& schema, const nlohmann::json& object,
                                        const nlohmann::json* old = nullptr);

// The CEL rules of `schema` that do not compile here, each named by its
// path under `path` (a CRD with one is refused).
std::vector<StatusCause> compileValidationRules(const nlohmann::json& schema, const std::string& path);

}  // namespace tandem::apiserver
