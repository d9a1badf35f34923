#include "e2e/apiserver/api_server.h"

#include <thread>

#include "absl/strings/escaping.h"
#include "e2e/apiserver/router.h"
#include "src/common/strings.h"
#include "src/http/server.h"

namespace tandem::apiserver {

// Wiring: the Router behind an http::Server, and the thread that runs the
// Router's timer work.
class ApiServer::Impl {
 public:
  Impl(ApiServerOptions options, const Clock& clock) : options_(std::move(options)), router_(options_, clock) {}

  absl::Status start() {
    http::Routes routes;
    for (const char* method : {"GET", "POST", "PUT", "PATCH", "DELETE"}) {
      routes.handlePrefix(method, "/", [this](http::Request& req) { return router_.serve(req); });
    }
    // Watches are newline-delimited JSON on the SSE stream machinery: no
    // keepalive comments. Long requests are only watches.
    auto server = http::Server::start({.host = options_.host,
                                       .port = options_.port,
                                       .maxBodyBytes = 8 << 20,
                                       .requestTimeout = std::chrono::seconds(60),
                                       .sseKeepalive = Duration::zero(),
                                       .requireUtf8Body = false,
                                       .tlsCertFile = options_.tlsCertFile,
                                       .tlsKeyFile = options_.tlsKeyFile,
                                       .tlsClientCaFile = options_.tlsClientCaFile},
                                      std::move(routes));
    if (!server.ok()) return server.status();
    http_ = std::move(*server);
    router_.setServerAddress(strCat(options_.host, ":", http_->port()));
    timers_ = std::thread([this] { router_.runTimers(); });
    return absl::OkStatus();
  }

  void shutdown() {
    router_.stop();
    if (timers_.joinable()) timers_.join();
    if (http_) http_->shutdown(std::chrono::seconds(1));
  }

  int port() const { return http_->port(); }
  std::string baseUrl() const { return http_->baseUrl(); }

 private:
  const ApiServerOptions options_;
  Router router_;
  std::unique_ptr<http::Server> http_;
  std::thread timers_;
};

ApiServer::ApiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ApiServer::~ApiServer() { impl_->shutdown(); }

absl::StatusOr<std::unique_ptr<ApiServer>> ApiServer::start(ApiServerOptions options, const Clock& clock) {
  auto impl = std::make_unique<Impl>(std::move(options), clock);
  absl::Status s = impl->start();
  if (!s.ok()) return s;
  return std::make_unique<ApiServer>(std::move(impl));
}

int ApiServer::port() const { return impl_->port(); }
std::string ApiServer::baseUrl() const { return impl_->baseUrl(); }
void ApiServer::shutdown() { impl_->shutdown(); }

std::string kubeconfigYaml(const std::string& server, const std::string& caPem) {
  std::string ca = caPem.empty() ? "" : strCat("    certificate-authority-data: ", absl::Base64Escape(caPem), "\n");
  // Over https kubectl asks for a user name and password when the user has
  // no credential; the emulator does not authenticate, so any token will do.
  std::string user = server.rfind("https://", 0) == 0 ? "  user: {token: tandem-local-admin}\n" : "  user: {}\n";
  return strCat("apiVersion: v1\n", "kind: Config\n", "clusters:\n", "- name: tandem\n", "  cluster:\n",
                "    server: ", server, "\n", ca, "users:\n", "- name: tandem\n", user, "contexts:\n",
                "- name: tandem\n", "  context:\n", "    cluster: tandem\n", "    user: tandem\n",
                "    namespace: default\n", "current-context: tandem\n", "preferences: {}\n");
}

}  // namespace tandem::apiserver
