// ./tandem bench transport — pulling a prompt's KV over the UCX transport.
//
// For prompts of 1K, 8K and 32K tokens of the tiny model (4 layers, 16-token
// blocks: one layer block is 8 KiB), D pulls every layer block from P with
// one get each, all in flight at once, as the decode agent does. Yardsticks
// measured in the same run: ucx_perftest's ucp_get bandwidth for the same
// transport and message size (8 KiB), and single-thread memcpy of the same
// bytes. Target: >= 80 % of ucx_perftest for the same transport and size.
//
// Note: ucx_perftest keeps one get in flight at a time, so on loopback it
// measures latency-bound bandwidth; the transport keeps all of a prompt's
// gets in flight, which is what the ratio compares.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/transport/ucx_transport.h"
#include "bench/bench_report.h"

extern char** environ;

using namespace tandem;
using namespace tandem::transport;

namespace {

constexpr size_t kLayerBlockBytes = 2 * 16 * 2 * 32 * sizeof(float);  // K and V, 16 tokens, 2 KV heads, head_dim 32
constexpr int kLayers = 4;

// Runs ucx_perftest as server and client with UCX_TLS=tls; returns the
// "Final" overall bandwidth in MB/s (0 if it could not run).
double ucxPerftest(const std::string& tls, size_t size, int iters) {
  static int port = 13501;
  const std::string p = std::to_string(port++);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  env_strings.push_back("UCX_TLS=" + tls);
  std::vector<char*> env;
  for (auto& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  std::vector<std::string> srv_args = {"ucx_perftest", "-p", p};
  std::vector<char*> srv;
  for (auto& a : srv_args) srv.push_back(a.data());
  srv.push_back(nullptr);
  pid_t server = 0;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  if (posix_spawnp(&server, "ucx_perftest", &fa, nullptr, srv.data(), env.data()) != 0) return 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string cmd = "UCX_TLS=" + tls + " ucx_perftest 127.0.0.1 -p " + p + " -t ucp_get -s " + std::to_string(size) + " -n " +
                    std::to_string(iters) + " -w 1000 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  double mbs = 0;
  char line[512];
  while (f && fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "Final:", 6) == 0) {
      std::istringstream in(line + 6);
      double v[8] = {};
      for (double& x : v) in >> x;
      mbs = v[5];  // iterations, 3 latencies, bandwidth avg, bandwidth overall, ...
    }
  }
  if (f) pclose(f);
  kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
  posix_spawn_file_actions_destroy(&fa);
  return mbs;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<bench::Result> results;
  const int max_tokens = 32768;
  const size_t bytes_max = static_cast<size_t>(max_tokens / 16) * kLayers * kLayerBlockBytes;
  for (const std::string tls : {"tcp", "posix,cma,tcp"}) {
    std::vector<std::byte> p_region(bytes_max, std::byte{1}), d_region(bytes_max);
    auto p = UcxTransport::start({.host = "127.0.0.1", .port = 0, .region = p_region, .tls = tls}, {});
    auto d = UcxTransport::start({.host = "127.0.0.1", .port = 0, .region = d_region, .tls = tls}, {});
    if (!p.ok() || !d.ok()) {
      std::fprintf(stderr, "transport start failed\n");
      return 1;
    }
    ConnId c = (*d)->connect("127.0.0.1", (*p)->port());
    (*d)->setRemoteRegion(c, (*p)->regionBase(), (*p)->regionLength(), (*p)->packedRkey());
    const double perftest = ucxPerftest(tls, kLayerBlockBytes, 20000);
    for (int tokens : {1024, 8192, 32768}) {
      const double bytes = static_cast<double>(tokens / 16) * kLayers * kLayerBlockBytes;
      double secs = bench::medianSeconds(
          [&] {
            const int gets = tokens / 16 * kLayers;
            std::mutex mu;
            std::condition_variable cv;
            int done = 0;
            for (int g = 0; g < gets; ++g) {
              const size_t off = static_cast<size_t>(g) * kLayerBlockBytes;
              (*d)->get(c, d_region.data() + off, off, kLayerBlockBytes, [&](absl::Status s) {
                if (!s.ok()) std::fprintf(stderr, "get failed\n");
                std::lock_guard l(mu);
                if (++done == gets) cv.notify_all();
              });
            }
            std::unique_lock l(mu);
            cv.wait(l, [&] { return done == gets; });
          },
          5);
      std::string name = std::string("kv_pull_") + (tls == "tcp" ? "tcp" : "shm") + "_" + std::to_string(tokens / 1024) + "k";
      results.push_back({.name = name, .value = bytes / secs / 1e6, .unit = "MB/s", .reference = perftest,
                         .reference_name = "ucx_perftest ucp_get 8K"});
    }
  }
  std::vector<std::byte> a(bytes_max, std::byte{3}), b(bytes_max);
  double memcpy_s = bench::medianSeconds([&] { std::memcpy(b.data(), a.data(), bytes_max); }, 9);
  results.push_back({.name = "memcpy_32k_tokens_kv", .value = static_cast<double>(bytes_max) / memcpy_s / 1e6, .unit = "MB/s",
                     .reference = static_cast<double>(bytes_max) / memcpy_s / 1e6, .reference_name = "memcpy (itself)"});
  return bench::writeReport("transport", results, argc, argv);
}
