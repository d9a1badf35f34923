#include "agent/router/upstream.h"

#include <nlohmann/json.hpp>

#include "agent/router/upstream_error.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::agent {
namespace {

using Kind = UpstreamOutcome::Kind;

// The `code` of an OpenAI error body ({"error": {"code": ...}}), if any.
std::optional<std::string> errorCode(std::string_view body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto e = j.find("error");
  if (e == j.end() || !e->is_object()) return std::nullopt;
  auto c = e->find("code");
  if (c == e->end() || !c->is_string()) return std::nullopt;
  return c->get<std::string>();
}

// D's answer when it is a refusal another worker could serve (kRefused),
// else nullopt (relay it).
std::optional<routing::RejectReason> retryableRefusal(std::string_view body) {
  std::optional<std::string> code = errorCode(body);
  if (!code) return std::nullopt;
  std::optional<routing::RejectReason> reason = rejectReasonForCode(*code);
  if (!reason || !retryElsewhere(*reason)) return std::nullopt;
  return reason;
}

http::ClientRequest clientRequest(const UpstreamRequest& r, bool stream) {
  http::ClientRequest c{.method = "POST", .url = r.path, .headers = r.headers, .body = r.body,
                        .timeout = stream ? r.open_timeout : r.idle_timeout, .read_timeout = r.idle_timeout};
  c.headers["Content-Type"] = "application/json";
  return c;
}

http::Response plainResponse(int status, std::string body, const http::Headers& headers) {
  auto ct = headers.find("Content-Type");
  http::Response resp =
      http::Response::text(status, std::move(body), ct != headers.end() ? ct->second : "application/json");
  if (auto ra = headers.find("Retry-After"); ra != headers.end()) resp.setHeader("Retry-After", ra->second);
  return resp;
}

UpstreamOutcome unreachable(const absl::Status& s) {
  return {.kind = Kind::kUnreachable, .detail = std::string(toStd(s.message()))};
}

// An error event ({"error": {...}}) instead of a chunk.
bool isError(const http::SseEvent& e) {
  if (e.data.empty() || e.data.front() != '{') return false;
  nlohmann::json j = nlohmann::json::parse(e.data, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("error");
}

// Whether the client's response may start now: not when the router called
// the attempt off.
bool mayStart(const UpstreamRequest& r) { return !r.attempt || r.attempt->start(); }

UpstreamOutcome calledOff() {
  return {.kind = Kind::kCalledOff, .detail = "the decode worker stopped answering"};
}

// An attempt that ended without an answer: called off by the router, left
// by the client, or D unreachable.
UpstreamOutcome noAnswer(const UpstreamRequest& r, http::Responder& responder, const absl::Status& s) {
  if (r.attempt && r.attempt->calledOff()) return calledOff();
  if (responder.context().cancelled() || s.code() == absl::StatusCode::kCancelled) return {.kind = Kind::kClientGone};
  return unreachable(s);
}

// Relays D's events to the client once the first token arrived (the
// readEvents callback of forwardStream).
class StreamRelay {
 public:
  StreamRelay(const UpstreamRequest& request, http::Responder& responder, const Clock& clock,
              const std::function<void()>& on_first_chunk)
      : request_(request), responder_(responder), clock_(clock), on_first_chunk_(on_first_chunk) {}

  // False: stop reading (the connection to D closes).
  bool onEvent(const http::SseEvent& e) {
    if (!writer_) {
      if (isError(e)) {
        // D failed before any token: the client has seen nothing yet.
        out_.in_stream = true;
        out_.status = 200;
        out_.body = e.data;
        out_.reason = retryableRefusal(e.data);
        return false;
      }
      if (!open()) return false;
    }
    if (!writer_->send(e.data)) {
      out_.kind = Kind::kClientGone;
      return false;
    }
    if (e.data != "[DONE]") {
      ++out_.chunks;
      out_.last_chunk = clock_.now();
      if (!out_.first_chunk) {
        out_.first_chunk = out_.last_chunk;
        if (on_first_chunk_) on_first_chunk_();
      }
    }
    return true;
  }

  // After readEvents returned `status`.
  UpstreamOutcome finish(const absl::Status& status) {
    if (writer_) {
      if (responder_.context().cancelled()) out_.kind = Kind::kClientGone;
      if (!status.ok() && out_.kind != Kind::kClientGone) {
        // D went away after tokens: the request cannot move; end the client's
        // stream with an error event, as D itself does.
        writer_->send(nlohmann::json{{"error",
                                      {{"message", strCat("the decode worker's stream broke: ", status.message())},
                                       {"type", "service_unavailable_error"},
                                       {"param", nullptr},
                                       {"code", "upstream_failed"}}}}
                          .dump());
        writer_->send("[DONE]");
      }
      writer_->close();
      return out_;
    }
    if (out_.kind == Kind::kCalledOff) return out_;
    if (out_.in_stream) {
      out_.kind = out_.reason ? Kind::kRefused : Kind::kServed;
      if (!out_.reason) {
        if (!mayStart(request_)) return calledOff();
        relayRefusal(out_, responder_);
      }
      return out_;
    }
    return noAnswer(request_, responder_,
                    status.ok() ? absl::UnavailableError("the stream ended before any event") : status);
  }

 private:
  bool open() {
    if (!mayStart(request_)) {
      out_ = calledOff();
      return false;
    }
    responder_.respond(http::Response::sse([this](std::shared_ptr<http::SseWriter> w) { writer_ = std::move(w); }));
    if (!writer_) {  // the call was answered already (deadline, shutdown)
      out_.kind = Kind::kClientGone;
      return false;
    }
    return true;
  }

  const UpstreamRequest& request_;
  http::Responder& responder_;
  const Clock& clock_;
  const std::function<void()>& on_first_chunk_;
  std::shared_ptr<http::SseWriter> writer_;
  UpstreamOutcome out_;
};

// Opens the request on D. The call's cancellation (client gone, deadline,
// shutdown) closes the connection from then on, also while D has not
// answered yet (a non-streamed answer comes only with the completion),
// which D takes as a cancel.
absl::StatusOr<std::unique_ptr<http::SseClient>> openUpstream(UpstreamPools& pools, const UpstreamRequest& request,
                                                               bool stream, http::Responder& responder) {
  TANDEM_ASSIGN_OR_RETURN(http::ConnectionPool * pool, pools.get(request.base_url));
  std::shared_ptr<http::StreamCanceller> canceller =
      request.attempt ? request.attempt->canceller() : std::make_shared<http::StreamCanceller>();
  responder.context().onCancel([canceller] { canceller->cancel(); });
  return pool->open(clientRequest(request, stream), canceller);
}

// D answered with an error status: a refusal to retry elsewhere, or the
// answer to relay.
UpstreamOutcome errorStatus(const UpstreamRequest& request, http::SseClient& sse, http::Responder& responder) {
  absl::StatusOr<std::string> body = sse.readBody();
  if (!body.ok()) return noAnswer(request, responder, body.status());
  UpstreamOutcome out{.status = sse.status(), .body = std::move(*body), .headers = sse.headers()};
  out.reason = retryableRefusal(out.body);
  out.kind = out.reason ? Kind::kRefused : Kind::kServed;
  if (!out.reason) {
    if (!mayStart(request)) return calledOff();
    relayRefusal(out, responder);
  }
  return out;
}

}  // namespace

absl::StatusOr<http::ConnectionPool*> UpstreamPools::get(const std::string& base_url) {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(base_url);
  if (it != pools_.end()) return it->second.get();
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<http::ConnectionPool> pool,
                          http::ConnectionPool::create(base_url, {.connect_timeout = connect_timeout_}));
  return pools_.emplace(base_url, std::move(pool)).first->second.get();
}

bool UpstreamAttempt::callOff() {
  {
    absl::MutexLock lock(&mu_);
    if (started_ || called_off_) return false;
    called_off_ = true;
  }
  canceller_->cancel();
  return true;
}

bool UpstreamAttempt::start() {
  absl::MutexLock lock(&mu_);
  if (called_off_) return false;
  started_ = true;
  return true;
}

bool UpstreamAttempt::calledOff() const {
  absl::MutexLock lock(&mu_);
  return called_off_;
}

bool UpstreamAttempt::started() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

UpstreamOutcome forwardUnary(UpstreamPools& pools, const UpstreamRequest& request, http::Responder& responder) {
  auto sse = openUpstream(pools, request, /*stream=*/false, responder);
  if (!sse.ok()) return noAnswer(request, responder, sse.status());
  if ((*sse)->status() != 200) return errorStatus(request, **sse, responder);
  absl::StatusOr<std::string> body = (*sse)->readBody();
  if (!body.ok()) return noAnswer(request, responder, body.status());
  if (!mayStart(request)) return calledOff();
  if (!responder.respond(plainResponse(200, std::move(*body), (*sse)->headers()))) return {.kind = Kind::kClientGone};
  return {.kind = Kind::kServed, .status = 200};
}

UpstreamOutcome forwardStream(UpstreamPools& pools, const UpstreamRequest& request, http::Responder& responder,
                              const Clock& clock, const std::function<void()>& on_first_chunk) {
  auto sse = openUpstream(pools, request, /*stream=*/true, responder);
  if (!sse.ok()) return noAnswer(request, responder, sse.status());
  if ((*sse)->status() != 200) return errorStatus(request, **sse, responder);
  StreamRelay relay(request, responder, clock, on_first_chunk);
  absl::Status status = (*sse)->readEvents([&relay](const http::SseEvent& e) { return relay.onEvent(e); });
  return relay.finish(status);
}

void relayRefusal(const UpstreamOutcome& outcome, http::Responder& responder) {
  if (!outcome.in_stream) {
    responder.respond(plainResponse(outcome.status, outcome.body, outcome.headers));
    return;
  }
  std::string event = outcome.body;
  responder.respond(http::Response::sse([event](std::shared_ptr<http::SseWriter> w) {
    w->send(event);
    w->send("[DONE]");
    w->close();
  }));
}

}  // namespace tandem::agent
