#pragma once
// What the router's process tests share: a worker's address as the router
// takes it, and the sessions a worker served (from its trace).

#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/agent/agent_process.h"

namespace tandem::agent::testing {

// "127.0.0.1:PORT" of the agent's HTTP API (--decode-workers takes these).
inline std::string hostPort(const AgentProcess& a) { return a.url("").substr(std::string("http://").size()); }

// The sessions `worker` served, from its trace lines (a request that ended
// cancelled, e.g. one the router called off, was not served there).
inline std::set<std::string> sessionsServedBy(const AgentProcess& worker) {
  std::set<std::string> out;
  std::istringstream in(worker.trace());
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j["session"].is_string() && j["finish_reason"] != "cancelled") out.insert(j["session"]);
  }
  return out;
}

}  // namespace tandem::agent::testing
