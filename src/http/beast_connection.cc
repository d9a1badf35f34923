#include "src/http/beast_connection.h"

#include <limits>

#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/read.hpp>

#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/server_core.h"

namespace tandem::http::beast_impl {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using boost::system::error_code;

namespace {

// Request headers larger than this close the connection.
constexpr uint32_t kHeaderLimit = 64 * 1024;
// After a response that left the request body unread, input is read and
// dropped this long (or until the client closes), so the client, still
// sending, sees the response instead of a reset.
constexpr Duration kLingerTime = std::chrono::seconds(5);
constexpr size_t kLingerChunk = 64 * 1024;

}  // namespace

Connection::Connection(std::shared_ptr<Shared> shared, asio::ip::tcp::socket socket)
    : shared_(std::move(shared)), socket_(std::move(socket)) {}

Connection::~Connection() {
  if (phase_ != Phase::kClosed) shared_->numConnections.fetch_sub(1);
}

void Connection::start() {
  post([self = shared_from_this()] { self->readRequest(/*first=*/true); });
}

void Connection::closeSoon() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
}

void Connection::readRequest(bool first) {
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  // No limit yet: the core checks Content-Length (413) and readBody() sets
  // the limit before any body byte is parsed. (Not boost::none: Beast 1.74
  // compares a Content-Length against an empty limit as "over".)
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  bodyComplete_ = false;
  closeAfter_ = false;
  timedOut_ = false;
  // The first request's header deadline counts from accept; a later one's
  // from its first byte, until which the idle deadline runs.
  if (first || buffer_.size() > 0) {
    phase_ = Phase::kHeader;
    arm(shared_->options.headerTimeout);
  } else {
    phase_ = Phase::kIdle;
    arm(shared_->options.idleTimeout);
  }
  readSome();
}

void Connection::readSome() {
  readPending_ = true;
  bhttp::async_read_some(socket_, buffer_, *parser_,
                         [self = shared_from_this()](error_code ec, size_t) { self->onRead(ec); });
}

void Connection::onRead(error_code ec) {
  readPending_ = false;
  if (phase_ == Phase::kClosed) return;
  if (ec) {  // EOF, reset, malformed or oversized headers, or the deadline closed the socket
    close();
    return;
  }
  if (phase_ == Phase::kIdle) {
    phase_ = Phase::kHeader;
    arm(shared_->options.headerTimeout);
  }
  if (!parser_->is_header_done()) {
    readSome();
    return;
  }
  disarm();
  phase_ = Phase::kBusy;
  bodyComplete_ = parser_->is_done();  // no body at all
  shared_->sink(makeWire(shared_from_this(), parser_->get()));
}

void Connection::readBody(size_t limit, std::function<void(BodyRead)> done) {
  if (phase_ == Phase::kClosed) {
    done({.outcome = BodyRead::Outcome::kFailed, .error = "connection closed"});
    return;
  }
  if (parser_->is_done()) {
    bodyComplete_ = true;
    done({.body = std::move(parser_->get().body())});
    return;
  }
  parser_->body_limit(limit);
  if (boost::beast::iequals(parser_->get()[bhttp::field::expect], "100-continue")) {
    // The client waits for this before it sends the body (curl does, for large ones).
    send("HTTP/1.1 100 Continue\r\n\r\n", /*last=*/false, /*closeAfter=*/false, nullptr);
  }
  phase_ = Phase::kBody;
  bodyDone_ = std::move(done);
  arm(shared_->options.bodyTimeout);
  readPending_ = true;
  bhttp::async_read(socket_, buffer_, *parser_,
                    [self = shared_from_this()](error_code ec, size_t) { self->onBody(ec); });
}

void Connection::onBody(error_code ec) {
  readPending_ = false;
  disarm();
  if (phase_ == Phase::kBody) phase_ = Phase::kBusy;
  auto done = std::move(bodyDone_);
  bodyDone_ = nullptr;
  if (!ec && phase_ != Phase::kClosed) {
    bodyComplete_ = true;
    done({.body = std::move(parser_->get().body())});
    return;
  }
  closeAfter_ = true;
  if (ec == bhttp::error::body_limit) {
    done({.outcome = BodyRead::Outcome::kTooLarge});
  } else if (timedOut_) {
    done({.outcome = BodyRead::Outcome::kTimedOut,
          .error = strCat("the request body did not arrive within ", formatSeconds(shared_->options.bodyTimeout))});
  } else {
    done({.outcome = BodyRead::Outcome::kFailed, .error = ec ? ec.message() : "connection closed"});
  }
}

void Connection::discardBody() { closeAfter_ = true; }

void Connection::send(std::string bytes, bool last, bool closeAfter, std::function<void(bool)> done) {
  if (closeAfter) closeAfter_ = true;
  if (done) responseDone_ = std::move(done);
  if (phase_ == Phase::kClosed || failed_.load()) {
    endResponse(false);
    return;
  }
  unsent_.fetch_add(bytes.size());
  outbox_.push_back({std::move(bytes), last});
  if (!writing_) writeNext();
}

void Connection::writeNext() {
  writing_ = true;
  asio::async_write(socket_, asio::buffer(outbox_.front().bytes),
                    [self = shared_from_this()](error_code ec, size_t) { self->onWritten(ec); });
}

void Connection::onWritten(error_code ec) {
  writing_ = false;
  Piece piece = std::move(outbox_.front());
  outbox_.pop_front();
  unsent_.fetch_sub(piece.bytes.size());
  if (ec) {
    failed_.store(true);
    outbox_.clear();
    unsent_.store(0);
    endResponse(false);
    close();
    return;
  }
  if (piece.last) {
    outbox_.clear();  // nothing may follow the end of a response
    unsent_.store(0);
    endResponse(true);
    afterResponse();
    return;
  }
  if (!outbox_.empty()) writeNext();
}

void Connection::endResponse(bool ok) {
  auto done = std::move(responseDone_);
  responseDone_ = nullptr;
  if (done) done(ok);
}

void Connection::afterResponse() {
  if (phase_ == Phase::kClosed) return;
  if (readPending_) {  // answered while the body was still arriving (504): the rest cannot be parsed
    close();
  } else if (closeAfter_ && !bodyComplete_) {
    linger();
  } else if (closeAfter_) {
    close();
  } else {
    readRequest(/*first=*/false);
  }
}

void Connection::linger() {
  phase_ = Phase::kLinger;
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  arm(kLingerTime);
  scratch_.resize(kLingerChunk);
  lingerRead();
}

void Connection::lingerRead() {
  socket_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](error_code ec, size_t) {
    if (ec || self->phase_ != Phase::kLinger) {
      self->close();
    } else {
      self->lingerRead();
    }
  });
}

void Connection::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  disarm();
  failed_.store(true);
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  shared_->numConnections.fetch_sub(1);
  // A pending write completes with an error and ends its response; without
  // one, a stream waiting for its next chunk ends here.
  if (!writing_) endResponse(false);
}

void Connection::arm(Duration timeout) {
  disarm();
  uint64_t generation = generation_;
  std::weak_ptr<Connection> weak = shared_from_this();
  timer_ = shared_->timers.schedule(shared_->timers.clock().now() + timeout, [weak, generation] {
    if (auto self = weak.lock()) self->post([self, generation] { self->onDeadline(generation); });
  });
}

void Connection::disarm() {
  ++generation_;
  if (timer_ != 0) shared_->timers.cancel(timer_);
  timer_ = 0;
}

void Connection::onDeadline(uint64_t generation) {
  if (generation != generation_) return;  // re-armed or disarmed since
  timer_ = 0;
  switch (phase_) {
    case Phase::kIdle:
    case Phase::kHeader:
    case Phase::kLinger:
      close();
      return;
    case Phase::kBody: {
      timedOut_ = true;
      error_code ignored;
      socket_.cancel(ignored);  // the read ends (onBody); the socket stays open for the 408
      return;
    }
    case Phase::kBusy:
    case Phase::kClosed:
      return;
  }
}

}  // namespace tandem::http::beast_impl
