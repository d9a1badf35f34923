// The UCP worker and the progress thread that owns it: the command queue
// other threads post to, the loop that progresses UCX and sleeps until an
// event, and the drain at shutdown.

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "agent/transport/ucx_transport_impl.h"
#include "src/common/thread_name.h"

namespace tandem::transport {
namespace {

// While gets are in flight the progress thread polls UCX (see pollForGets):
// back to back for kGetSpin after the last progress, then one poll every
// kGetPollInterval, sleeping between polls. The spin also ends after
// kGetSpinMaxPolls fruitless polls, so a clock that does not move (a
// FakeClock) cannot make it spin for as long as gets are in flight; on the
// real clock the time ends it first (an empty poll takes 30 ns with shared
// memory, microseconds with tcp).
constexpr std::chrono::nanoseconds kGetSpin{50'000};
constexpr int kGetSpinMaxPolls = 8192;
constexpr std::chrono::nanoseconds kGetPollInterval{20'000};
// UCX's keepalive (how a dead shared-memory peer is noticed) runs only from
// progress calls, on UCX's own clock: while connections exist the thread
// wakes this often even without an event.
constexpr int kKeepaliveTickMs = 10;
// How long shutdown keeps progressing for gets and endpoint closes to
// complete: a peer that vanished cannot hold shutdown forever.
constexpr std::chrono::seconds kShutdownDrain{5};

}  // namespace

UcxTransport::Impl::Impl(const Clock& c, TransportCallbacks callbacks) : clock(c), cb(std::move(callbacks)) {}

UcxTransport::Impl::~Impl() {
  if (listener) ucp_listener_destroy(listener);
  if (memh && !pool) ucp_mem_unmap(ctx, memh);
  if (worker_busy) {
    // Destroying it would abort the process (flushWorker); its memory goes
    // with the process, or stays until then in a test's.
    std::fprintf(stderr, "tandem transport: UCX still discarding closed endpoints at shutdown: worker left in place\n");
  } else {
    if (worker) ucp_worker_destroy(worker);
    if (ctx && !pool) ucp_cleanup(ctx);
  }
  if (wake_fd >= 0) ::close(wake_fd);
  if (epoll_fd >= 0) ::close(epoll_fd);
}

absl::Status UcxTransport::Impl::createWorker(ucs_status_t* raw) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches the worker
  ucs_status_t s = ucp_worker_create(ctx, &wp, &worker);
  *raw = s;
  if (s != UCS_OK) return ucsError("ucp_worker_create", s);
  return absl::OkStatus();
}

// The thread sleeps in epoll on two descriptors: UCX's event fd (armed with
// ucp_worker_arm) and an eventfd that post() writes.
absl::Status UcxTransport::Impl::setupWakeup() {
  ucs_status_t s = ucp_worker_get_efd(worker, &ucx_fd);
  if (s != UCS_OK) return ucsError("ucp_worker_get_efd", s);
  wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd < 0 || epoll_fd < 0) return absl::InternalError("eventfd/epoll_create1 failed");
  for (int fd : {ucx_fd, wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) return absl::InternalError("epoll_ctl failed");
  }
  return absl::OkStatus();
}

void UcxTransport::Impl::startThread() {
  absl::MutexLock lock(&join_mu);
  thread = std::thread([this] {
    nameThisThread("ucx-worker");
    run();
  });
}

void UcxTransport::Impl::post(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu);
    commands.push_back(std::move(fn));
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof(one));
}

void UcxTransport::Impl::requestStop() {
  {
    absl::MutexLock lock(&mu);
    stop = true;
  }
  post([] {});
}

void UcxTransport::Impl::join() {
  absl::MutexLock lock(&join_mu);
  if (thread.joinable()) thread.join();
}

void UcxTransport::Impl::run() {
  prctl(PR_SET_TIMERSLACK, 1000UL);  // sleep-polls wake on time (default slack: 50 us)
  IdleGetPolls idle;                 // while gets are in flight: fruitless polls since the last progress
  while (runCommands()) {
    if (ucp_worker_progress(worker) != 0) {
      idle = {};
    } else if (!gets.empty()) {
      pollForGets(idle);
    } else {
      waitForEvents();
    }
  }
  drain();
}

// Runs the commands posted so far; false once shutdown was requested.
bool UcxTransport::Impl::runCommands() {
  std::deque<std::function<void()>> batch;
  bool stopping = false;
  {
    absl::MutexLock lock(&mu);
    batch.swap(commands);
    stopping = stop;
  }
  for (auto& fn : batch) fn();
  return !stopping;
}

// While gets are in flight, keep polling UCX: the completion of a
// shared-memory get raises no wakeup event, so sleeping until one would
// stall the pull by tens of ms. Polls back to back first, then sleeps
// kGetPollInterval between polls (new commands wake the thread), leaving
// the core to the engine.
void UcxTransport::Impl::pollForGets(IdleGetPolls& idle) {
  const MonoTime now = clock.now();
  if (idle.polls == 0) idle.since = now;
  if (idle.polls < kGetSpinMaxPolls && now - idle.since < kGetSpin) {
    ++idle.polls;
    return;
  }
  pollfd pfd{.fd = wake_fd, .events = POLLIN, .revents = 0};
  const timespec interval{.tv_sec = 0, .tv_nsec = kGetPollInterval.count()};
  if (ppoll(&pfd, 1, &interval, nullptr) > 0) drainWakeFd();
}

// Sleeps until UCX or a command has work. With connections (or closes in
// flight) it also wakes every kKeepaliveTickMs for UCX's keepalive; with
// none, only an event can bring work, so it waits for one.
void UcxTransport::Impl::waitForEvents() {
  if (ucp_worker_arm(worker) == UCS_ERR_BUSY) return;
  const int timeout_ms = conns.empty() && closing.empty() ? -1 : kKeepaliveTickMs;
  epoll_event ev[4];
  const int n = epoll_wait(epoll_fd, ev, 4, timeout_ms);
  for (int i = 0; i < n; ++i) {
    if (ev[i].data.fd == wake_fd) drainWakeFd();
  }
}

void UcxTransport::Impl::drainWakeFd() {
  uint64_t v;
  [[maybe_unused]] ssize_t r = read(wake_fd, &v, sizeof(v));
}

// UCX may still be discarding a closed endpoint's transport lanes after the
// close completed, and a worker destroyed before that is done asserts in
// UCX 1.13 (ucp_ep.c:464, refcounts.create: seen twice in
// pd_control_channel_test at shutdown after a peer that never answered,
// about once in 30 runs). A worker flush completes once every such discard
// has (they count as the worker's flush operations); until then, or until
// `deadline`, it is progressed. A worker still busy then is not destroyed
// (~Impl): the process exits with it.
void UcxTransport::Impl::flushWorker(MonoTime deadline) {
  ucp_request_param_t p{};
  ucs_status_ptr_t r = ucp_worker_flush_nbx(worker, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) return;  // nothing in flight (or nothing to wait for)
  // At least a moment past the deadline: the discards start only now.
  const MonoTime until = std::max(deadline, clock.now() + std::chrono::milliseconds(500));
  while (ucp_request_check_status(r) == UCS_INPROGRESS && clock.now() < until) ucp_worker_progress(worker);
  if (ucp_request_check_status(r) == UCS_INPROGRESS) {
    worker_busy = true;  // the request stays with the worker, which is left alone
    return;
  }
  ucp_request_free(r);
}

// Shutdown: closes every connection, then progresses until all gets and
// closes completed or kShutdownDrain passed on the clock; gets still
// outstanding then complete as Cancelled.
void UcxTransport::Impl::drain() {
  std::vector<ConnId> ids;
  for (const auto& [id, c] : conns) ids.push_back(id);
  for (ConnId id : ids) dropConn(id, absl::OkStatus());
  const MonoTime deadline = clock.now() + kShutdownDrain;
  while ((!gets.empty() || !closing.empty()) && clock.now() < deadline) ucp_worker_progress(worker);
  flushWorker(deadline);
  for (auto it = gets.begin(); it != gets.end();) {
    auto next = std::next(it);
    it->second.status = UCS_ERR_CANCELED;
    finishGet(it);
    it = next;
  }
}

}  // namespace tandem::transport
