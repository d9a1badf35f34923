#include "e2e/apiserver/faults.h"

#include <nlohmann/json.hpp>

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/store.h"
#include "e2e/apiserver/watch_hub.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

int64_t millis(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

json toJson(const FaultOptions& f) {
  return {{"conflictRate", f.conflictRate},
          {"errorRate", f.errorRate},
          {"slowRate", f.slowRate},
          {"slowDelayMs", millis(f.slowDelay)},
          {"watchDropAfterMs", millis(f.watchDropAfter)}};
}

FaultOptions fromJson(const json& b) {
  FaultOptions f;
  f.conflictRate = b.value("conflictRate", 0.0);
  f.errorRate = b.value("errorRate", 0.0);
  f.slowRate = b.value("slowRate", 0.0);
  f.slowDelay = std::chrono::milliseconds(b.value("slowDelayMs", 0));
  f.watchDropAfter = std::chrono::milliseconds(b.value("watchDropAfterMs", 0));
  return f;
}

}  // namespace

bool FaultInjector::draw(double rate) {
  if (rate <= 0) return false;
  std::uniform_real_distribution<double> coin(0, 1);
  return coin(rng_) < rate;
}

void FaultInjector::maybeFail(const std::string& method, const std::string& resource, const std::string& group,
                              const std::string& name) {
  if (draw(options_.errorRate)) throw internalError("injected fault (tandem-apiserver)");
  if ((method == "PUT" || method == "PATCH") && draw(options_.conflictRate)) {
    throw staleConflict(resource, group, name);
  }
}

Duration FaultInjector::delayFor(bool watch) {
  if (watch || !draw(options_.slowRate)) return Duration::zero();
  return options_.slowDelay;
}

void DelayedReplies::add(MonoTime due, std::shared_ptr<http::Responder> responder, http::Response response) {
  byDue_.emplace(due, Reply{std::move(responder), std::move(response)});
}

MonoTime DelayedReplies::nextDeadline() const { return byDue_.empty() ? MonoTime::max() : byDue_.begin()->first; }

std::vector<DelayedReplies::Reply> DelayedReplies::takeDue(MonoTime now) {
  std::vector<Reply> out;
  auto end = now == MonoTime::max() ? byDue_.end() : byDue_.upper_bound(now);
  for (auto it = byDue_.begin(); it != end; ++it) out.push_back(std::move(it->second));
  byDue_.erase(byDue_.begin(), end);
  return out;
}

http::Response faultControl(const http::Request& req, FaultInjector& faults, WatchHub& watches, Store& store,
                            MonoTime now) {
  if (req.path() == "/tandem/faults" && req.method() == "GET")
    return http::Response::json(200, toJson(faults.options()));
  if (req.path() == "/tandem/faults" && req.method() == "PUT") {
    FaultOptions f = fromJson(json::parse(req.body()));
    faults.set(f);
    if (f.watchDropAfter > Duration::zero()) watches.limitAll(now + f.watchDropAfter);
    return http::Response::json(200, toJson(f));
  }
  if (req.path() == "/tandem/compact" && req.method() == "POST") {
    store.compact();
    return http::Response::json(200, {{"compactedResourceVersion", std::to_string(store.compactedRv())}});
  }
  throw pathNotFound();
}

}  // namespace tandem::apiserver
