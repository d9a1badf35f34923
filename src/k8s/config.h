#pragma once
// Where the API server is and how to authenticate to it.
//
// Two sources, as client-go:
//  - in-cluster: the pod's service account, i.e. the token file, the CA file
//    and KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT;
//  - a kubeconfig file: the current context (or a named one) picks a cluster
//    (server, certificate-authority[-data], insecure-skip-tls-verify) and a
//    user (token[File], client-certificate[-data], client-key[-data]).
// Relative file paths in a kubeconfig are relative to the kubeconfig's
// directory. File references are read at load time, so a ClusterConfig holds
// only data (PEM text, token).
//
// Errors name what is wrong: `kubeconfig /x/config: context "dev": cluster
// "c1" not found`, `...: users[0].user.client-key-data: not valid base64`.

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::k8s {

struct ClusterConfig {
  std::string server;  // "https://10.0.0.1:443" or "http://127.0.0.1:8001"; no trailing slash
  std::string caData;  // PEM; empty: the system's trust store
  bool insecureSkipTlsVerify = false;
  std::string tlsServerName;   // overrides the name checked in the server certificate
  std::string token;           // bearer token; empty: none
  // Where `token` came from in a pod: re-read at most once a minute, as
  // client-go does, because the kubelet rotates projected tokens. Empty: `token` is fixed.
  std::string tokenFile;
  std::string clientCertData;  // PEM
  std::string clientKeyData;   // PEM
  std::string defaultNamespace = "default";
  std::string userAgent = "tandem";
};

struct KubeconfigOptions {
  std::string context;  // empty: current-context
};

// Parses kubeconfig text. `baseDir` resolves relative file references.
// `origin` names the file in error messages.
absl::StatusOr<ClusterConfig> parseKubeconfig(std::string_view yaml, std::string_view baseDir,
                                              const KubeconfigOptions& options = {},
                                              std::string_view origin = "kubeconfig");
// Reads and parses a kubeconfig file.
absl::StatusOr<ClusterConfig> loadKubeconfig(const std::string& path, const KubeconfigOptions& options = {});

struct InClusterOptions {
  // Defaults are the paths Kubernetes mounts the service account at.
  std::string tokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string caFile = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
  // KUBERNETES_SERVICE_HOST / _PORT; nullopt: read the process environment.
  std::optional<std::string> host;
  std::optional<std::string> port;
};

// FailedPrecondition when not running in a pod (host/port unset); NotFound /
// InvalidArgument naming the file when the token or CA is missing or empty.
absl::StatusOr<ClusterConfig> loadInClusterConfig(const InClusterOptions& options = {});

// client-go's order: $KUBECONFIG (first entry), else in-cluster, else
// ~/.kube/config.
absl::StatusOr<ClusterConfig> loadDefaultConfig();

}  // namespace tandem::k8s
