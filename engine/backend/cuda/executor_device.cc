#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include <absl/strings/str_cat.h>

#include "engine/backend/cuda/device.h"
#include "src/common/status.h"

namespace tandem::gpu {

class ExecutorDevice::Graph final : public DeviceGraph {
 public:
  std::vector<std::function<absl::Status()>> work;
  absl::Status error;  // the first thing done while capturing that a capture forbids
};

ExecutorDevice::ExecutorDevice(const CpuExecutor::Options& options) : executor_(options) {}

ExecutorDevice::~ExecutorDevice() {
  for (const auto& [at, region] : regions_) {
    if (region.owned) std::free(reinterpret_cast<void*>(at));
  }
}

absl::StatusOr<void*> ExecutorDevice::allocate(size_t bytes) {
  TANDEM_RETURN_IF_ERROR(notWhileCapturing("allocate"));
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("executor device: no memory for ", bytes, " bytes"));
  // The allocator may hand out the address of host memory adopted once and
  // freed since without being forgotten: that record is stale.
  regions_[reinterpret_cast<uintptr_t>(p)] = Region{.bytes = std::max<size_t>(bytes, 1), .owned = true};
  return p;
}

absl::Status ExecutorDevice::adoptHost(void* p, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  Region& r = regions_[reinterpret_cast<uintptr_t>(p)];
  if (r.owned) return absl::InvalidArgumentError("executor device: adopting memory it allocated itself");
  r.bytes = std::max(r.bytes, bytes);
  ++r.adopted;
  return absl::OkStatus();
}

void ExecutorDevice::forgetHost(void* p) {
  runQueued();  // as a GPU finishes what reads or writes memory before it is freed
  auto it = regions_.find(reinterpret_cast<uintptr_t>(p));
  if (it == regions_.end() || it->second.owned) return;  // never adopted, or reallocated since
  if (--it->second.adopted <= 0) regions_.erase(it);
}

void ExecutorDevice::release(void* p) {
  if (capture_ != nullptr && capture_->error.ok()) capture_->error = notWhileCapturing("release");
  runQueued();
  auto it = regions_.find(reinterpret_cast<uintptr_t>(p));
  if (it == regions_.end() || !it->second.owned) return;
  std::free(p);
  regions_.erase(it);
}

bool ExecutorDevice::owns(const void* p, size_t bytes) const {
  return withinRegion(regions_, p, bytes, [](const Region& r) { return r.bytes; });
}

bool ExecutorDevice::ownsStart(const void* p) const { return owns(p, 1); }

absl::Status ExecutorDevice::upload(void* device_dst, const void* host_src, size_t bytes) {
  runQueued();
  TANDEM_RETURN_IF_ERROR(notWhileCapturing("upload"));
  if (bytes == 0) return absl::OkStatus();
  if (!owns(device_dst, bytes)) return absl::InvalidArgumentError("executor device: upload to memory it does not own");
  std::memcpy(device_dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status ExecutorDevice::download(void* host_dst, const void* device_src, size_t bytes) {
  runQueued();
  TANDEM_RETURN_IF_ERROR(notWhileCapturing("download"));
  if (bytes == 0) return absl::OkStatus();
  if (!owns(device_src, bytes)) {
    return absl::InvalidArgumentError("executor device: download from memory it does not own");
  }
  std::memcpy(host_dst, device_src, bytes);
  return absl::OkStatus();
}

absl::Status ExecutorDevice::downloadAsync(void* host_dst, const void* device_src, size_t bytes) {
  TANDEM_RETURN_IF_ERROR(notWhileCapturing("downloadAsync"));
  if (bytes == 0) return absl::OkStatus();
  if (!owns(device_src, bytes)) {
    return absl::InvalidArgumentError("executor device: download from memory it does not own");
  }
  queued_.push_back({host_dst, device_src, bytes});
  return absl::OkStatus();
}

absl::Status ExecutorDevice::uploadAsync(void* device_dst, const void* host_src, size_t bytes) {
  TANDEM_RETURN_IF_ERROR(notWhileCapturing("uploadAsync"));
  if (bytes == 0) return absl::OkStatus();
  if (!owns(device_dst, bytes)) return absl::InvalidArgumentError("executor device: upload to memory it does not own");
  queued_.push_back({device_dst, host_src, bytes});
  return absl::OkStatus();
}

absl::Status ExecutorDevice::synchronize() {
  TANDEM_RETURN_IF_ERROR(notWhileCapturing("synchronize"));
  runQueued();
  return absl::OkStatus();
}

void ExecutorDevice::runQueued() {
  for (const QueuedCopy& c : queued_) std::memcpy(c.dst, c.src, c.bytes);
  queued_.clear();
}

absl::Status ExecutorDevice::pinHost(void* p, size_t bytes) {
  TANDEM_RETURN_IF_ERROR(notWhileCapturing("pinHost"));
  if (bytes == 0) return absl::OkStatus();
  if (owns(p, 1)) return absl::InvalidArgumentError("executor device: pinHost of device memory (it is not host memory)");
  pinned_[reinterpret_cast<uintptr_t>(p)] = bytes;
  return absl::OkStatus();
}

void ExecutorDevice::unpinHost(void* p) {
  if (capture_ != nullptr && capture_->error.ok()) capture_->error = notWhileCapturing("unpinHost");
  runQueued();  // as a GPU waits for the copies using it
  pinned_.erase(reinterpret_cast<uintptr_t>(p));
}

bool ExecutorDevice::pinned(const void* p, size_t bytes) const {
  return withinRegion(pinned_, p, bytes, [](size_t region_bytes) { return region_bytes; });
}

absl::Status ExecutorDevice::zero(void* device_dst, size_t bytes) {
  runQueued();
  TANDEM_RETURN_IF_ERROR(notWhileCapturing("zero"));
  if (bytes == 0) return absl::OkStatus();
  if (!owns(device_dst, bytes)) return absl::InvalidArgumentError("executor device: zeroing memory it does not own");
  std::memset(device_dst, 0, bytes);
  return absl::OkStatus();
}

absl::Status ExecutorDevice::check(const char* kernel,
                                   std::initializer_list<std::pair<const char*, const void*>> pointers) {
  runQueued();
  for (const auto& [name, p] : pointers) {
    if (!ownsStart(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kernel, " kernel: argument ", name, " is not device memory (a host pointer, or not uploaded)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ExecutorDevice::rmsNorm(const LaunchConfig& c, const RmsNormArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("rmsNorm", {{"x", a.x}, {"weight", a.weight}, {"out", a.out}}));
  return hostTask([this, c, a] { return executor_.launch(c, &rmsNormKernel, a); });
}
absl::Status ExecutorDevice::rope(const LaunchConfig& c, const RopeArgs& a) {
  TANDEM_RETURN_IF_ERROR(check(
      "rope", {{"x", a.x}, {"positions", a.positions}, {"cos_table", a.cos_table}, {"sin_table", a.sin_table}}));
  return hostTask([this, c, a] { return executor_.launch(c, &ropeKernel, a); });
}
absl::Status ExecutorDevice::toBf16(const LaunchConfig& c, const ToBf16Args& a) {
  TANDEM_RETURN_IF_ERROR(check("toBf16", {{"in", a.in}, {"out", a.out}}));
  return hostTask([this, c, a] { return executor_.launch(c, &toBf16Kernel, a); });
}

absl::Status ExecutorDevice::swiglu(const LaunchConfig& c, const SwigluArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("swiglu", {{"gate", a.gate}, {"up", a.up}, {"out", a.out}}));
  return hostTask([this, c, a] { return executor_.launch(c, &swigluKernel, a); });
}
absl::Status ExecutorDevice::add(const LaunchConfig& c, const AddArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("add", {{"x", a.x}, {"y", a.y}}));
  return hostTask([this, c, a] { return executor_.launch(c, &addKernel, a); });
}
absl::Status ExecutorDevice::addBias(const LaunchConfig& c, const AddBiasArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("addBias", {{"y", a.y}, {"bias", a.bias}}));
  return hostTask([this, c, a] { return executor_.launch(c, &addBiasKernel, a); });
}
absl::Status ExecutorDevice::gatherRows(const LaunchConfig& c, const GatherRowsArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("gatherRows", {{"src", a.src}, {"rows", a.rows}, {"dst", a.dst}}));
  return hostTask([this, c, a] { return executor_.launch(c, &gatherRowsKernel, a); });
}
absl::Status ExecutorDevice::writeKv(const LaunchConfig& c, const WriteKvArgs& a) {
  TANDEM_RETURN_IF_ERROR(check(
      "writeKv", {{"k", a.k}, {"v", a.v}, {"kv", a.kv}, {"row_block", a.row_block}, {"row_slot", a.row_slot}}));
  return hostTask([this, c, a] { return executor_.launch(c, &writeKvKernel, a); });
}
absl::Status ExecutorDevice::copyKvBlock(const LaunchConfig& c, const CopyKvBlockArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("copyKvBlock", {{"kv", a.kv}}));
  return hostTask([this, c, a] { return executor_.launch(c, &copyKvBlockKernel, a); });
}
absl::Status ExecutorDevice::kvChecksum(const LaunchConfig& c, const KvChecksumArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("kvChecksum", {{"kv", a.kv}, {"layer_blocks", a.layer_blocks}, {"out", a.out}}));
  return hostTask([this, c, a] { return executor_.launch(c, &kvChecksumKernel, a); });
}
absl::Status ExecutorDevice::attentionSplit(const LaunchConfig& c, const AttentionArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("attentionSplit", {{"q", a.q},
                                                  {"out", a.out},
                                                  {"kv", a.kv},
                                                  {"block_tables", a.block_tables},
                                                  {"row_pos", a.row_pos},
                                                  {"row_table", a.row_table},
                                                  {"row_split", a.row_split},
                                                  {"partial", a.partial}}));
  return hostTask([this, c, a] { return executor_.launch(c, &attentionSplitKernel, a); });
}
absl::Status ExecutorDevice::attentionCombine(const LaunchConfig& c, const AttentionArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("attentionCombine", {{"out", a.out}, {"row_pos", a.row_pos}, {"row_split", a.row_split},
                                                    {"partial", a.partial}}));
  return hostTask([this, c, a] { return executor_.launch(c, &attentionCombineKernel, a); });
}
absl::Status ExecutorDevice::sample(const LaunchConfig& c, const SampleArgs& a) {
  TANDEM_RETURN_IF_ERROR(check("sample", {{"logits", a.logits},
                                          {"temperature", a.temperature},
                                          {"top_k", a.top_k},
                                          {"top_p", a.top_p},
                                          {"uniform", a.uniform},
                                          {"probs", a.probs},
                                          {"out", a.out}}));
  return hostTask([this, c, a] { return executor_.launch(c, &sampleKernel, a); });
}

absl::Status ExecutorDevice::notWhileCapturing(const char* what) const {
  if (capture_ == nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("executor device: ", what, " while a graph is being captured (a GPU's stream capture forbids it)"));
}

absl::Status ExecutorDevice::hostTask(std::function<absl::Status()> work) {
  if (capture_ != nullptr) {
    capture_->work.push_back(std::move(work));
    return absl::OkStatus();
  }
  runQueued();
  return work();
}

absl::Status ExecutorDevice::beginCapture() {
  if (capture_ != nullptr) return absl::FailedPreconditionError("executor device: a graph is already being captured");
  runQueued();
  capture_ = std::make_unique<Graph>();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceGraph>> ExecutorDevice::endCapture() {
  if (capture_ == nullptr) return absl::FailedPreconditionError("executor device: endCapture without beginCapture");
  std::unique_ptr<Graph> graph = std::move(capture_);
  TANDEM_RETURN_IF_ERROR(graph->error);
  return std::unique_ptr<DeviceGraph>(std::move(graph));
}

void ExecutorDevice::abortCapture() { capture_.reset(); }

absl::Status ExecutorDevice::launchGraph(const DeviceGraph& graph) {
  TANDEM_RETURN_IF_ERROR(notWhileCapturing("launchGraph"));
  const auto* g = dynamic_cast<const Graph*>(&graph);
  if (g == nullptr) return absl::InvalidArgumentError("executor device: a graph another device captured");
  runQueued();
  for (const auto& work : g->work) TANDEM_RETURN_IF_ERROR(work());
  return absl::OkStatus();
}

}  // namespace tandem::gpu
