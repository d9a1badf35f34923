// P/D with the KV pool in device memory (docs/cuda.md, "KV transport from
// device memory"): the engine stages the pool through host memory the
// transport reads and writes (EngineOptions::kv_staging). A leased prefill's
// layer blocks are downloaded there before they are announced, and an
// import's blocks are uploaded from there when it completes; moving the
// staging copies' bytes the way the transport's gets do gives D the output
// of one engine alone. Runs on the CPU executor, whose device memory the
// host must not touch either (KvStorage asserts it).

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "engine/backend/cuda/kernel_backend.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::engine {
namespace {

using testing::greedy;
using testing::Harness;
using testing::randomPrompt;

EngineOptions opts() {
  EngineOptions o;
  o.num_blocks = 64;
  o.block_size = 16;
  o.max_num_batched_tokens = 64;  // several prefill chunks for longer prompts
  o.max_num_seqs = 8;
  o.seed = 5;
  return o;
}

// 64-byte aligned host memory, as the agent's UCX region is.
absl::StatusOr<KvMemory> hostMemory(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) return absl::ResourceExhaustedError("aligned_alloc");
  return KvMemory{.bytes = {static_cast<std::byte*>(p), bytes}, .keep_alive = std::shared_ptr<void>(p, std::free)};
}

// An engine on the kernels whose KV pool is in the device's memory, staged
// through host memory when `staged`.
std::unique_ptr<Harness> onDevice(bool staged) {
  auto backend = std::make_unique<KernelBackend>();
  KernelBackend* raw = backend.get();
  EngineOptions o = opts();
  o.kv_memory = [raw](size_t bytes) { return raw->kvMemory(bytes); };
  if (staged) o.kv_staging = hostMemory;
  return std::make_unique<Harness>(o, true, std::move(backend));
}

TEST(StagedKvTest, LeasedPrefillPlusImportThroughStagingEqualsOneEngine) {
  std::mt19937 rng(33);
  for (int len : {5, 16, 17, 150}) {
    auto prompt = randomPrompt(rng, len);
    const size_t num_blocks = static_cast<size_t>((len + 15) / 16);
    auto mono = onDevice(false);
    const RequestId ref = mono->add(greedy(prompt, 8));
    mono->runToCompletion();

    auto d = onDevice(true);
    ASSERT_TRUE(d->engine->kvStaged());
    RequestSpec ds = greedy(prompt, 8);
    ds.import_kv = true;
    const RequestId did = d->add(ds);
    for (int i = 0; i < 3; ++i) d->step();
    const std::vector<BlockId> d_blocks = d->outcome(did).kv_blocks;
    ASSERT_EQ(d_blocks.size(), num_blocks);

    auto p = onDevice(true);
    RequestId pid;
    const KvLayout& lay = p->engine->kv().layout();
    int announced = 0;
    p->engine->setLayerObserver([&](int layer, std::span<const Engine::LayerReady> ready) {
      ASSERT_EQ(ready.size(), 1u);
      const Engine::LayerReady& r = ready[0];
      // What D's get reads: P's staging copy, at the block's place in the pool.
      for (size_t i = 0; i < r.blocks.size(); ++i) {
        const size_t from = p->engine->kv().layerBlockByteOffset(layer, r.blocks[i]);
        const size_t to = d->engine->kv().layerBlockByteOffset(layer, d_blocks[r.first_block + i]);
        std::memcpy(d->engine->kvRegion().data() + to, p->engine->kvRegion().data() + from, lay.bytesPerLayerBlock());
        ++announced;
      }
    });
    RequestSpec ps = greedy(prompt, 1);
    ps.lease = LeaseSpec{9, p->clock.now() + std::chrono::seconds(30)};
    pid = p->add(ps);
    p->runToCompletion();
    ASSERT_EQ(p->outcome(pid).tokens.size(), 1u);
    EXPECT_EQ(announced, static_cast<int>(num_blocks) * lay.num_layers);

    ASSERT_TRUE(d->engine->completeImport(did, p->outcome(pid).tokens[0]));
    d->runToCompletion();
    EXPECT_EQ(d->outcome(did).tokens, mono->outcome(ref).tokens) << "prompt length " << len;
    EXPECT_EQ(d->outcome(did).final.finish_reason, FinishReason::kLength) << d->outcome(did).final.message;
    EXPECT_TRUE(p->engine->releaseLease(9));
  }
}

TEST(StagedKvTest, TheDevicePoolIsWhatDecodeReadsNotTheStagingCopy) {
  // The import's KV reaches the device pool only through completeImport's
  // upload: a staging copy written after it changes nothing, and one left
  // unwritten (zeros) changes the output.
  std::mt19937 rng(34);
  const auto prompt = randomPrompt(rng, 40);
  auto mono = onDevice(false);
  const RequestId ref = mono->add(greedy(prompt, 8));
  mono->runToCompletion();

  auto d = onDevice(true);
  RequestSpec ds = greedy(prompt, 8);
  ds.import_kv = true;
  const RequestId did = d->add(ds);
  for (int i = 0; i < 3; ++i) d->step();
  auto p = onDevice(true);
  p->engine->setLayerObserver([](int, std::span<const Engine::LayerReady>) {});
  RequestSpec ps = greedy(prompt, 1);
  ps.lease = LeaseSpec{3, p->clock.now() + std::chrono::seconds(30)};
  const RequestId pid = p->add(ps);
  p->runToCompletion();
  // Nothing copied into D's staging: its pool gets zeros.
  ASSERT_TRUE(d->engine->completeImport(did, p->outcome(pid).tokens[0]));
  d->runToCompletion();
  EXPECT_NE(d->outcome(did).tokens, mono->outcome(ref).tokens) << "zero KV gave the same output";
}

TEST(StagedKvTest, StagingIsForADevicePoolAndMustBeHostMemory) {
  // A host pool needs no staging: refused by name.
  EngineOptions host_pool = opts();
  host_pool.kv_staging = hostMemory;
  auto e = Engine::create(host_pool, testing::tinyWeights(), makeCpuBackend(), nullptr, SystemClock::instance());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("kv_staging: is for a KV pool in device memory"), std::string::npos)
      << e.status();

  // Device memory as staging: refused by name.
  auto backend = std::make_unique<KernelBackend>();
  KernelBackend* raw = backend.get();
  EngineOptions device_staging = opts();
  device_staging.kv_memory = [raw](size_t bytes) { return raw->kvMemory(bytes); };
  device_staging.kv_staging = [raw](size_t bytes) { return raw->kvMemory(bytes); };
  e = Engine::create(device_staging, testing::tinyWeights(), std::move(backend), nullptr, SystemClock::instance());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("kv_staging: must be host memory"), std::string::npos) << e.status();

  // Too small: the reason names the option.
  backend = std::make_unique<KernelBackend>();
  raw = backend.get();
  EngineOptions small = opts();
  small.kv_memory = [raw](size_t bytes) { return raw->kvMemory(bytes); };
  small.kv_staging = [](size_t bytes) { return hostMemory(bytes / 2); };
  e = Engine::create(small, testing::tinyWeights(), std::move(backend), nullptr, SystemClock::instance());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("kv_staging"), std::string::npos) << e.status();

  // A device pool without staging serves alone; it has nothing a transport could register.
  auto alone = onDevice(false);
  EXPECT_FALSE(alone->engine->kvStaged());
  EXPECT_TRUE(alone->engine->kvRegion().empty());
}

}  // namespace
}  // namespace tandem::engine
