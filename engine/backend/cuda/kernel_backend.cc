#include "engine/backend/cuda/kernel_backend.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <bit>
#include <cstring>

#include <absl/strings/str_cat.h>

#include "engine/backend/cuda/kernels.h"
#include "engine/backend/cuda/sampling_kernel.h"
#include "engine/backend/kernel_math.h"
#include "engine/backend/scoped_timer.h"

namespace tandem::engine {
namespace {

size_t size(int64_t rows, int64_t cols) { return static_cast<size_t>(rows) * static_cast<size_t>(cols); }

// Device memory, released to its device with the buffer (or, host memory
// the device adopted, forgotten by it).
class DeviceBuffer final : public BackendBuffer {
 public:
  DeviceBuffer(float* data, size_t floats, std::shared_ptr<gpu::Device> device, bool adopted)
      : BackendBuffer(data, floats), device_(std::move(device)), adopted_(adopted) {}
  ~DeviceBuffer() override {
    if (adopted_) {
      device_->forgetHost(data());
    } else {
      device_->release(data());
    }
  }

 private:
  std::shared_ptr<gpu::Device> device_;
  bool adopted_;
};

// The CPU backend's GEMM on the executor device's (host) memory.
class CpuKernelGemm final : public KernelGemm {
 public:
  explicit CpuKernelGemm(const CpuBackendOptions& options) : cpu_(options) {}
  std::unique_ptr<PreparedWeight> prepareWeight(const float* w_host, int32_t n, int32_t k) override {
    return cpu_.prepareWeight(w_host, n, k);
  }
  absl::Status gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) override {
    cpu_.gemm(x, w, y, m, accumulate);
    return absl::OkStatus();
  }
  absl::Status gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k,
                    bool accumulate) override {
    cpu_.gemm(x, w, y, m, n, k, accumulate);
    return absl::OkStatus();
  }
  BackendStats stats() const override { return cpu_.stats(); }
  void resetStats() override { cpu_.resetStats(); }

 private:
  CpuBackend cpu_;
};

}  // namespace

std::unique_ptr<KernelGemm> cpuKernelGemm(const CpuBackendOptions& options) {
  return std::make_unique<CpuKernelGemm>(options);
}

KernelBackend::KernelBackend(const KernelBackendOptions& options)
    : KernelBackend(std::make_shared<gpu::ExecutorDevice>(options.executor), cpuKernelGemm(options.gemm)) {}

KernelBackend::KernelBackend(std::shared_ptr<gpu::Device> device, std::unique_ptr<KernelGemm> gemm)
    : device_(std::move(device)), gemm_(std::move(gemm)) {}

KernelBackend::~KernelBackend() {
  if (adopted_kv_ != nullptr) device_->forgetHost(const_cast<void*>(adopted_kv_));
}

const gpu::CpuExecutor* KernelBackend::executor() const {
  const auto* e = dynamic_cast<const gpu::ExecutorDevice*>(device_.get());
  return e != nullptr ? &e->executor() : nullptr;
}

bool KernelBackend::ok(const absl::Status& s) {
  if (status_.ok() && !s.ok()) status_ = s;
  return status_.ok();
}

bool KernelBackend::inDeviceMemory(const char* call, std::initializer_list<Arg> args) {
  if (!status_.ok()) return false;
  for (const Arg& a : args) {
    if (a.floats == 0 || device_->owns(a.p, a.floats * sizeof(float))) continue;
    status_ = absl::InvalidArgumentError(absl::StrCat(
        call, ": ", a.name, " (", a.floats,
        " floats) is not backend memory (Backend::allocate or residentWeight): a device backend would be handed "
        "a host pointer"));
    return false;
  }
  return true;
}

float* KernelBackend::kvPool(const KvStorage& kv) {
  float* pool = kv.data();
  const size_t bytes = kv.layout().totalFloats() * sizeof(float);
  if (device_->owns(pool, bytes)) return pool;
  if (adopted_kv_ != nullptr) device_->forgetHost(const_cast<void*>(adopted_kv_));  // a new pool: the old one is gone
  adopted_kv_ = nullptr;
  if (kv.onDevice() || !device_->adoptHost(pool, bytes).ok()) {
    ok(absl::FailedPreconditionError(absl::StrCat(
        "the KV cache is not in ", device_->name(), "'s memory (give the engine KernelBackend::kvMemory)")));
    return nullptr;
  }
  adopted_kv_ = pool;
  return pool;
}

absl::StatusOr<KvMemory> KernelBackend::kvMemory(size_t bytes) {
  TANDEM_ASSIGN_OR_RETURN(void* p, device_->allocate(bytes));
  std::shared_ptr<void> keep(p, [device = device_](void* q) { device->release(q); });
  TANDEM_RETURN_IF_ERROR(device_->zero(p, bytes));
  return KvMemory{.bytes = {static_cast<std::byte*>(p), bytes}, .keep_alive = std::move(keep), .device = true};
}

std::unique_ptr<BackendBuffer> KernelBackend::allocate(size_t floats) {
  absl::StatusOr<void*> p = device_->allocate(floats * sizeof(float));
  if (!ok(p.status())) return nullptr;
  return std::make_unique<DeviceBuffer>(static_cast<float*>(*p), floats, device_, false);
}

std::unique_ptr<BackendBuffer> KernelBackend::residentWeight(std::span<const float> host) {
  // In place where the device can (the executor's host memory), else a copy.
  auto* p = const_cast<float*>(host.data());
  if (!host.empty() && device_->adoptHost(p, host.size_bytes()).ok()) {
    return std::make_unique<DeviceBuffer>(p, host.size(), device_, true);
  }
  std::unique_ptr<BackendBuffer> b = allocate(host.size());
  if (b != nullptr && !ok(device_->upload(b->data(), host.data(), host.size_bytes()))) return nullptr;
  return b;
}

void KernelBackend::add(float* x, const float* y, int64_t n) {
  const ScopedTimer t(&stats_.elementwise_time);
  const auto count = static_cast<size_t>(n);
  if (n <= 0 || !inDeviceMemory("add", {{"x", x, count}, {"y", y, count}})) return;
  ok(device_->add(gpu::elementwiseLaunch(n), gpu::AddArgs{x, y, n}));
}

std::unique_ptr<PreparedWeight> KernelBackend::prepareWeight(const float* w, int32_t n, int32_t k) {
  return gemm_->prepareWeight(w, n, k);
}

void KernelBackend::gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) {
  if (!inDeviceMemory("gemm", {{"x", x, size(m, w.k())}, {"y", y, size(m, w.n())}})) return;
  ok(gemm_->gemm(x, w, y, m, accumulate));
}

void KernelBackend::gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) {
  if (!inDeviceMemory("gemm", {{"x", x, size(m, k)}, {"w", w, size(n, k)}, {"y", y, size(m, n)}})) return;
  ok(gemm_->gemm(x, w, y, m, n, k, accumulate));
}

void KernelBackend::logits(const float* hidden, const PreparedWeight& lm_head, float* logits_host, int32_t m) {
  if (!inDeviceMemory("logits", {{"hidden", hidden, size(m, lm_head.k())}})) return;
  const size_t n = size(m, lm_head.n());
  float* out = d_logits_out_.reserve<float>(*this, n);
  if (out == nullptr || !ok(gemm_->gemm(hidden, lm_head, out, m, false))) return;
  ok(device_->download(logits_host, out, n * sizeof(float)));
}

void KernelBackend::rmsNorm(const float* x, const float* weight, float* out, int32_t rows, int32_t dim, float eps) {
  const ScopedTimer t(&stats_.elementwise_time);
  if (!inDeviceMemory("rmsNorm", {{"x", x, size(rows, dim)}, {"weight", weight, size(1, dim)}, {"out", out, size(rows, dim)}})) {
    return;
  }
  ok(device_->rmsNorm(gpu::rmsNormLaunch(rows), gpu::RmsNormArgs{x, weight, out, rows, dim, eps}));
}

void KernelBackend::rope(float* x, int32_t rows, int32_t num_heads, int32_t head_dim, const int32_t* positions,
                         std::span<const float> inv_freq) {
  const ScopedTimer t(&stats_.elementwise_time);
  assert(inv_freq.size() == static_cast<size_t>(head_dim / 2));
  if (!inDeviceMemory("rope", {{"x", x, size(rows, int64_t{num_heads} * head_dim)}})) return;
  int32_t max_pos = 0;
  for (int32_t r = 0; r < rows; ++r) max_pos = std::max(max_pos, positions[r]);
  // Grown in powers of two (each position's bits do not depend on the
  // table's size): a decode step adding one position uploads nothing.
  rope_table_.grow(static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(std::max(max_pos + 1, 1024)))), inv_freq);
  const std::span<const float> freq = rope_table_.frequencies();
  if (rope_table_.floats() != rope_uploaded_ || !std::equal(freq.begin(), freq.end(), rope_uploaded_freq_.begin(),
                                                            rope_uploaded_freq_.end())) {
    const bool uploaded = d_rope_cos_.upload(*this, std::span<const float>(rope_table_.cos(), rope_table_.floats())) &&
                          d_rope_sin_.upload(*this, std::span<const float>(rope_table_.sin(), rope_table_.floats()));
    if (!uploaded) return;
    rope_uploaded_ = rope_table_.floats();
    rope_uploaded_freq_.assign(freq.begin(), freq.end());
  }
  const int32_t* d_positions = d_positions_.uploadOnce(*this, std::span<const int32_t>(positions, static_cast<size_t>(rows)));
  if (d_positions == nullptr) return;
  ok(device_->rope(gpu::ropeLaunch(rows),
                   gpu::RopeArgs{x, d_positions, d_rope_cos_.reserve<float>(*this, rope_uploaded_),
                                 d_rope_sin_.reserve<float>(*this, rope_uploaded_), rows, num_heads, head_dim}));
}

void KernelBackend::addBias(float* y, const float* bias, int32_t rows, int32_t dim) {
  const ScopedTimer t(&stats_.elementwise_time);
  if (!inDeviceMemory("addBias", {{"y", y, size(rows, dim)}, {"bias", bias, size(1, dim)}})) return;
  ok(device_->addBias(gpu::elementwiseLaunch(static_cast<int64_t>(rows) * dim), gpu::AddBiasArgs{y, bias, rows, dim}));
}

void KernelBackend::swiglu(const float* gate, const float* up, float* out, int64_t n) {
  const ScopedTimer t(&stats_.elementwise_time);
  const auto count = static_cast<size_t>(n);
  if (n <= 0 || !inDeviceMemory("swiglu", {{"gate", gate, count}, {"up", up, count}, {"out", out, count}})) return;
  ok(device_->swiglu(gpu::elementwiseLaunch(n), gpu::SwigluArgs{gate, up, out, n}));
}

void KernelBackend::gatherRows(const float* src, const int32_t* rows, int32_t num_rows, int32_t dim, float* dst) {
  const ScopedTimer t(&stats_.elementwise_time);
  int32_t src_rows = 0;
  for (int32_t r = 0; r < num_rows; ++r) src_rows = std::max(src_rows, rows[r] + 1);
  if (!inDeviceMemory("gatherRows", {{"src", src, size(src_rows, dim)}, {"dst", dst, size(num_rows, dim)}})) return;
  const int32_t* d_rows = d_rows_.uploadOnce(*this, std::span<const int32_t>(rows, static_cast<size_t>(num_rows)));
  if (d_rows == nullptr) return;
  ok(device_->gatherRows(gpu::gatherRowsLaunch(num_rows), gpu::GatherRowsArgs{src, d_rows, dst, num_rows, dim}));
}

void KernelBackend::writeKv(int32_t layer, const float* k, const float* v, std::span<const ChunkDesc> chunks,
                            KvStorage& kv) {
  const ScopedTimer t(&stats_.elementwise_time);
  const KvLayout& layout = kv.layout();
  row_block_.clear();
  row_slot_.clear();
  for (const ChunkDesc& c : chunks) {
    for (int32_t r = 0; r < c.num_rows; ++r) {
      const int32_t pos = c.start_pos + r;
      row_block_.push_back(c.block_table[static_cast<size_t>(kmath::blockIndexOf(pos, layout.block_size))].value());
      row_slot_.push_back(kmath::slotOf(pos, layout.block_size));
    }
  }
  // Rows are grouped by chunk in order (backend.h): row r of the step is the r-th pushed.
  const auto rows = static_cast<int32_t>(row_block_.size());
  if (rows == 0) return;
  const size_t floats = size(rows, static_cast<int64_t>(layout.floatsPerToken()));
  if (!inDeviceMemory("writeKv", {{"k", k, floats}, {"v", v, floats}})) return;
  float* pool = kvPool(kv);
  const int32_t* d_block = d_row_block_.uploadOnce<int32_t>(*this, row_block_);
  const int32_t* d_slot = d_row_slot_.uploadOnce<int32_t>(*this, row_slot_);
  if (pool == nullptr || d_block == nullptr || d_slot == nullptr) return;
  ok(device_->writeKv(gpu::writeKvLaunch(rows), gpu::WriteKvArgs{k, v, pool, d_block, d_slot, rows, layer,
                                                                  layout.num_blocks, layout.block_size,
                                                                  layout.num_kv_heads, layout.head_dim}));
}

void KernelBackend::copyKvBlock(KvStorage& kv, BlockId src, BlockId dst) {
  const ScopedTimer t(&stats_.elementwise_time);
  if (!status_.ok()) return;
  const KvLayout& layout = kv.layout();
  float* pool = kvPool(kv);
  if (pool == nullptr) return;
  ok(device_->copyKvBlock(gpu::copyKvBlockLaunch(layout.num_layers, layout.floatsPerLayerBlock()),
                          gpu::CopyKvBlockArgs{pool, src.value(), dst.value(), layout.num_blocks,
                                               static_cast<int64_t>(layout.floatsPerLayerBlock())}));
}

void KernelBackend::downloadKv(const KvStorage& kv, size_t offset, std::span<std::byte> host) {
  if (!kv.onDevice()) return Backend::downloadKv(kv, offset, host);
  if (!status_.ok()) return;
  ok(device_->downloadAsync(host.data(), kv.bytes().data() + offset, host.size()));
}

void KernelBackend::uploadKv(KvStorage& kv, size_t offset, std::span<const std::byte> host) {
  if (!kv.onDevice()) return Backend::uploadKv(kv, offset, host);
  if (!status_.ok()) return;
  ok(device_->uploadAsync(kv.bytes().data() + offset, host.data(), host.size()));
}

void KernelBackend::finishKvCopies() {
  // Always waited for, after a failed copy too: the copies queued before it
  // read or write host memory that may be freed once this returns.
  ok(device_->synchronize());
}

absl::Status KernelBackend::pinKvHost(std::span<std::byte> host) { return device_->pinHost(host.data(), host.size()); }

void KernelBackend::unpinKvHost(std::span<std::byte> host) { device_->unpinHost(host.data()); }

void KernelBackend::attention(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                              const AttentionShape& shape, float* out) {
  const ScopedTimer t(&stats_.attention_time);
  const KvLayout& layout = kv.layout();
  if (shape.head_dim > gpu::kAttentionMaxHeadDim) {
    ok(absl::InvalidArgumentError(absl::StrCat("attention: head_dim ", shape.head_dim, " is over the ",
                                               gpu::kAttentionMaxHeadDim, " the kernel holds")));
    return;
  }
  block_tables_.clear();
  row_pos_.clear();
  row_table_.clear();
  row_split_.clear();
  int32_t splits = 0, max_splits = 1;
  for (const ChunkDesc& c : chunks) {
    const auto table_at = static_cast<int32_t>(block_tables_.size());
    for (BlockId b : c.block_table) block_tables_.push_back(b.value());
    for (int32_t r = 0; r < c.num_rows; ++r) {
      const int32_t pos = c.start_pos + r;
      const int32_t s = gpu::attentionSplits(kmath::visibleKeys(c.start_pos, r));
      row_pos_.push_back(pos);
      row_table_.push_back(table_at);
      row_split_.push_back(splits);
      splits += s;
      max_splits = std::max(max_splits, s);
    }
  }
  const auto rows = static_cast<int32_t>(row_pos_.size());
  if (rows == 0) return;
  const size_t floats = size(rows, int64_t{shape.num_heads} * shape.head_dim);
  if (!inDeviceMemory("attention", {{"q", q, floats}, {"out", out, floats}})) return;
  const float* pool = kvPool(kv);
  float* partial = d_partial_.reserve<float>(*this, static_cast<size_t>(splits) * static_cast<size_t>(shape.num_heads) *
                                                    static_cast<size_t>(gpu::attentionPartialFloats(shape.head_dim)));
  const int32_t* d_tables = d_block_tables_.uploadOnce<int32_t>(*this, block_tables_);
  const int32_t* d_pos = d_row_pos_.uploadOnce<int32_t>(*this, row_pos_);
  const int32_t* d_table = d_row_table_.uploadOnce<int32_t>(*this, row_table_);
  const int32_t* d_split = d_row_split_.uploadOnce<int32_t>(*this, row_split_);
  if (!status_.ok() || pool == nullptr || partial == nullptr) return;
  const gpu::AttentionArgs args{q,
                                out,
                                pool,
                                d_tables,
                                d_pos,
                                d_table,
                                d_split,
                                partial,
                                rows,
                                layer,
                                layout.num_blocks,
                                layout.block_size,
                                shape.num_heads,
                                shape.num_kv_heads,
                                shape.head_dim,
                                kmath::attentionScale(shape.head_dim)};
  if (!ok(device_->attentionSplit(gpu::attentionSplitLaunch(rows, shape.num_heads, max_splits, shape.head_dim), args))) {
    return;
  }
  ok(device_->attentionCombine(gpu::attentionCombineLaunch(rows, shape.num_heads), args));
}

void KernelBackend::sampleOnDevice(const float* d_logits, int32_t vocab, std::span<const SamplingParams> params,
                                   std::span<const double> uniforms, std::span<TokenId> tokens) {
  const auto rows = static_cast<int32_t>(params.size());
  assert(uniforms.size() == params.size() && tokens.size() == params.size());
  temperature_.clear();
  top_p_.clear();
  top_k_.clear();
  for (const SamplingParams& p : params) {
    temperature_.push_back(p.temperature);
    top_p_.push_back(p.top_p);
    top_k_.push_back(p.top_k);
  }
  sampled_.assign(params.size(), gpu::kSampleOnHost);
  int32_t* d_sampled = d_sampled_.upload<int32_t>(*this, sampled_);
  const gpu::SampleArgs args{d_logits,
                             d_temperature_.upload<float>(*this, temperature_),
                             d_top_k_.upload<int32_t>(*this, top_k_),
                             d_top_p_.upload<float>(*this, top_p_),
                             d_uniforms_.upload(*this, uniforms),
                             d_sample_probs_.reserve<double>(*this, params.size() * gpu::kSampleMaxCandidates),
                             d_sampled,
                             rows,
                             vocab};
  if (d_logits != nullptr && status_.ok() && ok(device_->sample(gpu::sampleLaunch(rows), args))) {
    ok(device_->download(sampled_.data(), d_sampled, sampled_.size() * sizeof(int32_t)));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = status_.ok() ? sampled_[i] : gpu::kSampleOnHost;
    if (tokens[i] != gpu::kSampleOnHost) ++rows_sampled_on_device_;
  }
}

std::vector<TokenId> KernelBackend::sample(std::span<const float> logits, int32_t vocab,
                                           std::span<const SamplingParams> params, std::span<const double> uniforms,
                                           int* on_host) {
  assert(logits.size() == params.size() * static_cast<size_t>(vocab));
  std::vector<TokenId> tokens(params.size());
  if (on_host != nullptr) *on_host = 0;
  if (params.empty()) return tokens;
  // These logits are the host's: uploaded, sampled there.
  sampleOnDevice(d_logits_.upload(*this, logits), vocab, params, uniforms, tokens);
  // After a failure every row is decided on the host (status() says why).
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] != gpu::kSampleOnHost) continue;
    tokens[i] = sampleTokenWithDraw(logits.subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab)),
                                    params[i], uniforms[i], &sampler_scratch_);
    ++rows_sampled_on_host_;
    if (on_host != nullptr) ++*on_host;
  }
  return tokens;
}

void KernelBackend::sampleLogits(const float* hidden, const PreparedWeight& lm_head, int32_t m,
                                 std::span<const SamplingParams> params, std::span<const double> uniforms,
                                 std::span<TokenId> tokens) {
  assert(params.size() == static_cast<size_t>(m));
  if (m == 0 || !inDeviceMemory("sampleLogits", {{"hidden", hidden, size(m, lm_head.k())}})) return;
  const int32_t vocab = lm_head.n();
  float* d_logits = d_logits_out_.reserve<float>(*this, size(m, vocab));
  if (d_logits == nullptr || !ok(gemm_->gemm(hidden, lm_head, d_logits, m, false))) return;
  sampleOnDevice(d_logits, vocab, params, uniforms, tokens);
  if (!status_.ok()) return;  // the step fails: status() says why
  // Rows the kernel hands back (more candidates than it holds): their logits
  // row comes to the host, and the CPU sampler decides with the same draw.
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] != gpu::kSampleOnHost) continue;
    handed_back_.resize(static_cast<size_t>(vocab));
    if (!ok(device_->download(handed_back_.data(), d_logits + i * static_cast<size_t>(vocab),
                              handed_back_.size() * sizeof(float)))) {
      return;
    }
    tokens[i] = sampleTokenWithDraw(handed_back_, params[i], uniforms[i], &sampler_scratch_);
    ++rows_sampled_on_host_;
  }
}

BackendStats KernelBackend::stats() const {
  BackendStats s = stats_;
  const BackendStats g = gemm_->stats();
  s.gemm_calls = g.gemm_calls;
  s.gemm_time = g.gemm_time;
  s.gemm_flops = g.gemm_flops;
  return s;
}

void KernelBackend::resetStats() {
  stats_ = BackendStats{};
  gemm_->resetStats();
}

}  // namespace tandem::engine
