#pragma once
// Names the calling thread as `top -H`, gdb, perf and /proc show it. Linux
// keeps 15 characters; a longer name is cut. Names in use: engine-loop,
// cpu-worker, http-io, router-call, events-pump, stream-reader,
// stream-watch, ucx-worker.

#include <pthread.h>

#include <string>
#include <string_view>

namespace tandem {

inline void nameThisThread(std::string_view name) {
  std::string cut(name.substr(0, 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace tandem
