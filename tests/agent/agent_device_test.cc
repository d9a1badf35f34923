// The agent's --device (docs/cuda.md): cuda-emulator serves through the GPU
// kernels on the CPU executor, with the KV pool in the device's memory, and
// answers what the CPU backend answers; in P/D it stages that pool through
// the UCX region (the path a GPU agent takes where UCX cannot read device
// memory) and answers what one emulated agent answers. cuda, with no CUDA
// backend in the binary, is a start-up error that says what to use instead.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agent/cuda_device_backend.h"
#include "src/http/client.h"
#include "tests/agent/agent_process.h"
#include "tests/testing/command.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using testing::AgentProcess;
using testing::metricValue;
using testing::metricValueWith;
using testing::scrape;
using testing::waitFor;

std::string complete(const AgentProcess& a, const std::string& prompt) {
  http::ClientRequest req{.method = "POST", .url = a.url("/v1/completions")};
  req.headers["Content-Type"] = "application/json";
  req.body =
      json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}}.dump();
  req.timeout = std::chrono::seconds(60);
  auto r = http::httpSend(req);
  if (!r.ok() || r->status != 200) {
    ADD_FAILURE() << (r.ok() ? r->body : std::string(r.status().message()));
    return "";
  }
  return json::parse(r->body)["choices"][0]["text"].get<std::string>();
}

// The number after " NAME=" in an agent's start-up line; -1 when absent.
int64_t logNumber(const std::string& log, const std::string& name) {
  const size_t at = log.find(" " + name + "=");
  return at == std::string::npos ? -1 : std::stoll(log.substr(at + name.size() + 2));
}

TEST(AgentDeviceTest, TheCudaEmulatorServesWhatTheCpuBackendServes) {
  auto cpu = AgentProcess::start({"--device", "cpu"});
  auto emulated = AgentProcess::start({"--device", "cuda-emulator"});
  ASSERT_TRUE(cpu && emulated);
  for (const std::string prompt : {"hello", "a longer prompt that fills a few blocks of the cache, and then some"}) {
    const std::string want = complete(*cpu, prompt);
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(complete(*emulated, prompt), want) << prompt;
  }
  // The decode steps ran as graphs (docs/cuda.md), each replay matching
  // the launches (or the answers above would differ); none on the CPU.
  const std::string m = scrape(*emulated), c = scrape(*cpu);
  EXPECT_GE(metricValueWith(m, "tandem_cuda_graph_steps_total", "outcome=\"captured\""), 1) << m;
  EXPECT_GE(metricValueWith(m, "tandem_cuda_graph_steps_total", "outcome=\"replayed\""), 10) << m;
  EXPECT_EQ(metricValueWith(c, "tandem_cuda_graph_steps_total", "outcome=\"replayed\""), 0);
  EXPECT_EQ(emulated->stop(SIGTERM), 0) << emulated->log();
  EXPECT_EQ(cpu->stop(SIGTERM), 0) << cpu->log();
}

// --dtype bfloat16: the emulated GPU's bf16 projections (toBf16Kernel and
// bf16 weights) answer what the CPU backend's bf16 mode answers; the agents
// say so at start-up, with a fingerprint of their own (bf16 KV is not fp32's).
TEST(AgentDeviceTest, Bf16ProjectionsOnTheCudaEmulatorServeWhatTheCpuBackendsBf16ModeServes) {
  auto cpu = AgentProcess::start({"--device", "cpu", "--dtype", "bfloat16"});
  auto emulated = AgentProcess::start({"--device", "cuda-emulator", "--dtype", "bfloat16", "--log-level", "info"});
  auto fp32 = AgentProcess::start({"--device", "cpu", "--log-level", "info"});
  ASSERT_TRUE(cpu && emulated && fp32);
  for (const std::string prompt : {"hello", "a longer prompt that fills a few blocks of the cache, and then some"}) {
    const std::string want = complete(*cpu, prompt);
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(complete(*emulated, prompt), want) << prompt;
  }
  EXPECT_EQ(emulated->stop(SIGTERM), 0) << emulated->log();
  EXPECT_EQ(cpu->stop(SIGTERM), 0) << cpu->log();
  EXPECT_EQ(fp32->stop(SIGTERM), 0) << fp32->log();
  EXPECT_NE(emulated->log().find("dtype=bfloat16"), std::string::npos) << emulated->log();
  EXPECT_NE(emulated->log().find("model fingerprint with bf16 projections"), std::string::npos) << emulated->log();
  EXPECT_NE(fp32->log().find("dtype=float32"), std::string::npos) << fp32->log();
  EXPECT_EQ(fp32->log().find("bf16 projections"), std::string::npos) << fp32->log();
}

TEST(AgentDeviceTest, PrefillAndDecodeOnTheCudaEmulatorStageTheDevicePoolAndAnswerAsOneAgent) {
  for (const std::string tls : {"tcp", "posix,cma,tcp"}) {
    // At level info, for the start-up line.
    auto mono = AgentProcess::start({"--device", "cuda-emulator", "--num-blocks", "128", "--log-level", "info"});
    auto prefill = AgentProcess::start({"--device", "cuda-emulator", "--role", "prefill", "--kv-listen", "127.0.0.1:0",
                                        "--kv-tls", tls, "--num-blocks", "128", "--log-level", "info"});
    ASSERT_TRUE(mono && prefill);
    auto decode = AgentProcess::start({"--device", "cuda-emulator", "--role", "decode", "--kv-listen", "127.0.0.1:0",
                                       "--kv-tls", tls, "--num-blocks", "128", "--checksum-rate", "1", "--log-level", "info",
                                       "--prefill-peer", "127.0.0.1:" + std::to_string(prefill->kvPort())});
    ASSERT_NE(decode, nullptr);
    // Every prompt is new to both sides (no cached prefix): its whole KV moves.
    for (const std::string prompt : {"x", "sixteen chars ok", "a prompt that spans several blocks of sixteen tokens each, and then some"}) {
      EXPECT_EQ(complete(*decode, prompt), complete(*mono, prompt)) << tls << ": " << prompt;
    }
    const std::string d = scrape(*decode);
    EXPECT_EQ(metricValueWith(d, "tandem_request_path_total", "path=\"disagg\""), 3) << tls;
    EXPECT_GT(metricValue(d, "tandem_kv_checksum_verified_total{"), 0) << tls;
    EXPECT_EQ(metricValueWith(d, "tandem_kv_transfer_failures_total", "reason=\"checksum_mismatch\""), 0) << tls;
    EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*prefill), "tandem_kv_leases_active{") == 0; })) << tls;
    // The staging copies, counted: P's layers to the host, D's imports to the device.
    const std::string p_metrics = scrape(*prefill);
    EXPECT_GT(metricValueWith(p_metrics, "tandem_kv_staged_bytes_total", "direction=\"to_host\""), 0) << tls;
    EXPECT_EQ(metricValueWith(p_metrics, "tandem_kv_staged_bytes_total", "direction=\"to_device\""), 0) << tls;
    EXPECT_GT(metricValueWith(d, "tandem_kv_staged_bytes_total", "direction=\"to_device\""), 0) << tls;
    EXPECT_EQ(metricValueWith(scrape(*mono), "tandem_kv_staged_bytes_total", "direction=\"to_host\""), 0) << tls;
    // Each says at start-up where its pool is and what its UCX can read
    // (no with Debian's UCX; yes with NVIDIA's builds).
    for (const AgentProcess* a : {prefill.get(), decode.get()}) {
      const std::string log = a->log();
      EXPECT_TRUE(log.find("kv_memory=\"device, staged through pinned host memory\" ucx_cuda_memory=no") != std::string::npos ||
                  log.find("kv_memory=\"device, staged through pinned host memory\" ucx_cuda_memory=yes") != std::string::npos)
          << log;
    }
    EXPECT_NE(mono->log().find("kv_memory=device ucx_cuda_memory=n/a"), std::string::npos) << mono->log();
    EXPECT_EQ(decode->stop(SIGTERM), 0) << decode->log();
    EXPECT_EQ(prefill->stop(SIGTERM), 0) << prefill->log();
    EXPECT_EQ(mono->stop(SIGTERM), 0) << mono->log();
  }
}

// --kv-device-transport direct: UCX registers the device pool itself (on a
// GPU, GPUDirect; the emulator's device memory is host memory, registered
// as such): nothing is staged either way, the prefill agent's checksums and
// the decode agent's checks of pulled blocks are computed by the device's
// kernel, and the answers are one agent's. A staged decode agent pulls from
// a direct prefill agent as well (the wire does not change).
TEST(AgentDeviceTest, DirectPrefillAndDecodeRegisterTheDevicePoolAndAnswerAsOneAgent) {
  auto mono = AgentProcess::start({"--device", "cuda-emulator", "--num-blocks", "128"});
  auto prefill =
      AgentProcess::start({"--device", "cuda-emulator", "--role", "prefill", "--kv-listen", "127.0.0.1:0", "--kv-tls",
                           "tcp", "--num-blocks", "128", "--kv-device-transport", "direct", "--log-level", "info"});
  ASSERT_TRUE(mono && prefill);
  const std::string peer = "127.0.0.1:" + std::to_string(prefill->kvPort());
  auto direct = AgentProcess::start({"--device", "cuda-emulator", "--role", "decode", "--kv-listen", "127.0.0.1:0",
                                     "--kv-tls", "tcp", "--num-blocks", "128", "--checksum-rate", "1",
                                     "--kv-device-transport", "direct", "--log-level", "info", "--prefill-peer", peer});
  auto staged = AgentProcess::start({"--device", "cuda-emulator", "--role", "decode", "--kv-listen", "127.0.0.1:0",
                                     "--kv-tls", "tcp", "--num-blocks", "128", "--checksum-rate", "1",
                                     "--kv-device-transport", "staged", "--prefill-peer", peer});
  ASSERT_TRUE(direct && staged);
  // Every prompt is new to both sides (no cached prefix): its whole KV moves.
  int n = 0;
  for (const std::string prompt :
       {"x", "sixteen chars ok", "a prompt that spans several blocks of sixteen tokens each, and then some"}) {
    const std::string want = complete(*mono, prompt);
    EXPECT_EQ(complete(*direct, prompt), want) << prompt;
    EXPECT_EQ(complete(*staged, prompt + " (again)"), complete(*mono, prompt + " (again)")) << prompt;
    ++n;
  }
  for (const AgentProcess* d : {direct.get(), staged.get()}) {
    const std::string m = scrape(*d);
    EXPECT_EQ(metricValueWith(m, "tandem_request_path_total", "path=\"disagg\""), n) << d->log();
    EXPECT_GT(metricValue(m, "tandem_kv_checksum_verified_total{"), 0);
    EXPECT_EQ(metricValueWith(m, "tandem_kv_transfer_failures_total", "reason=\"checksum_mismatch\""), 0);
  }
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*prefill), "tandem_kv_leases_active{") == 0; }));
  // Nothing staged on the direct agents; the staged one uploads its imports.
  const std::string p = scrape(*prefill), d = scrape(*direct), s = scrape(*staged);
  EXPECT_EQ(metricValueWith(p, "tandem_kv_staged_bytes_total", "direction=\"to_host\""), 0);
  EXPECT_EQ(metricValueWith(d, "tandem_kv_staged_bytes_total", "direction=\"to_device\""), 0);
  EXPECT_GT(metricValueWith(s, "tandem_kv_staged_bytes_total", "direction=\"to_device\""), 0);
  for (const AgentProcess* a : {prefill.get(), direct.get()}) {
    EXPECT_NE(a->log().find("kv_memory=\"device, registered with UCX directly (no staging copy; the emulator's device "
                            "memory is host memory)\""),
              std::string::npos)
        << a->log();
  }
  EXPECT_EQ(staged->stop(SIGTERM), 0) << staged->log();
  EXPECT_EQ(direct->stop(SIGTERM), 0) << direct->log();
  EXPECT_EQ(prefill->stop(SIGTERM), 0) << prefill->log();
  EXPECT_EQ(mono->stop(SIGTERM), 0) << mono->log();
}

// --kv-dtype bfloat16: the KV pool in bf16, half the bytes for the same
// blocks. The emulated GPU's kernels (bf16 writes, widening reads) answer
// what the CPU backend answers with a bf16 pool; P and D on the emulator
// move the bf16 layer blocks (staged, checksummed) and answer as one agent;
// a decode agent whose prefill peer keeps fp32 refuses it, and the request
// fails naming --kv-dtype (as for any incompatible peer: docs/pd.md).
TEST(AgentDeviceTest, ABf16KvCacheServesAsTheCpuBackendsMovesInPdAndRefusesAnFp32Peer) {
  auto cpu = AgentProcess::start({"--device", "cpu", "--kv-dtype", "bfloat16", "--num-blocks", "128"});
  auto emulated = AgentProcess::start(
      {"--device", "cuda-emulator", "--kv-dtype", "bfloat16", "--num-blocks", "128", "--log-level", "info"});
  auto fp32 = AgentProcess::start({"--device", "cpu", "--num-blocks", "128", "--log-level", "info"});
  ASSERT_TRUE(cpu && emulated && fp32);
  const std::vector<std::string> prompts = {"x", "sixteen chars ok",
                                            "a prompt that spans several blocks of sixteen tokens each, and then some"};
  std::vector<std::string> want;
  for (const std::string& prompt : prompts) {
    want.push_back(complete(*cpu, prompt));
    EXPECT_FALSE(want.back().empty());
    EXPECT_EQ(complete(*emulated, prompt), want.back()) << prompt;
  }
  EXPECT_EQ(emulated->stop(SIGTERM), 0) << emulated->log();
  EXPECT_EQ(fp32->stop(SIGTERM), 0) << fp32->log();
  EXPECT_NE(emulated->log().find("kv_dtype=bfloat16"), std::string::npos) << emulated->log();
  EXPECT_NE(fp32->log().find("kv_dtype=float32"), std::string::npos) << fp32->log();
  EXPECT_GT(logNumber(fp32->log(), "kv_pool_bytes"), 0) << fp32->log();
  EXPECT_EQ(2 * logNumber(emulated->log(), "kv_pool_bytes"), logNumber(fp32->log(), "kv_pool_bytes"))
      << "the same blocks in half the bytes";

  auto prefill = AgentProcess::start({"--device", "cuda-emulator", "--kv-dtype", "bfloat16", "--role", "prefill",
                                      "--kv-listen", "127.0.0.1:0", "--num-blocks", "128"});
  ASSERT_NE(prefill, nullptr);
  auto decode = AgentProcess::start({"--device", "cuda-emulator", "--kv-dtype", "bfloat16", "--role", "decode",
                                     "--kv-listen", "127.0.0.1:0", "--num-blocks", "128", "--checksum-rate", "1",
                                     "--prefill-peer", "127.0.0.1:" + std::to_string(prefill->kvPort())});
  ASSERT_NE(decode, nullptr);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(complete(*decode, prompts[i]), want[i]) << prompts[i];
  const std::string d = scrape(*decode);
  EXPECT_EQ(metricValueWith(d, "tandem_request_path_total", "path=\"disagg\""), 3) << d;
  EXPECT_GT(metricValue(d, "tandem_kv_checksum_verified_total{"), 0);
  EXPECT_EQ(metricValueWith(d, "tandem_kv_transfer_failures_total", "reason=\"checksum_mismatch\""), 0);
  EXPECT_EQ(decode->stop(SIGTERM), 0) << decode->log();
  EXPECT_EQ(prefill->stop(SIGTERM), 0) << prefill->log();

  auto fp32_prefill = AgentProcess::start({"--device", "cpu", "--role", "prefill", "--kv-listen", "127.0.0.1:0"});
  ASSERT_NE(fp32_prefill, nullptr);
  auto bf16_decode = AgentProcess::start({"--device", "cpu", "--kv-dtype", "bfloat16", "--role", "decode",
                                          "--kv-listen", "127.0.0.1:0", "--num-blocks", "128", "--prefill-peer",
                                          "127.0.0.1:" + std::to_string(fp32_prefill->kvPort())});
  ASSERT_NE(bf16_decode, nullptr);
  http::ClientRequest req{.method = "POST", .url = bf16_decode->url("/v1/completions")};
  req.headers["Content-Type"] = "application/json";
  req.body = json{{"model", "tiny"}, {"prompt", prompts[2]}, {"max_tokens", 4}}.dump();
  req.timeout = std::chrono::seconds(60);
  auto r = http::httpSend(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_NE(r->body.find("the peer prefill keeps its KV cache in float32, this agent in bfloat16"), std::string::npos)
      << r->body;
  EXPECT_NE(r->body.find("--kv-dtype"), std::string::npos) << r->body;
  EXPECT_TRUE(waitFor([&] {
    return metricValueWith(scrape(*bf16_decode), "tandem_kv_control_messages_rejected_total",
                           "reason=\"kv_dtype_mismatch\"") >= 1;
  })) << scrape(*bf16_decode);
  EXPECT_EQ(bf16_decode->stop(SIGTERM), 0);
  EXPECT_EQ(fp32_prefill->stop(SIGTERM), 0);
  EXPECT_EQ(cpu->stop(SIGTERM), 0) << cpu->log();
}

// --kv-cache-bytes: the pool holds the most blocks that fit in the bytes,
// on the emulated device as on the CPU; too few bytes for one block is a
// start-up error naming the flag.
TEST(AgentDeviceTest, KvCacheBytesSizeThePoolAndTooFewAreAStartUpError) {
  for (const char* device : {"cpu", "cuda-emulator"}) {
    auto a = AgentProcess::start(
        {"--device", device, "--kv-cache-bytes", "1Mi", "--kv-dtype", "bfloat16", "--log-level", "info"});
    ASSERT_NE(a, nullptr) << device;
    EXPECT_FALSE(complete(*a, "hello").empty()) << device;
    EXPECT_EQ(a->stop(SIGTERM), 0) << a->log();
    const std::string log = a->log();
    const int64_t blocks = logNumber(log, "kv_blocks"), pool = logNumber(log, "kv_pool_bytes");
    ASSERT_GT(blocks, 0) << log;
    ASSERT_GT(pool, 0) << log;
    EXPECT_EQ(logNumber(log, "kv_cache_bytes"), int64_t{1} << 20) << log;
    EXPECT_LE(pool, int64_t{1} << 20) << device;
    EXPECT_GT(pool + pool / blocks, int64_t{1} << 20) << device << ": one more block would have fit";
  }
  const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
  const testutil::CommandResult r = testutil::runCommand(std::string(bin_dir ? bin_dir : "build/bin") +
                                                         "/tandem-agent --listen 127.0.0.1:0 --kv-cache-bytes 1Ki "
                                                         "--model-dir " +
                                                         testing::tinyModelDir() + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("--kv-cache-bytes 1024 holds no KV block: one takes"), std::string::npos) << r.out;
}

TEST(AgentDeviceTest, CudaWithoutACudaBackendIsAStartUpErrorThatSaysWhatToUse) {
  if (hasCudaDeviceBackend()) GTEST_SKIP() << "this build has the CUDA backend (./tandem check cuda tests its refusal)";
  const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
  const testutil::CommandResult r = testutil::runCommand(std::string(bin_dir ? bin_dir : "build/bin") +
                                                         "/tandem-agent --listen 127.0.0.1:0 --device cuda --model-dir " +
                                                         testing::tinyModelDir() + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("--device cuda: this tandem-agent has no CUDA backend"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("use --device cpu"), std::string::npos) << r.out;
}

// A TANDEM_CUDA_GRAPHS the backend cannot read stops start-up, naming it,
// instead of serving with graphs silently on or off.
TEST(AgentDeviceTest, AnUnreadableGraphSettingIsAStartUpErrorNamingIt) {
  const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
  const testutil::CommandResult r = testutil::runCommand(
      "TANDEM_CUDA_GRAPHS=sometimes " + std::string(bin_dir ? bin_dir : "build/bin") +
      "/tandem-agent --listen 127.0.0.1:0 --device cuda-emulator --model-dir " + testing::tinyModelDir() + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("TANDEM_CUDA_GRAPHS=sometimes: expected on, off"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem::agent
