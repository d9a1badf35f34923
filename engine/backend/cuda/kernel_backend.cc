#include "engine/backend/cuda/kernel_backend.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>
#include <map>

#include <absl/strings/str_cat.h>

#include "engine/backend/cuda/kernels.h"
#include "engine/backend/host_buffer.h"
#include "engine/backend/cuda/sampling_kernel.h"
#include "engine/backend/kernel_math.h"
#include "engine/backend/scoped_timer.h"

namespace tandem::engine {
namespace {

size_t size(int64_t rows, int64_t cols) { return static_cast<size_t>(rows) * static_cast<size_t>(cols); }

}  // namespace

// Regions [first address, + floats) of the memory handed out, shared with
// the buffers, which take theirs out when freed.
struct KernelBackendRegions {
  std::map<uintptr_t, size_t> floats;

  bool contain(const void* p, size_t n) const {
    const auto at = reinterpret_cast<uintptr_t>(p);
    auto it = floats.upper_bound(at);
    if (it == floats.begin()) return false;
    --it;
    return at + n * sizeof(float) <= it->first + it->second * sizeof(float);
  }
};

namespace {

// Backend memory of the kernel backend: host memory, registered while it lives.
class TrackedBuffer final : public BackendBuffer {
 public:
  TrackedBuffer(std::unique_ptr<BackendBuffer> inner, std::shared_ptr<KernelBackendRegions> regions)
      : BackendBuffer(inner->data(), inner->floats()), inner_(std::move(inner)), regions_(std::move(regions)) {
    regions_->floats[reinterpret_cast<uintptr_t>(data())] = std::max<size_t>(floats(), 1);
  }
  ~TrackedBuffer() override { regions_->floats.erase(reinterpret_cast<uintptr_t>(data())); }

 private:
  std::unique_ptr<BackendBuffer> inner_;
  std::shared_ptr<KernelBackendRegions> regions_;
};

}  // namespace

KernelBackend::KernelBackend(const KernelBackendOptions& options)
    : gemm_(options.gemm), executor_(options.executor), regions_(std::make_shared<KernelBackendRegions>()) {}

template <typename Args>
void KernelBackend::launch(const gpu::LaunchConfig& config, void (*kernel)(Args), const Args& args) {
  if (!status_.ok()) return;
  status_ = executor_.launch(config, kernel, args);
}

bool KernelBackend::inBackendMemory(const char* call, std::initializer_list<Arg> args) {
  if (!status_.ok()) return false;
  for (const Arg& a : args) {
    if (a.floats == 0 || regions_->contain(a.p, a.floats)) continue;
    status_ = absl::InvalidArgumentError(absl::StrCat(
        call, ": ", a.name, " (", a.floats,
        " floats) is not backend memory (Backend::allocate or residentWeight): a device backend would be handed "
        "a host pointer"));
    return false;
  }
  return true;
}

std::unique_ptr<BackendBuffer> KernelBackend::track(std::unique_ptr<BackendBuffer> buffer) {
  return std::make_unique<TrackedBuffer>(std::move(buffer), regions_);
}

std::unique_ptr<BackendBuffer> KernelBackend::allocate(size_t floats) { return track(HostBuffer::allocate(floats)); }

std::unique_ptr<BackendBuffer> KernelBackend::residentWeight(std::span<const float> host) {
  return track(HostBuffer::view(host));
}

void KernelBackend::add(float* x, const float* y, int64_t n) {
  const ScopedTimer t(&stats_.elementwise_time);
  const auto count = static_cast<size_t>(n);
  if (!inBackendMemory("add", {{"x", x, count}, {"y", y, count}})) return;
  launch(gpu::elementwiseLaunch(n), &gpu::addKernel, gpu::AddArgs{x, y, n});
}

std::unique_ptr<PreparedWeight> KernelBackend::prepareWeight(const float* w, int32_t n, int32_t k) {
  return gemm_.prepareWeight(w, n, k);
}

void KernelBackend::gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) {
  if (!inBackendMemory("gemm", {{"x", x, size(m, w.k())}, {"y", y, size(m, w.n())}})) return;
  gemm_.gemm(x, w, y, m, accumulate);
}

void KernelBackend::gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) {
  if (!inBackendMemory("gemm", {{"x", x, size(m, k)}, {"w", w, size(n, k)}, {"y", y, size(m, n)}})) return;
  gemm_.gemm(x, w, y, m, n, k, accumulate);
}

void KernelBackend::logits(const float* hidden, const PreparedWeight& lm_head, float* logits_host, int32_t m) {
  if (!inBackendMemory("logits", {{"hidden", hidden, size(m, lm_head.k())}})) return;
  gemm_.logits(hidden, lm_head, logits_host, m);
}

void KernelBackend::rmsNorm(const float* x, const float* weight, float* out, int32_t rows, int32_t dim, float eps) {
  const ScopedTimer t(&stats_.elementwise_time);
  if (!inBackendMemory("rmsNorm", {{"x", x, size(rows, dim)}, {"weight", weight, size(1, dim)}, {"out", out, size(rows, dim)}})) {
    return;
  }
  launch(gpu::rmsNormLaunch(rows), &gpu::rmsNormKernel, gpu::RmsNormArgs{x, weight, out, rows, dim, eps});
}

void KernelBackend::rope(float* x, int32_t rows, int32_t num_heads, int32_t head_dim, const int32_t* positions,
                         std::span<const float> inv_freq) {
  const ScopedTimer t(&stats_.elementwise_time);
  assert(inv_freq.size() == static_cast<size_t>(head_dim / 2));
  if (!inBackendMemory("rope", {{"x", x, size(rows, int64_t{num_heads} * head_dim)}})) return;
  int32_t max_pos = 0;
  for (int32_t r = 0; r < rows; ++r) max_pos = std::max(max_pos, positions[r]);
  rope_table_.grow(max_pos + 1, inv_freq);
  const std::span<const float> freq = rope_table_.frequencies();
  if (rope_table_.floats() != rope_uploaded_ || !std::equal(freq.begin(), freq.end(), rope_uploaded_freq_.begin(),
                                                            rope_uploaded_freq_.end())) {
    d_rope_cos_.upload(*this, std::span<const float>(rope_table_.cos(), rope_table_.floats()));
    d_rope_sin_.upload(*this, std::span<const float>(rope_table_.sin(), rope_table_.floats()));
    rope_uploaded_ = rope_table_.floats();
    rope_uploaded_freq_.assign(freq.begin(), freq.end());
  }
  const gpu::RopeArgs args{x,
                           d_positions_.upload(*this, std::span<const int32_t>(positions, static_cast<size_t>(rows))),
                           d_rope_cos_.reserve<float>(*this, rope_uploaded_),
                           d_rope_sin_.reserve<float>(*this, rope_uploaded_),
                           rows,
                           num_heads,
                           head_dim};
  if (!inBackendMemory("rope", {{"positions", args.positions, size(rows, 1)},
                                {"cos_table", args.cos_table, rope_uploaded_},
                                {"sin_table", args.sin_table, rope_uploaded_}})) {
    return;
  }
  launch(gpu::ropeLaunch(rows), &gpu::ropeKernel, args);
}

void KernelBackend::addBias(float* y, const float* bias, int32_t rows, int32_t dim) {
  const ScopedTimer t(&stats_.elementwise_time);
  if (!inBackendMemory("addBias", {{"y", y, size(rows, dim)}, {"bias", bias, size(1, dim)}})) return;
  launch(gpu::elementwiseLaunch(static_cast<int64_t>(rows) * dim), &gpu::addBiasKernel,
         gpu::AddBiasArgs{y, bias, rows, dim});
}

void KernelBackend::swiglu(const float* gate, const float* up, float* out, int64_t n) {
  const ScopedTimer t(&stats_.elementwise_time);
  const auto count = static_cast<size_t>(n);
  if (!inBackendMemory("swiglu", {{"gate", gate, count}, {"up", up, count}, {"out", out, count}})) return;
  launch(gpu::elementwiseLaunch(n), &gpu::swigluKernel, gpu::SwigluArgs{gate, up, out, n});
}

void KernelBackend::gatherRows(const float* src, const int32_t* rows, int32_t num_rows, int32_t dim, float* dst) {
  const ScopedTimer t(&stats_.elementwise_time);
  int32_t src_rows = 0;
  for (int32_t r = 0; r < num_rows; ++r) src_rows = std::max(src_rows, rows[r] + 1);
  if (!inBackendMemory("gatherRows", {{"src", src, size(src_rows, dim)}, {"dst", dst, size(num_rows, dim)}})) return;
  const int32_t* d_rows = d_rows_.upload(*this, std::span<const int32_t>(rows, static_cast<size_t>(num_rows)));
  launch(gpu::gatherRowsLaunch(num_rows), &gpu::gatherRowsKernel, gpu::GatherRowsArgs{src, d_rows, dst, num_rows, dim});
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
  if (!inBackendMemory("writeKv", {{"k", k, floats}, {"v", v, floats}})) return;
  const gpu::WriteKvArgs args{k, v, kv.layerBlock(0, BlockId(0)), d_row_block_.upload<int32_t>(*this, row_block_),
                              d_row_slot_.upload<int32_t>(*this, row_slot_), rows, layer,
                              layout.num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim};
  if (!inBackendMemory("writeKv", {{"row_block", args.row_block, size(rows, 1)}, {"row_slot", args.row_slot, size(rows, 1)}})) {
    return;
  }
  launch(gpu::writeKvLaunch(rows), &gpu::writeKvKernel, args);
}

void KernelBackend::copyKvBlock(KvStorage& kv, BlockId src, BlockId dst) {
  const ScopedTimer t(&stats_.elementwise_time);
  const KvLayout& layout = kv.layout();
  launch(gpu::copyKvBlockLaunch(layout.num_layers, layout.floatsPerLayerBlock()), &gpu::copyKvBlockKernel,
         gpu::CopyKvBlockArgs{kv.layerBlock(0, BlockId(0)), src.value(), dst.value(), layout.num_blocks,
                              static_cast<int64_t>(layout.floatsPerLayerBlock())});
}

void KernelBackend::attention(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                              const AttentionShape& shape, float* out) {
  const ScopedTimer t(&stats_.attention_time);
  const KvLayout& layout = kv.layout();
  if (shape.head_dim > gpu::kAttentionMaxHeadDim) {
    status_.Update(absl::InvalidArgumentError(absl::StrCat("attention: head_dim ", shape.head_dim, " is over the ",
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
  if (!inBackendMemory("attention", {{"q", q, floats}, {"out", out, floats}})) return;
  float* partial = d_partial_.reserve<float>(*this, static_cast<size_t>(splits) * static_cast<size_t>(shape.num_heads) *
                                                    static_cast<size_t>(gpu::attentionPartialFloats(shape.head_dim)));
  const gpu::AttentionArgs args{q,
                                out,
                                kv.layerBlock(0, BlockId(0)),
                                d_block_tables_.upload<int32_t>(*this, block_tables_),
                                d_row_pos_.upload<int32_t>(*this, row_pos_),
                                d_row_table_.upload<int32_t>(*this, row_table_),
                                d_row_split_.upload<int32_t>(*this, row_split_),
                                partial,
                                rows,
                                layer,
                                layout.num_blocks,
                                layout.block_size,
                                shape.num_heads,
                                shape.num_kv_heads,
                                shape.head_dim,
                                kmath::attentionScale(shape.head_dim)};
  if (!inBackendMemory("attention", {{"block_tables", args.block_tables, block_tables_.size()},
                                     {"row_pos", args.row_pos, size(rows, 1)},
                                     {"row_table", args.row_table, size(rows, 1)},
                                     {"row_split", args.row_split, size(rows, 1)}})) {
    return;
  }
  launch(gpu::attentionSplitLaunch(rows, shape.num_heads, max_splits, shape.head_dim), &gpu::attentionSplitKernel,
         args);
  launch(gpu::attentionCombineLaunch(rows, shape.num_heads), &gpu::attentionCombineKernel, args);
}

std::vector<TokenId> KernelBackend::sample(std::span<const float> logits, int32_t vocab,
                                           std::span<const SamplingParams> params, std::span<const double> uniforms,
                                           int* on_host) {
  const auto rows = static_cast<int32_t>(params.size());
  assert(logits.size() == static_cast<size_t>(rows) * static_cast<size_t>(vocab) && uniforms.size() == params.size());
  std::vector<TokenId> tokens(params.size());
  if (on_host != nullptr) *on_host = 0;
  if (rows == 0) return tokens;
  temperature_.clear();
  top_p_.clear();
  top_k_.clear();
  for (const SamplingParams& p : params) {
    temperature_.push_back(p.temperature);
    top_p_.push_back(p.top_p);
    top_k_.push_back(p.top_k);
  }
  sampled_.assign(params.size(), gpu::kSampleOnHost);
  // The logits are the host's here (the engine samples on the host); a
  // device engine step would sample its own logits without the upload.
  int32_t* d_sampled = d_sampled_.upload<int32_t>(*this, sampled_);
  launch(gpu::sampleLaunch(rows), &gpu::sampleKernel,
         gpu::SampleArgs{d_logits_.upload(*this, logits), d_temperature_.upload<float>(*this, temperature_),
                         d_top_k_.upload<int32_t>(*this, top_k_), d_top_p_.upload<float>(*this, top_p_),
                         d_uniforms_.upload(*this, uniforms),
                         d_sample_probs_.reserve<double>(*this, params.size() * gpu::kSampleMaxCandidates), d_sampled,
                         rows, vocab});
  std::memcpy(sampled_.data(), d_sampled, sampled_.size() * sizeof(int32_t));  // the download
  for (int32_t r = 0; r < rows; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (sampled_[i] != gpu::kSampleOnHost) {
      tokens[i] = sampled_[i];
      continue;
    }
    tokens[i] = sampleTokenWithDraw(logits.subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab)),
                                    params[i], uniforms[i], &sampler_scratch_);
    if (on_host != nullptr) ++*on_host;
  }
  return tokens;
}

BackendStats KernelBackend::stats() const {
  BackendStats s = stats_;
  const BackendStats g = gemm_.stats();
  s.gemm_calls = g.gemm_calls;
  s.gemm_time = g.gemm_time;
  s.gemm_flops = g.gemm_flops;
  return s;
}

void KernelBackend::resetStats() {
  stats_ = BackendStats{};
  gemm_.resetStats();
}

}  // namespace tandem::engine
