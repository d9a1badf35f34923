#include "agent/tensor_parallel_ranks.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <iostream>
#include <thread>

#include "agent/agent_config.h"
#include "agent/cuda_device_backend.h"
#include "engine/backend/cuda/kernel_backend.h"
#include "engine/model/llama.h"
#include "engine/model/model_loader.h"
#include "engine/model/rank_group.h"
#include "src/common/log.h"
#include "src/common/strings.h"

extern char** environ;

namespace tandem::agent {
namespace {

std::string describeExit(int rank, int pid, int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    return strCat("tensor-parallel rank ", rank, " (pid ", pid, ") was killed by signal ", WTERMSIG(wait_status));
  }
  return strCat("tensor-parallel rank ", rank, " (pid ", pid, ") exited with status ", WEXITSTATUS(wait_status));
}

}  // namespace

absl::StatusOr<std::unique_ptr<engine::Backend>> makeRankBackend(const std::string& device, engine::SimdLevel simd,
                                                                 int rank, int world, engine::GemmDtype dtype) {
  // On the CPU the ranks share the machine's cores.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const engine::CpuBackendOptions cpu{
      .num_threads = world > 1 ? std::max(1, cores / world) : 0, .simd = simd, .gemm_dtype = dtype};
  if (device == "cuda") return makeCudaDeviceBackend(rank, dtype);
  if (device == "cuda-emulator") {
    auto kernels = std::make_unique<engine::KernelBackend>(engine::KernelBackendOptions{.gemm = cpu});
    TANDEM_RETURN_IF_ERROR(kernels->status());  // TANDEM_CUDA_GRAPHS unreadable
    return std::unique_ptr<engine::Backend>(std::move(kernels));
  }
  return std::unique_ptr<engine::Backend>(std::make_unique<engine::CpuBackend>(cpu));
}

// --- rank 0's side ---

absl::StatusOr<std::unique_ptr<RankProcesses>> RankProcesses::start(int world, std::span<const std::string> agent_args,
                                                                     const std::string& rendezvous) {
  if (agent_args.empty()) {
    return absl::InvalidArgumentError(
        "tensor parallelism: the agent's command line is unknown (a config built in code has none), so its ranks "
        "cannot be started");
  }
  std::unique_ptr<RankProcesses> p(new RankProcesses());
  absl::MutexLock lock(&p->mu_);
  for (int rank = 1; rank < world; ++rank) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      return absl::InternalError(strCat("tensor-parallel rank ", rank, ": socketpair: ", std::strerror(errno)));
    }
    std::vector<std::string> args = {"tandem-agent", "tensor-parallel-rank", "--rank", std::to_string(rank), "--world",
                                     std::to_string(world), "--link", std::to_string(kRankLinkFd)};
    if (!rendezvous.empty()) {
      args.push_back("--rendezvous");
      args.push_back(rendezvous);
    }
    args.push_back("--");
    args.insert(args.end(), agent_args.begin(), agent_args.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    // The child's end becomes descriptor 3 there, without close-on-exec
    // (dup2 clears it; one already at 3 is moved first so dup2 is not a no-op).
    int child = fds[1];
    if (child == kRankLinkFd) child = ::fcntl(fds[1], F_DUPFD_CLOEXEC, kRankLinkFd + 1);
    if (child < 0 || posix_spawn_file_actions_adddup2(&fa, child, kRankLinkFd) != 0) {
      posix_spawn_file_actions_destroy(&fa);
      ::close(fds[0]);
      ::close(fds[1]);
      return absl::InternalError(strCat("tensor-parallel rank ", rank, ": cannot pass its link: ", std::strerror(errno)));
    }
    int pid = -1;
    const int rc = ::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (child != fds[1]) ::close(child);
    ::close(fds[1]);
    if (rc != 0) {
      ::close(fds[0]);
      return absl::InternalError(strCat("tensor-parallel rank ", rank, ": cannot start it: ", std::strerror(rc)));
    }
    p->ranks_.push_back({.pid = pid, .link = fds[0]});
  }
  return p;
}

RankProcesses::~RankProcesses() {
  absl::MutexLock lock(&mu_);
  for (Rank& r : ranks_) {
    if (r.link >= 0) ::close(r.link);  // never taken: closing it tells the rank to go
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (Rank& r : ranks_) {
    while (!r.wait_status && std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) == r.pid) {
        r.wait_status = status;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    if (!r.wait_status) {
      ::kill(r.pid, SIGKILL);
      int status = 0;
      ::waitpid(r.pid, &status, 0);
    }
  }
}

std::vector<int> RankProcesses::takeLinks() {
  absl::MutexLock lock(&mu_);
  std::vector<int> links;
  for (Rank& r : ranks_) links.push_back(std::exchange(r.link, -1));
  return links;
}

std::optional<std::string> RankProcesses::reapLocked() {
  std::optional<std::string> first;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    int status = 0;
    if (!r.wait_status && ::waitpid(r.pid, &status, WNOHANG) == r.pid) r.wait_status = status;
    if (r.wait_status && !first) first = describeExit(static_cast<int>(i) + 1, r.pid, *r.wait_status);
  }
  return first;
}

std::optional<std::string> RankProcesses::exited(std::chrono::milliseconds grace) {
  absl::MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    if (auto e = reapLocked()) return e;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    mu_.Unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    mu_.Lock();
  }
}

// --- a rank's side ---

namespace {

struct RankArgs {
  int rank = 0;
  int world = 0;
  int link = -1;
  std::string rendezvous;
  std::vector<const char*> agent_argv;  // program name first
};

absl::StatusOr<int> intArg(std::string_view flag, std::string_view v) {
  int n = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || p != v.data() + v.size()) {
    return absl::InvalidArgumentError(strCat(flag, ": expected an integer, got \"", v, "\""));
  }
  return n;
}

absl::StatusOr<RankArgs> parseRankArgs(int argc, char** argv, const char* program) {
  RankArgs a;
  a.agent_argv.push_back(program);
  int i = 1;
  for (; i < argc; ++i) {
    const std::string_view f = argv[i];
    if (f == "--") break;
    if (i + 1 >= argc) return absl::InvalidArgumentError(strCat(f, ": a value must follow"));
    const std::string_view v = argv[++i];
    if (f == "--rank") {
      TANDEM_ASSIGN_OR_RETURN(a.rank, intArg(f, v));
    } else if (f == "--world") {
      TANDEM_ASSIGN_OR_RETURN(a.world, intArg(f, v));
    } else if (f == "--link") {
      TANDEM_ASSIGN_OR_RETURN(a.link, intArg(f, v));
    } else if (f == "--rendezvous") {
      a.rendezvous = std::string(v);
    } else {
      return absl::InvalidArgumentError(strCat("unexpected argument \"", f, "\""));
    }
  }
  if (i >= argc) return absl::InvalidArgumentError("missing \"--\" before the agent's arguments");
  for (++i; i < argc; ++i) a.agent_argv.push_back(argv[i]);
  if (a.world < 2 || a.world > 64) return absl::InvalidArgumentError(strCat("--world: must be in [2, 64], got ", a.world));
  if (a.rank < 1 || a.rank >= a.world) {
    return absl::InvalidArgumentError(strCat("--rank: must be in [1, ", a.world, "), got ", a.rank));
  }
  if (a.link < 0 || ::fcntl(a.link, F_GETFD) < 0) {
    return absl::InvalidArgumentError(strCat("--link: ", a.link, " is not an open descriptor"));
  }
  return a;
}

// Loads the rank's shard and serves rank 0's steps.
absl::Status serveRank(const RankArgs& a, const AgentConfig& config, Logger& log) {
  engine::RankGroupFollower follower(a.link, a.rank, a.world);
  TANDEM_ASSIGN_OR_RETURN(const engine::SimdLevel simd, engine::simdLevelFromEnvironment());
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::Backend> backend,
                          makeRankBackend(config.device, simd, a.rank, a.world, config.gemmDtype()));
  std::optional<DeviceAllReduce> nccl;
  if (!a.rendezvous.empty()) {
    TANDEM_ASSIGN_OR_RETURN(nccl, joinCudaGroup(*backend, {.socket_path = a.rendezvous, .world = a.world, .rank = a.rank}));
  }
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<const engine::ModelWeights> shard,
                          engine::loadModelShard(config.model_dir, a.rank, a.world));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::LlamaModel> model,
                          engine::LlamaModel::create(shard, *backend, nccl ? nccl->all_reduce : follower.allReduce()));
  const engine::KvLayout layout =
      engine::kvLayoutFor(shard->config, config.engine.num_blocks, config.engine.block_size, config.engine.kv_dtype);
  std::unique_ptr<engine::KvStorage> kv;
  if (auto* kernels = dynamic_cast<engine::KernelBackend*>(backend.get())) {
    TANDEM_ASSIGN_OR_RETURN(engine::KvMemory memory, kernels->kvMemory(layout.totalBytes()));
    TANDEM_RETURN_IF_ERROR(engine::KvStorage::checkMemory(layout, memory));
    kv = std::make_unique<engine::KvStorage>(layout, std::move(memory));
  } else {
    kv = std::make_unique<engine::KvStorage>(layout);
  }
  TANDEM_RETURN_IF_ERROR(follower.hello(layout, /*socket_all_reduce=*/!nccl));
  log.info("tensor-parallel rank ready",
           {{"rank", a.rank}, {"world", a.world}, {"device", config.device}, {"kv_heads", shard->config.num_kv_heads},
            {"all_reduce", nccl ? "nccl" : "link"}});
  return follower.serve(*model, *kv, *backend, nccl ? nccl->status : nullptr);
}

}  // namespace

int runTensorParallelRank(int argc, char** argv, const char* program) {
  absl::StatusOr<RankArgs> a = parseRankArgs(argc, argv, program);
  if (!a.ok()) {
    std::cerr << program << " tensor-parallel-rank: " << a.status().message()
              << "\n(started by an agent with --tensor-parallel; not meant to be run by hand)\n";
    return 2;
  }
  bool help = false;
  absl::StatusOr<AgentConfig> config =
      parseAgentConfig(static_cast<int>(a->agent_argv.size()), a->agent_argv.data(), &help);
  if (!config.ok()) {
    std::cerr << program << " tensor-parallel-rank " << a->rank << ": " << config.status().message() << "\n";
    return 2;
  }
  auto format = parseLogFormat(config->log_format);
  configureLogging({.spec = config->log_level, .format = format.ok() ? *format : LogFormat::kText}).IgnoreError();
  // Rank 0 decides when this rank ends: it drains on SIGTERM, then closes
  // the link. If rank 0 is killed, this rank goes too, even while it loads
  // or waits inside NCCL (where it would not see the link close).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 1;  // rank 0 went before the line above
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  Logger log("rank");
  // The same pool size as rank 0's (resolveKvCacheBytes reads the same flags and model).
  absl::Status served = resolveKvCacheBytes(*config);
  if (served.ok()) served = serveRank(*a, *config, log);
  if (!served.ok()) {
    log.error("tensor-parallel rank failed", {{"rank", a->rank}, {"error", std::string(served.message())}});
    return 1;
  }
  log.info("tensor-parallel rank done: rank 0 closed the link", {{"rank", a->rank}});
  return 0;
}

}  // namespace tandem::agent
