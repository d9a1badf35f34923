// The Wire (wire.h) of one request on a Beast connection: the request's
// headers, copied once, and a response serialized by hand (status line,
// headers, then either Content-Length and the body, or chunks).

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include <boost/beast/http/status.hpp>

#include "src/common/strings.h"
#include "src/http/beast_connection.h"
#include "src/http/target.h"

namespace tandem::http::beast_impl {

namespace bhttp = boost::beast::http;

namespace {

// Beast 1.74's string_view is Boost's, which converts to neither std type implicitly.
std::string str(boost::beast::string_view v) { return std::string(v.data(), v.size()); }

bool closeRequested(const Headers& headers) {
  auto it = headers.find("Connection");
  return it != headers.end() && it->second.find("close") != std::string::npos;
}

// Status line and headers, up to and including the blank line. The caller's
// headers go first; framing and Connection come from here.
std::string head(int status, const Headers& headers, std::string_view framing, bool closeAfter, bool http10) {
  auto code = static_cast<unsigned>(status);
  std::string out = strCat("HTTP/1.1 ", status, " ", str(bhttp::obsolete_reason(bhttp::int_to_status(code))), "\r\n");
  for (const auto& [name, value] : headers) {
    if (CaseInsensitiveLess{}(name, "Connection") || CaseInsensitiveLess{}("Connection", name)) {
      out += strCat(name, ": ", value, "\r\n");
    }
  }
  out += framing;
  if (closeAfter) {
    out += "Connection: close\r\n";
  } else if (http10) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  return out;
}

class BeastWire final : public Wire {
 public:
  BeastWire(std::shared_ptr<Connection> connection, const bhttp::request<bhttp::string_body>& header)
      : connection_(std::move(connection)),
        method_(str(header.method_string())),
        target_(str(header.target())),
        keepAlive_(header.keep_alive()),
        http10_(header.version() == 10) {
    for (const auto& field : header) {
      auto [it, inserted] = headers_.try_emplace(str(field.name_string()), str(field.value()));
      if (!inserted) it->second += ", " + str(field.value());  // as cpprestsdk joins them
    }
    if (auto length = header.find(bhttp::field::content_length); length != header.end()) {
      declaredLength_ = std::strtoull(str(length->value()).c_str(), nullptr, 10);
    }
  }

  const std::string& method() const override { return method_; }
  std::string rawPath() const override { return target_.substr(0, target_.find('?')); }
  absl::Status decodeTarget(std::string& path, QueryParams& query) const override {
    return http::decodeTarget(target_, path, query);
  }
  Headers headers() const override { return headers_; }
  std::optional<uint64_t> declaredLength() const override { return declaredLength_; }

  void readBody(size_t limit, std::function<void(BodyRead)> done) override {
    auto c = connection_;
    auto bodyRead = bodyRead_;
    auto noteRead = [bodyRead, done](BodyRead read) {
      if (read.outcome == BodyRead::Outcome::kComplete) bodyRead->store(true);
      done(std::move(read));
    };
    if (!c->post([c, limit, noteRead] { c->readBody(limit, noteRead); })) {
      done({.outcome = BodyRead::Outcome::kFailed, .error = "server closed"});
    }
  }

  void discardBody() override {
    auto c = connection_;
    c->post([c] { c->discardBody(); });
  }

  void reply(const Response& response, std::function<void(bool ok)> done) override {
    // A response before the whole body was read (413, 408, 503, 504) ends
    // the connection: what follows on it cannot be parsed.
    bool closeAfter = !keepAlive_ || closeRequested(response.headers()) || !bodyRead_->load();
    Headers headers = response.headers();
    if (headers.find("Content-Type") == headers.end()) headers["Content-Type"] = "text/plain; charset=utf-8";
    std::string bytes = head(response.status(), headers, strCat("Content-Length: ", response.body().size(), "\r\n"),
                             closeAfter, http10_) +
                        (method_ == "HEAD" ? std::string() : response.body());  // HEAD: the length, no body
    sendFirst(std::move(bytes), /*last=*/true, closeAfter, std::move(done));
  }

  void openStream(const Headers& headers, std::function<void(bool ok)> done) override {
    bool closeAfter = !keepAlive_ || http10_;  // HTTP/1.0 has no chunks: the end of the stream is the close
    std::string framing = http10_ ? "" : "Transfer-Encoding: chunked\r\n";
    sendFirst(head(200, headers, framing, closeAfter, false), /*last=*/false, closeAfter, std::move(done));
  }

  bool writeStream(std::string_view bytes) override {
    if (!connection_->writable()) return false;
    if (bytes.empty()) return true;  // an empty chunk would end the stream
    char size[20];
    std::snprintf(size, sizeof(size), "%zx\r\n", bytes.size());
    std::string chunk = http10_ ? std::string(bytes) : strCat(size, bytes, "\r\n");
    auto c = connection_;
    return c->post([c, chunk = std::move(chunk)]() mutable { c->send(std::move(chunk), false, false, nullptr); });
  }

  size_t numUnsentBytes() const override { return connection_->numUnsentBytes(); }

  void closeStream() override {
    auto c = connection_;
    c->post([c, end = std::string(http10_ ? "" : "0\r\n\r\n")]() mutable {
      c->send(std::move(end), true, false, nullptr);
    });
  }

 private:
  void sendFirst(std::string bytes, bool last, bool closeAfter, std::function<void(bool ok)> done) {
    auto c = connection_;
    auto shared = std::make_shared<std::function<void(bool)>>(std::move(done));
    bool posted = c->post([c, bytes = std::move(bytes), last, closeAfter, shared]() mutable {
      c->send(std::move(bytes), last, closeAfter, std::move(*shared));
    });
    // Listener closed: nobody else will ever call it.
    if (!posted) (*shared)(false);
  }

  const std::shared_ptr<Connection> connection_;
  const std::string method_;
  const std::string target_;
  const bool keepAlive_;
  const bool http10_;
  Headers headers_;
  std::optional<uint64_t> declaredLength_;
  // Set once readBody() delivered the whole body; shared with its callback.
  const std::shared_ptr<std::atomic<bool>> bodyRead_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

std::shared_ptr<Wire> makeWire(std::shared_ptr<Connection> connection,
                               const bhttp::request<bhttp::string_body>& header) {
  return std::make_shared<BeastWire>(std::move(connection), header);
}

}  // namespace tandem::http::beast_impl
