#include "src/k8s/resource.h"

#include <cstdio>
#include <ctime>

#include "src/common/strings.h"

namespace tandem::k8s {

ResourceRef podsResource() { return {"", "v1", "pods", true}; }
ResourceRef configMapsResource() { return {"", "v1", "configmaps", true}; }
ResourceRef servicesResource() { return {"", "v1", "services", true}; }
ResourceRef namespacesResource() { return {"", "v1", "namespaces", false}; }
ResourceRef deploymentsResource() { return {"apps", "v1", "deployments", true}; }
ResourceRef leasesResource() { return {"coordination.k8s.io", "v1", "leases", true}; }
ResourceRef eventsResource() { return {"events.k8s.io", "v1", "events", true}; }
ResourceRef secretsResource() { return {"", "v1", "secrets", true}; }
ResourceRef endpointSlicesResource() { return {"discovery.k8s.io", "v1", "endpointslices", true}; }

std::string collectionPath(const ResourceRef& ref, std::string_view ns) {
  std::string out = ref.group.empty() ? strCat("/api/", ref.version) : strCat("/apis/", ref.group, "/", ref.version);
  if (ref.namespaced && !ns.empty()) out = strCat(out, "/namespaces/", percentEncode(ns));
  return strCat(out, "/", ref.resource);
}

std::string objectPath(const ResourceRef& ref, std::string_view ns, std::string_view name,
                       std::string_view subresource) {
  std::string out = strCat(collectionPath(ref, ns), "/", percentEncode(name));
  if (!subresource.empty()) out = strCat(out, "/", subresource);
  return out;
}

std::string percentEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                      c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string encodeQuery(const QueryParams& params) {
  std::string out;
  for (const auto& [k, v] : params) out = strCat(out, out.empty() ? "?" : "&", percentEncode(k), "=", percentEncode(v));
  return out;
}

namespace {
std::string formatEqualities(const std::map<std::string, std::string>& m) {
  std::string out;
  for (const auto& [k, v] : m) out = strCat(out, out.empty() ? "" : ",", k, "=", v);
  return out;
}

std::string_view trimView(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}
}  // namespace

std::string formatLabelSelector(const std::map<std::string, std::string>& labels) { return formatEqualities(labels); }
std::string formatFieldSelector(const std::map<std::string, std::string>& fields) { return formatEqualities(fields); }

bool labelsMatch(std::string_view selector, const nlohmann::json& labels) {
  auto lookup = [&](std::string_view key) -> const nlohmann::json* {
    if (!labels.is_object()) return nullptr;
    auto it = labels.find(std::string(key));
    return it == labels.end() || !it->is_string() ? nullptr : &*it;
  };
  // Set-based terms contain parentheses with commas inside: split outside them.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= selector.size(); ++i) {
    if (i < selector.size()) {
      if (selector[i] == '(') ++depth;
      if (selector[i] == ')') --depth;
      if (selector[i] != ',' || depth > 0) continue;
    }
    std::string_view term = trimView(selector.substr(start, i - start));
    start = i + 1;
    if (term.empty() || term.find('(') != std::string_view::npos) continue;
    if (size_t p = term.find("!="); p != std::string_view::npos) {
      const nlohmann::json* v = lookup(trimView(term.substr(0, p)));
      if (v && v->get<std::string>() == trimView(term.substr(p + 2))) return false;
    } else if (size_t q = term.find('='); q != std::string_view::npos) {
      size_t valueStart = (q + 1 < term.size() && term[q + 1] == '=') ? q + 2 : q + 1;
      const nlohmann::json* v = lookup(trimView(term.substr(0, q)));
      if (!v || v->get<std::string>() != trimView(term.substr(valueStart))) return false;
    } else if (term.front() == '!') {
      if (lookup(trimView(term.substr(1)))) return false;
    } else if (!lookup(term)) {
      return false;
    }
  }
  return true;
}

namespace {
std::string metaString(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto meta = obj.find("metadata");
  if (meta == obj.end() || !meta->is_object()) return "";
  auto it = meta->find(key);
  return it != meta->end() && it->is_string() ? it->get<std::string>() : "";
}
}  // namespace

std::string objectName(const nlohmann::json& obj) { return metaString(obj, "name"); }
std::string objectNamespace(const nlohmann::json& obj) { return metaString(obj, "namespace"); }
std::string objectResourceVersion(const nlohmann::json& obj) { return metaString(obj, "resourceVersion"); }
std::string objectUid(const nlohmann::json& obj) { return metaString(obj, "uid"); }

const nlohmann::json& objectLabels(const nlohmann::json& obj) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  if (!obj.is_object()) return kEmpty;
  auto meta = obj.find("metadata");
  if (meta == obj.end() || !meta->is_object()) return kEmpty;
  auto it = meta->find("labels");
  return it != meta->end() && it->is_object() ? *it : kEmpty;
}

std::string objectKey(std::string_view ns, std::string_view name) {
  return ns.empty() ? std::string(name) : strCat(ns, "/", name);
}
std::string objectKey(const nlohmann::json& obj) { return objectKey(objectNamespace(obj), objectName(obj)); }

std::pair<std::string, std::string> splitObjectKey(std::string_view key) {
  size_t slash = key.find('/');
  if (slash == std::string_view::npos) return {"", std::string(key)};
  return {std::string(key.substr(0, slash)), std::string(key.substr(slash + 1))};
}

std::string formatTime(WallTime t) {
  const std::string micro = formatMicroTime(t);
  return micro.substr(0, micro.find('.')) + "Z";
}

std::string formatMicroTime(WallTime t) {
  auto micros = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  int64_t secs = micros / 1000000;
  int64_t frac = micros % 1000000;
  if (frac < 0) {
    frac += 1000000;
    --secs;
  }
  std::time_t tt = static_cast<std::time_t>(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(frac));
  return buf;
}

bool parseTime(std::string_view s, WallTime* out) {
  std::tm tm{};
  int year, mon, day, hour, min, sec;
  std::string str(s);
  int consumed = 0;
  if (std::sscanf(str.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &year, &mon, &day, &hour, &min, &sec, &consumed) != 6) {
    return false;
  }
  int64_t micros = 0;
  size_t i = static_cast<size_t>(consumed);
  if (i < str.size() && str[i] == '.') {
    ++i;
    int digits = 0;
    while (i < str.size() && str[i] >= '0' && str[i] <= '9') {
      if (digits < 6) {
        micros = micros * 10 + (str[i] - '0');
        ++digits;
      }
      ++i;
    }
    while (digits++ < 6) micros *= 10;
  }
  if (i >= str.size() || (str[i] != 'Z' && str[i] != 'z')) return false;  // only UTC, as the API server writes
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = min;
  tm.tm_sec = sec;
  std::time_t tt = timegm(&tm);
  *out = WallTime(
      std::chrono::duration_cast<WallTime::duration>(std::chrono::seconds(tt) + std::chrono::microseconds(micros)));
  return true;
}

}  // namespace tandem::k8s
