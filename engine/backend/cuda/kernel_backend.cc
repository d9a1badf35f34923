#include "engine/backend/cuda/kernel_backend.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <absl/cleanup/cleanup.h>
#include <absl/strings/numbers.h>
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

// An embedding table in device memory: the fp32 one (residentWeight, in
// place on the executor), or its bf16 values.
class DeviceEmbedding final : public EmbeddingTable {
 public:
  DeviceEmbedding(int32_t rows, int32_t dim, std::unique_ptr<BackendBuffer> fp32)
      : EmbeddingTable(rows, dim, false), fp32_(std::move(fp32)) {}
  DeviceEmbedding(int32_t rows, int32_t dim, std::shared_ptr<void> bf16)
      : EmbeddingTable(rows, dim, true), bf16_(std::move(bf16)) {}
  const void* data() const { return fp32_ ? static_cast<const void*>(fp32_->data()) : bf16_.get(); }

 private:
  std::unique_ptr<BackendBuffer> fp32_;
  std::shared_ptr<void> bf16_;  // released through the device
};

// The CPU backend's GEMM on the executor device's (host) memory, in its
// stream order (hostTask).
class CpuKernelGemm final : public KernelGemm {
 public:
  CpuKernelGemm(const CpuBackendOptions& options, std::shared_ptr<gpu::ExecutorDevice> device)
      : cpu_(options), device_(std::move(device)) {}
  std::unique_ptr<PreparedWeight> prepareWeight(const float* w_host, int32_t n, int32_t k) override {
    return cpu_.prepareWeight(w_host, n, k);
  }
  absl::Status gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) override {
    return device_->hostTask([this, x, &w, y, m, accumulate] {
      cpu_.gemm(x, w, y, m, accumulate);
      return absl::OkStatus();
    });
  }
  absl::Status gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k,
                    bool accumulate) override {
    return device_->hostTask([this, x, w, y, m, n, k, accumulate] {
      cpu_.gemm(x, w, y, m, n, k, accumulate);
      return absl::OkStatus();
    });
  }
  GemmDtype dtype() const override { return cpu_.gemmDtype(); }
  // The CPU backend's bf16 GEMM of the input the device rounded: its bf16 bits.
  absl::Status gemmBf16(const uint16_t* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) override {
    return device_->hostTask([this, x, &w, y, m, accumulate] {
      cpu_.gemmBf16(x, w, y, m, accumulate);
      return absl::OkStatus();
    });
  }
  BackendStats stats() const override { return cpu_.stats(); }
  void resetStats() override { cpu_.resetStats(); }

 private:
  CpuBackend cpu_;
  std::shared_ptr<gpu::ExecutorDevice> device_;
};

}  // namespace

absl::Status KernelGemm::gemmBf16(const uint16_t*, const PreparedWeight&, float*, int32_t, bool) {
  return absl::UnimplementedError("this GEMM takes no bf16 inputs (GemmDtype::kFloat32)");
}

std::unique_ptr<KernelGemm> cpuKernelGemm(const CpuBackendOptions& options,
                                          std::shared_ptr<gpu::ExecutorDevice> device) {
  return std::make_unique<CpuKernelGemm>(options, std::move(device));
}

absl::StatusOr<int32_t> graphMaxRowsFromEnvironment() {
  const char* v = std::getenv("TANDEM_CUDA_GRAPHS");
  if (v == nullptr || *v == '\0' || std::string_view(v) == "on") return kDefaultGraphMaxRows;
  if (std::string_view(v) == "off") return 0;
  int32_t rows = 0;
  if (!absl::SimpleAtoi(v, &rows) || rows < 0 || rows > KernelBackend::kMaxGraphRows) {
    return absl::InvalidArgumentError(absl::StrCat("TANDEM_CUDA_GRAPHS=", v,
                                                   ": expected on, off, or the most rows a graphed decode step has, 0 "
                                                   "to ",
                                                   KernelBackend::kMaxGraphRows));
  }
  return rows;
}

namespace {
std::shared_ptr<gpu::ExecutorDevice> executorDevice(const KernelBackendOptions& options) {
  return std::make_shared<gpu::ExecutorDevice>(options.executor);
}
}  // namespace

KernelBackend::KernelBackend(const KernelBackendOptions& options) : KernelBackend(executorDevice(options), options) {}

KernelBackend::KernelBackend(std::shared_ptr<gpu::ExecutorDevice> device, const KernelBackendOptions& options)
    : KernelBackend(device, cpuKernelGemm(options.gemm, device), options.graph_max_rows) {}

KernelBackend::KernelBackend(std::shared_ptr<gpu::Device> device, std::unique_ptr<KernelGemm> gemm,
                             std::optional<int32_t> graph_max_rows)
    : device_(std::move(device)), gemm_(std::move(gemm)) {
  if (graph_max_rows) {
    graph_max_rows_ = *graph_max_rows;
  } else if (absl::StatusOr<int32_t> rows = graphMaxRowsFromEnvironment(); rows.ok()) {
    graph_max_rows_ = *rows;
  } else {
    status_ = rows.status();
  }
}

class KernelBackend::RecordedCall {
 public:
  virtual ~RecordedCall() = default;
  // The same launch: kernel, shape and every argument (pointers included).
  virtual bool same(const RecordedCall& other) const = 0;
  virtual absl::Status run(gpu::Device& device, KernelGemm& gemm) const = 0;
};

namespace {

template <typename Args>
class KernelCall final : public KernelBackend::RecordedCall {
 public:
  using Kernel = absl::Status (gpu::Device::*)(const gpu::LaunchConfig&, const Args&);
  KernelCall(Kernel kernel, const gpu::LaunchConfig& config, const Args& args)
      : kernel_(kernel), config_(config), args_(args) {}
  bool same(const RecordedCall& other) const override {
    const auto* o = dynamic_cast<const KernelCall*>(&other);
    return o != nullptr && o->kernel_ == kernel_ && o->config_ == config_ && o->args_ == args_;
  }
  absl::Status run(gpu::Device& device, KernelGemm&) const override { return (device.*kernel_)(config_, args_); }

 private:
  Kernel kernel_;
  gpu::LaunchConfig config_;
  Args args_;
};

class GemmCall final : public KernelBackend::RecordedCall {
 public:
  // x is fp32, or bf16 (`bf16_x`: the kBfloat16 GEMM of a prepared weight).
  GemmCall(const void* x, bool bf16_x, const PreparedWeight* prepared, const void* weight_data, const float* w,
           float* y, int32_t m, int32_t n, int32_t k, bool accumulate)
      : x_(x),
        bf16_x_(bf16_x),
        prepared_(prepared),
        weight_data_(weight_data),
        w_(w),
        y_(y),
        m_(m),
        n_(n),
        k_(k),
        accumulate_(accumulate) {}
  bool same(const RecordedCall& other) const override {
    const auto* o = dynamic_cast<const GemmCall*>(&other);
    return o != nullptr && o->x_ == x_ && o->bf16_x_ == bf16_x_ && o->prepared_ == prepared_ &&
           o->weight_data_ == weight_data_ && o->w_ == w_ && o->y_ == y_ && o->m_ == m_ && o->n_ == n_ && o->k_ == k_ &&
           o->accumulate_ == accumulate_;
  }
  absl::Status run(gpu::Device&, KernelGemm& gemm) const override {
    if (bf16_x_) return gemm.gemmBf16(static_cast<const uint16_t*>(x_), *prepared_, y_, m_, accumulate_);
    const auto* x = static_cast<const float*>(x_);
    if (prepared_ != nullptr) return gemm.gemm(x, *prepared_, y_, m_, accumulate_);
    return gemm.gemm(x, w_, y_, m_, n_, k_, accumulate_);
  }

 private:
  const void* x_;
  bool bf16_x_;
  const PreparedWeight* prepared_;  // or w_
  const void* weight_data_;         // KernelGemm::weightData(*prepared_)
  const float* w_;
  float* y_;
  int32_t m_, n_, k_;
  bool accumulate_;
};

}  // namespace

template <typename Args>
void KernelBackend::launch(absl::Status (gpu::Device::*kernel)(const gpu::LaunchConfig&, const Args&),
                           const gpu::LaunchConfig& c, const Args& a) {
  if (!status_.ok()) return;
  if (graphStep() && deferred(std::make_unique<KernelCall<Args>>(kernel, c, a))) return;
  ok((device_.get()->*kernel)(c, a));
}

const uint16_t* KernelBackend::roundGemmInput(const float* x, int32_t m, int32_t k) {
  const int64_t count = static_cast<int64_t>(m) * k;
  uint16_t* rounded = d_gemm_input_.reserve<uint16_t>(*this, static_cast<size_t>(count));
  if (!status_.ok() || rounded == nullptr) return nullptr;
  launch(&gpu::Device::toBf16, gpu::elementwiseLaunch(count), gpu::ToBf16Args{x, rounded, count});
  return status_.ok() ? rounded : nullptr;
}

void KernelBackend::gemmSharedInput(const float* x, std::span<const GemmOut> outs, int32_t m) {
  if (gemm_->dtype() != GemmDtype::kBfloat16 || outs.empty()) return Backend::gemmSharedInput(x, outs, m);
  const int32_t k = outs[0].w->k();
  if (!inDeviceMemory("gemm", {{"x", x, size(m, k)}})) return;
  for (const GemmOut& o : outs) {
    if (o.w->k() != k) {
      ok(absl::InvalidArgumentError(absl::StrCat("gemmSharedInput: weights of k ", k, " and ", o.w->k())));
      return;
    }
    if (!inDeviceMemory("gemm", {{"y", o.y, size(m, o.w->n())}})) return;
  }
  if (!status_.ok()) return;
  const uint16_t* rounded = roundGemmInput(x, m, k);  // once for all of them
  if (rounded == nullptr) return;
  for (const GemmOut& o : outs) runGemm(x, o.w, nullptr, o.y, m, o.w->n(), k, /*accumulate=*/false, rounded);
}

void KernelBackend::runGemm(const float* x, const PreparedWeight* prepared, const float* w, float* y, int32_t m,
                            int32_t n, int32_t k, bool accumulate, const uint16_t* rounded) {
  if (!status_.ok()) return;
  // Counted here, once per GEMM asked for, whether it runs now or in a graph.
  ++stats_.gemm_calls;
  stats_.gemm_flops += 2.0 * m * n * k;
  // kBfloat16: the input rounded to bf16 on the device first (a launch like
  // any other: graphed with the step), unless the caller did.
  const bool bf16 = prepared != nullptr && gemm_->dtype() == GemmDtype::kBfloat16;
  const void* input = x;
  if (bf16) {
    input = rounded != nullptr ? rounded : roundGemmInput(x, m, k);
    if (input == nullptr) return;
  }
  if (graphStep() && deferred(std::make_unique<GemmCall>(input, bf16, prepared,
                                                         prepared != nullptr ? gemm_->weightData(*prepared) : nullptr,
                                                         w, y, m, n, k, accumulate))) {
    return;
  }
  if (bf16) {
    ok(gemm_->gemmBf16(static_cast<const uint16_t*>(input), *prepared, y, m, accumulate));
  } else {
    ok(prepared != nullptr ? gemm_->gemm(x, *prepared, y, m, accumulate) : gemm_->gemm(x, w, y, m, n, k, accumulate));
  }
}

int32_t KernelBackend::beginStep(const StepShape& step) {
  if (mode_ != GraphMode::kOff) endStep();  // a step left open
  step_rows_ = -1;
  if (!step.decode || step.rows <= 0 || step.rows > graph_max_rows_ || !status_.ok()) return step.rows;
  int32_t rows = step.rows;
  for (int32_t b : kGraphRowBuckets) {
    if (b >= step.rows) {
      rows = b;
      break;
    }
  }
  if (rows > graph_max_rows_) rows = step.rows;  // a limit between buckets: this size alone
  const auto splits = static_cast<int32_t>(
      std::bit_ceil(static_cast<uint32_t>(gpu::attentionSplits(kmath::visibleKeys(step.max_position, 0)))));
  key_ = GraphKey{rows, splits, step.samples};
  if (graphs_.contains(key_)) {
    mode_ = GraphMode::kReplay;
  } else if (warmed_.contains(key_)) {
    mode_ = GraphMode::kCapture;
  } else {
    mode_ = GraphMode::kWarmup;
    warmed_.insert(key_);
    ++graph_stats_.warmed;
  }
  capturing_ = false;
  captured_.clear();
  replay_at_ = 0;
  ++step_id_;
  staged_scratch_.clear();
  step_rows_ = step.rows;
  graph_stats_.padding_rows += rows - step.rows;
  return rows;
}

void KernelBackend::endStep() {
  step_rows_ = -1;
  if (mode_ == GraphMode::kOff) return;
  finishGraph();
  // The staged metadata's host copies are rewritten by the next graph
  // step: its uploads must be done (the stream is idle after the step's
  // download; a step that had none waits here).
  ok(device_->synchronize());
}

bool KernelBackend::deferred(std::unique_ptr<RecordedCall> call) {
  if (mode_ == GraphMode::kCapture) {
    if (!capturing_) {
      if (absl::Status s = device_->beginCapture(); !s.ok()) {
        graphFailed(s);
        return false;
      }
      capturing_ = true;
    }
    if (absl::Status s = call->run(*device_, *gemm_); !s.ok()) {  // captured, not run
      graphFailed(s);
      return false;  // run now, where a bug in the launch fails the step
    }
    captured_.push_back(std::move(call));
    return true;
  }
  const StepGraph& g = graphs_.at(key_);
  if (replay_at_ < g.calls.size() && g.calls[replay_at_]->same(*call)) {
    ++replay_at_;
    return true;
  }
  leaveGraph();
  return false;
}

void KernelBackend::runDeferred(std::span<const std::unique_ptr<RecordedCall>> calls) {
  uploadStaged();
  for (const auto& call : calls) {
    if (!status_.ok()) return;  // (the metadata was not uploaded either)
    ok(call->run(*device_, *gemm_));
  }
}

void KernelBackend::leaveGraph() {
  if (!graphStep()) return;
  const GraphMode mode = mode_;
  mode_ = GraphMode::kLeft;
  ++graph_stats_.left;
  if (mode == GraphMode::kCapture) {
    if (capturing_) device_->abortCapture();
    capturing_ = false;
    runDeferred(captured_);
    captured_.clear();
    return;
  }
  auto it = graphs_.find(key_);
  runDeferred(std::span<const std::unique_ptr<RecordedCall>>(it->second.calls).first(replay_at_));
  graphs_.erase(it);  // captured again by the next step of this key
}

void KernelBackend::graphFailed(const absl::Status& why) {
  if (graph_failure_.ok()) {
    graph_failure_ = absl::Status(why.code(), absl::StrCat("CUDA graphs turned off: ", why.message()));
  }
  device_->abortCapture();  // whatever state the failure left the capture in
  capturing_ = false;
  leaveGraph();
  graph_max_rows_ = 0;
  graphs_.clear();
}

void KernelBackend::finishGraph() {
  const absl::Cleanup off = [this] { mode_ = GraphMode::kOff; };
  if (!graphStep()) return;  // warming up, or left: nothing deferred
  if (!status_.ok()) {       // nothing more runs
    if (capturing_) device_->abortCapture();
    capturing_ = false;
    captured_.clear();
    return;
  }
  if (mode_ == GraphMode::kCapture) {
    if (!capturing_) return;  // nothing was launched
    capturing_ = false;
    absl::StatusOr<std::unique_ptr<gpu::DeviceGraph>> graph = device_->endCapture();
    if (!graph.ok()) return graphFailed(graph.status());
    uploadStaged();
    if (absl::Status s = device_->launchGraph(**graph); !s.ok()) return launchFailed(s);
    graphs_[key_] = StepGraph{std::move(*graph), std::move(captured_)};
    captured_.clear();
    ++graph_stats_.captured;
    return;
  }
  auto it = graphs_.find(key_);
  if (replay_at_ != it->second.calls.size()) return leaveGraph();  // the step made fewer calls than the graph has
  uploadStaged();
  if (absl::Status s = device_->launchGraph(*it->second.graph); !s.ok()) return launchFailed(s);
  ++graph_stats_.replayed;
}

void KernelBackend::launchFailed(const absl::Status& why) {
  // Part of the graph may have run: running its calls again could apply an
  // accumulation twice, so the step fails (status()), and graphs are off.
  graph_failure_ = absl::Status(why.code(), absl::StrCat("CUDA graphs turned off: ", why.message()));
  ok(absl::Status(why.code(), absl::StrCat("a CUDA graph's launch failed (TANDEM_CUDA_GRAPHS=off runs without "
                                           "them): ",
                                           why.message())));
  captured_.clear();
  graph_max_rows_ = 0;
  graphs_.clear();
}

void KernelBackend::uploadStaged() {
  for (Scratch* scratch : staged_scratch_) {
    const std::span<const std::byte> staged = scratch->staged();
    if (status_.ok() && ok(device_->uploadAsync(scratch->data(), staged.data(), staged.size()))) {
      ++metadata_uploads_.uploaded;
    }
  }
  staged_scratch_.clear();
}

KernelBackend::GraphStats KernelBackend::graphStats() const {
  GraphStats s = graph_stats_;
  s.graphs = static_cast<int64_t>(graphs_.size());
  return s;
}

KernelBackend::Scratch::~Scratch() {
  if (pinned_on_ != nullptr) pinned_on_->unpinHost(staged_.data());
}

void KernelBackend::Scratch::reserveBytes(KernelBackend& backend, size_t bytes) {
  const size_t floats = std::max<size_t>((bytes + sizeof(float) - 1) / sizeof(float), 1);
  if (buffer_ && buffer_->floats() >= floats) return;
  // Launches deferred by a graph step may read this buffer, and its
  // graph holds its address: the step leaves the graph first.
  backend.leaveGraph();
  const size_t grown = std::max(floats, 2 * (buffer_ ? buffer_->floats() : 0));
  buffer_.reset();
  uploaded_.clear();
  buffer_ = backend.allocate(grown);
  if (staged_.capacity() > 0) mirror(backend);  // a buffer that stages keeps its host side as large
}

void KernelBackend::Scratch::mirror(KernelBackend& backend) {
  const size_t bytes = buffer_ ? buffer_->floats() * sizeof(float) : 0;
  if (bytes == 0 || staged_.capacity() >= bytes) return;
  // Pinning is nothing to do while capturing, and a copy may still read
  // the old host side: the step leaves its graph, and the copies finish.
  backend.leaveGraph();
  backend.device_->synchronize().IgnoreError();  // a failure is the next call's to report
  if (pinned_on_ != nullptr) pinned_on_->unpinHost(staged_.data());
  pinned_on_ = nullptr;
  std::vector<std::byte> host;
  host.reserve(bytes);
  host.assign(staged_.begin(), staged_.end());
  staged_.swap(host);
  // Not pinned: the copies still work, through the driver's own buffers.
  if (backend.device_->pinHost(staged_.data(), staged_.capacity()).ok()) pinned_on_ = backend.device_.get();
}

void* KernelBackend::Scratch::stageBytes(KernelBackend& backend, std::span<const std::byte> host, bool share) {
  if (staged_step_ != backend.step_id_) {
    staged_step_ = backend.step_id_;
    staged_.clear();
    places_.clear();
  }
  const bool staging = backend.graphStep();
  if (staging) uploaded_.clear();  // the device copy becomes what is staged
  if (share) {
    for (const Place& p : places_) {
      if (p.shared && p.host == host.data() && p.bytes == host.size() &&
          std::equal(host.begin(), host.end(), staged_.begin() + static_cast<ptrdiff_t>(p.offset))) {
        return staging ? buffer_->data() + p.offset / sizeof(float) : nullptr;
      }
    }
  }
  const size_t offset = staged_.size();
  const size_t room = std::bit_ceil(std::max<size_t>(host.size(), 64));
  if (!buffer_ || buffer_->floats() * sizeof(float) < offset + room) {
    reserveBytes(backend, offset + room);  // leaves the graph: the caller uploads now
  }
  mirror(backend);  // the first staging in this buffer (left the graph too)
  if (!buffer_) return nullptr;
  staged_.resize(offset + room);  // within its capacity: the buffer's bytes
  std::copy(host.begin(), host.end(), staged_.begin() + static_cast<ptrdiff_t>(offset));
  places_.push_back(Place{offset, host.size(), host.data(), share});
  if (!backend.graphStep()) return nullptr;  // the room is made; uploaded by the caller
  if (places_.size() == 1) backend.staged_scratch_.push_back(this);
  return buffer_->data() + offset / sizeof(float);
}

KernelBackend::~KernelBackend() {
  if (capturing_) device_->abortCapture();
  // No copy may still read a Scratch's host side when it goes.
  device_->synchronize().IgnoreError();
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

std::byte* KernelBackend::kvPool(const KvStorage& kv) {
  std::byte* pool = kv.data();
  const size_t bytes = kv.layout().totalBytes();
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
  leaveGraph();  // (a graph step defers launches, and a capture allows no allocation)
  TANDEM_ASSIGN_OR_RETURN(void* p, device_->allocate(bytes));
  std::shared_ptr<void> keep(p, [device = device_](void* q) { device->release(q); });
  TANDEM_RETURN_IF_ERROR(device_->zero(p, bytes));
  return KvMemory{.bytes = {static_cast<std::byte*>(p), bytes}, .keep_alive = std::move(keep), .device = true};
}

std::unique_ptr<BackendBuffer> KernelBackend::allocate(size_t floats) {
  if (capturing_) leaveGraph();  // a capture allows no allocation
  absl::StatusOr<void*> p = device_->allocate(floats * sizeof(float));
  if (!ok(p.status())) return nullptr;
  return std::make_unique<DeviceBuffer>(static_cast<float*>(*p), floats, device_, false);
}

std::unique_ptr<BackendBuffer> KernelBackend::residentWeight(std::span<const float> host) {
  leaveGraph();
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
  launch(&gpu::Device::add, gpu::elementwiseLaunch(n), gpu::AddArgs{x, y, n});
}

std::unique_ptr<PreparedWeight> KernelBackend::prepareWeight(const float* w, int32_t n, int32_t k) {
  leaveGraph();  // (a GPU's copy: allocated and uploaded)
  return gemm_->prepareWeight(w, n, k);
}

void KernelBackend::gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) {
  if (!inDeviceMemory("gemm", {{"x", x, size(m, w.k())}, {"y", y, size(m, w.n())}})) return;
  runGemm(x, &w, nullptr, y, m, w.n(), w.k(), accumulate);
}

void KernelBackend::gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) {
  if (!inDeviceMemory("gemm", {{"x", x, size(m, k)}, {"w", w, size(n, k)}, {"y", y, size(m, n)}})) return;
  runGemm(x, nullptr, w, y, m, n, k, accumulate);
}

void KernelBackend::logits(const float* hidden, const PreparedWeight& lm_head, float* logits_host, int32_t m) {
  if (!inDeviceMemory("logits", {{"hidden", hidden, size(m, lm_head.k())}})) return;
  const size_t n = size(m, lm_head.n());
  float* out = d_logits_out_.reserve<float>(*this, n);
  if (out == nullptr) return;
  runGemm(hidden, &lm_head, nullptr, out, m, lm_head.n(), lm_head.k(), false);
  finishGraph();
  if (!status_.ok()) return;
  ok(device_->download(logits_host, out, n * sizeof(float)));
}

void KernelBackend::rmsNorm(const float* x, const float* weight, float* out, int32_t rows, int32_t dim, float eps) {
  const ScopedTimer t(&stats_.elementwise_time);
  if (!inDeviceMemory("rmsNorm", {{"x", x, size(rows, dim)}, {"weight", weight, size(1, dim)}, {"out", out, size(rows, dim)}})) {
    return;
  }
  launch(&gpu::Device::rmsNorm, gpu::rmsNormLaunch(rows), gpu::RmsNormArgs{x, weight, out, rows, dim, eps});
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
    // Not staged: a table that grew does not fit a graph's room (the step
    // leaves its graph), and staging it would pin a copy of it for nothing.
    const bool uploaded =
        d_rope_cos_.uploadNow(*this, std::span<const float>(rope_table_.cos(), rope_table_.floats())) &&
        d_rope_sin_.uploadNow(*this, std::span<const float>(rope_table_.sin(), rope_table_.floats()));
    if (!uploaded) return;
    rope_uploaded_ = rope_table_.floats();
    rope_uploaded_freq_.assign(freq.begin(), freq.end());
  }
  const int32_t* d_positions = d_positions_.uploadOnce(*this, std::span<const int32_t>(positions, static_cast<size_t>(rows)));
  if (d_positions == nullptr) return;
  launch(&gpu::Device::rope, gpu::ropeLaunch(rows),
                   gpu::RopeArgs{x, d_positions, d_rope_cos_.reserve<float>(*this, rope_uploaded_),
                                 d_rope_sin_.reserve<float>(*this, rope_uploaded_), rows, num_heads, head_dim});
}

void KernelBackend::addBias(float* y, const float* bias, int32_t rows, int32_t dim) {
  const ScopedTimer t(&stats_.elementwise_time);
  if (!inDeviceMemory("addBias", {{"y", y, size(rows, dim)}, {"bias", bias, size(1, dim)}})) return;
  launch(&gpu::Device::addBias, gpu::elementwiseLaunch(static_cast<int64_t>(rows) * dim),
         gpu::AddBiasArgs{y, bias, rows, dim});
}

void KernelBackend::swiglu(const float* gate, const float* up, float* out, int64_t n) {
  const ScopedTimer t(&stats_.elementwise_time);
  const auto count = static_cast<size_t>(n);
  if (n <= 0 || !inDeviceMemory("swiglu", {{"gate", gate, count}, {"up", up, count}, {"out", out, count}})) return;
  launch(&gpu::Device::swiglu, gpu::elementwiseLaunch(n), gpu::SwigluArgs{gate, up, out, n});
}

void KernelBackend::gatherRows(const float* src, const int32_t* rows, int32_t num_rows, int32_t dim, float* dst) {
  const ScopedTimer t(&stats_.elementwise_time);
  int32_t src_rows = 0;
  for (int32_t r = 0; r < num_rows; ++r) src_rows = std::max(src_rows, rows[r] + 1);
  if (!inDeviceMemory("gatherRows", {{"src", src, size(src_rows, dim)}, {"dst", dst, size(num_rows, dim)}})) return;
  const int32_t* d_rows = d_rows_.uploadOnce(*this, std::span<const int32_t>(rows, static_cast<size_t>(num_rows)));
  if (d_rows == nullptr) return;
  launch(&gpu::Device::gatherRows, gpu::gatherRowsLaunch(num_rows), gpu::GatherRowsArgs{src, d_rows, dst, num_rows, dim});
}

std::unique_ptr<EmbeddingTable> KernelBackend::prepareEmbedding(std::span<const float> table, int32_t dim) {
  leaveGraph();  // (an allocation)
  const auto rows = static_cast<int32_t>(table.size() / static_cast<size_t>(dim));
  if (gemm_->dtype() != GemmDtype::kBfloat16) {
    std::unique_ptr<BackendBuffer> fp32 = residentWeight(table);
    if (fp32 == nullptr) return nullptr;
    return std::make_unique<DeviceEmbedding>(rows, dim, std::move(fp32));
  }
  absl::StatusOr<void*> p = device_->allocate(table.size() * sizeof(uint16_t));
  if (!ok(p.status())) return nullptr;
  std::shared_ptr<void> keep(*p, [device = device_](void* q) { device->release(q); });
  // Rounded and uploaded a piece at a time: no host copy of the whole table.
  constexpr size_t kPiece = size_t{1} << 22;  // values (8 MiB of bf16)
  auto* d = static_cast<uint16_t*>(*p);
  for (size_t at = 0; at < table.size(); at += kPiece) {
    const std::vector<uint16_t> piece = bf16Values(table.subspan(at, std::min(kPiece, table.size() - at)));
    if (!ok(device_->upload(d + at, piece.data(), piece.size() * sizeof(uint16_t)))) return nullptr;
  }
  return std::make_unique<DeviceEmbedding>(rows, dim, std::move(keep));
}

void KernelBackend::embed(const EmbeddingTable& table, const int32_t* tokens, int32_t n, float* dst) {
  const ScopedTimer t(&stats_.elementwise_time);
  const auto& e = static_cast<const DeviceEmbedding&>(table);  // only this backend's prepareEmbedding made it
  if (!inDeviceMemory("embed", {{"dst", dst, size(n, e.dim())}})) return;
  const int32_t* d_rows = d_rows_.uploadOnce(*this, std::span<const int32_t>(tokens, static_cast<size_t>(n)));
  if (d_rows == nullptr) return;
  launch(&gpu::Device::gatherRows, gpu::gatherRowsLaunch(n),
         gpu::GatherRowsArgs{e.data(), d_rows, dst, n, e.dim(), e.bf16()});
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
      if (c.block_table.empty() && inGraphStep()) {  // a graph bucket's padding row (beginStep): written nowhere
        row_block_.push_back(-1);
        row_slot_.push_back(0);
        continue;
      }
      row_block_.push_back(c.block_table[static_cast<size_t>(kmath::blockIndexOf(pos, layout.block_size))].value());
      row_slot_.push_back(kmath::slotOf(pos, layout.block_size));
    }
  }
  // Rows are grouped by chunk in order (backend.h): row r of the step is the r-th pushed.
  const auto rows = static_cast<int32_t>(row_block_.size());
  if (rows == 0) return;
  const size_t floats = size(rows, static_cast<int64_t>(layout.elementsPerToken()));
  if (!inDeviceMemory("writeKv", {{"k", k, floats}, {"v", v, floats}})) return;
  std::byte* pool = kvPool(kv);
  const int32_t* d_block = d_row_block_.uploadOnce<int32_t>(*this, row_block_);
  const int32_t* d_slot = d_row_slot_.uploadOnce<int32_t>(*this, row_slot_);
  if (pool == nullptr || d_block == nullptr || d_slot == nullptr) return;
  launch(&gpu::Device::writeKv, gpu::writeKvLaunch(rows),
         gpu::WriteKvArgs{k, v, pool, d_block, d_slot, rows, layer, layout.num_blocks, layout.block_size,
                          layout.num_kv_heads, layout.head_dim, layout.dtype == KvDtype::kBfloat16});
}

void KernelBackend::copyKvBlock(KvStorage& kv, BlockId src, BlockId dst) {
  const ScopedTimer t(&stats_.elementwise_time);
  if (!status_.ok()) return;
  const KvLayout& layout = kv.layout();
  std::byte* pool = kvPool(kv);
  if (pool == nullptr) return;
  // Exact: a layer block is 2 x block_size x heads x head_dim elements, an
  // even count, so a multiple of 4 bytes in bf16 too.
  const size_t words = layout.bytesPerLayerBlock() / sizeof(uint32_t);
  launch(&gpu::Device::copyKvBlock, gpu::copyKvBlockLaunch(layout.num_layers, words),
         gpu::CopyKvBlockArgs{reinterpret_cast<uint32_t*>(pool), src.value(), dst.value(), layout.num_blocks,
                              static_cast<int64_t>(words)});
}

void KernelBackend::downloadKv(const KvStorage& kv, size_t offset, std::span<std::byte> host) {
  leaveGraph();  // (a copy is not for a graph: it would be replayed with the step)
  if (!kv.onDevice()) return Backend::downloadKv(kv, offset, host);
  if (!status_.ok()) return;
  ok(device_->downloadAsync(host.data(), kv.bytes().data() + offset, host.size()));
}

void KernelBackend::uploadKv(KvStorage& kv, size_t offset, std::span<const std::byte> host) {
  leaveGraph();
  if (!kv.onDevice()) return Backend::uploadKv(kv, offset, host);
  if (!status_.ok()) return;
  ok(device_->uploadAsync(kv.bytes().data() + offset, host.data(), host.size()));
}

void KernelBackend::checksumKv(const KvStorage& kv, std::span<const KvLayerBlock> items, std::span<uint64_t> out) {
  leaveGraph();  // (the sums are downloaded: not for a graph)
  if (!kv.onDevice()) return Backend::checksumKv(kv, items, out);
  if (!status_.ok() || items.empty()) return;
  const ScopedTimer t(&stats_.elementwise_time);
  const KvLayout& layout = kv.layout();
  checksum_blocks_.clear();
  for (const KvLayerBlock& i : items) {
    checksum_blocks_.push_back(static_cast<int64_t>(i.layer) * layout.num_blocks + i.block.value());
  }
  std::byte* pool = kvPool(kv);
  const int64_t* d_blocks = d_checksum_blocks_.uploadOnce<int64_t>(*this, checksum_blocks_);
  uint64_t* d_sums = d_checksums_.reserve<uint64_t>(*this, items.size());
  if (pool == nullptr || d_blocks == nullptr || d_sums == nullptr) return;
  const auto count = static_cast<int32_t>(items.size());
  launch(&gpu::Device::kvChecksum, gpu::kvChecksumLaunch(count),
         gpu::KvChecksumArgs{reinterpret_cast<const uint32_t*>(pool), d_blocks, d_sums, count,
                             static_cast<int64_t>(layout.bytesPerLayerBlock() / sizeof(uint32_t))});
  // In stream order: the sums are there once the launches before them ran.
  if (status_.ok()) ok(device_->download(out.data(), d_sums, out.size_bytes()));
}

void KernelBackend::finishKvCopies() {
  leaveGraph();
  // Always waited for, after a failed copy too: the copies queued before it
  // read or write host memory that may be freed once this returns.
  ok(device_->synchronize());
}

absl::Status KernelBackend::pinKvHost(std::span<std::byte> host) {
  leaveGraph();
  return device_->pinHost(host.data(), host.size());
}

void KernelBackend::unpinKvHost(std::span<std::byte> host) {
  leaveGraph();
  device_->unpinHost(host.data());
}

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
      // A graph bucket's padding row (an empty table) reads no keys.
      const int32_t pos = c.block_table.empty() && inGraphStep() ? -1 : c.start_pos + r;
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
  const std::byte* pool = kvPool(kv);
  if (inGraphStep()) {
    // The graph's shape: its key's splits, whatever this step's rows need
    // (at most that: the key is the bucket above them); the partials' room
    // for them, so the buffer stays put. (Also once the step has left its
    // graph: the next step of the key then fits.)
    max_splits = key_.splits;
    splits = rows * key_.splits;
  }
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
                                kmath::attentionScale(shape.head_dim),
                                layout.dtype == KvDtype::kBfloat16};
  launch(&gpu::Device::attentionSplit,
         gpu::attentionSplitLaunch(rows, shape.num_heads, shape.num_kv_heads, max_splits, shape.head_dim), args);
  launch(&gpu::Device::attentionCombine, gpu::attentionCombineLaunch(rows, shape.num_heads), args);
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
  if (d_logits != nullptr && status_.ok()) launch(&gpu::Device::sample, gpu::sampleLaunch(rows), args);
  finishGraph();
  if (d_logits != nullptr && status_.ok()) {
    ok(device_->download(sampled_.data(), d_sampled, sampled_.size() * sizeof(int32_t)));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = status_.ok() ? sampled_[i] : gpu::kSampleOnHost;
    if (tokens[i] != gpu::kSampleOnHost && !padding(i)) ++rows_sampled_on_device_;
  }
}

std::vector<TokenId> KernelBackend::sample(std::span<const float> logits, int32_t vocab,
                                           std::span<const SamplingParams> params, std::span<const double> uniforms,
                                           int* on_host) {
  assert(logits.size() == params.size() * static_cast<size_t>(vocab));
  std::vector<TokenId> tokens(params.size());
  if (on_host != nullptr) *on_host = 0;
  if (params.empty()) return tokens;
  leaveGraph();
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
  if (d_logits == nullptr) return;
  runGemm(hidden, &lm_head, nullptr, d_logits, m, vocab, lm_head.k(), false);
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
    if (!padding(i)) ++rows_sampled_on_host_;
  }
}

BackendStats KernelBackend::stats() const {
  BackendStats s = stats_;
  const BackendStats g = gemm_->stats();
  // Calls and flops are counted per GEMM asked for (runGemm), graphed or
  // not; the time is the GEMM's own (on a GPU, the host's time to issue it).
  s.gemm_time = g.gemm_time;
  s.graph_steps_captured = graph_stats_.captured;
  s.graph_steps_replayed = graph_stats_.replayed;
  s.graph_steps_left = graph_stats_.left;
  return s;
}

void KernelBackend::resetStats() {
  stats_ = BackendStats{};
  gemm_->resetStats();
}

}  // namespace tandem::engine
