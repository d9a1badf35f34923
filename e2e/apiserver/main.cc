// tandem-apiserver: the Kubernetes API-server emulator (e2e/README.md).
//
//   tandem-apiserver --listen 127.0.0.1:0 --kubeconfig-out /tmp/kubeconfig [--port-file F]
//                    [--watch-history N] [--bookmark-interval 5s]
//                    [--fault-conflict-rate P] [--fault-error-rate P]
//                    [--fault-slow-rate P --fault-slow-delay 500ms] [--fault-watch-drop-after 10s]
//                    [--tls-cert CERT.pem --tls-key KEY.pem [--tls-ca CA.pem]]
//
// With --tls-cert/--tls-key it serves HTTPS only, and the kubeconfig gets an
// https:// server and certificate-authority-data from --tls-ca (default: the
// --tls-cert file, right for a self-signed certificate).
// Writes the kubeconfig (and the port file) once it accepts connections,
// then serves until SIGINT or SIGTERM.

#include <pthread.h>

#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "e2e/apiserver/api_server.h"
#include "src/common/log.h"
#include "src/common/strings.h"

namespace {

using tandem::Duration;

bool parseDuration(const std::string& s, Duration* out) {
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    std::string unit = s.substr(used);
    double scale = unit == "ms" ? 1e-3 : unit == "s" || unit.empty() ? 1 : unit == "m" ? 60 : -1;
    if (scale < 0) return false;
    *out = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(v * scale));
    return true;
  } catch (...) {
    return false;
  }
}

int usage(const std::string& why) {
  std::cerr << "tandem-apiserver: " << why << "\n"
            << "usage: tandem-apiserver --listen ADDR:PORT --kubeconfig-out FILE [--port-file FILE]\n"
            << "  [--watch-history N] [--bookmark-interval DUR] [--fault-conflict-rate P] [--fault-error-rate P]\n"
            << "  [--fault-slow-rate P] [--fault-slow-delay DUR] [--fault-watch-drop-after DUR] [--log-level L]\n"
            << "  [--tls-cert FILE --tls-key FILE [--tls-ca FILE] [--tls-client-ca FILE]]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Block SIGINT and SIGTERM before any thread starts, so every thread
  // (cpprestsdk's pool, the server's timer and pump threads) inherits the
  // mask and the signals stay pending until sigwait() below takes them. With
  // a handler instead, the kernel may run it on any thread, and the main
  // thread's sigsuspend() then never returns: the process ignores SIGTERM.
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);

  tandem::apiserver::ApiServerOptions options;
  std::string kubeconfigOut;
  std::string portFile;
  std::string logLevel = "info";
  std::string tlsCa;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return usage("help"), 0;
    if (i + 1 >= argc) return usage(tandem::strCat(flag, " needs a value"));
    std::string v = argv[++i];
    try {
      if (flag == "--listen") {
        size_t colon = v.rfind(':');
        if (colon == std::string::npos) return usage("--listen wants ADDR:PORT");
        options.host = v.substr(0, colon);
        options.port = std::stoi(v.substr(colon + 1));
      } else if (flag == "--kubeconfig-out") {
        kubeconfigOut = v;
      } else if (flag == "--port-file") {
        portFile = v;
      } else if (flag == "--watch-history") {
        options.watchHistory = std::stoul(v);
      } else if (flag == "--bookmark-interval") {
        if (!parseDuration(v, &options.bookmarkInterval)) return usage("bad --bookmark-interval");
      } else if (flag == "--fault-conflict-rate") {
        options.faults.conflictRate = std::stod(v);
      } else if (flag == "--fault-error-rate") {
        options.faults.errorRate = std::stod(v);
      } else if (flag == "--fault-slow-rate") {
        options.faults.slowRate = std::stod(v);
      } else if (flag == "--fault-slow-delay") {
        if (!parseDuration(v, &options.faults.slowDelay)) return usage("bad --fault-slow-delay");
      } else if (flag == "--fault-watch-drop-after") {
        if (!parseDuration(v, &options.faults.watchDropAfter)) return usage("bad --fault-watch-drop-after");
      } else if (flag == "--tls-cert") {
        options.tlsCertFile = v;
      } else if (flag == "--tls-key") {
        options.tlsKeyFile = v;
      } else if (flag == "--tls-ca") {
        tlsCa = v;
      } else if (flag == "--tls-client-ca") {
        options.tlsClientCaFile = v;
      } else if (flag == "--log-level") {
        logLevel = v;
      } else {
        return usage(tandem::strCat("unknown flag ", flag));
      }
    } catch (const std::exception&) {
      return usage(tandem::strCat("bad value for ", flag, ": ", v));
    }
  }
  if (kubeconfigOut.empty()) return usage("--kubeconfig-out is required");
  if (options.tlsCertFile.empty() != options.tlsKeyFile.empty()) return usage("--tls-cert and --tls-key go together");
  if (!tlsCa.empty() && options.tlsCertFile.empty()) return usage("--tls-ca needs --tls-cert");
  if (!options.tlsClientCaFile.empty() && options.tlsCertFile.empty()) return usage("--tls-client-ca needs --tls-cert");
  std::string caPem;
  if (!options.tlsCertFile.empty()) {
    const std::string& caFile = tlsCa.empty() ? options.tlsCertFile : tlsCa;
    std::ifstream in(caFile);
    std::ostringstream content;
    content << in.rdbuf();
    if (!in || content.str().empty()) return usage(tandem::strCat("cannot read ", caFile));
    caPem = content.str();
  }
  if (auto s = tandem::configureLogging({.spec = logLevel}); !s.ok())
    return usage(std::string(tandem::toStd(s.message())));
  tandem::Logger log("apiserver");

  auto server = tandem::apiserver::ApiServer::start(options, tandem::SystemClock::instance());
  if (!server.ok()) {
    std::cerr << "tandem-apiserver: " << tandem::toStd(server.status().message()) << "\n";
    return 1;
  }
  // Write to a temporary name and rename, so a reader never sees half a file.
  auto writeFile = [](const std::string& path, const std::string& content) {
    std::string tmp = path + ".tmp";
    std::ofstream(tmp) << content;
    return std::rename(tmp.c_str(), path.c_str()) == 0;
  };
  if (!writeFile(kubeconfigOut, tandem::apiserver::kubeconfigYaml((*server)->baseUrl(), caPem))) {
    std::cerr << "tandem-apiserver: cannot write " << kubeconfigOut << "\n";
    return 1;
  }
  if (!portFile.empty() && !writeFile(portFile, std::to_string((*server)->port()) + "\n")) {
    std::cerr << "tandem-apiserver: cannot write " << portFile << "\n";
    return 1;
  }
  log.info("serving", {{"url", (*server)->baseUrl()}, {"kubeconfig", kubeconfigOut}});

  int sig = 0;
  while (sigwait(&stopSignals, &sig) != 0) {
  }
  log.info("stopping", {{"signal", sig}});
  (*server)->shutdown();
  return 0;
}
