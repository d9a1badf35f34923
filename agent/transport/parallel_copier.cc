#include "agent/transport/parallel_copier.h"

#include <algorithm>
#include <cstring>

namespace tandem::transport {
namespace {

// Bytes [total * share / shares, total * (share + 1) / shares) of the ranges
// laid end to end, boundaries rounded down to 4 KiB.
void copyShare(const std::vector<ParallelCopier::Range>& ranges, size_t total, int share, int shares) {
  auto boundary = [&](int k) {
    return k == shares ? total : (total / static_cast<size_t>(shares) * static_cast<size_t>(k)) & ~size_t{4095};
  };
  const size_t begin = boundary(share);
  const size_t end = boundary(share + 1);
  size_t pos = 0;
  for (const ParallelCopier::Range& r : ranges) {
    const size_t r_begin = pos;
    pos += r.length;
    if (pos <= begin) continue;
    if (r_begin >= end) break;
    const size_t a = std::max(begin, r_begin);
    const size_t b = std::min(end, pos);
    std::memcpy(r.dst + (a - r_begin), r.src + (a - r_begin), b - a);
  }
}

}  // namespace

ParallelCopier::ParallelCopier(int helpers) : shares_(helpers + 1) {
  for (int i = 0; i < helpers; ++i) threads_.emplace_back([this, i] { run(i + 1); });
}

ParallelCopier::~ParallelCopier() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

void ParallelCopier::copy(const std::vector<Range>& ranges, size_t total) {
  {
    absl::MutexLock lock(&mu_);
    job_ = &ranges;
    total_ = total;
    pending_ = shares_ - 1;
    ++generation_;
  }
  work_cv_.SignalAll();
  copyShare(ranges, total, 0, shares_);
  absl::MutexLock lock(&mu_);
  while (pending_ > 0) done_cv_.Wait(&mu_);
  job_ = nullptr;
}

void ParallelCopier::run(int share) {
  uint64_t seen = 0;
  absl::MutexLock lock(&mu_);
  for (;;) {
    while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
    if (stop_) return;
    seen = generation_;
    const std::vector<Range>* job = job_;
    const size_t total = total_;
    mu_.Unlock();
    copyShare(*job, total, share, shares_);
    mu_.Lock();
    if (--pending_ == 0) done_cv_.SignalAll();
  }
}

}  // namespace tandem::transport
