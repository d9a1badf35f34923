#pragma once
// Reading and writing the metadata of a stored object (JSON), shared by the
// emulator's writes, watches and garbage collector. Missing or ill-typed
// fields read as empty. Pure code.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::apiserver {

// metadata, or an empty object when it is missing or not an object.
const nlohmann::json& meta(const nlohmann::json& o);
std::string nameOf(const nlohmann::json& o);
std::string nsOf(const nlohmann::json& o);
std::string uidOf(const nlohmann::json& o);
std::string resourceVersionOf(const nlohmann::json& o);
// metadata.deletionTimestamp is set: the object is being deleted.
bool deleting(const nlohmann::json& o);
std::vector<std::string> finalizersOf(const nlohmann::json& o);
// Writes metadata.finalizers (removes the field when `f` is empty).
void setFinalizers(nlohmann::json& o, const std::vector<std::string>& f);

// The object as a given served version shows it (apiVersion and kind set).
struct ResourceType;
nlohmann::json view(const ResourceType& t, nlohmann::json o);

}  // namespace tandem::apiserver
