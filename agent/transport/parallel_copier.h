#pragma once
// The helper threads that share large shared-memory copies with the
// transport's progress thread. A get from a peer pool mapped into this
// process is a plain copy, and one thread's memcpy leaves memory bandwidth
// unused (docs/pd.md, "Transport").
//
// Thread-safety: copy() is called by one thread at a time (the progress
// thread); the helpers only run the shares it hands them.

#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::transport {

// Copies a list of byte ranges with the calling thread and `helpers` more
// threads, each taking an equal share of the bytes (boundaries 4 KiB aligned).
class ParallelCopier {
 public:
  struct Range {
    std::byte* dst;
    const std::byte* src;
    size_t length;
  };

  explicit ParallelCopier(int helpers);
  ~ParallelCopier();
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;

  // Returns once every byte of `ranges` (`total` bytes in all) is copied.
  void copy(const std::vector<Range>& ranges, size_t total) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void run(int share) ABSL_LOCKS_EXCLUDED(mu_);

  const int shares_;  // helpers + the calling thread
  absl::Mutex mu_;
  absl::CondVar work_cv_;  // a new job or stop_
  absl::CondVar done_cv_;  // pending_ reached 0
  // The job in progress: valid while pending_ > 0 or the caller copies its share.
  const std::vector<Range>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t total_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;          // helpers still copying
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // one per job; helpers wait for a new one
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // started by the constructor, joined by the destructor
};

}  // namespace tandem::transport
