#include "src/http/server_core.h"

#include <nlohmann/json.hpp>

#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/http/beast_listener.h"
#include "src/http/call_handles.h"
#include "src/http/cpprest_listener.h"
#include "src/http/error.h"
#include "src/http/exchange.h"

namespace tandem::http {

std::string formatSeconds(Duration d) {
  return strCat(std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 1000.0, "s");
}

Server::Impl::Impl(ServerOptions options, Routes routes)
    : options_(std::move(options)), clock_(*options_.clock), routes_(std::move(routes)), timers_(clock_) {}

Server::Impl::~Impl() { timers_.stop(); }

absl::Status Server::Impl::open() {
  // The sink holds a raw pointer: this Impl owns the listener and closes it
  // (no sink calls after that) before it can go away.
  RequestSink sink = [this](std::shared_ptr<Wire> wire) { onRequest(std::move(wire)); };
  if (options_.library == ServerLibrary::kBeast && options_.tlsCertFile.empty()) {
    TANDEM_ASSIGN_OR_RETURN(listener_, openBeastListener(options_, timers_, std::move(sink)));
  } else {
    TANDEM_ASSIGN_OR_RETURN(listener_, openCpprestListener(options_, std::move(sink)));
  }
  port_ = listener_->port();
  log_.info("listening", {{"host", options_.host}, {"port", port_}, {"library", serverLibraryName(options_.library)}});
  return absl::OkStatus();
}

bool Server::Impl::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

size_t Server::Impl::numInFlight() const {
  absl::MutexLock lock(&mu_);
  return inFlight_.size();
}

void Server::Impl::onRequest(std::shared_ptr<Wire> wire) {
  // Runs on a library I/O thread: nothing here may block.
  std::shared_ptr<Exchange> ex;
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    draining = draining_;
    uint64_t id = draining ? 0 : nextId_++;
    ex = std::make_shared<Exchange>(shared_from_this(), std::move(wire), id, clock_.now() + options_.requestTimeout,
                                    clock_);
    if (!draining) inFlight_[id] = ex;
  }
  if (draining) {
    answer(ex, Response::error(503, kUnavailableError, "server is shutting down").setHeader("Connection", "close"));
    ex->wire->discardBody();
    return;
  }
  scheduleDeadline(ex);
  std::optional<uint64_t> declared = ex->wire->declaredLength();
  if (declared && *declared > options_.maxBodyBytes) {
    answerError(ex, 413,
                strCat("request body of ", *declared, " bytes is over the limit of ", options_.maxBodyBytes, " bytes"));
    // The body is thrown away as it comes instead of being buffered.
    ex->wire->discardBody();
    return;
  }
  ex->wire->readBody(options_.maxBodyBytes, [this, ex](BodyRead read) { onBody(ex, std::move(read)); });
}

void Server::Impl::onBody(const std::shared_ptr<Exchange>& ex, BodyRead read) {
  switch (read.outcome) {
    case BodyRead::Outcome::kComplete:
      dispatch(ex, std::move(read.body));
      return;
    case BodyRead::Outcome::kTooLarge:
      answerError(ex, 413, strCat("request body is over the limit of ", options_.maxBodyBytes, " bytes"));
      ex->wire->discardBody();
      return;
    case BodyRead::Outcome::kTimedOut:
      answerError(ex, 408, read.error);
      return;
    case BodyRead::Outcome::kFailed:
      ex->context->cancel(CancelReason::kClientDisconnected);
      answerError(ex, 400, strCat("could not read the request body: ", read.error));
      return;
  }
}

void Server::Impl::dispatch(const std::shared_ptr<Exchange>& ex, std::string body) {
  if (!ex->pending()) return;  // the deadline passed while the body was arriving
  const std::string& method = ex->wire->method();
  std::string path;
  QueryParams query;
  if (absl::Status target = ex->wire->decodeTarget(path, query); !target.ok()) {
    answerError(ex, 400, toStd(target.message()));
    return;
  }
  Routes::Match match = routes_.match(method, path);
  if (match.handler == nullptr) {
    if (match.allow.empty()) {
      answerError(ex, 404, strCat("no route for ", method, " ", path));
    } else {
      answer(ex, Response::error(405, kInvalidRequestError,
                                 strCat("method ", method, " is not allowed for ", path, "; allowed: ", match.allow))
                     .setHeader("Allow", match.allow));
    }
    return;
  }
  if (options_.requireUtf8Body && !isValidUtf8(body)) {
    answerError(ex, 400, "request body is not valid UTF-8");
    return;
  }
  Request request(method, std::move(path), std::move(query), ex->wire->headers(), std::move(body), ex->context);
  if (!enterHandler()) {
    answerError(ex, 503, "server is shutting down");
    return;
  }
  deliver(ex, callHandler(*match.handler, request));
  leaveHandler();
}

Response Server::Impl::callHandler(const Handler& handler, Request& request) {
  try {
    return handler(request);
  } catch (const nlohmann::json::parse_error& e) {
    return Response::error(400, kInvalidRequestError, invalidJsonMessage(e.what()));
  } catch (const std::exception& e) {
    log_.error("handler threw", {{"method", request.method()}, {"path", request.path()}, {"what", e.what()}});
    return Response::error(500, kServerError, strCat("internal error: ", e.what()));
  } catch (...) {
    log_.error("handler threw a non-std exception", {{"method", request.method()}, {"path", request.path()}});
    return Response::error(500, kServerError, "internal error: unknown exception");
  }
}

void Server::Impl::deliver(const std::shared_ptr<Exchange>& ex, Response response) {
  switch (response.kind()) {
    case Response::Kind::kPlain:
      answer(ex, response);
      return;
    case Response::Kind::kSse:
      openStream(ex, response);
      return;
    case Response::Kind::kDeferred: {
      auto responder = std::make_shared<ResponderImpl>(ex);
      try {
        if (response.deferredStart()) response.deferredStart()(responder);
      } catch (const std::exception& e) {
        responder->respond(Response::error(500, kServerError, strCat("internal error: ", e.what())));
      } catch (...) {
        responder->respond(Response::error(500, kServerError, "internal error: unknown exception"));
      }
      return;
    }
  }
}

bool Server::Impl::openStream(const std::shared_ptr<Exchange>& ex, const Response& response) {
  if (!ex->claim(Exchange::State::kStreaming)) return false;  // answered already (deadline): never start
  Headers headers{{"Content-Type", "text/event-stream"},
                  {"Cache-Control", "no-cache"},
                  {"X-Accel-Buffering", "no"}};  // tell nginx-style proxies not to buffer
  for (const auto& [name, value] : response.headers()) headers[name] = value;
  ex->wire->openStream(headers, [ex](bool ok) { ex->server->onSent(ex, ok); });
  if (options_.sseKeepalive > Duration::zero()) scheduleKeepalive(ex, clock_.now() + options_.sseKeepalive);

  auto writer = std::make_shared<SseWriterImpl>(ex);
  try {
    if (response.sseStart()) response.sseStart()(writer);
  } catch (const std::exception& e) {
    // The status line is gone already; the error travels as the last event.
    writer->send(errorBody(500, kServerError, strCat("internal error: ", e.what())));
    writer->close();
  } catch (...) {
    writer->send(errorBody(500, kServerError, "internal error: unknown exception"));
    writer->close();
  }
  return true;
}

bool Server::Impl::answer(const std::shared_ptr<Exchange>& ex, const Response& response) {
  if (!ex->claim(Exchange::State::kAnswered)) return false;
  if (response.status() >= 500 && response.status() != 503) {  // 503s come in floods while draining
    log_.warn("server error response", {{"method", ex->wire->method()},
                                        {"path", ex->wire->rawPath()},
                                        {"status", response.status()},
                                        {"body", response.body()}});
  }
  sendReply(ex, response);
  return true;
}

bool Server::Impl::answerError(const std::shared_ptr<Exchange>& ex, int status, std::string_view message) {
  return answer(ex, Response::error(status, errorTypeForStatus(status), message));
}

void Server::Impl::sendReply(const std::shared_ptr<Exchange>& ex, const Response& response) {
  ex->wire->reply(response, [ex](bool ok) { ex->server->onSent(ex, ok); });
}

void Server::Impl::onSent(const std::shared_ptr<Exchange>& ex, bool ok) {
  // A failed write is the only sign some libraries give of a vanished client.
  if (!ok) {
    ex->context->cancel(CancelReason::kClientDisconnected);
    ex->closeStream();
  }
  finish(*ex);
}

void Server::Impl::finish(Exchange& ex) {
  TimerQueue::Id deadline = 0;
  {
    absl::MutexLock lock(&mu_);
    std::swap(deadline, ex.deadlineTimer);
    if (ex.id != 0 && inFlight_.erase(ex.id) > 0) changed_.SignalAll();
  }
  if (deadline != 0) timers_.cancel(deadline);
}

bool Server::Impl::enterHandler() {
  absl::MutexLock lock(&mu_);
  if (stopped_) return false;
  ++numRunningHandlers_;
  return true;
}

void Server::Impl::leaveHandler() {
  absl::MutexLock lock(&mu_);
  --numRunningHandlers_;
}

void Server::Impl::scheduleDeadline(const std::shared_ptr<Exchange>& ex) {
  std::weak_ptr<Exchange> weak = ex;
  TimerQueue::Id id = timers_.schedule(ex->context->deadline(), [weak] {
    if (auto ex = weak.lock()) ex->server->onDeadline(ex);
  });
  absl::MutexLock lock(&mu_);
  ex->deadlineTimer = id;
}

void Server::Impl::onDeadline(const std::shared_ptr<Exchange>& ex) {
  {
    absl::MutexLock lock(&mu_);
    ex->deadlineTimer = 0;
  }
  if (!ex->claim(Exchange::State::kAnswered)) return;  // answered or streaming: the deadline is moot
  ex->context->cancel(CancelReason::kDeadline);
  log_.warn("request deadline passed", {{"method", ex->wire->method()}, {"path", ex->wire->rawPath()}});
  sendReply(ex, Response::error(
                    504, kTimeoutError,
                    strCat("no response within the request deadline of ", formatSeconds(options_.requestTimeout))));
}

void Server::Impl::scheduleKeepalive(const std::shared_ptr<Exchange>& ex, MonoTime when) {
  std::weak_ptr<Exchange> weak = ex;
  timers_.schedule(when, [weak] {
    if (auto ex = weak.lock()) ex->server->onKeepalive(ex);
  });
}

void Server::Impl::onKeepalive(const std::shared_ptr<Exchange>& ex) {
  std::optional<MonoTime> due = ex->keepaliveDue(options_.sseKeepalive);
  if (!due) return;
  if (*due <= clock_.now()) {
    ex->write(formatSseComment("keepalive"));
    due = ex->keepaliveDue(options_.sseKeepalive);
    if (!due) return;
  }
  scheduleKeepalive(ex, *due);
}

}  // namespace tandem::http
