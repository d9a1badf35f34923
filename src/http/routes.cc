// Routes (server.h): method + exact path or longest prefix.

#include <algorithm>

#include "src/common/strings.h"
#include "src/http/server.h"

namespace tandem::http {

Routes& Routes::handle(std::string method, std::string path, Handler handler) {
  return add(std::move(method), std::move(path), false, std::move(handler));
}

Routes& Routes::handlePrefix(std::string method, std::string prefix, Handler handler) {
  return add(std::move(method), std::move(prefix), true, std::move(handler));
}

Routes& Routes::add(std::string method, std::string path, bool prefix, Handler handler) {
  auto route = std::find_if(routes_.begin(), routes_.end(),
                            [&](const Route& r) { return r.path == path && r.prefix == prefix; });
  if (route == routes_.end()) {
    routes_.push_back(Route{std::move(path), prefix, {}});
    route = std::prev(routes_.end());
  }
  auto same = std::find_if(route->byMethod.begin(), route->byMethod.end(),
                           [&](const auto& entry) { return entry.first == method; });
  if (same != route->byMethod.end()) {
    same->second = std::move(handler);  // the later registration wins
  } else {
    route->byMethod.emplace_back(std::move(method), std::move(handler));
  }
  return *this;
}

Routes::Match Routes::match(std::string_view method, std::string_view path) const {
  // Candidates by priority: the exact route, then prefixes, longest first.
  std::vector<const Route*> candidates;
  for (const Route& r : routes_) {
    if (r.prefix ? path.starts_with(r.path) : path == r.path) candidates.push_back(&r);
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const Route* a, const Route* b) {
    if (a->prefix != b->prefix) return !a->prefix;
    return a->path.size() > b->path.size();
  });
  Match match;
  std::vector<std::string> allowed;
  for (const Route* r : candidates) {
    for (const auto& [m, handler] : r->byMethod) {
      if (m == method) {
        match.handler = &handler;
        return match;
      }
      if (std::find(allowed.begin(), allowed.end(), m) == allowed.end()) allowed.push_back(m);
    }
  }
  std::sort(allowed.begin(), allowed.end());
  for (const std::string& m : allowed) match.allow = match.allow.empty() ? m : strCat(match.allow, ", ", m);
  return match;
}

}  // namespace tandem::http
