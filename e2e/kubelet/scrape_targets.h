#pragma once
// The local cluster's answer to Prometheus' Kubernetes service discovery
// (docs/local-cluster.md, "Metrics"): the kubelet keeps a file_sd file of
// every Running pod with an IP and the annotation prometheus.io/scrape:
// "true", at the port of prometheus.io/port (else its first container
// port) and the path of prometheus.io/path (default /metrics), labelled as
// kubernetes_sd relabelling usually labels them: `namespace` and `pod`.
// Prometheus on the host reads it with file_sd_configs (the pod IPs are
// reachable from the host).
//
// Pure, but for writing the file.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace tandem::kubelet {

// The file's content for `pods`: a JSON array of target groups, sorted by
// namespace and name (so an unchanged set writes the same bytes).
nlohmann::json scrapeTargets(const std::vector<nlohmann::json>& pods);

// Writes `targets` to `path` atomically (a temporary file renamed over it).
absl::Status writeScrapeTargets(const std::string& path, const nlohmann::json& targets);

}  // namespace tandem::kubelet
