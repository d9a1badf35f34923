#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "src/common/strings.h"
#include "src/k8s/config.h"

namespace tandem::k8s {
namespace {

using ::testing::HasSubstr;

std::string b64(const std::string& s) {
  std::string out;
  absl::Base64Escape(s, &out);
  return out;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/k8s_config_test.XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) {
    std::string p = path_ + "/" + name;
    std::ofstream(p) << content;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string kubeconfig(const std::string& clusterExtra, const std::string& userExtra,
                       const std::string& current = "dev") {
  return strCat(R"(apiVersion: v1
kind: Config
current-context: )",
                current, R"(
clusters:
- name: c1
  cluster:
    server: https://10.0.0.1:6443/
)",
                clusterExtra, R"(
- name: plain
  cluster:
    server: http://127.0.0.1:8080
contexts:
- name: dev
  context:
    cluster: c1
    user: u1
    namespace: team-a
- name: local
  context:
    cluster: plain
users:
- name: u1
  user:
)",
                userExtra, "\n");
}

TEST(KubeconfigTest, CurrentContextWithInlineData) {
  std::string yaml = kubeconfig(
      strCat("    certificate-authority-data: ", b64("CA-PEM")),
      strCat("    token: abc\n    client-certificate-data: ", b64("CERT"), "\n    client-key-data: ", b64("KEY")));
  auto config = parseKubeconfig(yaml, "/nonexistent");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.0.0.1:6443");
  EXPECT_EQ(config->caData, "CA-PEM");
  EXPECT_EQ(config->token, "abc");
  EXPECT_EQ(config->clientCertData, "CERT");
  EXPECT_EQ(config->clientKeyData, "KEY");
  EXPECT_EQ(config->defaultNamespace, "team-a");
  EXPECT_FALSE(config->insecureSkipTlsVerify);
}

TEST(KubeconfigTest, NamedContextPlainHttpWithoutUser) {
  auto config = parseKubeconfig(kubeconfig("", "    token: x"), "", {.context = "local"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "http://127.0.0.1:8080");
  EXPECT_EQ(config->token, "");
  EXPECT_EQ(config->defaultNamespace, "default");
}

TEST(KubeconfigTest, FilesRelativeToKubeconfigAndInsecure) {
  TempDir dir;
  dir.write("ca.crt", "CA-FROM-FILE");
  dir.write("token", "tok-from-file\n");
  dir.write("client.crt", "CERT-FILE");
  dir.write("client.key", "KEY-FILE");
  std::string path = dir.write(
      "config", kubeconfig("    certificate-authority: ca.crt\n    insecure-skip-tls-verify: true",
                           "    tokenFile: token\n    client-certificate: client.crt\n    client-key: " + dir.path() +
                               "/client.key"));
  auto config = loadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->caData, "CA-FROM-FILE");
  EXPECT_EQ(config->token, "tok-from-file");
  EXPECT_EQ(config->clientCertData, "CERT-FILE");
  EXPECT_EQ(config->clientKeyData, "KEY-FILE");
  EXPECT_TRUE(config->insecureSkipTlsVerify);
}

TEST(KubeconfigTest, BadInputNamesTheField) {
  struct Case {
    std::string yaml;
    std::string expected;
  };
  std::vector<Case> cases = {
      {"clusters: [", "malformed YAML"},
      {"- a\n- b\n", "not a YAML map"},
      {kubeconfig("", "    token: x", "nope"), "contexts: no entry named \"nope\""},
      {kubeconfig("", "    token: x", ""), "current-context: not set"},
      {kubeconfig("    certificate-authority-data: '!!notbase64!!'", "    token: x"),
       "clusters[0].cluster.certificate-authority-data: not valid base64"},
      {kubeconfig("    certificate-authority: /no/such/ca.crt", "    token: x"),
       "clusters[0].cluster.certificate-authority: cannot read file '/no/such/ca.crt'"},
      {kubeconfig("    insecure-skip-tls-verify: maybe", "    token: x"),
       "clusters[0].cluster.insecure-skip-tls-verify: expected true or false"},
      {kubeconfig("", strCat("    client-certificate-data: ", b64("C"))),
       "users[0].user: client-certificate given without client-key"},
      {kubeconfig("", "    token: [1, 2]"), "users[0].user.token: expected a string"},
      {R"(current-context: x
contexts:
- name: x
  context:
    cluster: missing
clusters: []
)",
       "clusters: no entry named \"missing\""},
      {R"(current-context: x
contexts:
- name: x
  context:
    cluster: c
clusters:
- name: c
  cluster:
    server: ftp://host
)",
       "clusters[0].cluster.server: not an http(s) URL"},
      {R"(current-context: x
contexts:
- name: x
  context:
    cluster: c
clusters:
- name: c
  cluster: {}
)",
       "clusters[0].cluster.server: not set"},
  };
  for (const Case& c : cases) {
    auto config = parseKubeconfig(c.yaml, "", {}, "kubeconfig test");
    ASSERT_FALSE(config.ok()) << c.yaml;
    EXPECT_THAT(std::string(toStd(config.status().message())), HasSubstr(c.expected)) << c.yaml;
    EXPECT_THAT(std::string(toStd(config.status().message())), HasSubstr("kubeconfig test"));
  }
}

TEST(KubeconfigTest, MissingFileIsNotFound) {
  auto config = loadKubeconfig("/no/such/kubeconfig");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
}

TEST(InClusterConfigTest, ReadsServiceAccount) {
  TempDir dir;
  InClusterOptions options{.tokenFile = dir.write("token", "sa-token\n"),
                           .caFile = dir.write("ca.crt", "SA-CA"),
                           .namespaceFile = dir.write("namespace", "tandem-system"),
                           .host = "10.96.0.1",
                           .port = "443"};
  auto config = loadInClusterConfig(options);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->token, "sa-token");
  EXPECT_EQ(config->caData, "SA-CA");
  EXPECT_EQ(config->defaultNamespace, "tandem-system");

  options.host = "fd00::1";
  config = loadInClusterConfig(options);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->server, "https://[fd00::1]:443");
}

TEST(InClusterConfigTest, Errors) {
  TempDir dir;
  InClusterOptions options{
      .tokenFile = dir.path() + "/missing", .caFile = dir.write("ca", "CA"), .host = "", .port = ""};
  EXPECT_EQ(loadInClusterConfig(options).status().code(), absl::StatusCode::kFailedPrecondition);
  options.host = "10.0.0.1";
  options.port = "443";
  auto missing = loadInClusterConfig(options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(toStd(missing.status().message())), HasSubstr("token"));
  options.tokenFile = dir.write("empty", "");
  EXPECT_EQ(loadInClusterConfig(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::k8s
