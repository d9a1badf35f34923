#include "agent/config_option.h"

// The router role's options (YAML section `router:`, docs/routing.md).

namespace tandem::agent {
namespace {

template <typename T>
Option routingNumber(const char* flag, const char* key, const char* help, T routing::RouterConfig::*member, double min,
                     double max) {
  return nestedNumber(flag, "router", key, help, &AgentConfig::routing, member, min, max);
}

// A list of agents' HTTP addresses.
Option workerListOption(const char* flag, const char* key, const char* help,
                        std::vector<HostPort> AgentConfig::*member) {
  return {flag,
          "router",
          key,
          help,
          [member](const AgentConfig& c) {
            std::string s;
            for (const HostPort& hp : c.*member) s += strCat(s.empty() ? "" : ",", hp.host, ":", hp.port);
            return s;
          },
          [=](AgentConfig& c, std::string_view v) -> absl::Status {
            TANDEM_ASSIGN_OR_RETURN(c.*member, parsePeerList(strCat("--", flag), v));
            return absl::OkStatus();
          },
          [=](AgentConfig& c, ConfigMap& m) {
            std::vector<std::string> items;
            if (!m.field(key, &items)) return;
            std::string text;
            for (const std::string& e : items) text += (text.empty() ? "" : ",") + e;
            auto list = parsePeerList(key, text);
            if (list.ok()) {
              c.*member = std::move(*list);
            } else {
              // The error without its "key: " prefix: ConfigMap names the key.
              m.fail(key, toStd(list.status().message()).substr(std::string_view(key).size() + 2));
            }
          }};
}

}  // namespace

void addRouterOptions(std::vector<Option>& o) {
  using routing::RouterConfig;
  o.push_back(workerListOption("decode-workers", "decode_workers",
                               "router: decode agents' HTTP addresses HOST:PORT,... (their state streams and APIs)",
                               &AgentConfig::decode_workers));
  o.push_back(workerListOption("prefill-workers", "prefill_workers",
                               "router: prefill agents' HTTP addresses HOST:PORT,... (their state streams)",
                               &AgentConfig::prefill_workers));
  o.push_back(durationOption("upstream-open-timeout", "router", "upstream_open_timeout",
                             "router: how long a decode agent may take to accept a connection and, for a streamed request, to answer its headers",
                             &AgentConfig::upstream_open_timeout));
  o.push_back(durationOption("worker-stale-after", "router", "worker_stale_after",
                             "router: a worker whose state stream says nothing this long does not answer: no new "
                             "requests, and those it has not started move (at least 100ms; keep it 3 or more of the "
                             "workers' --events-heartbeat)",
                             &AgentConfig::worker_stale_after));
  o.push_back(durationOption("unserved-timeout", "router", "unserved_timeout",
                             "router: a request that only unresponsive decode workers could take fails with 503 this "
                             "long after it arrived (at least 100ms)",
                             &AgentConfig::unserved_timeout));
  o.push_back(stringOption("routing-knobs", "router", "routing_knobs",
                           "router: a JSON file of routing knobs the planner sets (directMaxSuffixTokens, "
                           "loadFloorWeight, prefillOverloadTokens), re-read every 2 s; they override the --route-* values while it exists",
                           &AgentConfig::routing_knobs_file));
  o.push_back(routingNumber("route-overlap-weight", "overlap_weight",
                            "router: score of holding the whole prompt prefix", &RouterConfig::overlap_weight, 0, 1e6));
  o.push_back(routingNumber("route-sticky-weight", "sticky_weight", "router: score of holding the session resident",
                            &RouterConfig::sticky_weight, 0, 1e6));
  o.push_back(routingNumber("route-load-floor-weight", "load_floor_weight",
                            "router: bonus of an idle worker, graduated to 0 at the mean assignment",
                            &RouterConfig::load_floor_weight, 0, 1e6));
  o.push_back(nestedBool("route-load-floor-without-session", "router", "load_floor_without_session",
                         "router: give the load-floor bonus to requests without a session id too (true|false)",
                         &AgentConfig::routing, &RouterConfig::load_floor_without_session));
  o.push_back(routingNumber("route-queue-penalty", "queue_penalty", "router: score lost per queued request",
                            &RouterConfig::queue_penalty, 0, 1e6));
  o.push_back(routingNumber("route-tie-epsilon", "tie_epsilon",
                            "router: scores this close are ties, broken by the session's rendezvous hash",
                            &RouterConfig::tie_epsilon, 0, 1e6));
  o.push_back(routingNumber("route-miss-max-blocks", "miss_max_blocks",
                            "router: overlap of at most this many blocks is a miss (least-loaded worker)",
                            &RouterConfig::miss_max_blocks, 0, 1e9));
  o.push_back(routingNumber("route-direct-max-suffix", "direct_max_suffix_tokens",
                            "router: direct-to-D when the session is resident and at most this many tokens are new",
                            &RouterConfig::direct_max_suffix_tokens, 0, 1e9));
  o.push_back(routingNumber("route-prefill-overload-tokens", "prefill_overload_tokens",
                            "router: a prefill agent with more queued prompt tokens is passed over",
                            &RouterConfig::prefill_overload_tokens, 0, 1e12));
  o.push_back(routingNumber("route-prefill-balance-tokens", "prefill_balance_tokens",
                            "router: prefill agents this close in queued tokens are ties, broken by cached prefix",
                            &RouterConfig::prefill_balance_tokens, 0, 1e12));
  o.push_back(routingNumber("route-migrate-after", "capacity_rejections_to_migrate",
                            "router: capacity rejections of a session before it moves to another decode agent",
                            &RouterConfig::capacity_rejections_to_migrate, 1, 1e6));
}

}  // namespace tandem::agent
