#include "src/k8s/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "absl/strings/escaping.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::k8s {

namespace {

absl::StatusOr<std::string> readFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(strCat(what, ": cannot read file '", path, "'"));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string resolve(std::string_view baseDir, const std::string& path) {
  if (path.empty() || path.front() == '/' || baseDir.empty()) return path;
  return (std::filesystem::path(std::string(baseDir)) / path).string();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  size_t start = s.find_first_not_of(" \t\r\n");
  return start == std::string::npos ? "" : s.substr(start);
}

// One entry of the named lists (clusters, users, contexts).
struct Named {
  YAML::Node node;   // the inner map ("cluster:", "user:", "context:")
  std::string path;  // "clusters[1].cluster" for error messages
};

// Reads a scalar string field; InvalidArgument naming `path.key` when it
// exists but is not a scalar.
absl::StatusOr<std::string> scalar(const YAML::Node& map, const char* key, std::string_view path) {
  YAML::Node n = map[key];
  if (!n || n.IsNull()) return std::string();
  if (!n.IsScalar()) return absl::InvalidArgumentError(strCat(path, ".", key, ": expected a string"));
  return n.as<std::string>();
}

absl::StatusOr<Named> findNamed(const YAML::Node& root, const char* list, const char* inner, const std::string& name,
                                std::string_view origin) {
  YAML::Node entries = root[list];
  if (entries && !entries.IsSequence())
    return absl::InvalidArgumentError(strCat(origin, ": ", list, ": expected a list"));
  if (entries) {
    for (size_t i = 0; i < entries.size(); ++i) {
      const YAML::Node& e = entries[i];
      if (!e.IsMap()) return absl::InvalidArgumentError(strCat(origin, ": ", list, "[", i, "]: expected a map"));
      YAML::Node n = e["name"];
      if (!n || !n.IsScalar() || n.as<std::string>() != name) continue;
      YAML::Node body = e[inner];
      if (!body || !body.IsMap()) {
        return absl::InvalidArgumentError(strCat(origin, ": ", list, "[", i, "].", inner, ": missing or not a map"));
      }
      return Named{body, strCat(list, "[", i, "].", inner)};
    }
  }
  return absl::NotFoundError(strCat(origin, ": ", list, ": no entry named \"", name, "\""));
}

// "<field>-data" (base64) or "<field>" (a file path); empty when neither.
absl::StatusOr<std::string> dataOrFile(const YAML::Node& map, const std::string& field, std::string_view path,
                                       std::string_view baseDir, std::string_view origin) {
  std::string dataKey = field + "-data";
  TANDEM_ASSIGN_OR_RETURN(std::string data, scalar(map, dataKey.c_str(), path));
  if (!data.empty()) {
    std::string decoded;
    if (!absl::Base64Unescape(absl::string_view(data), &decoded)) {
      return absl::InvalidArgumentError(strCat(origin, ": ", path, ".", dataKey, ": not valid base64"));
    }
    return decoded;
  }
  TANDEM_ASSIGN_OR_RETURN(std::string file, scalar(map, field.c_str(), path));
  if (file.empty()) return std::string();
  return readFile(resolve(baseDir, file), strCat(origin, ": ", path, ".", field));
}

absl::StatusOr<ClusterConfig> parseKubeconfigNode(const YAML::Node& root, std::string_view baseDir,
                                                  const KubeconfigOptions& options, std::string_view origin) {
  if (!root.IsMap()) return absl::InvalidArgumentError(strCat(origin, ": not a YAML map"));
  std::string contextName = options.context;
  if (contextName.empty()) {
    TANDEM_ASSIGN_OR_RETURN(contextName, scalar(root, "current-context", "current-context"));
    if (contextName.empty()) return absl::InvalidArgumentError(strCat(origin, ": current-context: not set"));
  }
  auto context = findNamed(root, "contexts", "context", contextName, origin);
  if (!context.ok()) return context.status();

  ClusterConfig config;
  TANDEM_ASSIGN_OR_RETURN(std::string clusterName, scalar(context->node, "cluster", context->path));
  if (clusterName.empty()) {
    return absl::InvalidArgumentError(
        strCat(origin, ": ", context->path, ".cluster: not set (context \"", contextName, "\")"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::string userName, scalar(context->node, "user", context->path));
  TANDEM_ASSIGN_OR_RETURN(std::string ns, scalar(context->node, "namespace", context->path));
  if (!ns.empty()) config.defaultNamespace = ns;

  TANDEM_ASSIGN_OR_RETURN(Named cluster, findNamed(root, "clusters", "cluster", clusterName, origin));
  TANDEM_ASSIGN_OR_RETURN(config.server, scalar(cluster.node, "server", cluster.path));
  if (config.server.empty()) return absl::InvalidArgumentError(strCat(origin, ": ", cluster.path, ".server: not set"));
  if (config.server.rfind("http://", 0) != 0 && config.server.rfind("https://", 0) != 0) {
    return absl::InvalidArgumentError(
        strCat(origin, ": ", cluster.path, ".server: not an http(s) URL: '", config.server, "'"));
  }
  while (config.server.back() == '/') config.server.pop_back();
  TANDEM_ASSIGN_OR_RETURN(config.caData,
                          dataOrFile(cluster.node, "certificate-authority", cluster.path, baseDir, origin));
  TANDEM_ASSIGN_OR_RETURN(config.tlsServerName, scalar(cluster.node, "tls-server-name", cluster.path));
  if (YAML::Node insecure = cluster.node["insecure-skip-tls-verify"]; insecure && !insecure.IsNull()) {
    try {
      config.insecureSkipTlsVerify = insecure.as<bool>();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(
          strCat(origin, ": ", cluster.path, ".insecure-skip-tls-verify: expected true or false"));
    }
  }

  if (!userName.empty()) {
    TANDEM_ASSIGN_OR_RETURN(Named user, findNamed(root, "users", "user", userName, origin));
    TANDEM_ASSIGN_OR_RETURN(config.token, scalar(user.node, "token", user.path));
    if (config.token.empty()) {
      TANDEM_ASSIGN_OR_RETURN(std::string tokenFile, scalar(user.node, "tokenFile", user.path));
      if (!tokenFile.empty()) {
        TANDEM_ASSIGN_OR_RETURN(config.token,
                                readFile(resolve(baseDir, tokenFile), strCat(origin, ": ", user.path, ".tokenFile")));
        config.token = trim(config.token);
      }
    }
    TANDEM_ASSIGN_OR_RETURN(config.clientCertData,
                            dataOrFile(user.node, "client-certificate", user.path, baseDir, origin));
    TANDEM_ASSIGN_OR_RETURN(config.clientKeyData, dataOrFile(user.node, "client-key", user.path, baseDir, origin));
    if (config.clientCertData.empty() != config.clientKeyData.empty()) {
      return absl::InvalidArgumentError(
          strCat(origin, ": ", user.path, ": ", config.clientCertData.empty() ? "client-key" : "client-certificate",
                 " given without ", config.clientCertData.empty() ? "client-certificate" : "client-key"));
    }
    if (user.node["exec"] || user.node["auth-provider"]) {
      return absl::UnimplementedError(
          strCat(origin, ": ", user.path, ": exec and auth-provider credentials are not supported"));
    }
  }
  return config;
}

}  // namespace

absl::StatusOr<ClusterConfig> parseKubeconfig(std::string_view yaml, std::string_view baseDir,
                                              const KubeconfigOptions& options, std::string_view origin) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(strCat(origin, ": malformed YAML: ", e.what()));
  }
  try {
    absl::StatusOr<ClusterConfig> config = parseKubeconfigNode(root, baseDir, options, origin);
    // Field-level helpers do not know the file: name it here.
    if (!config.ok() && toStd(config.status().message()).rfind(origin, 0) != 0) {
      return absl::Status(config.status().code(), strCat(origin, ": ", config.status().message()));
    }
    return config;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(strCat(origin, ": ", e.what()));
  }
}

absl::StatusOr<ClusterConfig> loadKubeconfig(const std::string& path, const KubeconfigOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, readFile(path, "kubeconfig"));
  std::string baseDir = std::filesystem::path(path).parent_path().string();
  return parseKubeconfig(text, baseDir, options, strCat("kubeconfig ", path));
}

absl::StatusOr<ClusterConfig> loadInClusterConfig(const InClusterOptions& options) {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  std::string host = options.host ? *options.host : env("KUBERNETES_SERVICE_HOST");
  std::string port = options.port ? *options.port : env("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    return absl::FailedPreconditionError(
        "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set (not running in a pod?)");
  }
  ClusterConfig config;
  // An IPv6 host needs brackets in a URL.
  bool ipv6 = host.find(':') != std::string::npos;
  config.server = strCat("https://", ipv6 ? "[" : "", host, ipv6 ? "]" : "", ":", port);
  TANDEM_ASSIGN_OR_RETURN(std::string token, readFile(options.tokenFile, "in-cluster config: service account token"));
  config.token = trim(token);
  if (config.token.empty()) {
    return absl::InvalidArgumentError(strCat("in-cluster config: token file '", options.tokenFile, "' is empty"));
  }
  config.tokenFile = options.tokenFile;
  TANDEM_ASSIGN_OR_RETURN(config.caData, readFile(options.caFile, "in-cluster config: service account CA"));
  if (auto ns = readFile(options.namespaceFile, "namespace"); ns.ok() && !trim(*ns).empty()) {
    config.defaultNamespace = trim(*ns);
  }
  return config;
}

absl::StatusOr<ClusterConfig> loadDefaultConfig() {
  if (const char* kc = std::getenv("KUBECONFIG"); kc && *kc) {
    std::string first(kc);
    first = first.substr(0, first.find(':'));
    return loadKubeconfig(first);
  }
  if (std::getenv("KUBERNETES_SERVICE_HOST")) return loadInClusterConfig();
  const char* home = std::getenv("HOME");
  if (!home) return absl::NotFoundError("no KUBECONFIG, not in a cluster, and HOME is not set");
  return loadKubeconfig(strCat(home, "/.kube/config"));
}

}  // namespace tandem::k8s
