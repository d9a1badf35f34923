#include "agent/agent_config.h"

#include "engine/model/model_loader.h"
#include "engine/model/weights.h"

#include <gtest/gtest.h>

#include <fstream>

namespace tandem::agent {
namespace {

absl::StatusOr<AgentConfig> parse(std::vector<std::string> args, bool* help = nullptr) {
  std::vector<const char*> argv{"tandem-agent"};
  for (const auto& a : args) argv.push_back(a.c_str());
  bool h = false;
  return parseAgentConfig(static_cast<int>(argv.size()), argv.data(), help ? help : &h);
}

std::string writeFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(AgentConfigTest, FlagsInBothForms) {
  auto c = parse({"--model-dir", "/m/tiny/", "--listen=0.0.0.0:9000", "--num-blocks", "64", "--prefix-cache=false",
                  "--request-timeout", "2s", "--pool", "p1"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_name, "tiny");  // from the directory name
  EXPECT_EQ(c->host, "0.0.0.0");
  EXPECT_EQ(c->port, 9000);
  EXPECT_EQ(c->engine.num_blocks, 64);
  EXPECT_FALSE(c->engine.enable_prefix_cache);
  EXPECT_EQ(c->request_timeout, std::chrono::seconds(2));
  EXPECT_EQ(c->pool, "p1");
  EXPECT_FALSE(c->worker.empty());
}

TEST(AgentConfigTest, YamlFileAndFlagsWin) {
  std::string path = writeFile("agent.yaml", R"(
pool: from-file
listen: 127.0.0.1:8100
model:
  dir: /models/tiny
  name: served
engine:
  num_blocks: 100
  block_size: 32
limits:
  max_body_bytes: 2048
trace:
  file: "-"
)");
  auto c = parse({"--config", path, "--num-blocks", "200"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool, "from-file");
  EXPECT_EQ(c->model_name, "served");
  EXPECT_EQ(c->engine.num_blocks, 200);  // the flag wins
  EXPECT_EQ(c->engine.block_size, 32);
  EXPECT_EQ(c->max_body_bytes, 2048u);
  EXPECT_EQ(c->trace_file, "-");
}

TEST(AgentConfigTest, ScriptedOutputNeedsAllowTestHooks) {
  auto refused = parse({"--model-dir", "m", "--scripted-output", "/tmp/reply.txt"});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--allow-test-hooks"), std::string_view::npos) << refused.status();
  EXPECT_FALSE(parse({"--model-dir", "m", "--scripted-output", "r", "--allow-test-hooks", "false"}).ok());
  auto allowed = parse({"--model-dir", "m", "--scripted-output", "r", "--allow-test-hooks", "true"});
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(allowed->scripted_output_file, "r");
  EXPECT_FALSE(parse({"--model-dir", "m", "--allow-test-hooks", "yes"}).ok());
}

TEST(AgentConfigTest, RouterRole) {
  auto c = parse({"--model-dir", "m", "--role", "router", "--decode-workers", "10.0.0.2:8100,10.0.0.3:8100",
                  "--prefill-workers", "10.0.0.1:8100", "--route-sticky-weight", "3.5", "--route-migrate-after", "4"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, AgentRole::kRouter);
  ASSERT_EQ(c->decode_workers.size(), 2u);
  EXPECT_EQ(c->decode_workers[1].host, "10.0.0.3");
  EXPECT_EQ(c->decode_workers[1].port, 8100);
  ASSERT_EQ(c->prefill_workers.size(), 1u);
  EXPECT_EQ(c->routing.sticky_weight, 3.5);
  EXPECT_EQ(c->routing.capacity_rejections_to_migrate, 4);
  EXPECT_FALSE(c->routing.load_floor_without_session);
  auto on = parse({"--model-dir", "m", "--route-load-floor-without-session", "true"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->routing.load_floor_without_session);
  EXPECT_EQ(c->routing.overlap_weight, routing::RouterConfig{}.overlap_weight);  // defaults stay
}

TEST(AgentConfigTest, HeartbeatSettingsFromYamlAndFlags) {
  auto defaults = parse({"--model-dir", "m"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->kv_heartbeat_interval, std::chrono::milliseconds(500));
  EXPECT_EQ(defaults->kv_heartbeat_idle_interval, std::chrono::seconds(2));
  EXPECT_EQ(defaults->kv_heartbeat_misses, 3);
  std::string path = writeFile("heartbeat.yaml", "kv:\n  heartbeat_interval: 250ms\n  heartbeat_misses: 5\n");
  auto c = parse({"--config", path, "--model-dir", "m", "--kv-heartbeat-idle-interval", "4s"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_heartbeat_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(c->kv_heartbeat_idle_interval, std::chrono::seconds(4));
  EXPECT_EQ(c->kv_heartbeat_misses, 5);
}

TEST(AgentConfigTest, ConnectionLimitsAndPoolKeyFromYamlAndFlags) {
  auto defaults = parse({"--model-dir", "m"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->header_timeout, std::chrono::seconds(10));
  EXPECT_EQ(defaults->max_connections, 4096);
  EXPECT_EQ(defaults->pool_key_dir, "");
  std::string path = writeFile("limits.yaml",
                               "limits:\n  header_timeout: 2s\n  idle_timeout: 30s\n  max_connections: 100\n"
                               "auth:\n  pool_key_dir: /etc/tandem/pool-key\n");
  auto c = parse({"--config", path, "--model-dir", "m", "--body-timeout", "5s"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->header_timeout, std::chrono::seconds(2));
  EXPECT_EQ(c->body_timeout, std::chrono::seconds(5));
  EXPECT_EQ(c->idle_timeout, std::chrono::seconds(30));
  EXPECT_EQ(c->max_connections, 100);
  EXPECT_EQ(c->pool_key_dir, "/etc/tandem/pool-key");
  auto options = httpServerOptions(*c, SystemClock::instance());
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->headerTimeout, std::chrono::seconds(2));
  EXPECT_EQ(options->maxConnections, 100u);
  auto too_short = parse({"--model-dir", "m", "--header-timeout", "1ms"});
  ASSERT_FALSE(too_short.ok());
  EXPECT_NE(too_short.status().message().find("--header-timeout (limits.header_timeout)"), std::string::npos)
      << too_short.status();
  EXPECT_FALSE(parse({"--model-dir", "m", "--max-connections", "0"}).ok());
}

TEST(AgentConfigTest, RouterLivenessSettingsFromYamlAndFlags) {
  auto defaults = parse({"--model-dir", "m"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->worker_stale_after, std::chrono::seconds(2));
  EXPECT_EQ(defaults->unserved_timeout, std::chrono::seconds(10));
  std::string path = writeFile("liveness.yaml", "router:\n  worker_stale_after: 3s\n  unserved_timeout: 5s\n");
  auto c = parse({"--config", path, "--model-dir", "m", "--role", "router", "--decode-workers", "a:1",
                  "--unserved-timeout", "7s"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_stale_after, std::chrono::seconds(3));
  EXPECT_EQ(c->unserved_timeout, std::chrono::seconds(7));  // the flag wins
}

TEST(AgentConfigTest, PrefillDeadlineSettingsFromYamlAndFlags) {
  auto defaults = parse({"--model-dir", "m"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->prefill_deadline_floor, std::chrono::seconds(2));
  EXPECT_EQ(defaults->prefill_deadline_slack, 4.0);
  EXPECT_EQ(defaults->prefill_assumed_rate, 1000.0);
  std::string path = writeFile("deadline.yaml", "kv:\n  prefill_deadline_floor: 750ms\n  prefill_deadline_slack: 2.5\n");
  auto c = parse({"--config", path, "--model-dir", "m", "--prefill-assumed-rate", "250"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prefill_deadline_floor, std::chrono::milliseconds(750));
  EXPECT_EQ(c->prefill_deadline_slack, 2.5);
  EXPECT_EQ(c->prefill_assumed_rate, 250.0);
}

TEST(AgentConfigTest, DeviceFromFlagOrYamlAndOnlyTheKnownOnes) {
  auto c = parse({"--model-dir", "m"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "cpu");
  c = parse({"--model-dir", "m", "--device", "cuda-emulator"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "cuda-emulator");
  c = parse({"--config", writeFile("device.yaml", "model: {dir: m}\nengine: {device: cuda}\n")});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "cuda");
  c = parse({"--model-dir", "m", "--device", "gpu"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("--device: \"gpu\" is not one of: cpu, cuda, cuda-emulator"),
            std::string::npos)
      << c.status();
}

TEST(AgentConfigTest, DtypeFromFlagOrYamlAndOnlyTheKnownOnes) {
  auto c = parse({"--model-dir", "m"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dtype, "float32");
  EXPECT_EQ(c->gemmDtype(), engine::GemmDtype::kFloat32);
  c = parse({"--model-dir", "m", "--dtype", "bfloat16"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gemmDtype(), engine::GemmDtype::kBfloat16);
  c = parse({"--config", writeFile("dtype.yaml", "model: {dir: m}\nengine: {dtype: bfloat16}\n")});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gemmDtype(), engine::GemmDtype::kBfloat16);
  c = parse({"--model-dir", "m", "--dtype", "float16"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("--dtype: \"float16\" is not one of: float32, bfloat16"),
            std::string::npos)
      << c.status();
}

// --kv-device-transport / kv.device_transport: auto by default; direct only
// for a prefill or decode agent's pool in GPU memory and not with tensor
// parallelism, each refusal naming the flag and why.
TEST(AgentConfigTest, KvDeviceTransportAndWhereDirectCannotWork) {
  auto c = parse({"--model-dir", "m"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_device_transport, "auto");
  c = parse({"--model-dir", "m", "--device", "cuda-emulator", "--kv-device-transport", "direct"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_device_transport, "direct");
  c = parse({"--config", writeFile("kv_device.yaml",
                                   "model: {dir: m}\nengine: {device: cuda}\n"
                                   "kv: {device_transport: staged}\n")});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_device_transport, "staged");
  c = parse({"--model-dir", "m", "--kv-device-transport", "gpudirect"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message())
                .find("--kv-device-transport: \"gpudirect\" is not one of: auto, staged, direct"),
            std::string::npos)
      << c.status();
  // Roles without a KV transport take it and ignore it (the operator's
  // agent.yaml is every role's).
  c = parse({"--model-dir", "m", "--kv-device-transport", "direct"});  // --device cpu, role both
  ASSERT_TRUE(c.ok()) << c.status();
  c = parse({"--model-dir", "m", "--role", "prefill", "--kv-device-transport", "direct"});  // --device cpu
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message())
                .find("--kv-device-transport direct (kv.device_transport) is for a KV pool in GPU memory"),
            std::string::npos)
      << c.status();
  c = parse({"--model-dir", "m", "--role", "prefill", "--device", "cuda-emulator", "--kv-device-transport", "direct",
             "--tensor-parallel", "2"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message())
                .find("--kv-device-transport direct (kv.device_transport) with --tensor-parallel 2"),
            std::string::npos)
      << c.status();
}

TEST(AgentConfigTest, KvDtypeFromFlagOrYamlAndOnlyTheKnownOnes) {
  auto c = parse({"--model-dir", "m"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.kv_dtype, engine::KvDtype::kFloat32);
  c = parse({"--model-dir", "m", "--kv-dtype", "bfloat16"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.kv_dtype, engine::KvDtype::kBfloat16);
  EXPECT_EQ(c->gemmDtype(), engine::GemmDtype::kFloat32) << "independent of --dtype";
  c = parse({"--config", writeFile("kv_dtype.yaml", "model: {dir: m}\nengine: {kv_dtype: bfloat16}\n")});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.kv_dtype, engine::KvDtype::kBfloat16);
  c = parse({"--model-dir", "m", "--kv-dtype", "fp8"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("--kv-dtype: \"fp8\" is not one of: float32, bfloat16"),
            std::string::npos)
      << c.status();
  c = parse({"--config", writeFile("kv_dtype_bad.yaml", "model: {dir: m}\nengine: {kv_dtype: half}\n")});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("kv_dtype"), std::string::npos) << c.status();
  EXPECT_NE(std::string(c.status().message()).find("half"), std::string::npos) << c.status();
}

// --kv-cache-bytes sizes the pool by memory: the blocks of the model's
// layout (this rank's KV heads, --kv-dtype) that fit.
TEST(AgentConfigTest, KvCacheBytesBecomesTheBlocksThatFit) {
  const engine::ModelConfig tiny = engine::tinyModelConfig();
  const std::string dir = ::testing::TempDir() + "/kv-cache-bytes-model";
  ASSERT_TRUE(engine::writeModelDir(dir, *engine::makeRandomWeights(tiny, 1), engine::DType::kF32).ok());
  const int64_t per_block = int64_t{tiny.num_layers} * 2 * 16 * tiny.num_kv_heads * tiny.head_dim * 4;  // fp32

  auto c = parse({"--model-dir", dir, "--kv-cache-bytes", "1Mi", "--num-blocks", "7"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_cache_bytes, int64_t{1} << 20);
  ASSERT_TRUE(resolveKvCacheBytes(*c).ok());
  EXPECT_EQ(c->engine.num_blocks, (int64_t{1} << 20) / per_block) << "the bytes win over --num-blocks";

  c = parse({"--model-dir", dir, "--kv-cache-bytes", "1Mi", "--kv-dtype", "bfloat16"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(resolveKvCacheBytes(*c).ok());
  EXPECT_EQ(c->engine.num_blocks, (int64_t{1} << 20) / (per_block / 2)) << "bf16: twice the blocks";

  c = parse({"--model-dir", dir, "--kv-cache-bytes", "1Mi", "--tensor-parallel", "2"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(resolveKvCacheBytes(*c).ok());
  EXPECT_EQ(c->engine.num_blocks, (int64_t{1} << 20) / (per_block / 2)) << "a rank holds half the KV heads";

  c = parse(
      {"--config", writeFile("kv_cache_bytes.yaml", "model: {dir: " + dir + "}\nengine: {kv_cache_bytes: 2MiB}\n")});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(resolveKvCacheBytes(*c).ok());
  EXPECT_EQ(c->engine.num_blocks, (int64_t{2} << 20) / per_block);

  c = parse({"--model-dir", dir, "--num-blocks", "7"});  // unset: --num-blocks decides
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(resolveKvCacheBytes(*c).ok());
  EXPECT_EQ(c->engine.num_blocks, 7);

  c = parse({"--model-dir", dir, "--kv-cache-bytes", "100"});
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Status small = resolveKvCacheBytes(*c);
  EXPECT_NE(std::string(small.message())
                .find("--kv-cache-bytes 100 holds no KV block: one takes " + std::to_string(per_block) + " bytes"),
            std::string::npos)
      << small;

  for (const char* bad : {"40GB!", "-1", "1.5Gi", "lots"}) {
    c = parse({"--model-dir", dir, "--kv-cache-bytes", bad});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(std::string(c.status().message()).find("--kv-cache-bytes: expected a size such as 40Gi"),
              std::string::npos)
        << c.status();
  }
  c = parse({"--config", writeFile("kv_cache_bytes_bad.yaml", "model: {dir: m}\nengine: {kv_cache_bytes: huge}\n")});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("kv_cache_bytes"), std::string::npos) << c.status();
}

TEST(AgentConfigTest, BadInputNamesTheProblem) {
  auto msg = [](const absl::StatusOr<AgentConfig>& c) { return std::string(c.status().message()); };
  EXPECT_NE(msg(parse({"--model-dir", "m", "--num-blocks", "many"})).find("--num-blocks: expected a number"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--num-blocks", "0"})).find("out of range"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--bogus", "1"})).find("unknown flag --bogus"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir"})).find("--model-dir: missing value"), std::string::npos);
  EXPECT_NE(msg(parse({})).find("--model-dir (model.dir) is required"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--listen", "nowhere"})).find("expected HOST:PORT"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--log-format", "xml"})).find("not one of: text, json"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "router"}))
                .find("role router needs exactly one of --decode-workers (router.decode_workers) and --decode-service "
                      "(discovery.decode_service)"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "router", "--decode-workers", "a:1", "--decode-service", "d"}))
                .find("needs exactly one of --decode-workers"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "router", "--decode-service", "d", "--prefill-workers", "p:1",
                       "--prefill-service", "p"}))
                .find("exclude each other"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "decode"}))
                .find("role decode needs exactly one of --prefill-peers (kv.prefill_peers)"),
            std::string::npos);
  EXPECT_TRUE(parse({"--model-dir", "m", "--role", "decode", "--prefill-service", "pool-prefill"}).ok());
  EXPECT_TRUE(parse({"--model-dir", "m", "--role", "router", "--decode-service", "d", "--prefill-service", "p"}).ok());
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "router", "--decode-workers", "a:1,nohost"}))
                .find("--decode-workers: expected HOST:PORT, got \"nohost\""),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "router", "--decode-workers", "a:1,a:1"})).find("listed twice"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--route-sticky-weight", "-1"})).find("out of range"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--route-migrate-after", "0"})).find("out of range"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--prefix-cache", "maybe"}))
                .find("--prefix-cache: expected true or false, got \"maybe\""),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--route-load-floor-without-session", "yes"}))
                .find("--route-load-floor-without-session: expected true or false, got \"yes\""),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "decode", "--prefill-peer", "nohost"}))
                .find("--prefill-peer: expected HOST:PORT"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--checksum-rate", "2"})).find("out of range"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--kv-heartbeat-interval", "0s"}))
                .find("--kv-heartbeat-interval (kv.heartbeat_interval): 0s is below the 10ms minimum"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--kv-heartbeat-idle-interval", "5ms"})).find("below the 10ms minimum"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--kv-heartbeat-misses", "0"})).find("out of range"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--prefill-deadline-floor", "1ms"}))
                .find("--prefill-deadline-floor (kv.prefill_deadline_floor): 0.001s is below the 10ms minimum"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--prefill-deadline-slack", "0.5"})).find("out of range"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--prefill-assumed-rate", "0"})).find("out of range"), std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "router", "--decode-workers", "a:1", "--worker-stale-after",
                       "50ms"}))
                .find("--worker-stale-after (router.worker_stale_after): 0.05s is below the 100ms minimum"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "router", "--decode-workers", "a:1", "--unserved-timeout", "0s"}))
                .find("--unserved-timeout (router.unserved_timeout): 0s is below the 100ms minimum"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--kv-heartbeat-interval", "soon"})).find("expected a duration"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--drain-grace", "5"})).find("expected a duration"), std::string::npos);
  EXPECT_NE(msg(parse({"positional"})).find("unexpected argument"), std::string::npos);

  std::string path = writeFile("bad.yaml", "engine:\n  num_blokcs: 3\n  block_size: big\n");
  std::string m = msg(parse({"--config", path}));
  EXPECT_NE(m.find("engine.num_blokcs: unknown key"), std::string::npos) << m;
  EXPECT_NE(m.find("engine.block_size: expected integer"), std::string::npos) << m;
  EXPECT_NE(msg(parse({"--config", "/nonexistent.yaml"})).find("/nonexistent.yaml"), std::string::npos);
  std::string broken = writeFile("broken.yaml", "engine: [1,\n");
  EXPECT_NE(msg(parse({"--config", broken})).find("invalid YAML"), std::string::npos);
}

TEST(AgentConfigTest, WorkerStreamSettingsFromYamlAndFlags) {
  auto d = parse({"--model-dir", "m"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->events_load_interval, std::chrono::milliseconds(50));
  EXPECT_EQ(d->events_heartbeat, std::chrono::milliseconds(500));
  EXPECT_EQ(d->events_buffer, 4096);
  std::string path = writeFile("events.yaml", R"(
model:
  dir: /models/tiny
events:
  load_interval: 10ms
  heartbeat: 2s
  buffer: 64
)");
  auto c = parse({"--config", path, "--events-heartbeat", "0s"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->events_load_interval, std::chrono::milliseconds(10));
  EXPECT_EQ(c->events_heartbeat, Duration(0));  // the flag wins
  EXPECT_EQ(c->events_buffer, 64);
  EXPECT_NE(parse({"--model-dir", "m", "--events-buffer", "0"}).status().message().find("out of range"),
            absl::string_view::npos);
}

TEST(AgentConfigTest, RoleAndPrefillPeerAreParsedOnce) {
  auto c = parse({"--model-dir", "m"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, AgentRole::kBoth);
  EXPECT_TRUE(c->prefill_peers.empty());
  c = parse({"--model-dir", "m", "--role", "decode", "--prefill-peer", "10.0.0.1:8201"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, AgentRole::kDecode);
  ASSERT_EQ(c->prefill_peers.size(), 1u);
  EXPECT_EQ(c->prefill_peers[0].host, "10.0.0.1");
  EXPECT_EQ(c->prefill_peers[0].port, 8201);
  std::string path = writeFile("roles.yaml", "role: prefill\nmodel:\n  dir: m\nkv:\n  prefill_peer: p:1\n");
  c = parse({"--config", path});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, AgentRole::kPrefill);
  ASSERT_EQ(c->prefill_peers.size(), 1u);
  EXPECT_EQ(c->prefill_peers[0].host, "p");
  auto msg = [](const absl::StatusOr<AgentConfig>& r) { return std::string(r.status().message()); };
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "wizard"}))
                .find("--role: \"wizard\" is not one of: both, prefill, decode, router"),
            std::string::npos);
  std::string bad = writeFile("bad_roles.yaml", "role: wizard\nmodel:\n  dir: m\nkv:\n  prefill_peer: nohost\n");
  std::string m = msg(parse({"--config", bad}));
  EXPECT_NE(m.find("role"), std::string::npos) << m;
  EXPECT_NE(m.find("kv.prefill_peer: expected HOST:PORT"), std::string::npos) << m;
  EXPECT_EQ(agentRoleName(AgentRole::kPrefill), "prefill");
  EXPECT_NE(agentHelp().find("--role VALUE"), std::string::npos);
}

TEST(AgentConfigTest, PrefillPeersListAndItsOneElementAlias) {
  auto c = parse({"--model-dir", "m", "--role", "decode", "--prefill-peers", "10.0.0.1:8200,p-1:8201"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->prefill_peers.size(), 2u);
  EXPECT_EQ(c->prefill_peers[1].host, "p-1");
  EXPECT_EQ(c->prefill_peers[1].port, 8201);
  std::string path = writeFile("peers.yaml", "role: decode\nmodel:\n  dir: m\nkv:\n  prefill_peers: [a:1, b:2, c:3]\n");
  c = parse({"--config", path});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->prefill_peers.size(), 3u);
  EXPECT_EQ(c->prefill_peers[2].host, "c");
  // The alias is the one-element list; a flag wins over the file.
  c = parse({"--config", path, "--prefill-peer", "d:4"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->prefill_peers.size(), 1u);
  EXPECT_EQ(c->prefill_peers[0].host, "d");

  auto msg = [](const absl::StatusOr<AgentConfig>& r) { return std::string(r.status().message()); };
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "decode", "--prefill-peers", "a:1,nohost"}))
                .find("--prefill-peers: expected HOST:PORT, got \"nohost\""),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "decode", "--prefill-peers", "a:1,,b:2"}))
                .find("--prefill-peers: expected HOST:PORT, got \"\""),
            std::string::npos);
  EXPECT_NE(
      msg(parse({"--model-dir", "m", "--role", "decode", "--prefill-peers", "a:1,a:1"})).find("a:1 is listed twice"),
      std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--role", "decode", "--prefill-peer", "a:1,b:2"}))
                .find("--prefill-peer: expected one HOST:PORT"),
            std::string::npos);
  std::string bad = writeFile("bad_peers.yaml", "model:\n  dir: m\nkv:\n  prefill_peers: [a:1, x]\n");
  EXPECT_NE(msg(parse({"--config", bad})).find("kv.prefill_peers: expected HOST:PORT, got \"x\""), std::string::npos)
      << msg(parse({"--config", bad}));
}

TEST(AgentConfigTest, ModelFingerprintAndCacheSalt) {
  auto c = parse({"--model-dir", "m"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->model_fingerprint.has_value());
  EXPECT_EQ(c->cache_salt, "");
  c = parse({"--model-dir", "m", "--model-fingerprint", "0x00000000deadbeef", "--cache-salt", "tenant-a"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_fingerprint, 0xdeadbeefu);
  EXPECT_EQ(c->cache_salt, "tenant-a");
  std::string path = writeFile("fp.yaml", "model:\n  dir: m\n  fingerprint: abc\n  cache_salt: t\n");
  c = parse({"--config", path});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_fingerprint, 0xabcu);
  EXPECT_EQ(c->cache_salt, "t");
  // Empty, as in docs/agent.md's example: computed from the files.
  c = parse({"--config", writeFile("fp_empty.yaml", "model:\n  dir: m\n  fingerprint: \"\"\n")});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->model_fingerprint.has_value());
  c = parse({"--config", path, "--model-fingerprint", ""});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->model_fingerprint.has_value()) << "an empty flag unpins the file's value";
  auto msg = [](const absl::StatusOr<AgentConfig>& r) { return std::string(r.status().message()); };
  EXPECT_NE(msg(parse({"--model-dir", "m", "--model-fingerprint", "main"}))
                .find("--model-fingerprint: expected 1 to 16 hex digits, got \"main\""),
            std::string::npos);
  std::string bad = writeFile("bad_fp.yaml", "model:\n  dir: m\n  fingerprint: 12345678901234567\n");
  EXPECT_NE(msg(parse({"--config", bad})).find("model.fingerprint: expected 1 to 16 hex digits"), std::string::npos)
      << msg(parse({"--config", bad}));
}

TEST(AgentConfigTest, ApiKeySettingsFromYamlAndFlags) {
  std::string path = writeFile("api_keys.yaml", R"(
model:
  dir: m
api_keys:
  file: /etc/tandem/api-keys/keys.yaml
  reload_interval: 2s
  requests_per_second: 2.5
  burst: 5
  max_concurrent: 3
)");
  auto c = parse({"--config", path, "--api-key-max-concurrent", "8"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->api_keys_file, "/etc/tandem/api-keys/keys.yaml");
  EXPECT_EQ(c->api_keys_reload_interval, std::chrono::seconds(2));
  EXPECT_EQ(c->api_key_limits.requests_per_second, 2.5);
  EXPECT_EQ(c->api_key_limits.burst, 5);
  EXPECT_EQ(c->api_key_limits.max_concurrent, 8);  // the flag wins
  auto defaults = parse({"--model-dir", "m"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->api_keys_file, "");  // off unless asked for
  EXPECT_EQ(defaults->api_key_limits.requests_per_second, 0);
  auto msg = [](const absl::StatusOr<AgentConfig>& r) { return std::string(r.status().message()); };
  EXPECT_NE(msg(parse({"--model-dir", "m", "--api-keys-file", "k", "--api-keys-reload-interval", "10ms"}))
                .find("--api-keys-reload-interval (api_keys.reload_interval): 0.01s is below the 100ms minimum"),
            std::string::npos);
  EXPECT_NE(msg(parse({"--model-dir", "m", "--api-key-burst", "-1"})).find("--api-key-burst: -1 is out of range"),
            std::string::npos);
  EXPECT_NE(agentHelp().find("tandem-agent hash-api-key --name NAME"), std::string::npos);
}

TEST(AgentConfigTest, HelpListsEveryFlagWithYamlKey) {
  bool help = false;
  auto c = parse({"--help"}, &help);
  EXPECT_TRUE(help);
  std::string h = agentHelp();
  for (const char* flag : {"--model-dir", "--listen", "--num-blocks", "--block-size", "--max-batched-tokens",
                           "--max-waiting", "--request-timeout", "--drain-grace", "--trace-file", "--log-format"}) {
    EXPECT_NE(h.find(flag), std::string::npos) << flag;
  }
  EXPECT_NE(h.find("yaml: engine.num_blocks"), std::string::npos);
}

}  // namespace
}  // namespace tandem::agent
