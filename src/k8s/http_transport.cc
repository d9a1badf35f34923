// cpprestsdk under k8s::Transport. Everything cpprestsdk (and Boost.Asio's
// TLS context) stays in this file.

#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include <cpprest/http_client.h>
#include <boost/asio/ssl.hpp>

#include "absl/strings/ascii.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/http/cpprest_await.h"
#include "src/k8s/transport.h"

namespace tandem::k8s {

namespace wh = web::http;
namespace whc = web::http::client;

namespace {

using http::cpprest::await;
using http::cpprest::statusFromException;
using http::cpprest::toMicros;

constexpr Duration kPooledIdleTimeout = std::chrono::hours(1);

// The TLS material, applied to each new connection's context.
void configureTls(boost::asio::ssl::context& ctx, const ClusterConfig& config) {
  if (!config.caData.empty()) ctx.add_certificate_authority(boost::asio::buffer(config.caData));
  if (!config.clientCertData.empty()) {
    ctx.use_certificate_chain(boost::asio::buffer(config.clientCertData));
    ctx.use_private_key(boost::asio::buffer(config.clientKeyData), boost::asio::ssl::context::pem);
  }
}

whc::http_client_config clientConfig(const ClusterConfig& config, Duration timeout) {
  whc::http_client_config c;
  c.set_timeout(toMicros(timeout));
  c.set_validate_certificates(!config.insecureSkipTlsVerify);
  if (config.server.rfind("https://", 0) == 0) {
    c.set_ssl_context_callback([config](boost::asio::ssl::context& ctx) { configureTls(ctx, config); });
  }
  return c;
}

class HttpLineStream final : public LineStream {
 public:
  HttpLineStream(std::unique_ptr<whc::http_client> client, pplx::cancellation_token_source cts,
                 wh::http_response response, std::string what)
      : client_(std::move(client)), cts_(std::move(cts)), response_(std::move(response)), what_(std::move(what)) {}
  ~HttpLineStream() override { stop(); }

  absl::StatusOr<std::optional<std::string>> nextLine() override {
    try {
      auto body = response_.body().streambuf();
      std::vector<uint8_t> chunk(16 * 1024);
      while (true) {
        if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
          std::string line = buffer_.substr(0, nl);
          buffer_.erase(0, nl + 1);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          if (line.empty()) continue;
          return std::optional<std::string>(std::move(line));
        }
        if (stopped_.load()) return cancelled();
        size_t got = 0;
        try {
          got = http::cpprest::readSome(body, chunk);
        } catch (...) {
          if (stopped_.load()) return cancelled();
          return statusFromException(std::current_exception(), what_);
        }
        if (got == 0) {
          if (stopped_.load()) return cancelled();
          if (!buffer_.empty()) {  // a last line without '\n'
            std::string line = std::move(buffer_);
            buffer_.clear();
            return std::optional<std::string>(std::move(line));
          }
          return std::optional<std::string>();
        }
        buffer_.append(reinterpret_cast<const char*>(chunk.data()), got);
      }
    } catch (...) {
      return statusFromException(std::current_exception(), what_);
    }
  }

  void stop() override {
    if (stopped_.exchange(true)) return;
    cts_.cancel();  // cpprestsdk closes the socket, also mid-body
  }

 private:
  absl::Status cancelled() const { return absl::CancelledError(strCat(what_, ": stopped")); }

  std::unique_ptr<whc::http_client> client_;
  pplx::cancellation_token_source cts_;
  wh::http_response response_;
  const std::string what_;
  std::string buffer_;  // reading thread only
  std::atomic<bool> stopped_{false};
};

class HttpTransport final : public Transport {
 public:
  HttpTransport(ClusterConfig config, web::uri base)
      : config_(std::move(config)), base_(std::move(base)), pooled_(base_, clientConfig(config_, kPooledIdleTimeout)) {}

  absl::StatusOr<HttpResponse> send(const HttpRequest& request) override {
    std::string what = strCat(request.method, " ", request.path);
    try {
      pplx::cancellation_token_source cts;
      pplx::task<HttpResponse> task =
          pooled_.request(toCpprest(request), cts.get_token()).then([](wh::http_response response) {
            return response.extract_vector().then([response](std::vector<unsigned char> body) {
              HttpResponse out;
              out.status = response.status_code();
              out.body.assign(body.begin(), body.end());
              return out;
            });
          });
      return await(std::move(task), cts, request.timeout, what);
    } catch (...) {
      return statusFromException(std::current_exception(), what);
    }
  }

  absl::StatusOr<StreamResponse> stream(const HttpRequest& request) override {
    std::string what = strCat(request.method, " ", request.path);
    try {
      // Its own client, so closing this stream's connection touches no other.
      auto client = std::make_unique<whc::http_client>(base_, clientConfig(config_, request.timeout));
      pplx::cancellation_token_source cts;
      TANDEM_ASSIGN_OR_RETURN(wh::http_response response,
                              await(client->request(toCpprest(request), cts.get_token()), cts, request.timeout, what));
      StreamResponse out;
      out.status = response.status_code();
      if (out.status < 200 || out.status >= 300) {
        TANDEM_ASSIGN_OR_RETURN(std::vector<unsigned char> body,
                                await(response.extract_vector(), cts, request.timeout, what));
        out.errorBody.assign(body.begin(), body.end());
        return out;
      }
      out.lines = std::make_unique<HttpLineStream>(std::move(client), std::move(cts), std::move(response), what);
      return out;
    } catch (...) {
      return statusFromException(std::current_exception(), what);
    }
  }

 private:
  wh::http_request toCpprest(const HttpRequest& request) const {
    wh::http_request r(request.method);
    r.set_request_uri(request.path);
    r.headers().add("Accept", request.accept);
    r.headers().add("User-Agent", config_.userAgent);
    if (std::string token = bearerToken(); !token.empty()) r.headers().add("Authorization", "Bearer " + token);
    if (!request.body.empty() || !request.contentType.empty()) r.set_body(request.body, request.contentType);
    return r;
  }

  // config_.token, or what config_.tokenFile holds now (read at most once a
  // minute; a file that cannot be read or is empty keeps the last token).
  std::string bearerToken() const {
    if (config_.tokenFile.empty()) return config_.token;
    std::lock_guard l(tokenMu_);
    const auto now = std::chrono::steady_clock::now();
    if (tokenReadAt_ == std::chrono::steady_clock::time_point{} || now - tokenReadAt_ >= std::chrono::minutes(1)) {
      tokenReadAt_ = now;
      std::ifstream in(config_.tokenFile);
      std::stringstream text;
      text << in.rdbuf();
      const std::string fresh(absl::StripAsciiWhitespace(text.str()));
      if (in && !fresh.empty()) token_ = fresh;
    }
    return token_;
  }

  const ClusterConfig config_;
  mutable std::mutex tokenMu_;
  mutable std::string token_ = config_.token;
  mutable std::chrono::steady_clock::time_point tokenReadAt_{};
  const web::uri base_;
  whc::http_client pooled_;  // thread-safe; pools connections
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> makeHttpTransport(const ClusterConfig& config) {
  web::uri base;
  try {
    base = web::uri(config.server);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(strCat("server URL '", config.server, "': ", e.what()));
  }
  if ((base.scheme() != "http" && base.scheme() != "https") || base.host().empty()) {
    return absl::InvalidArgumentError(strCat("server URL '", config.server, "': not an http(s) URL with a host"));
  }
  if (base.scheme() == "https") {
    // Load the material once now, so a bad PEM fails here and not on the
    // first request.
    try {
      boost::asio::ssl::context ctx(boost::asio::ssl::context::tls_client);
      configureTls(ctx, config);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(strCat("TLS material for ", config.server, ": ", e.what()));
    }
  }
  try {
    return std::unique_ptr<Transport>(std::make_unique<HttpTransport>(config, base));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(strCat("cannot create a client for ", config.server, ": ", e.what()));
  }
}

}  // namespace tandem::k8s
