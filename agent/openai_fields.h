#pragma once
// Typed readers of one field of an OpenAI request body, and the 400 errors
// they give; the building blocks of parseRequest (openai_request.cc).
//
// Every reader leaves `*out` unset when the field is absent or null, and
// returns an ApiError naming the field when it has the wrong type. Pure
// functions; thread-safe.

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/openai_api.h"

namespace tandem::agent {

// A 400 invalid_request_error about `param` ("" for the body itself).
ApiError invalidField(std::string param, std::string message, std::string code = {});

// "a string", "an integer", ... for messages like "'x' must be a number, got a string".
std::string jsonTypeName(const nlohmann::json& v);

// An integer, or a whole number written as a float (1e3); "too large" beyond
// int64 or (floats) beyond 2^53, where a double is no longer exact.
std::optional<ApiError> readInt(const nlohmann::json& body, const char* key, std::optional<int64_t>* out);
std::optional<ApiError> readNumber(const nlohmann::json& body, const char* key, std::optional<double>* out);
std::optional<ApiError> readBool(const nlohmann::json& body, const char* key, std::optional<bool>* out);
std::optional<ApiError> readString(const nlohmann::json& body, const char* key, std::optional<std::string>* out);

}  // namespace tandem::agent
