#include "agent/router/routing_knobs.h"

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "src/common/log.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::agent {

absl::StatusOr<routing::RouterConfig> applyRoutingKnobs(const routing::RouterConfig& base, std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("routing knobs: not JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("routing knobs: expected a JSON object");
  routing::RouterConfig c = base;
  for (const auto& [key, v] : j.items()) {
    if (key == "directMaxSuffixTokens") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        return absl::InvalidArgumentError(strCat("routing knobs: directMaxSuffixTokens: expected an integer >= 0, got ", v.dump()));
      }
      c.direct_max_suffix_tokens = v.get<int64_t>();
    } else if (key == "loadFloorWeight") {
      if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > 1e6) {
        return absl::InvalidArgumentError(strCat("routing knobs: loadFloorWeight: expected a number in [0, 1e6], got ", v.dump()));
      }
      c.load_floor_weight = v.get<double>();
    } else if (key == "prefillOverloadTokens") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > int64_t{1'000'000'000'000}) {
        return absl::InvalidArgumentError(
            strCat("routing knobs: prefillOverloadTokens: expected an integer in [0, 1e12], got ", v.dump()));
      }
      c.prefill_overload_tokens = v.get<int64_t>();
    } else {
      return absl::InvalidArgumentError(strCat("routing knobs: unknown knob \"", key,
                                               "\" (known: directMaxSuffixTokens, loadFloorWeight, prefillOverloadTokens)"));
    }
  }
  TANDEM_RETURN_IF_ERROR(routing::validateRouterConfig(c));
  return c;
}

struct RoutingKnobsWatcher::Impl {
  std::string path;
  routing::RouterConfig base;
  std::function<absl::Status(const routing::RouterConfig&)> apply;
  Logger log{"router"};
  std::optional<std::string> applied;  // the file's content last applied; nullopt: the base (no file)
  std::string last_error;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread thread;

  void poll() {
    std::ifstream in(path);
    std::optional<std::string> content;
    if (in) {
      std::ostringstream s;
      s << in.rdbuf();
      content = s.str();
    }
    if (content == applied) return;
    absl::StatusOr<routing::RouterConfig> c = content ? applyRoutingKnobs(base, *content) : base;
    absl::Status s = c.ok() ? apply(*c) : c.status();
    if (!s.ok()) {
      if (std::string why(s.message()); why != last_error) {
        log.warn("routing knobs not applied", {{"file", path}, {"error", why}});
        last_error = why;
      }
      return;
    }
    applied = content;
    last_error.clear();
    log.info(content ? "routing knobs applied" : "routing knobs removed: the configured ones apply",
             {{"file", path},
              {"direct_max_suffix_tokens", c->direct_max_suffix_tokens},
              {"load_floor_weight", c->load_floor_weight},
              {"prefill_overload_tokens", c->prefill_overload_tokens}});
  }
};

RoutingKnobsWatcher::RoutingKnobsWatcher(std::string path, routing::RouterConfig base,
                                         std::function<absl::Status(const routing::RouterConfig&)> apply)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  impl_->base = base;
  impl_->apply = std::move(apply);
  impl_->poll();
  impl_->thread = std::thread([impl = impl_.get()] {
    std::unique_lock l(impl->mu);
    while (!impl->cv.wait_for(l, std::chrono::seconds(2), [&] { return impl->stopping; })) impl->poll();
  });
}

RoutingKnobsWatcher::~RoutingKnobsWatcher() {
  {
    std::lock_guard l(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

void RoutingKnobsWatcher::poll() {
  std::lock_guard l(impl_->mu);
  impl_->poll();
}

}  // namespace tandem::agent
