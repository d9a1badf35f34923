#include "e2e/kubelet/scheduler.h"

#include <algorithm>
#include <charconv>

#include "src/common/strings.h"

namespace tandem::kubelet {
namespace {

bool tolerates(const Toleration& t, const Taint& taint) {
  if (!t.effect.empty() && t.effect != taint.effect) return false;
  if (t.op == "Exists") return t.key.empty() || t.key == taint.key;
  return t.key == taint.key && t.value == taint.value;
}

}  // namespace

absl::StatusOr<int64_t> parseQuantityMilli(std::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(strCat("quantity \"", text,
                                             "\": expected a non-negative number with at most three decimals and "
                                             "an optional suffix (m, k, M, G, T, Ki, Mi, Gi, Ti)"));
  };
  size_t digits_end = 0;
  while (digits_end < text.size() && ((text[digits_end] >= '0' && text[digits_end] <= '9') || text[digits_end] == '.')) {
    ++digits_end;
  }
  const std::string_view number = text.substr(0, digits_end), suffix = text.substr(digits_end);
  if (number.empty() || number.front() == '.' || number.back() == '.') return bad();
  const size_t dot = number.find('.');
  const std::string_view whole = number.substr(0, dot);
  const std::string_view frac = dot == std::string_view::npos ? std::string_view() : number.substr(dot + 1);
  if (frac.size() > 3 || frac.find('.') != std::string_view::npos) return bad();
  int64_t w = 0, f = 0;
  if (std::from_chars(whole.data(), whole.data() + whole.size(), w).ec != std::errc()) return bad();
  if (!frac.empty() && std::from_chars(frac.data(), frac.data() + frac.size(), f).ec != std::errc()) return bad();
  for (size_t i = frac.size(); i < 3; ++i) f *= 10;
  int64_t scale = 0;  // multiplier of the value in thousandths; 0: "m"
  if (suffix.empty()) {
    scale = 1;
  } else if (suffix == "m") {
    scale = 0;
  } else {
    static const std::pair<std::string_view, int64_t> kSuffixes[] = {
        {"k", 1000},       {"M", 1000000},    {"G", 1000000000},    {"T", 1000000000000},
        {"Ki", int64_t{1} << 10}, {"Mi", int64_t{1} << 20}, {"Gi", int64_t{1} << 30}, {"Ti", int64_t{1} << 40}};
    for (const auto& [s, m] : kSuffixes) {
      if (suffix == s) scale = m;
    }
    if (scale == 0) return bad();
  }
  if (scale == 0) {  // "m": the number is already thousandths; no decimals
    if (!frac.empty()) return bad();
    return w;
  }
  if (w > INT64_MAX / 1000 - 1) return bad();
  const int64_t milli = w * 1000 + f;
  if (milli > INT64_MAX / scale) return bad();
  return milli * scale;
}

std::variant<std::string, Unschedulable> schedule(const PodNeeds& pod, const std::vector<NodeInfo>& nodes,
                                                  const std::map<std::string, std::map<std::string, int64_t>>& bound) {
  std::map<std::string, int> reasons;  // reason -> number of nodes
  const std::string* best = nullptr;
  double best_room = -1;
  for (const NodeInfo& node : nodes) {
    if (node.unschedulable) {
      ++reasons["node(s) were unschedulable"];
      continue;
    }
    const Taint* untolerated = nullptr;
    for (const Taint& taint : node.taints) {
      if (taint.effect == "PreferNoSchedule") continue;
      const bool ok = std::any_of(pod.tolerations.begin(), pod.tolerations.end(),
                                  [&](const Toleration& t) { return tolerates(t, taint); });
      if (!ok) {
        untolerated = &taint;
        break;
      }
    }
    if (untolerated != nullptr) {
      ++reasons[strCat("node(s) had untolerated taint {", untolerated->key, ": ", untolerated->value, "}")];
      continue;
    }
    bool selected = true;
    for (const auto& [k, v] : pod.node_selector) {
      auto it = node.labels.find(k);
      selected = selected && it != node.labels.end() && it->second == v;
    }
    if (!selected) {
      ++reasons["node(s) didn't match Pod's node affinity/selector"];
      continue;
    }
    auto used_it = bound.find(node.name);
    bool fits = true;
    double room = 0;
    for (const auto& [resource, want] : pod.requests) {
      if (want <= 0) continue;
      auto a = node.allocatable.find(resource);
      const int64_t allocatable = a == node.allocatable.end() ? 0 : a->second;
      int64_t used = 0;
      if (used_it != bound.end()) {
        auto u = used_it->second.find(resource);
        if (u != used_it->second.end()) used = u->second;
      }
      if (allocatable - used < want) {
        ++reasons[strCat("Insufficient ", resource)];
        fits = false;
      } else {
        room += static_cast<double>(allocatable - used - want) / static_cast<double>(allocatable);
      }
    }
    if (!fits) continue;
    if (best == nullptr || room > best_room || (room == best_room && node.name < *best)) {
      best = &node.name;
      best_room = room;
    }
  }
  if (best != nullptr) return *best;
  if (nodes.empty()) return Unschedulable{"no nodes available to schedule pods"};
  // "<count> <reason>", sorted as strings, as kube-scheduler sorts them.
  std::vector<std::string> counted;
  for (const auto& [reason, n] : reasons) counted.push_back(strCat(n, " ", reason));
  std::sort(counted.begin(), counted.end());
  std::string why;
  for (const std::string& r : counted) why += strCat(why.empty() ? "" : ", ", r);
  return Unschedulable{strCat("0/", nodes.size(), " nodes are available", why.empty() ? "" : ": ", why, ".")};
}

}  // namespace tandem::kubelet
