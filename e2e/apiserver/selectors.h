#pragma once
// Label selectors (?labelSelector=) and field selectors (?fieldSelector=).
//
//   labels: "a=b", "a==b", "a!=b", "a in (x,y)", "a notin (x)", "a", "!a", comma-joined (AND)
//   fields: "metadata.name=x", "metadata.namespace!=y", comma-joined (AND)
//
// Custom resources support only metadata.name and metadata.namespace in
// field selectors (as on a real server without selectableFields); built-ins
// here accept any dotted path, where a real server allows a fixed list per
// kind (spec.nodeName, status.phase, ...). Parse errors throw ApiError 400.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::apiserver {

class Selector {
 public:
  static Selector parseLabels(const std::string& text);
  static Selector parseFields(const std::string& text, bool customResource);

  bool matches(const nlohmann::json& object) const;
  bool empty() const { return terms_.empty(); }

 private:
  enum class Op { kEq, kNotEq, kIn, kNotIn, kExists, kNotExists };
  struct Term {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };
  bool fields_ = false;
  std::vector<Term> terms_;
};

// "app=x,tier=y" from a LabelSelector's matchLabels (Scale.status.selector).
std::string formatLabelSelector(const nlohmann::json& selector);

}  // namespace tandem::apiserver
