#include "engine/backend/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <absl/strings/str_cat.h>

#include "engine/backend/cuda/cublas_gemm.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/kernel_math.h"
#include "src/common/status.h"

// cudaGraphInstantiate(exec, graph, flags) and stream capture as used here.
static_assert(CUDART_VERSION >= 12000, "the CUDA backend needs CUDA 12 or later");

namespace tandem::gpu {
namespace {

// A failed call's error, taken off the thread's last error so that the
// next launch (whose error is read with cudaGetLastError) does not report
// it as its own: a failed capture must not fail the launches that run
// instead. (A sticky error stays: every later call reports it.)
absl::Status cudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e), " (", static_cast<int>(e), ")"));
}

// A launch's error (cuda_kernels.h returns the cudaError_t as an int). A
// kernel's own fault surfaces at a later call (launches are asynchronous):
// CUDA_LAUNCH_BLOCKING=1 makes each launch wait, to name the kernel.
absl::Status launched(int code, const char* kernel) {
  if (code == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(kernel, " launch: ", cudaErrorText(code), " (", code, ")"));
}

class CudaGraph final : public DeviceGraph {
 public:
  explicit CudaGraph(cudaGraphExec_t e) : exec(e) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec); }
  cudaGraphExec_t exec;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::string name, cudaStream_t stream)
      : ordinal_(ordinal), name_(std::move(name)), stream_(stream) {}
  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  // The current device is per host thread: every entry point makes it this
  // one (the engine runs on another thread than the one that made it).
  absl::Status current() const { return cudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice"); }

  std::string name() const override { return name_; }
  void* stream() const { return stream_; }

  absl::StatusOr<void*> allocate(size_t bytes) override {
    TANDEM_RETURN_IF_ERROR(current());
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name_, ": cudaMalloc of ", bytes, " bytes: ", cudaGetErrorString(e)));
    }
    regions_[reinterpret_cast<uintptr_t>(p)] = std::max<size_t>(bytes, 1);
    return p;
  }
  void release(void* p) override {
    if (regions_.erase(reinterpret_cast<uintptr_t>(p)) == 0) return;
    current().IgnoreError();
    cudaStreamSynchronize(stream_);  // no launch still reading it
    cudaFree(p);
  }
  // What this device allocated, with its size (no driver call per argument).
  bool owns(const void* p, size_t bytes) const override {
    return withinRegion(regions_, p, bytes, [](size_t region_bytes) { return region_bytes; });
  }
  absl::Status adoptHost(void*, size_t) override {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": host memory cannot be used as device memory"));
  }
  void forgetHost(void*) override {}

  absl::Status upload(void* device_dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    TANDEM_RETURN_IF_ERROR(current());
    TANDEM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
                                      "upload (cudaMemcpyAsync)"));
    return cudaStatus(cudaStreamSynchronize(stream_), "upload (cudaStreamSynchronize)");
  }
  absl::Status download(void* host_dst, const void* device_src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    TANDEM_RETURN_IF_ERROR(current());
    TANDEM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_),
                                      "download (cudaMemcpyAsync)"));
    return cudaStatus(cudaStreamSynchronize(stream_), "download (cudaStreamSynchronize)");
  }
  absl::Status downloadAsync(void* host_dst, const void* device_src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    TANDEM_RETURN_IF_ERROR(current());
    return cudaStatus(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_),
                      "download (cudaMemcpyAsync)");
  }
  absl::Status uploadAsync(void* device_dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    TANDEM_RETURN_IF_ERROR(current());
    return cudaStatus(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
                      "upload (cudaMemcpyAsync)");
  }
  absl::Status synchronize() override {
    TANDEM_RETURN_IF_ERROR(current());
    return cudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  absl::Status pinHost(void* p, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    if (owns(p, 1)) return absl::InvalidArgumentError(absl::StrCat(name_, ": pinHost of device memory"));
    TANDEM_RETURN_IF_ERROR(current());
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e == cudaSuccess) {
      pinned_by_us_.insert(p);
      return absl::OkStatus();
    }
    // Not left as the thread's last error, which the next launch would report as its own.
    cudaGetLastError();
    // Someone registered it first (a UCX built with CUDA may): pinned, not ours to unpin.
    if (e == cudaErrorHostMemoryAlreadyRegistered) return absl::OkStatus();
    return cudaStatus(e, "pinning host memory (cudaHostRegister)");
  }
  void unpinHost(void* p) override {
    if (pinned_by_us_.erase(p) == 0 || !current().ok()) return;
    cudaStreamSynchronize(stream_);  // no copy still using it
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
  }
  absl::Status zero(void* device_dst, size_t bytes) override {
    TANDEM_RETURN_IF_ERROR(current());
    TANDEM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(device_dst, 0, bytes, stream_), "zero (cudaMemsetAsync)"));
    return cudaStatus(cudaStreamSynchronize(stream_), "zero (cudaStreamSynchronize)");
  }

  absl::Status rmsNorm(const LaunchConfig& c, const RmsNormArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchRmsNorm(c, a, stream_), "rmsNorm");
  }
  absl::Status rope(const LaunchConfig& c, const RopeArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchRope(c, a, stream_), "rope");
  }
  absl::Status swiglu(const LaunchConfig& c, const SwigluArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchSwiglu(c, a, stream_), "swiglu");
  }
  absl::Status toBf16(const LaunchConfig& c, const ToBf16Args& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchToBf16(c, a, stream_), "toBf16");
  }
  absl::Status add(const LaunchConfig& c, const AddArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchAdd(c, a, stream_), "add");
  }
  absl::Status addBias(const LaunchConfig& c, const AddBiasArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchAddBias(c, a, stream_), "addBias");
  }
  absl::Status gatherRows(const LaunchConfig& c, const GatherRowsArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchGatherRows(c, a, stream_), "gatherRows");
  }
  absl::Status writeKv(const LaunchConfig& c, const WriteKvArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchWriteKv(c, a, stream_), "writeKv");
  }
  absl::Status copyKvBlock(const LaunchConfig& c, const CopyKvBlockArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchCopyKvBlock(c, a, stream_), "copyKvBlock");
  }
  absl::Status kvChecksum(const LaunchConfig& c, const KvChecksumArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchKvChecksum(c, a, stream_), "kvChecksum");
  }
  absl::Status attentionSplit(const LaunchConfig& c, const AttentionArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchAttentionSplit(c, a, stream_), "attentionSplit");
  }
  absl::Status attentionCombine(const LaunchConfig& c, const AttentionArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchAttentionCombine(c, a, stream_), "attentionCombine");
  }
  absl::Status sample(const LaunchConfig& c, const SampleArgs& a) override {
    TANDEM_RETURN_IF_ERROR(current());
    return launched(launchSample(c, a, stream_), "sample");
  }

  // Thread-local mode: this thread's calls that a capture forbids fail
  // (and end it), other threads' do not.
  absl::Status beginCapture() override {
    TANDEM_RETURN_IF_ERROR(current());
    return cudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  }
  absl::StatusOr<std::unique_ptr<DeviceGraph>> endCapture() override {
    TANDEM_RETURN_IF_ERROR(current());
    cudaGraph_t graph = nullptr;
    TANDEM_RETURN_IF_ERROR(cudaStatus(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture"));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TANDEM_RETURN_IF_ERROR(cudaStatus(e, "cudaGraphInstantiate"));
    return std::unique_ptr<DeviceGraph>(std::make_unique<CudaGraph>(exec));
  }
  void abortCapture() override {
    if (!current().ok()) return;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &capturing) != cudaSuccess || capturing == cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      return;
    }
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);  // an invalidated capture ends with an error and no graph
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // not the next launch's error
  }
  absl::Status launchGraph(const DeviceGraph& graph) override {
    TANDEM_RETURN_IF_ERROR(current());
    const auto* g = dynamic_cast<const CudaGraph*>(&graph);
    if (g == nullptr) return absl::InvalidArgumentError(absl::StrCat(name_, ": a graph another device captured"));
    return cudaStatus(cudaGraphLaunch(g->exec, stream_), "cudaGraphLaunch");
  }

 private:
  int ordinal_;
  std::string name_;
  cudaStream_t stream_;
  std::set<void*> pinned_by_us_;  // host memory pinHost registered (unpinHost unregisters only these)
  std::map<uintptr_t, size_t> regions_;  // allocations by first address: their bytes
};

}  // namespace

void* cudaStreamOf(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  return cuda != nullptr ? cuda->stream() : nullptr;
}

absl::Status cudaMakeCurrent(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (cuda == nullptr) return absl::InvalidArgumentError("not a device makeCudaDevice made");
  return cuda->current();
}

int cudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::shared_ptr<Device>> makeCudaDevice(int ordinal) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device: cudaGetDeviceCount ",
        e != cudaSuccess ? absl::StrCat("failed: ", cudaGetErrorString(e)) : std::string("found 0 devices")));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", ordinal, " (", count, " found)"));
  }
  TANDEM_RETURN_IF_ERROR(cudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"));
  cudaDeviceProp prop{};
  TANDEM_RETURN_IF_ERROR(cudaStatus(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties"));
  // A GPU the kernels were not built for would start and fail its first launch.
  if (const int e = kernelsRunnableHere(); e != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the GPU kernels cannot run on ", prop.name, " (compute capability ", prop.major, ".", prop.minor,
        "): they are built for CMAKE_CUDA_ARCHITECTURES ", TANDEM_CUDA_ARCHITECTURES, " (", cudaErrorText(e),
        "); rebuild with its capability, or serve with --device cpu"));
  }
  cudaStream_t stream = nullptr;
  TANDEM_RETURN_IF_ERROR(cudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  return std::shared_ptr<Device>(std::make_shared<CudaDevice>(
      ordinal, absl::StrCat("cuda:", ordinal, " ", prop.name, " (compute capability ", prop.major, ".", prop.minor, ")"),
      stream));
}

}  // namespace tandem::gpu

namespace tandem::engine {
namespace {

// A weight uploaded to the device once: fp32, or bf16 (GemmDtype::kBfloat16).
class DeviceWeight final : public PreparedWeight {
 public:
  DeviceWeight(int32_t n, int32_t k, void* data, std::shared_ptr<gpu::Device> device)
      : PreparedWeight(n, k), data_(data), device_(std::move(device)) {}
  ~DeviceWeight() override { device_->release(data_); }
  const void* data() const { return data_; }

 private:
  void* data_;
  std::shared_ptr<gpu::Device> device_;
};

class CublasKernelGemm final : public KernelGemm {
 public:
  // `fp32` runs the plain-weight GEMMs (fp32 in every mode); `prepared` the
  // prepared weights' (bf16 inputs with GemmDtype::kBfloat16, else `fp32`
  // itself).
  CublasKernelGemm(std::shared_ptr<gpu::Device> device, void* stream, std::shared_ptr<gpu::CublasGemm> fp32,
                   std::shared_ptr<gpu::CublasGemm> prepared, GemmDtype dtype)
      : device_(std::move(device)),
        stream_(stream),
        fp32_(std::move(fp32)),
        prepared_(std::move(prepared)),
        dtype_(dtype) {}

  // nullptr when the upload fails: the backend's next GEMM with it reports it.
  // In bf16 the host rounds w (exact for a bf16 checkpoint) and uploads half the bytes.
  std::unique_ptr<PreparedWeight> prepareWeight(const float* w_host, int32_t n, int32_t k) override {
    const size_t count = static_cast<size_t>(n) * static_cast<size_t>(k);
    std::vector<uint16_t> narrowed;
    const void* from = w_host;
    size_t bytes = count * sizeof(float);
    if (dtype_ == GemmDtype::kBfloat16) {
      narrowed = bf16Values({w_host, count});
      from = narrowed.data();
      bytes = count * sizeof(uint16_t);
    }
    absl::StatusOr<void*> p = device_->allocate(bytes);
    if (!p.ok()) {
      failed_ = p.status();
      return std::make_unique<DeviceWeight>(n, k, nullptr, device_);
    }
    if (absl::Status s = device_->upload(*p, from, bytes); !s.ok()) failed_ = s;
    return std::make_unique<DeviceWeight>(n, k, *p, device_);
  }
  absl::Status gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) override {
    TANDEM_RETURN_IF_ERROR(failed_);
    if (dtype_ == GemmDtype::kBfloat16) {
      return absl::InternalError("cuBLASLt GEMM: an fp32 input for a bf16 weight (KernelBackend calls gemmBf16)");
    }
    return run(*fp32_, x, static_cast<const DeviceWeight&>(w).data(), y, m, w.n(), w.k(), accumulate);
  }
  absl::Status gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k,
                    bool accumulate) override {
    return run(*fp32_, x, w, y, m, n, k, accumulate);
  }
  GemmDtype dtype() const override { return dtype_; }
  absl::Status gemmBf16(const uint16_t* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) override {
    TANDEM_RETURN_IF_ERROR(failed_);
    if (dtype_ != GemmDtype::kBfloat16) {
      return absl::InternalError("cuBLASLt GEMM: a bf16 input for an fp32 weight");
    }
    return run(*prepared_, x, static_cast<const DeviceWeight&>(w).data(), y, m, w.n(), w.k(), accumulate);
  }
  BackendStats stats() const override { return stats_; }
  void resetStats() override { stats_ = BackendStats{}; }
  const void* weightData(const PreparedWeight& w) const override {
    return static_cast<const DeviceWeight&>(w).data();
  }

 private:
  absl::Status run(gpu::CublasGemm& cublas, const void* x, const void* w, float* y, int32_t m, int32_t n, int32_t k,
                   bool accumulate) {
    // The engine thread is not the one that made the device: select it here
    // too, as every CudaDevice call does.
    TANDEM_RETURN_IF_ERROR(gpu::cudaMakeCurrent(*device_));
    const auto start = std::chrono::steady_clock::now();
    const std::string error = cublas.run(x, w, y, m, n, k, accumulate, stream_);
    // Host time of the call (the launch, not the GPU's work: the stream is asynchronous).
    stats_.gemm_time += std::chrono::steady_clock::now() - start;
    ++stats_.gemm_calls;
    stats_.gemm_flops += 2.0 * m * n * k;
    if (!error.empty()) return absl::InternalError(absl::StrCat("cuBLASLt GEMM ", m, "x", n, "x", k, ": ", error));
    return absl::OkStatus();
  }

  std::shared_ptr<gpu::Device> device_;
  void* stream_;
  std::shared_ptr<gpu::CublasGemm> fp32_, prepared_;
  GemmDtype dtype_;
  absl::Status failed_;  // a weight that could not be uploaded
  BackendStats stats_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KernelGemm>> cublasKernelGemm(std::shared_ptr<gpu::Device> device, GemmDtype dtype) {
  void* stream = gpu::cudaStreamOf(*device);
  if (stream == nullptr) return absl::InvalidArgumentError("cublasKernelGemm: not a device makeCudaDevice made");
  std::string error;
  std::shared_ptr<gpu::CublasGemm> fp32 = gpu::CublasGemm::create(&error);
  if (fp32 == nullptr) return absl::FailedPreconditionError(absl::StrCat("cuBLASLt: ", error));
  std::shared_ptr<gpu::CublasGemm> prepared = fp32;
  if (dtype == GemmDtype::kBfloat16) {
    prepared = gpu::CublasGemm::create(&error, {.bf16_inputs = true});
    if (prepared == nullptr) return absl::FailedPreconditionError(absl::StrCat("cuBLASLt (bf16 inputs): ", error));
  }
  return std::unique_ptr<KernelGemm>(
      std::make_unique<CublasKernelGemm>(std::move(device), stream, std::move(fp32), std::move(prepared), dtype));
}

absl::StatusOr<std::unique_ptr<KernelBackend>> makeCudaBackend(int ordinal, std::optional<int32_t> graph_max_rows,
                                                               GemmDtype dtype) {
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<gpu::Device> device, gpu::makeCudaDevice(ordinal));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KernelGemm> gemm, cublasKernelGemm(device, dtype));
  auto backend = std::make_unique<KernelBackend>(std::move(device), std::move(gemm), graph_max_rows);
  TANDEM_RETURN_IF_ERROR(backend->status());  // TANDEM_CUDA_GRAPHS unreadable
  return backend;
}

}  // namespace tandem::engine
