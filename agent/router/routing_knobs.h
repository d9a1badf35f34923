#pragma once
// The planner's routing knobs as the router takes them (docs/planner.md,
// "Routing knobs"): the operator writes them into the ConfigMap
// "<pool>-routing" (knobs.json), which the router's pod mounts; the router
// re-reads the file every 2 s and applies what changed on top of its own
// --route-* configuration. A file that goes away restores that
// configuration; a file that does not parse changes nothing and is logged
// once (saying which knob and why).
//
//   {"directMaxSuffixTokens": 4096, "loadFloorWeight": 3, "prefillOverloadTokens": 32000}

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "src/routing/router_config.h"

namespace tandem::agent {

// `base` with the knobs of `text` applied. InvalidArgument naming the knob:
// not JSON, not an object, an unknown knob, a value of the wrong type or
// out of range.
absl::StatusOr<routing::RouterConfig> applyRoutingKnobs(const routing::RouterConfig& base, std::string_view text);

// Follows the file at `path`: `apply` gets the configuration to use every
// time it changes (the base one when the file is absent). Stops with the
// object.
class RoutingKnobsWatcher {
 public:
  RoutingKnobsWatcher(std::string path, routing::RouterConfig base,
                      std::function<absl::Status(const routing::RouterConfig&)> apply);
  ~RoutingKnobsWatcher();
  RoutingKnobsWatcher(const RoutingKnobsWatcher&) = delete;
  RoutingKnobsWatcher& operator=(const RoutingKnobsWatcher&) = delete;

  // Reads the file now and applies it if it changed (what the thread does every 2 s).
  void poll();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::agent
