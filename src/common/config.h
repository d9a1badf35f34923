#pragma once
// Validated configuration from YAML.
//
//   TANDEM_ASSIGN_OR_RETURN(ConfigDoc doc, ConfigDoc::fromFile(path));
//   ConfigMap engine = doc.root().section("engine");
//   engine.field("num_blocks", &opts.num_blocks, {.min = 1});
//   engine.field("block_size", &opts.block_size, {.min = 1, .max = 1024});
//   doc.root().field("role", &opts.role, {.one_of = {"prefill", "decode", "both", "router"}});
//   TANDEM_RETURN_IF_ERROR(doc.finish());
//
// A field that is absent keeps the value already in *out (the default). Every
// problem is collected and finish() reports all of them, one per line, each
// naming where and what, e.g.
//
//   agent.yaml:3:15: engine.num_blocks: expected integer, got "many"
//   agent.yaml:5:3: engine.blok_size: unknown key (known keys: block_size, num_blocks)
//   agent.yaml: role: required key is missing
//
// Unknown keys are errors: a typo must not silently fall back to a default.
// Not thread-safe; one loader at a time.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/status.h"

namespace tandem {

struct FieldSpec {
  bool required = false;
  // Inclusive bounds for numbers (and durations, in seconds).
  std::optional<double> min;
  std::optional<double> max;
  // Allowed values for strings; empty means any.
  std::vector<std::string> one_of;
};

class ConfigDoc;

// A YAML mapping at some key path. A handle into its ConfigDoc; valid while
// the doc lives.
class ConfigMap {
 public:
  // Reads `key` into *out. Supported T: bool, int32_t, int64_t, uint32_t,
  // uint64_t, double, std::string, std::vector<std::string>,
  // std::chrono::nanoseconds ("250ms", "30s", "5m", "1h"). Returns true when
  // the key was present and valid.
  template <typename T>
  bool field(std::string_view key, T* out, const FieldSpec& spec = {});

  // A nested mapping. Absent: an empty map (its fields keep their defaults).
  // Present but not a mapping: an error, and an empty map is returned.
  ConfigMap section(std::string_view key, const FieldSpec& spec = {});
  // A sequence of mappings (e.g. a list of peers); paths read "peers[2].host".
  std::vector<ConfigMap> sectionList(std::string_view key, const FieldSpec& spec = {});

  bool has(std::string_view key) const;
  // Records a semantic error against `key` of this map (cross-field checks).
  void fail(std::string_view key, std::string_view message);
  // Dotted path of this map ("" for the root).
  const std::string& path() const;

 private:
  friend class ConfigDoc;
  ConfigMap(ConfigDoc* doc, size_t index) : doc_(doc), index_(index) {}
  ConfigDoc* doc_;
  size_t index_;
};

class ConfigDoc {
 public:
  // Parses YAML text. Syntax errors fail here, naming line and column. An
  // empty document is an empty mapping; a top level that is not a mapping
  // is an error. `source` names the text in messages (a file name).
  static absl::StatusOr<ConfigDoc> fromString(std::string_view text, std::string_view source = "<config>");
  // Reads and parses a file; a missing or unreadable file is an error naming it.
  static absl::StatusOr<ConfigDoc> fromFile(const std::string& path);

  ConfigDoc(ConfigDoc&&) noexcept;
  ConfigDoc& operator=(ConfigDoc&&) noexcept;
  ~ConfigDoc();

  ConfigMap root() { return ConfigMap(this, 0); }

  // Checks for unknown keys in every map that was read and returns all
  // errors found (InvalidArgument), or OK.
  [[nodiscard]] absl::Status finish();

 private:
  friend class ConfigMap;
  struct Impl;
  explicit ConfigDoc(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Parses "250ms", "1.5s", "30s", "5m", "1h", "100us", "0". Exposed for flags.
absl::StatusOr<std::chrono::nanoseconds> parseDuration(std::string_view text);

}  // namespace tandem
