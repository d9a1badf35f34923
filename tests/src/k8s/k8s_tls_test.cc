// The client over HTTPS against the API-server emulator with TLS
// (tandem-apiserver --tls-cert/--tls-key/--tls-ca). A throwaway CA and a
// server certificate for 127.0.0.1 (IP SAN) are made per test run with the
// openssl command line (./tandem installs openssl).
//   - the kubeconfig the emulator wrote (https server, certificate-authority-data) works;
//   - a client that trusts another CA fails with a Status naming the certificate problem;
//   - insecure-skip-tls-verify works without any CA.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "src/common/strings.h"
#include "src/k8s/client.h"
#include "src/k8s/config.h"
#include "src/k8s/errors.h"
#include "tests/src/k8s/emulator_process.h"


namespace tandem::k8s {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Runs a shell command quietly; true on exit status 0.
bool sh(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

// A temp dir with ca.pem/ca.key (the CA), server.pem/server.key (CN and IP
// SAN 127.0.0.1, signed by the CA) and other-ca.pem (an unrelated CA).
class Pki {
 public:
  Pki() {
    char tmpl[] = "/tmp/k8s_tls_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
    if (!sh("command -v openssl")) return;
    const std::string d = dir_ + "/";
    std::ofstream(d + "ext") << "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                             << "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n";
    ok_ = sh(strCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=tandem-test-ca -keyout ", d,
                    "ca.key -out ", d, "ca.pem")) &&
          sh(strCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=tandem-other-ca -keyout ", d,
                    "other-ca.key -out ", d, "other-ca.pem")) &&
          sh(strCat("openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout ", d, "server.key -out ", d,
                    "server.csr")) &&
          sh(strCat("openssl x509 -req -days 1 -in ", d, "server.csr -CA ", d, "ca.pem -CAkey ", d,
                    "ca.key -CAcreateserial -extfile ", d, "ext -out ", d, "server.pem")) &&
          // A client certificate for mutual TLS, signed by the same CA.
          sh(strCat("printf 'basicConstraints=CA:FALSE\\nextendedKeyUsage=clientAuth\\n' > ", d, "client-ext")) &&
          sh(strCat("openssl req -newkey rsa:2048 -nodes -subj /CN=tandem-client -keyout ", d, "client.key -out ", d,
                    "client.csr")) &&
          sh(strCat("openssl x509 -req -days 1 -in ", d, "client.csr -CA ", d, "ca.pem -CAkey ", d,
                    "ca.key -CAcreateserial -extfile ", d, "client-ext -out ", d, "client.pem"));
  }
  ~Pki() { std::filesystem::remove_all(dir_); }
  bool ok() const { return ok_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
  bool ok_ = false;
};

// tandem-apiserver serving HTTPS with the Pki's server certificate;
// `mutual`: clients must also present a certificate signed by the Pki's CA.
class TlsEmulator : public testing::EmulatorProcess {
 public:
  explicit TlsEmulator(const Pki& pki, bool mutual = false) : EmulatorProcess(flags(pki, mutual)) {}

 private:
  static std::vector<std::string> flags(const Pki& pki, bool mutual) {
    std::vector<std::string> f = {"--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.key"),
                                  "--tls-ca", pki.path("ca.pem")};
    if (mutual) {
      f.push_back("--tls-client-ca");
      f.push_back(pki.path("ca.pem"));
    }
    return f;
  }
};

nlohmann::json configMap(const std::string& name, const std::string& value) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"data", {{"v", value}}}};
}

// Creates ConfigMap `name` and reads it back through `client`.
void createAndRead(Client& client, const std::string& name) {
  const ResourceRef cms = configMapsResource();
  auto created = client.create(cms, "default", configMap(name, name + "-value"));
  ASSERT_TRUE(created.ok()) << created.status();
  auto got = client.get(cms, "default", name);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)["data"]["v"], name + "-value");
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(pki_.ok()) << "could not make test certificates with the openssl command line (./tandem installs openssl)";
    emulator_ = std::make_unique<TlsEmulator>(pki_);
    ASSERT_TRUE(emulator_->available()) << "tandem-apiserver is missing (build it: it is a dependency of this test)";
    ASSERT_TRUE(emulator_->waitReady()) << "emulator did not start";
    auto config = loadKubeconfig(emulator_->kubeconfig());
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
  }

  Pki pki_;
  std::unique_ptr<TlsEmulator> emulator_;
  ClusterConfig config_;
};

TEST_F(TlsTest, KubeconfigWithCaDataWorks) {
  EXPECT_THAT(config_.server, ::testing::StartsWith("https://127.0.0.1:"));
  EXPECT_EQ(config_.caData, readAll(pki_.path("ca.pem")));
  EXPECT_FALSE(config_.insecureSkipTlsVerify);
  auto client = Client::create(config_);
  ASSERT_TRUE(client.ok()) << client.status();
  createAndRead(**client, "over-tls");
}

TEST_F(TlsTest, WrongCaFailsWithCertificateError) {
  ClusterConfig wrong = config_;
  wrong.caData = readAll(pki_.path("other-ca.pem"));
  auto client = Client::create(wrong, {.requestTimeout = seconds(10)});
  ASSERT_TRUE(client.ok()) << client.status();
  auto start = std::chrono::steady_clock::now();
  auto got = (*client)->get(configMapsResource(), "default", "anything");
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(10)) << "the failed handshake should not wait";
  ASSERT_FALSE(got.ok());
  EXPECT_FALSE(isNotFound(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()),
              ::testing::ContainsRegex("(certificate|handshake|[Ss][Ss][Ll]|TLS)"))
      << got.status();
}

TEST_F(TlsTest, InsecureSkipTlsVerifyWorksWithoutCa) {
  ClusterConfig insecure = config_;
  insecure.caData.clear();
  insecure.insecureSkipTlsVerify = true;
  auto client = Client::create(insecure);
  ASSERT_TRUE(client.ok()) << client.status();
  createAndRead(**client, "insecure");
}

// Plain HTTP to the TLS port fails (no silent downgrade).
TEST_F(TlsTest, PlainHttpToTlsPortFails) {
  ClusterConfig plain = config_;
  plain.server.replace(0, std::string("https").size(), "http");
  plain.caData.clear();
  auto client = Client::create(plain, {.requestTimeout = seconds(10)});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE((*client)->get(configMapsResource(), "default", "anything").ok());
}

// Mutual TLS: the client certificate and key from the kubeconfig are
// presented; without them the handshake fails.
TEST(MutualTlsTest, ClientCertificateIsPresentedAndRequired) {
  Pki pki;
  ASSERT_TRUE(pki.ok()) << "could not make test certificates with the openssl command line";
  TlsEmulator emulator(pki, /*mutual=*/true);
  ASSERT_TRUE(emulator.available());
  ASSERT_TRUE(emulator.waitReady());
  auto config = loadKubeconfig(emulator.kubeconfig());
  ASSERT_TRUE(config.ok()) << config.status();
  ClusterConfig with_cert = *config;
  with_cert.clientCertData = readAll(pki.path("client.pem"));
  with_cert.clientKeyData = readAll(pki.path("client.key"));
  auto good = Client::create(with_cert);
  ASSERT_TRUE(good.ok()) << good.status();
  createAndRead(**good, "mutual-tls");
  auto anonymous = Client::create(*config, {.requestTimeout = seconds(10)});
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_FALSE((*anonymous)->get(configMapsResource(), "default", "mutual-tls").ok());
}

}  // namespace
}  // namespace tandem::k8s
