#pragma once
// The real Prometheus server (Debian's `prometheus`) for tests, on
// loopback, scraping targets listed in a file_sd file the test writes
// (setTargets) every second. Its data and log live in `dir`; stop() (or the
// destructor) ends it.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/common/strings.h"
#include "src/http/client.h"
#include "tests/testing/spawn.h"
#include "tests/testing/wait.h"

namespace tandem::testutil {

class PrometheusServer {
 public:
  struct Target {
    std::string address;  // host:port
    std::map<std::string, std::string> labels;
  };

  // nullptr when it did not come up within 30 s (its log says why).
  // `targets_file`: a file_sd file someone else keeps (the local cluster's
  // kubelet); "" : <dir>/targets.json, kept by setTargets().
  static std::unique_ptr<PrometheusServer> start(const std::string& dir, const std::string& targets_file = "") {
    std::filesystem::create_directories(dir);
    auto p = std::unique_ptr<PrometheusServer>(new PrometheusServer(dir, targets_file));
    if (targets_file.empty()) std::ofstream(p->targetsPath()) << "[]";
    std::ofstream(dir + "/prometheus.yml") << strCat(R"(global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
- job_name: tandem
  file_sd_configs:
  - files: [")", p->targetsPath(), R"("]
    refresh_interval: 1s
)");
    for (int attempt = 0; attempt < 3; ++attempt) {
      p->port_ = unusedPort();
      p->pid_ = spawnLogged({"/usr/bin/prometheus", "--config.file=" + dir + "/prometheus.yml",
                             "--storage.tsdb.path=" + dir + "/data",
                             strCat("--web.listen-address=127.0.0.1:", p->port_), "--log.level=warn"},
                            dir + "/prometheus.log");
      if (p->pid_ <= 0) return nullptr;
      const bool up = waitFor(
          [&] {
            auto r = http::httpGet(p->url() + "/-/ready", std::chrono::seconds(2));
            return r.ok() && r->status == 200;
          },
          std::chrono::seconds(30), std::chrono::milliseconds(100));
      if (up) return p;
      p->stop();  // the port was taken meanwhile, or it failed: try another
    }
    return nullptr;
  }

  ~PrometheusServer() { stop(); }

  std::string url() const { return strCat("http://127.0.0.1:", port_); }
  std::string log() const {
    std::ifstream in(dir_ + "/prometheus.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Replaces the scraped targets (atomically: a rename).
  void setTargets(const std::vector<Target>& targets) {
    nlohmann::json groups = nlohmann::json::array();
    for (const Target& t : targets) groups.push_back({{"targets", {t.address}}, {"labels", t.labels}});
    const std::string tmp = targetsPath() + ".tmp";
    std::ofstream(tmp) << groups.dump();
    std::filesystem::rename(tmp, targetsPath());
  }

  // Whether every target is scraped and up.
  bool allUp(size_t n) const {
    auto r = http::httpGet(url() + "/api/v1/query?query=sum(up)", std::chrono::seconds(2));
    if (!r.ok() || r->status != 200) return false;
    auto j = r->json();
    if (!j.ok()) return false;
    const auto& result = (*j)["data"]["result"];
    return !result.empty() && std::stod(result[0]["value"][1].get<std::string>()) == static_cast<double>(n);
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  PrometheusServer(std::string dir, std::string targets_file)
      : dir_(std::move(dir)), targets_file_(std::move(targets_file)) {}
  std::string targetsPath() const { return targets_file_.empty() ? dir_ + "/targets.json" : targets_file_; }

  static int unusedPort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    const int port = ntohs(a.sin_port);
    ::close(fd);
    return port;
  }

  std::string dir_, targets_file_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace tandem::testutil
