#pragma once
// Whole-file reads and writes for model directories. Errors name the path
// and the OS reason.

#include <string>

#include "src/common/status.h"

namespace tandem::engine {

// NotFound when the file does not exist.
[[nodiscard]] absl::StatusOr<std::string> readFile(const std::string& path);
// Writes `path` + ".tmp" and renames it over `path`, so readers never see a
// partly written file.
[[nodiscard]] absl::Status writeFileAtomically(const std::string& path, const std::string& contents);
bool fileExists(const std::string& path);

}  // namespace tandem::engine
