#pragma once
// One client connection on Boost.Beast, and the state it moves through:
//
//   kIdle ──first byte──▶ kHeader ──headers in──▶ kBusy (a Wire is out: body, then response)
//     ▲                                             │
//     └──────────── response written, keep-alive ───┘
//   any ──(deadline, error, EOF, Connection: close)──▶ kClosed
//   kBusy ──response written, body left unread──▶ kLinger (drop input a moment) ──▶ kClosed
//
// A new connection starts in kIdle with the header deadline (headerTimeout
// counts from accept); a kept-alive one with the idle deadline. Everything
// runs on the connection's strand; the Wire's methods post onto it.
// Internal to src/http; only beast_*.cc include this.

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "absl/synchronization/mutex.h"
#include "src/http/listener.h"
#include "src/http/server.h"
#include "src/http/timer_queue.h"

namespace tandem::http::beast_impl {

class Connection;

// What the listener and all its connections share; outlives the listener
// object while connections hold it.
struct Shared {
  Shared(ServerOptions options, TimerQueue& timers, RequestSink sink)
      : options(std::move(options)), timers(timers), sink(std::move(sink)) {}

  // Connections' sockets live on it, so it lives as long as they do.
  boost::asio::io_context io;
  const ServerOptions options;
  TimerQueue& timers;
  const RequestSink sink;
  // Set by close(): nothing new is posted or scheduled after it.
  std::atomic<bool> closed{false};
  std::atomic<size_t> numConnections{0};
  absl::Mutex mu;
  // Every open connection, so close() can close them.
  std::vector<std::weak_ptr<Connection>> connections ABSL_GUARDED_BY(mu);
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class Phase { kIdle, kHeader, kBody, kBusy, kLinger, kClosed };

  Connection(std::shared_ptr<Shared> shared, boost::asio::ip::tcp::socket socket);
  ~Connection();

  // Starts reading the first request (on the strand).
  void start();
  // Closes the connection (from any thread; also after Shared::closed).
  void closeSoon();

  // The Wire's half (beast_wire.cc posts these onto the strand).
  void readBody(size_t limit, std::function<void(BodyRead)> done);
  void discardBody();
  // Queues a piece of the response. The first piece of a response brings
  // `done`, which runs once: true after the `last` piece was written, false
  // if the connection fails or closes first. `closeAfter`: the connection
  // ends after this response.
  void send(std::string bytes, bool last, bool closeAfter, std::function<void(bool)> done);
  // False once the connection failed or closed: a stream write would be lost.
  bool writable() const { return !failed_.load(); }
  // Bytes of the response queued and not yet written (from any thread).
  size_t numUnsentBytes() const { return unsent_.load(); }
  // Runs `fn` on the strand; false (and `fn` dropped) once the listener closed.
  template <typename F>
  bool post(F&& fn) {
    if (shared_->closed.load()) return false;
    boost::asio::post(socket_.get_executor(), std::forward<F>(fn));
    return true;
  }

 private:
  void readRequest(bool first);
  void readSome();
  void onRead(boost::system::error_code ec);
  void onBody(boost::system::error_code ec);
  void writeNext();
  void onWritten(boost::system::error_code ec);
  void afterResponse();
  void linger();
  void lingerRead();
  void close();
  void arm(Duration timeout);
  void disarm();
  void onDeadline(uint64_t generation);
  void endResponse(bool ok);

  const std::shared_ptr<Shared> shared_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  Phase phase_ = Phase::kIdle;
  bool readPending_ = false;
  bool timedOut_ = false;      // the body deadline cancelled the read
  bool bodyComplete_ = false;  // this request's body was read to its end
  bool closeAfter_ = false;    // the response ends the connection
  std::function<void(BodyRead)> bodyDone_;
  std::function<void(bool)> responseDone_;
  struct Piece {
    std::string bytes;
    bool last;
  };
  std::deque<Piece> outbox_;
  bool writing_ = false;
  std::atomic<size_t> unsent_{0};  // bytes in outbox_; written on the strand, read anywhere
  std::atomic<bool> failed_{false};
  TimerQueue::Id timer_ = 0;
  uint64_t generation_ = 0;  // of the armed deadline; a stale one is ignored
  std::string scratch_;      // lingering reads land here
};

// The Wire of one request on `connection` (beast_wire.cc).
std::shared_ptr<Wire> makeWire(std::shared_ptr<Connection> connection,
                               const boost::beast::http::request<boost::beast::http::string_body>& header);

}  // namespace tandem::http::beast_impl
