// ./tandem bench transport — pulling a prompt's KV over the UCX transport.
//
// For prompts of 1K, 8K and 32K tokens of the tiny model (4 layers, 16-token
// blocks: one layer block is 8 KiB), D pulls every layer block from P with
// one logical get per layer (UcxTransport::getv), all four layers in flight
// at once, as the decode agent does. Two block placements:
//  * contiguous: P's and D's blocks are runs of consecutive ids (a fresh
//    pool), so the transport merges a layer into one UCX get of
//    tokens/16 × 8 KiB;
//  * scattered: P's blocks are shuffled, nothing merges, every layer block
//    is its own 8 KiB UCX get.
// Yardsticks measured in the same run: ucx_perftest's ucp_get bandwidth for
// the same transport and the same UCX message size (the merged layer size,
// or 8 KiB with 64 gets outstanding for the scattered case), and
// single-thread memcpy of the same bytes. Target: >= 80 % of ucx_perftest
// for the same transport and size.
//
// Caveat on the yardstick: ucx_perftest reads the same buffer every
// iteration, so small messages are cache-hot on its side; the pull reads a
// prompt's worth of distinct bytes.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
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
double ucxPerftest(const std::string& tls, size_t size, int outstanding) {
  static int port = 13501;
  const std::string p = std::to_string(port++);
  // About 1 GiB per run, at least 20 iterations.
  const size_t iters = std::clamp<size_t>((size_t{1} << 30) / size, 20, 20000);
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
  std::string cmd = "UCX_TLS=" + tls + " ucx_perftest 127.0.0.1 -p " + p + " -t ucp_get -s " + std::to_string(size) +
                    " -n " + std::to_string(iters) + " -w " + std::to_string(std::max<size_t>(iters / 10, 2)) + " -O " +
                    std::to_string(outstanding) + " 2>/dev/null";
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
  const size_t max_blocks = max_tokens / 16;
  const size_t bytes_max = max_blocks * kLayers * kLayerBlockBytes;
  std::mt19937 rng(7);
  for (const std::string tls : {"tcp", "posix,cma,tcp"}) {
    const std::string tname = tls == "tcp" ? "tcp" : "shm";
    // Both KV pools are allocated by UCX, as the agent allocates them.
    auto p_pool = UcxRegion::allocate(bytes_max, {.tls = tls});
    auto d_pool = UcxRegion::allocate(bytes_max, {.tls = tls});
    if (!p_pool.ok() || !d_pool.ok()) {
      std::fprintf(stderr, "UCX region allocation failed\n");
      return 1;
    }
    std::span<std::byte> d_region = (*d_pool)->bytes();
    std::fill_n((*p_pool)->bytes().data(), bytes_max, std::byte{1});
    std::fill_n(d_region.data(), bytes_max, std::byte{0});
    auto p = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = *p_pool, .tls = tls}, {});
    auto d = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = *d_pool, .tls = tls}, {});
    if (!p.ok() || !d.ok()) {
      std::fprintf(stderr, "transport start failed\n");
      return 1;
    }
    ConnId c = (*d)->connect("127.0.0.1", (*p)->port());
    (*d)->setRemoteRegion(c, (*p)->regionBase(), (*p)->regionLength(), (*p)->packedRkey());
    const double perftest_8k = ucxPerftest(tls, kLayerBlockBytes, 64);
    for (int tokens : {1024, 8192, 32768}) {
      const size_t blocks = static_cast<size_t>(tokens / 16);
      const double bytes = static_cast<double>(blocks) * kLayers * kLayerBlockBytes;
      std::vector<size_t> scattered(max_blocks);
      std::iota(scattered.begin(), scattered.end(), 0);
      std::shuffle(scattered.begin(), scattered.end(), rng);
      for (bool contiguous : {true, false}) {
        // Layer-major regions as KvStorage lays them out: [layer][block].
        auto pull = [&] {
          std::mutex mu;
          std::condition_variable cv;
          int done = 0;
          for (int layer = 0; layer < kLayers; ++layer) {
            std::vector<UcxTransport::Segment> segs;
            for (size_t b = 0; b < blocks; ++b) {
              const size_t p_block = contiguous ? b : scattered[b];
              segs.push_back({d_region.data() + (layer * max_blocks + b) * kLayerBlockBytes,
                              (layer * max_blocks + p_block) * kLayerBlockBytes, kLayerBlockBytes});
            }
            (*d)->getv(c, std::move(segs), [&](absl::Status s) {
              if (!s.ok()) std::fprintf(stderr, "get failed: %s\n", std::string(s.message()).c_str());
              std::lock_guard l(mu);
              if (++done == kLayers) cv.notify_all();
            });
          }
          std::unique_lock l(mu);
          cv.wait(l, [&] { return done == kLayers; });
        };
        const double secs = bench::medianSeconds(pull, 5);
        const size_t msg = contiguous ? blocks * kLayerBlockBytes : kLayerBlockBytes;
        const double perftest = contiguous ? ucxPerftest(tls, msg, 1) : perftest_8k;
        results.push_back({.name = "kv_pull_" + tname + "_" + std::to_string(tokens / 1024) + "k_" +
                                   (contiguous ? "contiguous" : "scattered"),
                           .value = bytes / secs / 1e6, .unit = "MB/s", .reference = perftest,
                           .reference_name = "ucx_perftest ucp_get " + std::to_string(msg / 1024) + " KiB" +
                                             (contiguous ? "" : " x64 outstanding")});
        std::fflush(stdout);
      }
    }
  }
  std::vector<std::byte> a(bytes_max, std::byte{3}), b(bytes_max);
  double memcpy_s = bench::medianSeconds([&] { std::memcpy(b.data(), a.data(), bytes_max); }, 9);
  results.push_back({.name = "memcpy_32k_tokens_kv", .value = static_cast<double>(bytes_max) / memcpy_s / 1e6, .unit = "MB/s",
                     .reference = static_cast<double>(bytes_max) / memcpy_s / 1e6, .reference_name = "memcpy (itself)"});
  return bench::writeReport("transport", results, argc, argv);
}
