#include "engine/backend/cuda/cpu_executor.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <absl/strings/str_cat.h>

#if defined(__SANITIZE_ADDRESS__)
#define TANDEM_EXECUTOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TANDEM_EXECUTOR_ASAN 1
#endif
#endif
#if defined(TANDEM_EXECUTOR_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace tandem::gpu {
namespace {

constexpr int kMaxThreadsPerBlock = 1024;
// Per emulated thread. Kernels are shallow; AddressSanitizer's frames are
// several times larger, hence the margin. One guard page below each stack
// turns an overflow into a fault instead of another thread's corruption.
constexpr size_t kStackBytes = 128 * 1024;

enum class State { kRunnable, kAtBarrier, kAtExchange, kDone };

struct Fiber {
  ucontext_t context;
  executor::ThreadContext thread;
  State state = State::kRunnable;
  int src_lane = 0;
  uint64_t published = 0;
  uint64_t received = 0;
};

}  // namespace

struct CpuExecutor::Impl {
  explicit Impl(const Options& o) : options(o), rng(o.seed) {}
  ~Impl() {
    if (stacks != nullptr) ::munmap(stacks, stacks_bytes);
  }

  absl::Status ensureStacks(int threads);
  unsigned char* stackOf(int thread) const {
    return static_cast<unsigned char*>(stacks) + static_cast<size_t>(thread) * (kStackBytes + page) + page;
  }
  absl::Status runBlock(const LaunchConfig& c, int bx, int by, int bz);
  void resume(int thread);
  absl::Status releaseWaiters(int live);

  Options options;
  std::mt19937_64 rng;
  size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* stacks = nullptr;
  size_t stacks_bytes = 0;
  int stacks_for = 0;  // threads the mapping holds stacks for
  std::vector<Fiber> fibers;
  std::vector<int> order;
  std::vector<unsigned char> shared;
  ucontext_t scheduler;
  Fiber* running = nullptr;
  const absl::FunctionRef<void()>* body = nullptr;
  int64_t switches = 0;
#if defined(TANDEM_EXECUTOR_ASAN)
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
#endif
};

namespace {

thread_local CpuExecutor::Impl* tls_impl = nullptr;

// Back to the scheduler; `dying`: this fiber is never resumed.
void yieldToScheduler(CpuExecutor::Impl& im, Fiber& f, bool dying) {
#if defined(TANDEM_EXECUTOR_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake_stack, im.scheduler_stack_bottom, im.scheduler_stack_size);
  ::swapcontext(&f.context, &im.scheduler);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
  (void)dying;
  ::swapcontext(&f.context, &im.scheduler);
#endif
}

void fiberMain() {
  CpuExecutor::Impl& im = *tls_impl;
#if defined(TANDEM_EXECUTOR_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &im.scheduler_stack_bottom, &im.scheduler_stack_size);
#endif
  (*im.body)();
  Fiber& f = *im.running;
  f.state = State::kDone;
  yieldToScheduler(im, f, /*dying=*/true);
  std::abort();  // a finished fiber is never resumed
}

}  // namespace

namespace executor {

const ThreadContext& current() {
  assert(tls_impl != nullptr && tls_impl->running != nullptr && "a kernel called outside CpuExecutor::launch");
  return tls_impl->running->thread;
}

void blockBarrier() {
  CpuExecutor::Impl& im = *tls_impl;
  Fiber& f = *im.running;
  f.state = State::kAtBarrier;
  yieldToScheduler(im, f, /*dying=*/false);
}

void misalignedLoad(const void* p, int bytes) {
  const ThreadContext& t = current();
  std::fprintf(stderr,
               "CPU executor: a %d-byte vector load from %p, not %d-byte aligned (thread %d of block (%d, %d, %d)); "
               "a GPU faults here\n",
               bytes, p, bytes, t.thread_x, t.block_x, t.block_y, t.block_z);
  std::abort();
}

uint64_t warpExchange(uint64_t bits, int src_lane) {
  CpuExecutor::Impl& im = *tls_impl;
  Fiber& f = *im.running;
  f.published = bits;
  f.src_lane = src_lane & (kWarpSize - 1);  // CUDA takes the source lane modulo the width
  f.state = State::kAtExchange;
  yieldToScheduler(im, f, /*dying=*/false);
  return f.received;
}

}  // namespace executor

absl::Status CpuExecutor::Impl::ensureStacks(int threads) {
  if (threads <= stacks_for) return absl::OkStatus();
  if (stacks != nullptr) ::munmap(stacks, stacks_bytes);
  stacks_for = 0;
  stacks_bytes = static_cast<size_t>(threads) * (kStackBytes + page);
  stacks = ::mmap(nullptr, stacks_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) {
    stacks = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("CPU executor: cannot map ", stacks_bytes, " bytes of stacks for ", threads, " threads"));
  }
  for (int t = 0; t < threads; ++t) ::mprotect(stackOf(t) - page, page, PROT_NONE);
  stacks_for = threads;
  return absl::OkStatus();
}

void CpuExecutor::Impl::resume(int thread) {
  Fiber& f = fibers[static_cast<size_t>(thread)];
  running = &f;
  ++switches;
#if defined(TANDEM_EXECUTOR_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, stackOf(thread), kStackBytes);
  ::swapcontext(&scheduler, &f.context);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
  ::swapcontext(&scheduler, &f.context);
#endif
  running = nullptr;
}

// Nothing can run: release the warps whose lanes all wait at an exchange,
// else the block barrier if every live thread waits at it, else report
// where the threads are stuck.
absl::Status CpuExecutor::Impl::releaseWaiters(int live) {
  const int n = static_cast<int>(fibers.size());
  bool released = false;
  for (int w = 0; w < n / kWarpSize; ++w) {
    Fiber* lanes = &fibers[static_cast<size_t>(w * kWarpSize)];
    int exchanging = 0, done = 0;
    for (int l = 0; l < kWarpSize; ++l) {
      exchanging += lanes[l].state == State::kAtExchange;
      done += lanes[l].state == State::kDone;
    }
    if (exchanging == 0) continue;
    if (done > 0) {
      return absl::FailedPreconditionError(absl::StrCat("warp ", w, ": a warp exchange (shflXor/shflIdx) with ", done,
                                                        " of its lanes returned (the full warp must take part)"));
    }
    if (exchanging < kWarpSize) continue;
    for (int l = 0; l < kWarpSize; ++l) {
      lanes[l].received = lanes[lanes[l].src_lane].published;
      lanes[l].state = State::kRunnable;
    }
    released = true;
  }
  if (released) return absl::OkStatus();
  int at_barrier = 0, exchanging = 0;
  for (const Fiber& f : fibers) {
    at_barrier += f.state == State::kAtBarrier;
    exchanging += f.state == State::kAtExchange;
  }
  if (at_barrier == live) {
    for (Fiber& f : fibers) {
      if (f.state == State::kAtBarrier) f.state = State::kRunnable;
    }
    return absl::OkStatus();
  }
  std::string where;
  for (int w = 0; w < n / kWarpSize; ++w) {
    int b = 0, x = 0;
    for (int l = 0; l < kWarpSize; ++l) {
      b += fibers[static_cast<size_t>(w * kWarpSize + l)].state == State::kAtBarrier;
      x += fibers[static_cast<size_t>(w * kWarpSize + l)].state == State::kAtExchange;
    }
    if (b > 0 && x > 0) absl::StrAppend(&where, " warp ", w, " has ", b, " lanes at syncThreads and ", x, " at an exchange;");
  }
  return absl::FailedPreconditionError(absl::StrCat("divergent barriers: ", at_barrier, " threads wait at syncThreads, ",
                                                    exchanging, " at warp exchanges, ", n - live,
                                                    " returned, and none can go on;", where));
}

absl::Status CpuExecutor::Impl::runBlock(const LaunchConfig& c, int bx, int by, int bz) {
  const int n = static_cast<int>(c.block.x);
  fibers.resize(static_cast<size_t>(n));
  // Uninitialised shared memory reads as NaN (all bits set), as a GPU's
  // leftover contents would read as garbage: a kernel that relies on it shows.
  std::fill(shared.begin(), shared.end(), static_cast<unsigned char>(0xff));
  for (int t = 0; t < n; ++t) {
    Fiber& f = fibers[static_cast<size_t>(t)];
    f.state = State::kRunnable;
    f.thread = executor::ThreadContext{.thread_x = t,
                                       .block_x = bx,
                                       .block_y = by,
                                       .block_z = bz,
                                       .block_dim_x = n,
                                       .grid_dim_x = static_cast<int>(c.grid.x),
                                       .grid_dim_y = static_cast<int>(c.grid.y),
                                       .grid_dim_z = static_cast<int>(c.grid.z),
                                       .shared = shared.data()};
    ::getcontext(&f.context);
    f.context.uc_stack.ss_sp = stackOf(t);
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = nullptr;
    ::makecontext(&f.context, &fiberMain, 0);
  }
  int live = n;
  while (live > 0) {
    order.clear();
    for (int t = 0; t < n; ++t) {
      if (fibers[static_cast<size_t>(t)].state == State::kRunnable) order.push_back(t);
    }
    if (order.empty()) {
      if (absl::Status s = releaseWaiters(live); !s.ok()) return s;
      continue;
    }
    if (options.shuffle) std::shuffle(order.begin(), order.end(), rng);
    for (int t : order) {
      resume(t);
      live -= fibers[static_cast<size_t>(t)].state == State::kDone;
    }
  }
  return absl::OkStatus();
}

CpuExecutor::Options CpuExecutor::optionsFromEnvironment() {
  Options o;
  if (const char* seed = std::getenv("TANDEM_GPU_EXECUTOR_SHUFFLE"); seed != nullptr && *seed != '\0') {
    o.shuffle = true;
    o.seed = std::strtoull(seed, nullptr, 10);
  }
  return o;
}

CpuExecutor::CpuExecutor(const Options& options) : options_(options), impl_(std::make_unique<Impl>(options)) {}
CpuExecutor::~CpuExecutor() = default;

int64_t CpuExecutor::switches() const { return impl_->switches; }

absl::Status CpuExecutor::launch(const LaunchConfig& c, absl::FunctionRef<void()> thread_body) {
  const uint32_t threads = c.block.x;
  if (threads == 0 || threads > kMaxThreadsPerBlock || threads % kWarpSize != 0 || c.block.y != 1 ||
      c.block.z != 1) {
    return absl::InvalidArgumentError(absl::StrCat("launch: a block of ", c.block.x, "x", c.block.y, "x", c.block.z,
                                                   " threads; the portable subset takes one dimension of 32 to ",
                                                   kMaxThreadsPerBlock, " threads, a multiple of 32"));
  }
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || c.grid.y > 65535 || c.grid.z > 65535 ||
      c.grid.x > 0x7fffffffu) {
    return absl::InvalidArgumentError(absl::StrCat("launch: a grid of ", c.grid.x, "x", c.grid.y, "x", c.grid.z,
                                                   " blocks (each dimension at least 1; y and z at most 65535)"));
  }
  if (c.shared_bytes > options_.max_shared_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("launch: ", c.shared_bytes, " bytes of shared memory per block, over ",
                                                   options_.max_shared_bytes));
  }
  if (tls_impl != nullptr) return absl::FailedPreconditionError("launch: called from inside a kernel");
  Impl& im = *impl_;
  if (absl::Status s = im.ensureStacks(static_cast<int>(threads)); !s.ok()) return s;
  im.shared.resize(c.shared_bytes);
  im.body = &thread_body;
  tls_impl = &im;
  absl::Status status;
  for (uint32_t z = 0; z < c.grid.z && status.ok(); ++z) {
    for (uint32_t y = 0; y < c.grid.y && status.ok(); ++y) {
      for (uint32_t x = 0; x < c.grid.x && status.ok(); ++x) {
        status = im.runBlock(c, static_cast<int>(x), static_cast<int>(y), static_cast<int>(z));
        if (!status.ok()) {
          status = absl::Status(status.code(), absl::StrCat("block (", x, ",", y, ",", z, "): ", status.message()));
        }
      }
    }
  }
  tls_impl = nullptr;
  im.body = nullptr;
#if defined(TANDEM_EXECUTOR_ASAN)
  // An abandoned block's fibers left their frames poisoned on the stacks.
  if (!status.ok()) __asan_unpoison_memory_region(im.stacks, im.stacks_bytes);
#endif
  return status;
}

}  // namespace tandem::gpu
