#include "src/http/client.h"

#include <atomic>

#include <cpprest/http_client.h>
#include <nlohmann/json.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/http/cpprest_await.h"
#include "src/http/error.h"
#include "src/http/sse_client_impl.h"

namespace tandem::http {

namespace wh = web::http;
namespace whc = web::http::client;

namespace {

using cpprest::await;
using cpprest::statusFromException;
using cpprest::toMicros;

// After a timeout we cancel the request (cpprestsdk then closes the
// connection) and wait this long for its task chain to wind down.
// A Client's connections time out on silence only through the per-request
// timeout; cpprestsdk's own idle timer is set out of the way.
constexpr Duration kPooledIdleTimeout = std::chrono::hours(1);
// Error bodies quoted in a Status are cut to this many bytes.
constexpr size_t kMaxQuotedBody = 512;

struct Target {
  web::uri base;         // scheme://host:port
  std::string resource;  // /path?query
};

absl::StatusOr<Target> parseUrl(std::string_view url) {
  try {
    web::uri uri{std::string(url)};
    if (uri.scheme() != "http" && uri.scheme() != "https") {
      return absl::InvalidArgumentError(strCat("not an http(s) URL: '", url, "'"));
    }
    if (uri.host().empty()) return absl::InvalidArgumentError(strCat("URL without a host: '", url, "'"));
    std::string resource = uri.resource().to_string();
    return Target{uri.authority(), resource.empty() ? "/" : resource};
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(strCat("invalid URL '", url, "': ", e.what()));
  }
}

wh::http_request toCpprest(const ClientRequest& request, const std::string& resource) {
  wh::http_request r(request.method);
  r.set_request_uri(resource);
  std::string contentType = "application/json";
  for (const auto& [name, value] : request.headers) {
    if (CaseInsensitiveLess{}(name, "Content-Type") || CaseInsensitiveLess{}("Content-Type", name)) {
      r.headers().add(name, value);
    } else {
      contentType = value;
    }
  }
  if (!request.body.empty()) r.set_body(request.body, contentType);
  return r;
}

Headers toHeaders(const wh::http_headers& in) {
  Headers out;
  for (const auto& [name, value] : in) out[name] = value;
  return out;
}

absl::StatusOr<ClientResponse> sendOn(whc::http_client& client, const ClientRequest& request,
                                      const std::string& resource, std::string_view url) {
  std::string what = strCat(request.method, " ", url);
  try {
    pplx::cancellation_token_source cts;
    pplx::task<ClientResponse> task =
        client.request(toCpprest(request, resource), cts.get_token()).then([](wh::http_response response) {
          return response.extract_vector().then([response](std::vector<unsigned char> body) {
            ClientResponse out;
            out.status = response.status_code();
            out.headers = toHeaders(response.headers());
            out.body.assign(body.begin(), body.end());
            return out;
          });
        });
    return await(std::move(task), cts, request.timeout, what);
  } catch (...) {
    return statusFromException(std::current_exception(), what);
  }
}

whc::http_client_config configWithTimeout(Duration timeout) {
  whc::http_client_config config;
  config.set_timeout(toMicros(timeout));
  return config;
}

}  // namespace

absl::StatusOr<nlohmann::json> ClientResponse::json() const {
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {  // bad syntax, or e.g. a number beyond a double's range
    return absl::InvalidArgumentError(strCat("response body is not valid JSON: ", e.what()));
  }
}

absl::Status ClientResponse::toStatus() const {
  absl::StatusCode code = statusCodeForHttpStatus(status);
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  std::string message = body.substr(0, kMaxQuotedBody);
  try {
    auto parsed = nlohmann::json::parse(body);
    if (parsed.contains("error") && parsed["error"].is_object() && parsed["error"].contains("message") &&
        parsed["error"]["message"].is_string()) {
      message = parsed["error"]["message"].get<std::string>();
    }
  } catch (const nlohmann::json::exception&) {
    // Not our error shape: keep the raw body.
  }
  return absl::Status(code, strCat("HTTP ", status, ": ", message));
}

absl::StatusOr<ClientResponse> httpSend(const ClientRequest& request) {
  TANDEM_ASSIGN_OR_RETURN(Target target, parseUrl(request.url));
  try {
    whc::http_client client(target.base, configWithTimeout(request.timeout));
    return sendOn(client, request, target.resource, request.url);
  } catch (...) {
    return statusFromException(std::current_exception(), strCat(request.method, " ", request.url));
  }
}

absl::StatusOr<ClientResponse> httpGet(std::string_view url, Duration timeout) {
  return httpSend(ClientRequest{.method = "GET", .url = std::string(url), .timeout = timeout});
}

absl::StatusOr<ClientResponse> httpPost(std::string_view url, const nlohmann::json& body, Duration timeout) {
  return httpSend(ClientRequest{.method = "POST",
                                .url = std::string(url),
                                .body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                                .timeout = timeout});
}

// ---------------------------------------------------------------------------
// Client

class Client::Impl {
 public:
  Impl(web::uri base, std::string baseUrl)
      : baseUrl_(std::move(baseUrl)), client_(std::move(base), configWithTimeout(kPooledIdleTimeout)) {}

  absl::StatusOr<ClientResponse> send(const ClientRequest& request) {
    std::string resource = request.url.empty() ? "/" : request.url;
    return sendOn(client_, request, resource, strCat(baseUrl_, resource));
  }

 private:
  const std::string baseUrl_;
  whc::http_client client_;  // thread-safe; pools connections
};

absl::StatusOr<std::unique_ptr<Client>> Client::create(std::string_view baseUrl) {
  TANDEM_ASSIGN_OR_RETURN(Target target, parseUrl(baseUrl));
  try {
    std::string base(baseUrl);
    while (!base.empty() && base.back() == '/') base.pop_back();
    return std::make_unique<Client>(std::make_unique<Impl>(target.base, std::move(base)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(strCat("cannot create a client for '", baseUrl, "': ", e.what()));
  }
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<ClientResponse> Client::send(const ClientRequest& request) { return impl_->send(request); }

absl::StatusOr<ClientResponse> Client::get(std::string_view path, Duration timeout) {
  return send(ClientRequest{.method = "GET", .url = std::string(path), .timeout = timeout});
}

absl::StatusOr<ClientResponse> Client::post(std::string_view path, const nlohmann::json& body, Duration timeout) {
  return send(ClientRequest{.method = "POST",
                            .url = std::string(path),
                            .body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                            .timeout = timeout});
}

// ---------------------------------------------------------------------------
// SseClient

namespace {

// A stream on a cpprestsdk client of its own.
class CpprestStream final : public SseClient::Impl {
 public:
  CpprestStream(std::unique_ptr<whc::http_client> client, pplx::cancellation_token_source cts, wh::http_response response,
       std::string what)
      : client_(std::move(client)),
        cts_(std::move(cts)),
        response_(std::move(response)),
        status_(response_.status_code()),
        headers_(toHeaders(response_.headers())),
        what_(std::move(what)) {}

  ~CpprestStream() override { stop(); }

  int status() const override { return status_; }
  const Headers& headers() const override { return headers_; }

  absl::Status readEvents(const std::function<bool(const SseEvent&)>& onEvent) override {
    try {
      auto body = response_.body().streambuf();
      std::vector<uint8_t> chunk(16 * 1024);
      while (!stopped_.load()) {
        size_t got = 0;
        try {
          got = cpprest::readSome(body, chunk);
        } catch (...) {
          if (stopped_.load()) break;
          return statusFromException(std::current_exception(), what_);
        }
        if (got == 0) return stopped_.load() ? cancelled() : absl::OkStatus();
        for (const SseEvent& event : parser_.feed(std::string_view(reinterpret_cast<char*>(chunk.data()), got))) {
          if (!onEvent(event)) {
            stop();
            return absl::OkStatus();
          }
        }
      }
      return cancelled();
    } catch (...) {
      return statusFromException(std::current_exception(), what_);
    }
  }

  absl::StatusOr<std::string> readBody() override {
    try {
      std::vector<unsigned char> body = response_.extract_vector().get();
      return std::string(body.begin(), body.end());
    } catch (...) {
      if (stopped_.load()) return cancelled();
      return statusFromException(std::current_exception(), what_);
    }
  }

  void stop() override {
    if (stopped_.exchange(true)) return;
    // cpprestsdk closes the socket on cancellation, also while the body is
    // still being read.
    cts_.cancel();
  }

 private:
  absl::Status cancelled() const { return absl::CancelledError(strCat(what_, ": stopped")); }

  std::unique_ptr<whc::http_client> client_;
  pplx::cancellation_token_source cts_;
  wh::http_response response_;
  const int status_;
  const Headers headers_;
  const std::string what_;
  SseParser parser_;  // used by the reading thread only
  std::atomic<bool> stopped_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<SseClient>> SseClient::open(const ClientRequest& request) {
  TANDEM_ASSIGN_OR_RETURN(Target target, parseUrl(request.url));
  std::string what = strCat(request.method, " ", request.url);
  try {
    // Its own http_client, so closing this stream's connection touches no other.
    auto client = std::make_unique<whc::http_client>(target.base, configWithTimeout(request.timeout));
    ClientRequest withAccept = request;
    if (withAccept.headers.find("Accept") == withAccept.headers.end()) {
      withAccept.headers["Accept"] = "text/event-stream";
    }
    pplx::cancellation_token_source cts;
    TANDEM_ASSIGN_OR_RETURN(
        wh::http_response response,
        await(client->request(toCpprest(withAccept, target.resource), cts.get_token()), cts, request.timeout, what));
    return std::make_unique<SseClient>(
        std::make_unique<CpprestStream>(std::move(client), std::move(cts), std::move(response), std::move(what)));
  } catch (...) {
    return statusFromException(std::current_exception(), what);
  }
}

SseClient::SseClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SseClient::~SseClient() = default;

int SseClient::status() const { return impl_->status(); }
const Headers& SseClient::headers() const { return impl_->headers(); }
absl::Status SseClient::readEvents(const std::function<bool(const SseEvent&)>& onEvent) {
  return impl_->readEvents(onEvent);
}
absl::StatusOr<std::string> SseClient::readBody() { return impl_->readBody(); }
void SseClient::stop() { impl_->stop(); }

}  // namespace tandem::http
