// Server (server.h): validates the options, then hands everything to
// Server::Impl (server_core.h) and its listener.

#include "src/http/server.h"

#include <boost/asio/ssl/context.hpp>

#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/http/server_core.h"

namespace tandem::http {

namespace {

absl::Status checkOptions(const ServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(strCat("port out of range: ", options.port));
  }
  if (options.tlsCertFile.empty() != options.tlsKeyFile.empty()) {
    return absl::InvalidArgumentError("tlsCertFile and tlsKeyFile go together");
  }
  if (!options.tlsCertFile.empty()) {
    // Libraries load the files per connection and drop a connection whose
    // context fails; check them here so a bad file fails start() instead.
    try {
      boost::asio::ssl::context ctx(boost::asio::ssl::context::tls_server);
      ctx.use_certificate_chain_file(options.tlsCertFile);
      ctx.use_private_key_file(options.tlsKeyFile, boost::asio::ssl::context::pem);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          strCat("TLS certificate ", options.tlsCertFile, " / key ", options.tlsKeyFile, ": ", e.what()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view serverLibraryName(ServerLibrary library) {
  switch (library) {
    case ServerLibrary::kBeast:
      return "beast";
    case ServerLibrary::kCpprest:
      return "cpprest";
  }
  return "unknown";
}

absl::StatusOr<ServerLibrary> parseServerLibrary(std::string_view name) {
  if (name == "beast") return ServerLibrary::kBeast;
  if (name == "cpprest") return ServerLibrary::kCpprest;
  return absl::InvalidArgumentError(strCat("unknown HTTP server library '", name, "' (beast, cpprest)"));
}

absl::StatusOr<std::unique_ptr<Server>> Server::start(ServerOptions options, Routes routes) {
  TANDEM_RETURN_IF_ERROR(checkOptions(options));
  if (options.clock == nullptr) options.clock = &SystemClock::instance();
  auto impl = std::make_shared<Impl>(std::move(options), std::move(routes));
  TANDEM_RETURN_IF_ERROR(impl->open());
  return std::make_unique<Server>(std::move(impl));
}

Server::Server(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { impl_->shutdown(Duration::zero()); }

int Server::port() const { return impl_->port(); }

std::string Server::baseUrl() const {
  const std::string& host = impl_->options().host;
  return strCat(impl_->options().tlsCertFile.empty() ? "http://" : "https://", host == "0.0.0.0" ? "127.0.0.1" : host,
                ":", impl_->port());
}

bool Server::draining() const { return impl_->draining(); }

size_t Server::numInFlight() const { return impl_->numInFlight(); }

void Server::shutdown(Duration grace) { impl_->shutdown(grace); }

}  // namespace tandem::http
