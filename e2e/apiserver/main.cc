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
#include <optional>
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

// Everything the command line sets.
struct Flags {
  tandem::apiserver::ApiServerOptions options;
  std::string kubeconfigOut;
  std::string portFile;
  std::string logLevel = "info";
  std::string tlsCa;
};

// Sets one flag's value; false for an unknown flag or a bad value. Throws
// std::exception for numbers that do not parse.
bool setFlag(Flags& f, const std::string& flag, const std::string& v, std::string* why) {
  auto& o = f.options;
  auto duration = [&](Duration* out) {
    if (!parseDuration(v, out)) *why = tandem::strCat("bad ", flag);
    return why->empty();
  };
  if (flag == "--listen") {
    size_t colon = v.rfind(':');
    if (colon == std::string::npos) return *why = "--listen wants ADDR:PORT", false;
    o.host = v.substr(0, colon);
    o.port = std::stoi(v.substr(colon + 1));
  } else if (flag == "--kubeconfig-out") {
    f.kubeconfigOut = v;
  } else if (flag == "--port-file") {
    f.portFile = v;
  } else if (flag == "--watch-history") {
    o.watchHistory = std::stoul(v);
  } else if (flag == "--bookmark-interval") {
    return duration(&o.bookmarkInterval);
  } else if (flag == "--fault-conflict-rate") {
    o.faults.conflictRate = std::stod(v);
  } else if (flag == "--fault-error-rate") {
    o.faults.errorRate = std::stod(v);
  } else if (flag == "--fault-slow-rate") {
    o.faults.slowRate = std::stod(v);
  } else if (flag == "--fault-slow-delay") {
    return duration(&o.faults.slowDelay);
  } else if (flag == "--fault-watch-drop-after") {
    return duration(&o.faults.watchDropAfter);
  } else if (flag == "--tls-cert") {
    o.tlsCertFile = v;
  } else if (flag == "--tls-key") {
    o.tlsKeyFile = v;
  } else if (flag == "--tls-ca") {
    f.tlsCa = v;
  } else if (flag == "--tls-client-ca") {
    o.tlsClientCaFile = v;
  } else if (flag == "--log-level") {
    f.logLevel = v;
  } else {
    return *why = tandem::strCat("unknown flag ", flag), false;
  }
  return true;
}

// Parses and checks the command line; an exit code when main should stop.
std::optional<int> parseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return usage("help"), 0;
    if (i + 1 >= argc) return usage(tandem::strCat(flag, " needs a value"));
    std::string v = argv[++i];
    std::string why;
    try {
      if (!setFlag(f, flag, v, &why)) return usage(why);
    } catch (const std::exception&) {
      return usage(tandem::strCat("bad value for ", flag, ": ", v));
    }
  }
  const auto& o = f.options;
  if (f.kubeconfigOut.empty()) return usage("--kubeconfig-out is required");
  if (o.tlsCertFile.empty() != o.tlsKeyFile.empty()) return usage("--tls-cert and --tls-key go together");
  if (!f.tlsCa.empty() && o.tlsCertFile.empty()) return usage("--tls-ca needs --tls-cert");
  if (!o.tlsClientCaFile.empty() && o.tlsCertFile.empty()) return usage("--tls-client-ca needs --tls-cert");
  return std::nullopt;
}

// The CA certificates for the kubeconfig: --tls-ca, else the (self-signed) --tls-cert.
std::optional<std::string> readCaPem(const Flags& f) {
  if (f.options.tlsCertFile.empty()) return "";
  const std::string& caFile = f.tlsCa.empty() ? f.options.tlsCertFile : f.tlsCa;
  std::ifstream in(caFile);
  std::ostringstream content;
  content << in.rdbuf();
  if (!in || content.str().empty()) return std::nullopt;
  return content.str();
}

// Writes to a temporary name and renames, so a reader never sees half a file.
bool writeFile(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp";
  std::ofstream(tmp) << content;
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Block SIGINT and SIGTERM before any thread starts, so every thread
  // (cpprestsdk's pool, the server's timer thread) inherits the mask and the
  // signals stay pending until sigwait() below takes them. With a handler
  // instead, the kernel may run it on any thread, and the main thread's
  // sigsuspend() then never returns: the process ignores SIGTERM.
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);

  Flags flags;
  if (auto rc = parseFlags(argc, argv, flags)) return *rc;
  std::optional<std::string> caPem = readCaPem(flags);
  if (!caPem)
    return usage(tandem::strCat("cannot read ", flags.tlsCa.empty() ? flags.options.tlsCertFile : flags.tlsCa));
  const std::string& logLevel = flags.logLevel;
  const std::string& kubeconfigOut = flags.kubeconfigOut;
  const std::string& portFile = flags.portFile;
  const auto& options = flags.options;
  if (auto s = tandem::configureLogging({.spec = logLevel}); !s.ok())
    return usage(std::string(tandem::toStd(s.message())));
  tandem::Logger log("apiserver");

  auto server = tandem::apiserver::ApiServer::start(options, tandem::SystemClock::instance());
  if (!server.ok()) {
    std::cerr << "tandem-apiserver: " << tandem::toStd(server.status().message()) << "\n";
    return 1;
  }
  if (!writeFile(kubeconfigOut, tandem::apiserver::kubeconfigYaml((*server)->baseUrl(), *caPem))) {
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
