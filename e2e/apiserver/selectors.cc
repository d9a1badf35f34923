#include "e2e/apiserver/selectors.h"

#include <algorithm>

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/json_util.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

std::string trim(std::string s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Splits on commas outside parentheses.
std::vector<std::string> splitTerms(const std::string& text) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!trim(cur).empty()) out.push_back(trim(cur));
  return out;
}

}  // namespace

Selector Selector::parseLabels(const std::string& text) {
  Selector s;
  for (const std::string& term : splitTerms(text)) {
    if (term.empty()) continue;
    size_t pos;
    if (term[0] == '!') {
      s.terms_.push_back({trim(term.substr(1)), Op::kNotExists, {}});
    } else if ((pos = term.find(" notin ")) != std::string::npos || (pos = term.find(" in ")) != std::string::npos) {
      bool notIn = term.compare(pos, 7, " notin ") == 0;
      std::string key = trim(term.substr(0, pos));
      std::string rest = trim(term.substr(pos + (notIn ? 7 : 4)));
      if (rest.size() < 2 || rest.front() != '(' || rest.back() != ')') {
        throw badRequest(strCat("unable to parse requirement: found '", rest, "', expected: '('"));
      }
      std::vector<std::string> values;
      for (const auto& v : splitTerms(rest.substr(1, rest.size() - 2))) values.push_back(trim(v));
      s.terms_.push_back({key, notIn ? Op::kNotIn : Op::kIn, values});
    } else if ((pos = term.find("!=")) != std::string::npos) {
      s.terms_.push_back({trim(term.substr(0, pos)), Op::kNotEq, {trim(term.substr(pos + 2))}});
    } else if ((pos = term.find("==")) != std::string::npos) {
      s.terms_.push_back({trim(term.substr(0, pos)), Op::kEq, {trim(term.substr(pos + 2))}});
    } else if ((pos = term.find('=')) != std::string::npos) {
      s.terms_.push_back({trim(term.substr(0, pos)), Op::kEq, {trim(term.substr(pos + 1))}});
    } else {
      if (term.find_first_of(" ()") != std::string::npos)
        throw badRequest(strCat("unable to parse requirement: ", term));
      s.terms_.push_back({term, Op::kExists, {}});
    }
  }
  return s;
}

Selector Selector::parseFields(const std::string& text, bool customResource) {
  Selector s;
  s.fields_ = true;
  for (const std::string& term : splitTerms(text)) {
    if (term.empty()) continue;
    size_t pos;
    Term t;
    if ((pos = term.find("!=")) != std::string::npos) {
      t = {trim(term.substr(0, pos)), Op::kNotEq, {trim(term.substr(pos + 2))}};
    } else if ((pos = term.find("==")) != std::string::npos) {
      t = {trim(term.substr(0, pos)), Op::kEq, {trim(term.substr(pos + 2))}};
    } else if ((pos = term.find('=')) != std::string::npos) {
      t = {trim(term.substr(0, pos)), Op::kEq, {trim(term.substr(pos + 1))}};
    } else {
      throw badRequest(strCat("invalid selector: '", text, "'; can't understand '", term, "'"));
    }
    if (customResource && t.key != "metadata.name" && t.key != "metadata.namespace") {
      throw badRequest(strCat("field label not supported: ", t.key));
    }
    s.terms_.push_back(std::move(t));
  }
  return s;
}

bool Selector::matches(const json& object) const {
  for (const Term& t : terms_) {
    std::optional<std::string> value;
    if (fields_) {
      auto v = evalJsonPath(object, strCat(".", t.key));
      if (v) value = v->is_string() ? v->get<std::string>() : v->dump();
      if (!value) value = "";  // a missing field compares as empty, as on a real server
    } else {
      const json& labels = object["metadata"].value("labels", json::object());
      if (labels.contains(t.key) && labels[t.key].is_string()) value = labels[t.key].get<std::string>();
    }
    bool ok = false;
    switch (t.op) {
      case Op::kEq:
        ok = value && *value == t.values[0];
        break;
      case Op::kNotEq:
        ok = !value || *value != t.values[0];
        break;
      case Op::kIn:
        ok = value && std::find(t.values.begin(), t.values.end(), *value) != t.values.end();
        break;
      case Op::kNotIn:
        ok = !value || std::find(t.values.begin(), t.values.end(), *value) == t.values.end();
        break;
      case Op::kExists:
        ok = value.has_value();
        break;
      case Op::kNotExists:
        ok = !value.has_value();
        break;
    }
    if (!ok) return false;
  }
  return true;
}

std::string formatLabelSelector(const json& selector) {
  if (selector.is_string()) return selector.get<std::string>();
  std::string out;
  if (!selector.is_object()) return out;
  const json matchLabels = selector.value("matchLabels", json::object());
  for (const auto& [k, v] : matchLabels.items()) {
    out += strCat(out.empty() ? "" : ",", k, "=", v.is_string() ? v.get<std::string>() : v.dump());
  }
  for (const auto& e : selector.value("matchExpressions", json::array())) {
    std::string op = e.value("operator", "");
    std::string key = e.value("key", "");
    std::string values;
    for (const auto& v : e.value("values", json::array()))
      values += strCat(values.empty() ? "" : ",", v.get<std::string>());
    std::string term = op == "In"       ? strCat(key, " in (", values, ")")
                       : op == "NotIn"  ? strCat(key, " notin (", values, ")")
                       : op == "Exists" ? key
                                        : strCat("!", key);
    out += strCat(out.empty() ? "" : ",", term);
  }
  return out;
}

}  // namespace tandem::apiserver
