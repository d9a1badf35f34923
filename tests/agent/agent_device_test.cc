// The agent's --device (docs/cuda.md): cuda-emulator serves through the GPU
// kernels on the CPU executor and answers what the CPU backend answers;
// cuda, with no CUDA backend in the binary, is a start-up error that says
// what to use instead.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "src/http/client.h"
#include "tests/agent/agent_process.h"
#include "tests/testing/command.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using testing::AgentProcess;

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

TEST(AgentDeviceTest, TheCudaEmulatorServesWhatTheCpuBackendServes) {
  auto cpu = AgentProcess::start({"--device", "cpu"});
  auto emulated = AgentProcess::start({"--device", "cuda-emulator"});
  ASSERT_TRUE(cpu && emulated);
  for (const std::string prompt : {"hello", "a longer prompt that fills a few blocks of the cache, and then some"}) {
    const std::string want = complete(*cpu, prompt);
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(complete(*emulated, prompt), want) << prompt;
  }
  EXPECT_EQ(emulated->stop(SIGTERM), 0) << emulated->log();
  EXPECT_EQ(cpu->stop(SIGTERM), 0) << cpu->log();
}

TEST(AgentDeviceTest, CudaWithoutACudaBackendIsAStartUpErrorThatSaysWhatToUse) {
  const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
  const testutil::CommandResult r = testutil::runCommand(std::string(bin_dir ? bin_dir : "build/bin") +
                                                         "/tandem-agent --listen 127.0.0.1:0 --device cuda --model-dir " +
                                                         testing::tinyModelDir() + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("--device cuda: this tandem-agent has no CUDA backend"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("use --device cpu"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem::agent
