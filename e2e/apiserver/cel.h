#pragma once
// The subset of CEL that CRD validation rules (x-kubernetes-validations)
// use here (docs/testing.md): enough for the InferencePool's rules and
// their like, evaluated the way the API server does.
//
//   literals      integers, numbers, 'strings' / "strings", true, false, null
//   variables     self, oldSelf, and field selection: self.spec.replicas
//   functions     has(self.x.y) (presence of the last field), size(x)
//                 (string length in code points, list or map size)
//   operators     ! && || == != < <= > >= + - (numbers), parentheses
//
// Anything else (macros such as all()/exists(), indexing, ternaries,
// method calls) fails compile() with a message naming it, which the
// emulator turns into a refused CRD, as a real server refuses a rule that
// does not compile. Selecting a field that is absent is an error at
// evaluation ("no such key"), as in CEL: rules guard with has().
//
// Pure; a compiled program is immutable and thread-safe.

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace tandem::apiserver {

class CelProgram {
 public:
  struct Node;
  static absl::StatusOr<CelProgram> compile(std::string_view expression);

  // The rule's verdict for `self` (and `old_self` on an update; null on a
  // create, when a rule that reads oldSelf is not evaluated: see usesOldSelf).
  absl::StatusOr<bool> evaluate(const nlohmann::json& self, const nlohmann::json* old_self) const;
  // A transition rule: evaluated only when there is an old object.
  bool usesOldSelf() const { return uses_old_self_; }

 private:
  std::shared_ptr<const Node> root_;
  bool uses_old_self_ = false;
};

}  // namespace tandem::apiserver
