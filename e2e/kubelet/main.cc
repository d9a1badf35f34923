// tandem-kubelet: the process kubelet of the local cluster
// (docs/local-cluster.md). Runs against tandem-apiserver (or any API server
// its kubeconfig names) until SIGTERM or SIGINT, then stops every pod and
// removes the pod network.

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include "e2e/kubelet/controller_manager.h"
#include "e2e/kubelet/kubelet.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/k8s/config.h"

namespace {

using tandem::kubelet::KubeletOptions;
using tandem::kubelet::PodNetworkOptions;

int usage(const std::string& why) {
  std::cerr << "tandem-kubelet: " << why << "\n"
            << "usage: tandem-kubelet --kubeconfig FILE [--state-dir DIR] [--bin-dir DIR]\n"
               "  [--node 'NAME [RESOURCE=QUANTITY ...] [label:K=V ...] [taint:K=V:EFFECT ...]'] ...\n"
               "  [--pod-cidr CIDR] [--bridge NAME] [--netns-prefix P] [--network auto|namespaces|loopback]\n"
               "  [--stop-grace SECONDS] [--controllers on|off] [--log-level L] [--scrape-targets FILE]\n";
  return why == "help" ? 0 : 2;
}

struct Flags {
  std::string kubeconfig;
  KubeletOptions options;
  int stop_grace_s = 10;
  bool controllers = true;
  std::string log_level = "info";
};

std::string ownDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

std::optional<int> parseFlags(int argc, char** argv, Flags& f) {
  f.options.state_dir = ".tandem/kubelet";
  f.options.bin_dir = ownDir();
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return usage("help");
    if (i + 1 >= argc) return usage(tandem::strCat(flag, " needs a value"));
    const std::string v = argv[++i];
    if (flag == "--kubeconfig") {
      f.kubeconfig = v;
    } else if (flag == "--state-dir") {
      f.options.state_dir = v;
    } else if (flag == "--bin-dir") {
      f.options.bin_dir = v;
    } else if (flag == "--node") {
      auto spec = tandem::kubelet::parseNodeSpec(v);
      if (!spec.ok()) return usage(std::string(spec.status().message()));
      f.options.nodes.push_back(*spec);
    } else if (flag == "--pod-cidr") {
      f.options.network.cidr = v;
    } else if (flag == "--bridge") {
      f.options.network.bridge = v;
    } else if (flag == "--netns-prefix") {
      // The pods' namespaces are <prefix><namespace>.<pod>: two kubelets on
      // one host (a test beside `./tandem up`) need different ones.
      if (v.empty() || v.size() > 32 ||
          v.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-.") != std::string::npos) {
        return usage(tandem::strCat("--netns-prefix ", v, ": expected 1 to 32 lower-case letters, digits, '-' or '.'"));
      }
      f.options.network.netns_prefix = v;
    } else if (flag == "--network") {
      using Mode = PodNetworkOptions::Mode;
      if (v == "auto") {
        f.options.network.mode = Mode::kAuto;
      } else if (v == "namespaces") {
        f.options.network.mode = Mode::kNamespaces;
      } else if (v == "loopback") {
        f.options.network.mode = Mode::kLoopback;
      } else {
        return usage(tandem::strCat("--network ", v, ": expected auto, namespaces or loopback"));
      }
    } else if (flag == "--stop-grace") {
      char* end = nullptr;
      long s = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || s < 0 || s > 3600) {
        return usage(tandem::strCat("--stop-grace ", v, ": expected whole seconds, 0 to 3600"));
      }
      f.stop_grace_s = static_cast<int>(s);
    } else if (flag == "--controllers") {
      if (v != "on" && v != "off") return usage(tandem::strCat("--controllers ", v, ": expected on or off"));
      f.controllers = v == "on";
    } else if (flag == "--log-level") {
      f.log_level = v;
    } else if (flag == "--scrape-targets") {
      f.options.scrape_targets_file = v;
    } else {
      return usage(tandem::strCat("unknown flag ", flag));
    }
  }
  if (f.kubeconfig.empty()) return usage("--kubeconfig is required");
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  // Blocked before any thread starts, taken by sigwait() below (see tandem-apiserver).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // A peer that closes a socket we write to is an error on that socket
  // (the Service forwarders, the log endpoint), never the kubelet's end.
  signal(SIGPIPE, SIG_IGN);

  Flags flags;
  if (auto rc = parseFlags(argc, argv, flags)) return *rc;
  if (auto s = tandem::configureLogging({.spec = flags.log_level}); !s.ok()) return usage(std::string(s.message()));
  tandem::Logger log("kubelet");

  auto config = tandem::k8s::loadKubeconfig(flags.kubeconfig);
  if (!config.ok()) {
    std::cerr << "tandem-kubelet: " << config.status().message() << "\n";
    return 1;
  }
  auto client = tandem::k8s::Client::create(*config);
  if (!client.ok()) {
    std::cerr << "tandem-kubelet: " << client.status().message() << "\n";
    return 1;
  }
  flags.options.api_server = config->server;
  flags.options.api_ca_pem = config->caData;
  auto kubelet = tandem::kubelet::Kubelet::start(**client, flags.options);
  if (!kubelet.ok()) {
    std::cerr << "tandem-kubelet: " << kubelet.status().message() << "\n";
    return 1;
  }
  std::unique_ptr<tandem::kubelet::ControllerManager> controllers;
  if (flags.controllers) {
    auto c = tandem::kubelet::ControllerManager::start(**client);
    if (!c.ok()) {
      std::cerr << "tandem-kubelet: " << c.status().message() << "\n";
      return 1;
    }
    controllers = std::move(*c);
  }
  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  log.info("stopping: every pod's containers, then the pod network", {{"signal", sig}});
  if (controllers) controllers->stop();
  (*kubelet)->stop(std::chrono::seconds(flags.stop_grace_s));
  return 0;
}
