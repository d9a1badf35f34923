// tandem-agent --tensor-parallel N (docs/cuda.md, "Tensor parallelism"): the
// agent starts ranks 1..N-1 as processes of its own binary, answers what one
// process answers, fails its health checks when a rank dies, ends its ranks
// when it stops, and refuses what cannot work with an error that says why.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/model/model_loader.h"
#include "engine/model/weights.h"
#include "src/http/client.h"
#include "tests/agent/agent_process.h"
#include "tests/testing/command.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using testing::AgentProcess;

http::ClientResponse post(const AgentProcess& a, const std::string& path, const json& body) {
  http::ClientRequest req{.method = "POST", .url = a.url(path)};
  req.headers["Content-Type"] = "application/json";
  req.body = body.dump();
  req.timeout = std::chrono::seconds(60);
  auto r = http::httpSend(req);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : http::ClientResponse{};
}

std::string complete(const AgentProcess& a, const std::string& prompt) {
  const auto r = post(a, "/v1/completions",
                      {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? json::parse(r.body)["choices"][0]["text"].get<std::string>() : "";
}

// The pids of tensor-parallel ranks whose parent is `leader`.
std::vector<int> rankPids(int leader) {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string pid, comm, state;
    int ppid = 0;
    if (!(stat >> pid >> comm >> state >> ppid) || ppid != leader) continue;
    std::ifstream cmdline(e.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    if (args.find("tensor-parallel-rank") != std::string::npos) out.push_back(std::stoi(pid));
  }
  return out;
}

bool running(int pid) { return ::kill(pid, 0) == 0; }

TEST(AgentTensorParallelTest, TwoRanksAnswerWhatOneProcessAnswersAndStopWithTheAgent) {
  // The tiny model: 8 query heads and 2 KV heads, so rank r holds KV head r.
  auto one = AgentProcess::start({});
  auto two = AgentProcess::start({"--tensor-parallel", "2", "--log-level", "info", "--num-blocks", "64"});
  ASSERT_TRUE(one && two);
  const std::vector<int> ranks = rankPids(two->pid());
  ASSERT_EQ(ranks.size(), 1u) << two->log();
  // Prompts that share a prefix (prefix-cache hits on rank 0 mean block ids
  // every rank must honour), one long enough for several blocks.
  const std::string stem = "the same long prefix of a coding session, shared by every request: ";
  for (const std::string& prompt : {stem, stem + "append one", stem + "append two", std::string("x")}) {
    EXPECT_EQ(complete(*two, prompt), complete(*one, prompt)) << prompt;
  }
  // The group's size and how long rank 0 waited on the other rank.
  const std::string m2 = testing::scrape(*two), m1 = testing::scrape(*one);
  EXPECT_EQ(testing::metricValue(m2, "tandem_tensor_parallel_ranks{"), 2);
  EXPECT_GT(testing::metricValue(m2, "tandem_tensor_parallel_wait_seconds_total{"), 0);
  EXPECT_EQ(testing::metricValue(m1, "tandem_tensor_parallel_ranks{"), 1);
  EXPECT_EQ(testing::metricValue(m1, "tandem_tensor_parallel_wait_seconds_total{"), 0);
  const std::string log = two->log();
  EXPECT_NE(log.find("msg=\"tensor-parallel rank ready\" rank=1 world=2 device=cpu kv_heads=1 all_reduce=link"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("tensor_parallel=2"), std::string::npos) << log;
  // SIGTERM goes to rank 0 alone (as Kubernetes sends it); the rank ignores
  // its own, and ends when rank 0 closes the link after draining.
  ::kill(ranks[0], SIGTERM);
  EXPECT_EQ(complete(*two, "still served"), complete(*one, "still served"));
  EXPECT_EQ(two->stop(SIGTERM), 0) << two->log();
  EXPECT_FALSE(running(ranks[0]));
  EXPECT_NE(two->log().find("tensor-parallel rank done: rank 0 closed the link"), std::string::npos) << two->log();
  EXPECT_EQ(one->stop(SIGTERM), 0);
}

// On the CUDA emulator (the GPU kernels on the CPU executor) the ranks'
// partials are host memory too, and cross the link.
TEST(AgentTensorParallelTest, TwoRanksOnTheCudaEmulatorAnswerWhatTheCpuBackendAnswers) {
  auto cpu = AgentProcess::start({});
  auto two = AgentProcess::start({"--tensor-parallel", "2", "--device", "cuda-emulator", "--num-blocks", "64",
                                  "--log-level", "info"});
  ASSERT_TRUE(cpu && two);
  for (const std::string prompt : {"hello", "a longer prompt that fills a few blocks of the cache"}) {
    EXPECT_EQ(complete(*two, prompt), complete(*cpu, prompt)) << prompt;
  }
  EXPECT_NE(two->log().find("rank=1 world=2 device=cuda-emulator kv_heads=1 all_reduce=link"), std::string::npos)
      << two->log();
  EXPECT_EQ(two->stop(SIGTERM), 0) << two->log();
  EXPECT_EQ(cpu->stop(SIGTERM), 0);
}

TEST(AgentTensorParallelTest, ARankThatDiesFailsTheHealthChecksAndTheRequests) {
  auto two = AgentProcess::start({"--tensor-parallel", "2"});
  ASSERT_NE(two, nullptr);
  EXPECT_FALSE(complete(*two, "before").empty());
  const std::vector<int> ranks = rankPids(two->pid());
  ASSERT_EQ(ranks.size(), 1u);
  ::kill(ranks[0], SIGKILL);
  // Idle: the health checks see it at once, naming the rank.
  for (const char* probe : {"/healthz", "/readyz"}) {
    EXPECT_TRUE(testing::waitFor([&] {
      auto r = http::httpGet(two->url(probe));
      return r.ok() && r->status == 503 && r->body.find("tensor-parallel rank 1 (pid " + std::to_string(ranks[0]) +
                                                        ") was killed by signal 9") != std::string::npos;
    })) << probe;
  }
  const auto r = post(*two, "/v1/completions", {{"model", "tiny"}, {"prompt", "after"}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 500) << r.body;
  EXPECT_NE(r.body.find("tensor-parallel rank 1 of 2 is gone"), std::string::npos) << r.body;
  EXPECT_EQ(two->stop(SIGTERM), 0) << two->log();
}

// Prefill and decode across groups: a group's staging copy holds every
// rank's KV heads (the whole model's layout), so P and D of any group sizes
// pair up, and the KV moves as between one-process agents: the same
// answers as one agent alone, every transfer's checksums verified, no
// failure and no failover to computing the prompt on D.
TEST(AgentTensorParallelTest, PrefillAndDecodeGroupsOfAnySizeMoveTheKvAndAnswerAsOneAgent) {
  struct Case {
    int prefill_tp, decode_tp;
    std::string device, tls;
  };
  const std::vector<Case> cases = {{2, 2, "cpu", "tcp"},
                                   {2, 1, "cpu", "posix,cma,tcp"},
                                   {1, 2, "cpu", "tcp"},
                                   // Device pools: each rank downloads and uploads its own heads.
                                   {2, 2, "cuda-emulator", "tcp"}};
  auto mono = AgentProcess::start({"--num-blocks", "128"});
  ASSERT_NE(mono, nullptr);
  for (const Case& c : cases) {
    const std::string what = "P TP=" + std::to_string(c.prefill_tp) + ", D TP=" + std::to_string(c.decode_tp) + ", " +
                             c.device + ", " + c.tls;
    SCOPED_TRACE(what);
    auto prefill = AgentProcess::start({"--role", "prefill", "--kv-listen", "127.0.0.1:0", "--kv-tls", c.tls,
                                        "--num-blocks", "128", "--device", c.device, "--tensor-parallel",
                                        std::to_string(c.prefill_tp), "--log-level", "info"});
    ASSERT_NE(prefill, nullptr);
    auto decode = AgentProcess::start({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", c.tls,
                                       "--num-blocks", "128", "--device", c.device, "--tensor-parallel",
                                       std::to_string(c.decode_tp), "--checksum-rate", "1", "--prefill-peer",
                                       "127.0.0.1:" + std::to_string(prefill->kvPort())});
    ASSERT_NE(decode, nullptr);
    const std::vector<std::string> prompts = {"x", "sixteen chars ok",
                                              "a prompt that spans several blocks of sixteen tokens each, and then some"};
    for (const std::string& prompt : prompts) EXPECT_EQ(complete(*decode, prompt), complete(*mono, prompt)) << prompt;
    const std::string d = testing::scrape(*decode);
    EXPECT_EQ(testing::metricValueWith(d, "tandem_request_path_total", "path=\"disagg\""), 3);
    EXPECT_GT(testing::metricValue(d, "tandem_kv_checksum_verified_total{"), 0);
    for (const char* reason : {"checksum_mismatch", "transfer_failed", "prefill_timeout"}) {
      EXPECT_EQ(testing::metricValueWith(d, "tandem_kv_transfer_failures_total",
                                         std::string("reason=\"") + reason + "\""),
                0)
          << reason;
    }
    EXPECT_EQ(testing::metricValue(d, "tandem_kv_prefill_failovers_total{"), 0);
    if (c.prefill_tp > 1) {
      EXPECT_NE(prefill->log().find("every rank's KV heads"), std::string::npos) << prefill->log();
    }
    EXPECT_EQ(decode->stop(SIGTERM), 0) << decode->log();
    EXPECT_EQ(prefill->stop(SIGTERM), 0) << prefill->log();
  }
  EXPECT_EQ(mono->stop(SIGTERM), 0);
}

// With several KV heads per rank (a model with 4: 2 per rank at TP=2, 1 at
// TP=4), each rank's heads must land in their own slice of every token:
// groups of 4 and 2 and one process feed each other and answer as one agent.
TEST(AgentTensorParallelTest, GroupsOfFourAndTwoPairWithSeveralKvHeadsPerRank) {
  const std::string dir = testing::testScratchDir() / "kv4";
  engine::ModelConfig c = engine::tinyModelConfig();
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.intermediate_size = 96;
  ASSERT_TRUE(engine::writeModelDir(dir, *engine::makeRandomWeights(c, 20261127), engine::DType::kF32).ok());
  const std::vector<std::string> model = {"--model-dir", dir, "--model-name", "tiny", "--num-blocks", "128"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.begin(), model.begin(), model.end());
    return args;
  };
  auto mono = AgentProcess::start(with({}));
  ASSERT_NE(mono, nullptr);
  for (const auto& [p_tp, d_tp] : std::vector<std::pair<int, int>>{{4, 2}, {2, 1}, {1, 4}}) {
    SCOPED_TRACE("P TP=" + std::to_string(p_tp) + ", D TP=" + std::to_string(d_tp));
    auto prefill = AgentProcess::start(with({"--role", "prefill", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp",
                                             "--tensor-parallel", std::to_string(p_tp)}));
    ASSERT_NE(prefill, nullptr);
    auto decode = AgentProcess::start(with({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp",
                                            "--tensor-parallel", std::to_string(d_tp), "--checksum-rate", "1",
                                            "--prefill-peer", "127.0.0.1:" + std::to_string(prefill->kvPort())}));
    ASSERT_NE(decode, nullptr);
    for (const std::string& prompt : {std::string("sixteen chars ok"),
                                      std::string("a prompt that spans several blocks of sixteen tokens each")}) {
      EXPECT_EQ(complete(*decode, prompt), complete(*mono, prompt)) << prompt;
    }
    const std::string d = testing::scrape(*decode);
    EXPECT_EQ(testing::metricValueWith(d, "tandem_request_path_total", "path=\"disagg\""), 2);
    EXPECT_EQ(testing::metricValue(d, "tandem_kv_prefill_failovers_total{"), 0);
    EXPECT_EQ(decode->stop(SIGTERM), 0) << decode->log();
    EXPECT_EQ(prefill->stop(SIGTERM), 0) << prefill->log();
  }
  EXPECT_EQ(mono->stop(SIGTERM), 0);
}

// Start-up errors: the command, what it prints, exit status 1 or 2.
void expectStartUpError(const std::string& args, int status, const std::string& error) {
  SCOPED_TRACE(args);
  const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
  const testutil::CommandResult r = testutil::runCommand(std::string(bin_dir ? bin_dir : "build/bin") +
                                                         "/tandem-agent --listen 127.0.0.1:0 --model-dir " +
                                                         testing::tinyModelDir() + " " + args + " 2>&1");
  EXPECT_EQ(r.status, status) << r.out;
  EXPECT_NE(r.out.find(error), std::string::npos) << r.out;
}

TEST(AgentTensorParallelTest, WhatCannotBeSplitIsRefusedSayingWhy) {
  // Checked against config.json before any rank starts.
  expectStartUpError("--tensor-parallel 3", 1,
                     "--tensor-parallel 3: tensor parallel: num_attention_heads (8) is not divisible by the world size 3");
  expectStartUpError("--tensor-parallel 4", 1,
                     "--tensor-parallel 4: tensor parallel: num_key_value_heads (2) is not divisible by the world size 4");
  expectStartUpError("--tensor-parallel 0", 2, "--tensor-parallel: 0 is out of range [1, 64]");
  expectStartUpError("--tensor-parallel 2 --role router --decode-workers 127.0.0.1:1", 2,
                     "--tensor-parallel 2 (engine.tensor_parallel) with role router: a router holds no model");
  const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
  const std::string bin = std::string(bin_dir ? bin_dir : "build/bin") + "/tandem-agent";
  // The rank's own command is not for people; bad arguments say so.
  for (const auto& [args, error] : std::vector<std::pair<std::string, std::string>>{
           {"--rank 1 --world 2 --link 3", "missing \"--\" before the agent's arguments"},
           {"--rank 2 --world 2 --link 3 --", "--rank: must be in [1, 2), got 2"},
           {"--rank 1 --world 2 --link 99 --", "--link: 99 is not an open descriptor"},
           {"--rank one --world 2 --link 3 --", "--rank: expected an integer, got \"one\""}}) {
    const testutil::CommandResult r = testutil::runCommand(bin + " tensor-parallel-rank " + args + " 2>&1");
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find(error), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("not meant to be run by hand"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace tandem::agent
