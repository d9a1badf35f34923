// P/D with the KV pool in device memory (docs/cuda.md, "KV transport from
// device memory"): the engine stages the pool through host memory the
// transport reads and writes (EngineOptions::kv_staging). A leased prefill's
// layer blocks are downloaded there before they are announced, and an
// import's blocks are uploaded from there when it completes; moving the
// staging copies' bytes the way the transport's gets do gives D the output
// of one engine alone. Runs on the CPU executor, whose device memory the
// host must not touch either (KvStorage asserts it).
//
// Or the transport registers the device pool itself (EngineOptions::
// kv_direct): nothing is staged, and the checksums announced with each layer
// and those a decode engine checks pulled blocks with are computed on the
// device (kvChecksumKernel). Here the gets' writes into the pool are
// memcpys, which the executor's device memory (host memory) allows.

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

enum class Transport { kNone, kStaged, kDirect };

// An engine on the kernels whose KV pool is in the device's memory, staged
// through host memory or read by the transport in place.
std::unique_ptr<Harness> onDevice(Transport transport) {
  auto backend = std::make_unique<KernelBackend>();
  KernelBackend* raw = backend.get();
  EngineOptions o = opts();
  o.kv_memory = [raw](size_t bytes) { return raw->kvMemory(bytes); };
  if (transport == Transport::kStaged) o.kv_staging = hostMemory;
  o.kv_direct = transport == Transport::kDirect;
  return std::make_unique<Harness>(o, true, std::move(backend));
}
std::unique_ptr<Harness> onDevice(bool staged) { return onDevice(staged ? Transport::kStaged : Transport::kNone); }

// A leased prefill of `prompt` on `p` and its import on `d`, the staging
// copies' bytes moved the way the transport's gets move them (P's staging
// at P's blocks into D's staging at D's blocks, as each layer is
// announced). Returns D's request, imported and not yet run; `p_blocks`
// gets the prefill's blocks.
RequestId transfer(Harness& p, Harness& d, const std::vector<TokenId>& prompt, uint64_t lease,
                   std::vector<BlockId>* p_blocks = nullptr) {
  RequestSpec ds = greedy(prompt, 8);
  ds.import_kv = true;
  const RequestId did = d.add(ds);
  for (int i = 0; i < 3; ++i) d.step();
  const std::vector<BlockId> d_blocks = d.outcome(did).kv_blocks;
  const size_t num_blocks = (prompt.size() + 15) / 16;
  EXPECT_EQ(d_blocks.size(), num_blocks);
  const KvLayout& lay = p.engine->kv().layout();
  int announced = 0;
  p.engine->setLayerObserver([&](int layer, std::span<const Engine::LayerReady> ready) {
    for (const Engine::LayerReady& r : ready) {
      ASSERT_EQ(r.checksums.size(), r.blocks.size());
      for (size_t i = 0; i < r.blocks.size(); ++i) {
        const size_t from = p.engine->kv().layerBlockByteOffset(layer, r.blocks[i]);
        const size_t to = d.engine->kv().layerBlockByteOffset(layer, d_blocks[r.first_block + i]);
        const std::span<const std::byte> sent = p.engine->kvRegion().subspan(from, lay.bytesPerLayerBlock());
        EXPECT_EQ(r.checksums[i], layerBlockChecksum(sent)) << "layer " << layer << " block " << i;
        std::memcpy(d.engine->kvRegion().data() + to, sent.data(), sent.size());
        // What D checks the pulled block with: the same checksum.
        const KvLayerBlock landed[] = {{.layer = layer, .block = d_blocks[r.first_block + i]}};
        uint64_t sum = 0;
        EXPECT_TRUE(d.engine->kvRegionChecksums(landed, std::span<uint64_t>(&sum, 1)).ok());
        EXPECT_EQ(sum, r.checksums[i]) << "layer " << layer << " block " << i;
        ++announced;
      }
    }
  });
  RequestSpec ps = greedy(prompt, 1);
  ps.lease = LeaseSpec{lease, p.clock.now() + std::chrono::seconds(30)};
  const RequestId pid = p.add(ps);
  int64_t to_host = 0;  // what the steps' stats say was staged
  for (int i = 0; i < 1000 && p.engine->hasWork(); ++i) to_host += p.step().kv_staged_to_host_bytes;
  p.engine->setLayerObserver(nullptr);
  EXPECT_EQ(p.outcome(pid).tokens.size(), 1u);
  EXPECT_EQ(announced, static_cast<int>(num_blocks) * lay.num_layers) << "each block once per layer";
  const int64_t staged = p.engine->kvStaged() ? static_cast<int64_t>(announced * lay.bytesPerLayerBlock()) : 0;
  EXPECT_EQ(to_host, staged);
  if (p_blocks != nullptr) *p_blocks = p.outcome(pid).kv_blocks;
  EXPECT_TRUE(d.engine->completeImport(did, p.outcome(pid).tokens.at(0)));
  // The upload happened in completeImport; the next step's stats count it.
  EXPECT_EQ(d.step().kv_staged_to_device_bytes,
            d.engine->kvStaged() ? static_cast<int64_t>(announced * lay.bytesPerLayerBlock()) : 0);
  return did;
}

std::vector<TokenId> oneEngine(const std::vector<TokenId>& prompt) {
  auto mono = onDevice(false);
  const RequestId ref = mono->add(greedy(prompt, 8));
  mono->runToCompletion();
  return mono->outcome(ref).tokens;
}

TEST(StagedKvTest, LeasedPrefillPlusImportThroughStagingEqualsOneEngine) {
  std::mt19937 rng(33);
  for (int len : {5, 16, 17, 150}) {
    const auto prompt = randomPrompt(rng, len);
    auto p = onDevice(true);
    auto d = onDevice(true);
    ASSERT_TRUE(p->engine->kvStaged() && d->engine->kvStaged());
    const RequestId did = transfer(*p, *d, prompt, 9);
    d->runToCompletion();
    EXPECT_EQ(d->outcome(did).tokens, oneEngine(prompt)) << "prompt length " << len;
    EXPECT_EQ(d->outcome(did).final.finish_reason, FinishReason::kLength) << d->outcome(did).final.message;
    EXPECT_TRUE(p->engine->releaseLease(9));
  }
}

TEST(StagedKvTest, ADirectPoolIsReadInPlaceWithChecksumsFromTheDevice) {
  // No staging copy: the region is the device pool itself, nothing is
  // copied to or from the host, and the answers are one engine's. Also
  // between a direct prefill engine and a staged decode engine, and back.
  std::mt19937 rng(36);
  for (auto [pt, dt] :
       {std::pair{Transport::kDirect, Transport::kDirect}, std::pair{Transport::kDirect, Transport::kStaged},
        std::pair{Transport::kStaged, Transport::kDirect}}) {
    for (int len : {5, 150}) {
      if (len > 5 && pt != dt) continue;  // the mixed pairs: one short prompt
      const auto prompt = randomPrompt(rng, len);
      auto p = onDevice(pt);
      auto d = onDevice(dt);
      for (Harness* h : {p.get(), d.get()}) {
        const bool direct = h->engine->options().kv_direct;
        EXPECT_EQ(h->engine->kvRegionOnDevice(), direct);
        EXPECT_EQ(h->engine->kvStaged(), !direct);
        if (direct) {
          EXPECT_EQ(h->engine->kvRegion().data(), h->engine->kv().data()) << "the region is the pool";
        }
      }
      const RequestId did = transfer(*p, *d, prompt, 9);
      d->runToCompletion();
      EXPECT_EQ(d->outcome(did).tokens, oneEngine(prompt)) << "prompt length " << len;
      EXPECT_TRUE(p->engine->releaseLease(9));
    }
  }
}

TEST(StagedKvTest, DirectIsForADevicePoolAloneWithoutStaging) {
  EngineOptions host_pool = opts();
  host_pool.kv_direct = true;
  auto e = Engine::create(host_pool, testing::tinyWeights(), makeCpuBackend(), nullptr, SystemClock::instance());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("kv_direct: is for a KV pool in device memory"), std::string::npos) << e.status();

  auto backend = std::make_unique<KernelBackend>();
  KernelBackend* raw = backend.get();
  EngineOptions both = opts();
  both.kv_memory = [raw](size_t bytes) { return raw->kvMemory(bytes); };
  both.kv_staging = hostMemory;
  both.kv_direct = true;
  e = Engine::create(both, testing::tinyWeights(), std::move(backend), nullptr, SystemClock::instance());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("kv_direct: and kv_staging exclude each other"), std::string::npos) << e.status();
}

TEST(StagedKvTest, APrefixCachedOnPrefillIsStagedWithTheRest) {
  // P computed a prompt before: a new one sharing its first 48 tokens reuses
  // those blocks from P's prefix cache (computed, and staged, long before)
  // and takes new ones after another request's; its blocks are two runs.
  std::mt19937 rng(35);
  const auto earlier = randomPrompt(rng, 64);
  std::vector<TokenId> prompt(earlier.begin(), earlier.begin() + 48);
  const auto suffix = randomPrompt(rng, 40);
  prompt.insert(prompt.end(), suffix.begin(), suffix.end());
  auto p = onDevice(true);
  auto d = onDevice(true);
  p->add(greedy(earlier, 1));
  p->add(greedy(randomPrompt(rng, 40), 1));
  p->runToCompletion();
  std::vector<BlockId> p_blocks;
  const RequestId did = transfer(*p, *d, prompt, 4, &p_blocks);
  ASSERT_EQ(p_blocks.size(), 6u);
  bool gap = false;
  for (size_t i = 1; i < p_blocks.size(); ++i) gap |= p_blocks[i].value() != p_blocks[i - 1].value() + 1;
  EXPECT_TRUE(gap) << "the prefill's blocks are one run: the cached prefix was not reused";
  d->runToCompletion();
  EXPECT_EQ(d->outcome(did).tokens, oneEngine(prompt));
}

TEST(StagedKvTest, DecodeReadsTheDevicePoolNotTheStagingCopy) {
  // The import's KV reaches the device pool at completeImport, and from then
  // on decoding reads the pool: the staging copy overwritten after it
  // changes nothing.
  std::mt19937 rng(34);
  const auto prompt = randomPrompt(rng, 40);
  auto p = onDevice(true);
  auto d = onDevice(true);
  const RequestId did = transfer(*p, *d, prompt, 3);
  std::memset(d->engine->kvRegion().data(), 0x7f, d->engine->kvRegion().size());
  d->runToCompletion();
  EXPECT_EQ(d->outcome(did).tokens, oneEngine(prompt));
}

TEST(StagedKvTest, TheStagingCopyIsPinnedWhileTheEngineLives) {
  // Page-locked for the device's copies (a GPU copies it by DMA, and
  // asynchronously) from creation until the engine is destroyed.
  auto device = std::make_shared<gpu::ExecutorDevice>();
  auto backend = std::make_unique<KernelBackend>(device, KernelBackendOptions{});
  KernelBackend* raw = backend.get();
  EngineOptions o = opts();
  o.kv_memory = [raw](size_t bytes) { return raw->kvMemory(bytes); };
  o.kv_staging = hostMemory;
  auto harness = std::make_unique<Harness>(o, true, std::move(backend));
  const std::span<std::byte> staging = harness->engine->kvRegion();
  ASSERT_FALSE(staging.empty());
  EXPECT_TRUE(harness->engine->kvStagingPinned().ok()) << harness->engine->kvStagingPinned();
  EXPECT_TRUE(device->pinned(staging.data(), staging.size()));
  harness.reset();
  EXPECT_FALSE(device->pinned(staging.data(), 1)) << "unpinned with the engine";

  // Without staging nothing is pinned.
  auto alone = onDevice(false);
  EXPECT_TRUE(alone->engine->kvStagingPinned().ok());
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
