#pragma once
// The CUDA backend's kernels (kernels.h) behind the Backend interface, on a
// gpu::Device (device.h): the CPU executor with host memory standing in for
// device memory (the default, what every test runs), or a GPU through the
// CUDA runtime (cuda_device.h, in the CUDA build). The GEMMs (and logits) go
// to a KernelGemm: the CPU backend's GEMM standing in for cuBLAS on the
// executor, cuBLASLt with a pinned algorithm on a GPU (cuda_device.h).
//
// Everything else is the same code on both: what is allocated in device
// memory, what is uploaded before each launch (row blocks and slots,
// positions, block tables, the RoPE table, sampling parameters), the launch
// shapes, what is downloaded (logits, sampled tokens). So the whole model can
// run through the GPU kernels here and be compared with the CPU backend
// (tests/engine/backend/cuda), the agent can serve with it (`--device
// cuda-emulator`: slow, for checking the kernels end to end, never for
// production), and a missing upload fails here, not first on a GPU: every
// float* a call takes must lie in device memory (Backend::allocate,
// residentWeight, or the KV cache), checked with its size where the device
// tracks sizes (the executor does), and the executor device checks every
// pointer of every launch and copy.
//
// The KV cache must be device memory too: on the executor a host pool is
// adopted in place (until another pool is used, or the backend goes); a GPU
// takes a pool from kvMemory().
//
// Errors: Backend's calls return nothing, and a failed allocation, copy or
// launch or a pointer outside device memory here is a bug (a launch shape
// the subset forbids, divergent barriers, host memory passed as device
// memory) or an exhausted device, never bad input. The first one is kept
// (status()) and every later call does nothing; tests check status() after
// each forward pass.
//
// Not thread-safe, like every Backend.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/device.h"
#include "engine/backend/rope_table.h"
#include "engine/sched/sampler.h"
#include "src/common/status.h"

namespace tandem::engine {

// The kernel backend's GEMMs, on device memory (gemm's contract in backend.h).
class KernelGemm {
 public:
  virtual ~KernelGemm() = default;
  virtual std::unique_ptr<PreparedWeight> prepareWeight(const float* w_host, int32_t n, int32_t k) = 0;
  virtual absl::Status gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) = 0;
  virtual absl::Status gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k,
                            bool accumulate) = 0;
  virtual BackendStats stats() const = 0;  // gemm_calls, gemm_time, gemm_flops
  virtual void resetStats() = 0;
  // The memory a GEMM with `w` reads, where a captured graph holds it
  // instead of `w` (a GPU's copy); nullptr where the GEMM reads through `w`
  // when it runs. A graph replay compares it, so that a weight freed and
  // another made at its address is never taken for it.
  virtual const void* weightData(const PreparedWeight& w) const { return nullptr; }
  // What its GEMMs with prepared weights read (backend.h). With kBfloat16
  // prepareWeight keeps w in bf16, and KernelBackend rounds each such GEMM's
  // input to bf16 on the device (toBf16Kernel) and calls gemmBf16.
  virtual GemmDtype dtype() const { return GemmDtype::kFloat32; }
  // y = x · wᵀ (+ y), x [m, w.k()] in bf16 (kmath::bf16Bits), w prepared
  // in bf16: fp32 products and accumulation, fp32 y.
  virtual absl::Status gemmBf16(const uint16_t* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate);
};

// The CPU backend's GEMM on `device`'s (host) memory, in its stream order
// (ExecutorDevice::hostTask): captured into its graphs as cuBLAS's calls
// are into a GPU's.
std::unique_ptr<KernelGemm> cpuKernelGemm(const CpuBackendOptions& options, std::shared_ptr<gpu::ExecutorDevice> device);

// Decode steps run as CUDA graphs (KernelBackend's "Graph steps" below) up
// to this many rows by default; TANDEM_CUDA_GRAPHS overrides it: "off" (or
// 0) runs every step launch by launch, a number N (at most
// KernelBackend::kMaxGraphRows) graphs steps of up to N rows. Anything else
// is an error (graphMaxRowsFromEnvironment's status).
constexpr int32_t kDefaultGraphMaxRows = 128;
absl::StatusOr<int32_t> graphMaxRowsFromEnvironment();

struct KernelBackendOptions {
  gpu::CpuExecutor::Options executor = gpu::CpuExecutor::optionsFromEnvironment();
  CpuBackendOptions gemm;  // the stand-in for cuBLAS
  // Graph decode steps of up to this many rows; 0: never. Unset: from the environment.
  std::optional<int32_t> graph_max_rows;
};

class KernelBackend : public Backend {
 public:
  // On the CPU executor with the CPU backend's GEMM.
  explicit KernelBackend(const KernelBackendOptions& options = {});
  // On `device` with `gemm` (which works on that device's memory).
  KernelBackend(std::shared_ptr<gpu::Device> device, std::unique_ptr<KernelGemm> gemm,
                std::optional<int32_t> graph_max_rows = std::nullopt);
  ~KernelBackend() override;

  // On the executor `device` with the CPU backend's GEMM (tests that look at the device).
  KernelBackend(std::shared_ptr<gpu::ExecutorDevice> device, const KernelBackendOptions& options);

  // OK, or the first failure (see the header comment).
  absl::Status status() const override { return status_; }
  gpu::Device& device() const { return *device_; }
  const std::shared_ptr<gpu::Device>& sharedDevice() const { return device_; }
  // The executor when the device is the CPU executor (tests count its work), else nullptr.
  const gpu::CpuExecutor* executor() const;

  // KV pool memory in device memory, for EngineOptions::kv_memory: zeroed.
  absl::StatusOr<KvMemory> kvMemory(size_t bytes);

  std::unique_ptr<BackendBuffer> allocate(size_t floats) override;
  std::unique_ptr<BackendBuffer> residentWeight(std::span<const float> host) override;
  void add(float* x, const float* y, int64_t n) override;
  std::unique_ptr<PreparedWeight> prepareWeight(const float* w, int32_t n, int32_t k) override;
  void gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) override;
  // With bf16 projections: one toBf16 launch for every weight.
  void gemmSharedInput(const float* x, std::span<const GemmOut> outs, int32_t m) override;
  void gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) override;
  void rmsNorm(const float* x, const float* weight, float* out, int32_t rows, int32_t dim, float eps) override;
  void rope(float* x, int32_t rows, int32_t num_heads, int32_t head_dim, const int32_t* positions,
            std::span<const float> inv_freq) override;
  void addBias(float* y, const float* bias, int32_t rows, int32_t dim) override;
  void swiglu(const float* gate, const float* up, float* out, int64_t n) override;
  void gatherRows(const float* src, const int32_t* rows, int32_t num_rows, int32_t dim, float* dst) override;
  // fp32: the table as residentWeight keeps it; bf16: its bf16 values
  // uploaded (half the device memory), widened by the gather kernel.
  std::unique_ptr<EmbeddingTable> prepareEmbedding(std::span<const float> table, int32_t dim) override;
  void embed(const EmbeddingTable& table, const int32_t* tokens, int32_t n, float* dst) override;
  void writeKv(int32_t layer, const float* k, const float* v, std::span<const ChunkDesc> chunks,
               KvStorage& kv) override;
  void copyKvBlock(KvStorage& kv, BlockId src, BlockId dst) override;
  // Device copies for a pool in device memory (kvMemory); a host pool's, plain ones.
  void downloadKv(const KvStorage& kv, size_t offset, std::span<std::byte> host) override;
  void uploadKv(KvStorage& kv, size_t offset, std::span<const std::byte> host) override;
  void finishKvCopies() override;
  // A device pool's on the device (kvChecksumKernel), one launch and one
  // download of the sums; a host pool's on the host.
  void checksumKv(const KvStorage& kv, std::span<const KvLayerBlock> items, std::span<uint64_t> out) override;
  absl::Status pinKvHost(std::span<std::byte> host) override;
  void unpinKvHost(std::span<std::byte> host) override;
  void attention(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                 const AttentionShape& shape, float* out) override;
  void logits(const float* hidden, const PreparedWeight& lm_head, float* logits_host, int32_t m) override;
  bool samplesLogits() const override { return true; }
  void sampleLogits(const float* hidden, const PreparedWeight& lm_head, int32_t m, std::span<const SamplingParams> params,
                    std::span<const double> uniforms, std::span<TokenId> tokens) override;
  int32_t beginStep(const StepShape& step) override;
  void endStep() override;
  BackendStats stats() const override;
  void resetStats() override;

  // Graph steps (CUDA graphs). A decode step of up to graph_max_rows rows
  // is padded to a bucket of rows (kGraphRowBuckets) and keyed by (bucket,
  // attention splits bucket: the power of two at or above the most splits
  // a row has, and whether it samples on the device or downloads logits).
  // The first step of a key runs launch by launch (a warm-up: the key's
  // buffers reach their sizes, and first-use work such as cuBLASLt's
  // heuristics happens outside any capture). The second captures its
  // launches and GEMMs into a graph (Device::beginCapture); later steps of
  // the key replay it: the model makes the same calls, the backend builds
  // the same launches (pointers, shapes, scalars) and checks each against
  // the graph's, stages the step's metadata (positions, slots, block
  // tables, sampling parameters) in pinned host memory instead of uploading
  // it, and at the step's download uploads it (one asynchronous copy per
  // buffer) and launches the graph: one launch instead of hundreds, and no
  // wait between them. A launch that differs (a buffer grown, so a pointer
  // moved), a staging buffer without room, or a growing RoPE table leaves
  // the graph for the rest of the step: what it had deferred runs launch
  // by launch, then the rest does; the next step of that key captures it
  // again. So a graph never runs anything but the launches the step asked
  // for, and the results are the step's launch-by-launch results, bit for
  // bit. A capture that fails turns graphs off for good (graphFailure()
  // says why): that step and every later one run launch by launch, and the
  // backend keeps serving. A graph launch that fails fails the step too
  // (status(): part of the graph may have run), naming TANDEM_CUDA_GRAPHS.
  static constexpr int32_t kGraphRowBuckets[] = {1,  2,   4,   8,   16,  24,  32,  48,  64, 96,
                                                 128, 160, 192, 224, 256, 320, 384, 448, 512};
  static constexpr int32_t kMaxGraphRows = 512;
  struct GraphStats {
    int64_t warmed = 0;        // first steps of a key, run launch by launch
    int64_t captured = 0;      // steps that captured a graph (and ran it)
    int64_t replayed = 0;      // steps that ran a captured graph
    int64_t left = 0;          // graph steps that left their graph and ran launch by launch
    int64_t padding_rows = 0;  // rows added to reach a bucket
    int64_t graphs = 0;        // graphs held now
  };
  GraphStats graphStats() const;
  int32_t graphMaxRows() const { return graph_max_rows_; }
  // Why graphs were turned off: OK while they are on (or were never).
  absl::Status graphFailure() const { return graph_failure_; }

  // A launch or GEMM a graph step recorded (kernel_backend.cc).
  class RecordedCall;

  // One token per row of logits [rows, vocab] (host) by the sampling kernel
  // (sampling_kernel.h): row r with params[r] and the draw uniforms[r] (its
  // request's SamplerRng::uniform(), ignored when greedy). Rows the kernel
  // leaves to the host are decided by sampleTokenWithDraw; `on_host`, when
  // given, counts them. The same tokens as the CPU sampler's.
  std::vector<TokenId> sample(std::span<const float> logits, int32_t vocab, std::span<const SamplingParams> params,
                              std::span<const double> uniforms, int* on_host = nullptr);
  // Rows the sampling kernel decided, and rows it left to the host, since
  // construction (sampleLogits and sample).
  int64_t rowsSampledOnDevice() const { return rows_sampled_on_device_; }
  int64_t rowsSampledOnHost() const { return rows_sampled_on_host_; }
  // Uploads to the per-call scratch buffers (the step's metadata:
  // positions, block tables, KV slots, rows; sampling parameters; host
  // logits) since construction, and metadata uploads skipped because the
  // device already held the same bytes (an earlier layer of the same step
  // uploaded them).
  struct MetadataUploads {
    int64_t uploaded = 0;
    int64_t reused = 0;
  };
  MetadataUploads metadataUploads() const { return metadata_uploads_; }

 private:
  // Keeps the first failure; false (do nothing more) once there is one.
  bool ok(const absl::Status& s);
  // The sampling kernel over logits [rows, vocab] in device memory: tokens[r]
  // its token, or gpu::kSampleOnHost where the host must decide (and after
  // a failure: status() says which).
  void sampleOnDevice(const float* d_logits, int32_t vocab, std::span<const SamplingParams> params,
                      std::span<const double> uniforms, std::span<TokenId> tokens);
  struct Arg {
    const char* name;
    const void* p;
    size_t floats;
  };
  // True when every argument lies in device memory; otherwise the first
  // that does not goes into status() and the call does nothing.
  bool inDeviceMemory(const char* call, std::initializer_list<Arg> args);
  // The cache's pool as device memory (adopted in place on the executor).
  std::byte* kvPool(const KvStorage& kv);

  // A kernel launch or a GEMM: run now, or taken by the graph step
  // (captured, or matched against the graph being replayed).
  template <typename Args>
  void launch(absl::Status (gpu::Device::*kernel)(const gpu::LaunchConfig&, const Args&), const gpu::LaunchConfig& c,
              const Args& a);
  // `rounded`: x already rounded to bf16 on the device (gemmSharedInput);
  // else, with bf16 projections, runGemm rounds it first.
  void runGemm(const float* x, const PreparedWeight* prepared, const float* w, float* y, int32_t m, int32_t n,
               int32_t k, bool accumulate, const uint16_t* rounded = nullptr);
  // x [m, k] rounded to bf16 into the GEMM input buffer (one launch); nullptr after a failure.
  const uint16_t* roundGemmInput(const float* x, int32_t m, int32_t k);
  // True when the graph step took `call`; false: run it now.
  bool deferred(std::unique_ptr<RecordedCall> call);
  // Capturing or replaying: calls are deferred, metadata is staged.
  bool graphStep() const { return mode_ == GraphMode::kCapture || mode_ == GraphMode::kReplay; }
  // A decode step of the graphs' (warming up, or having left its graph too):
  // padding rows are known, and staging room is made.
  bool inGraphStep() const { return mode_ != GraphMode::kOff; }
  // Leaves the graph for the rest of the step: the staged metadata is
  // uploaded and the calls deferred so far run launch by launch. Nothing
  // to do outside graphStep().
  void leaveGraph();
  // leaveGraph(), and graphs off for good: `why` a capture failed (nothing
  // ran: the deferred work runs launch by launch).
  void graphFailed(const absl::Status& why);
  // A graph's launch failed: the step fails (part of it may have run), and
  // graphs are off.
  void launchFailed(const absl::Status& why);
  // The step's deferred work: the staged metadata uploaded and the graph
  // launched (captured first, when capturing).
  void finishGraph();
  void uploadStaged();
  // Staged metadata, then `calls`, launch by launch.
  void runDeferred(std::span<const std::unique_ptr<RecordedCall>> calls);
  // Row `row` of this step is a padding row (not counted in the stats).
  bool padding(size_t row) const { return step_rows_ >= 0 && row >= static_cast<size_t>(step_rows_); }

  // Device memory for one kind of per-call metadata, grown on demand.
  class Scratch {
   public:
    Scratch() = default;
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch();
    // Uploads `host`; nullptr (and status() set) when that failed. In a
    // graph step, staged instead (stage()).
    template <typename T>
    T* upload(KernelBackend& backend, std::span<const T> host) {
      if (backend.inGraphStep()) {
        if (T* d = stage(backend, host, /*share=*/false)) return d;
      }
      return uploadNow(backend, host);
    }
    // upload(), never staged: for what a graph step must not defer (the
    // step leaves its graph first).
    template <typename T>
    T* uploadNow(KernelBackend& backend, std::span<const T> host) {
      backend.leaveGraph();
      T* d = reserve<T>(backend, host.size());
      uploaded_.clear();  // a buffer written here may be written by a kernel too: never reused
      if (d != nullptr && !backend.ok(backend.device_->upload(d, host.data(), host.size_bytes()))) return nullptr;
      if (d != nullptr) ++backend.metadata_uploads_.uploaded;
      return d;
    }
    // upload(), skipped when `host` holds byte for byte what this buffer
    // got last: the step's metadata (positions, block tables, slots) that
    // every layer's calls pass again, uploaded once per step instead of
    // once per layer (each upload waits for the stream). Only for
    // metadata no kernel writes: the device copy must still be what was
    // uploaded.
    template <typename T>
    T* uploadOnce(KernelBackend& backend, std::span<const T> host) {
      if (backend.inGraphStep()) {
        if (T* d = stage(backend, host, /*share=*/true)) return d;
      }
      const auto* bytes = reinterpret_cast<const std::byte*>(host.data());
      if (buffer_ && !host.empty() && uploaded_.size() == host.size_bytes() &&
          std::equal(uploaded_.begin(), uploaded_.end(), bytes)) {
        ++backend.metadata_uploads_.reused;
        return reinterpret_cast<T*>(buffer_->data());
      }
      T* d = upload(backend, host);
      if (d != nullptr) uploaded_.assign(bytes, bytes + host.size_bytes());
      return d;
    }
    template <typename T>
    T* reserve(KernelBackend& backend, size_t n) {
      reserveBytes(backend, n * sizeof(T));
      return buffer_ ? reinterpret_cast<T*>(buffer_->data()) : nullptr;
    }
    // The contents staged in this buffer by the current graph step (host),
    // for uploadStaged().
    std::span<const std::byte> staged() const { return staged_; }
    float* data() const { return buffer_ ? buffer_->data() : nullptr; }

   private:
    // At least `bytes` of device memory (a graph step leaves its graph
    // before the buffer moves).
    void reserveBytes(KernelBackend& backend, size_t bytes);
    // A graph step's copy of `host` in this buffer: where it will be once
    // uploadStaged() has run. With `share`, the same host array with the
    // same contents staged again in a step shares its place (metadata no
    // kernel writes, passed by every layer); otherwise, and for different
    // contents, a place of its own, each rounded up to a power of two (so
    // a step's places stay where the last step's were while the sizes stay
    // within them). nullptr when the buffer has no room: the step has left
    // its graph, and the buffer has grown to the room it needed. Outside
    // graphStep() (a warm-up, or a step that has left its graph) nothing is
    // staged, but the room is still made, so that the next step fits.
    template <typename T>
    T* stage(KernelBackend& backend, std::span<const T> host, bool share) {
      void* d = stageBytes(backend, {reinterpret_cast<const std::byte*>(host.data()), host.size_bytes()}, share);
      return static_cast<T*>(d);
    }
    void* stageBytes(KernelBackend& backend, std::span<const std::byte> host, bool share);
    // staged_'s capacity at the buffer's bytes, pinned (leaves a graph
    // step's graph when it must grow).
    void mirror(KernelBackend& backend);

    std::unique_ptr<BackendBuffer> buffer_;
    std::vector<std::byte> uploaded_;  // what uploadOnce put there last
    // This graph step's contents (host), uploaded by uploadStaged: its
    // capacity is the buffer's bytes, page-locked on the device (pinHost)
    // so the uploads are asynchronous; never grown past it while pinned.
    std::vector<std::byte> staged_;
    gpu::Device* pinned_on_ = nullptr;  // the device staged_ is pinned on, if it is
    struct Place {
      size_t offset, bytes;
      const void* host;  // the array it is a copy of
      bool shared;
    };
    std::vector<Place> places_;  // of staged_
    int64_t staged_step_ = -1;   // the graph step they belong to
  };

  std::shared_ptr<gpu::Device> device_;
  std::unique_ptr<KernelGemm> gemm_;
  absl::Status status_;
  BackendStats stats_;  // attention and element-wise times; the GEMMs' are gemm_'s
  RopeTable rope_table_;  // the CPU backend's cos/sin bits, uploaded when it grows
  size_t rope_uploaded_ = 0;                // floats of the table in d_rope_cos_ / d_rope_sin_
  std::vector<float> rope_uploaded_freq_;  // its frequencies
  const void* adopted_kv_ = nullptr;       // the KV pool adopted on the executor
  // Per-call metadata, built on the host and uploaded.
  std::vector<int64_t> checksum_blocks_;
  std::vector<int32_t> row_block_, row_slot_, row_pos_, row_table_, row_split_, block_tables_;
  std::vector<float> temperature_, top_p_;
  std::vector<int32_t> top_k_, sampled_;
  Scratch d_checksum_blocks_, d_checksums_;  // checksumKv's block ids and sums
  Scratch d_row_block_, d_row_slot_, d_row_pos_, d_row_table_, d_row_split_, d_block_tables_, d_partial_;
  Scratch d_positions_, d_rows_, d_rope_cos_, d_rope_sin_, d_logits_out_;
  Scratch d_logits_, d_temperature_, d_top_k_, d_top_p_, d_uniforms_, d_sample_probs_, d_sampled_;
  Scratch d_gemm_input_;  // a GEMM's input in bf16 (GemmDtype::kBfloat16)
  SamplerScratch sampler_scratch_;
  std::vector<float> handed_back_;  // a logits row the kernel left to the host
  int64_t rows_sampled_on_device_ = 0, rows_sampled_on_host_ = 0;
  MetadataUploads metadata_uploads_;

  // Graph steps.
  enum class GraphMode { kOff, kWarmup, kCapture, kReplay, kLeft };
  struct GraphKey {
    int32_t rows = 0, splits = 0;
    bool samples = false;
    auto operator<=>(const GraphKey&) const = default;
  };
  struct StepGraph {
    std::unique_ptr<gpu::DeviceGraph> graph;
    std::vector<std::unique_ptr<RecordedCall>> calls;  // what it was captured from
  };
  int32_t graph_max_rows_ = 0;
  absl::Status graph_failure_;
  std::map<GraphKey, StepGraph> graphs_;
  std::set<GraphKey> warmed_;  // keys whose warm-up step has run
  int32_t step_rows_ = -1;     // a padded step's rows before padding; -1 outside one
  GraphMode mode_ = GraphMode::kOff;
  GraphKey key_;               // the graph step's
  bool capturing_ = false;     // the device is capturing (since the step's first launch)
  std::vector<std::unique_ptr<RecordedCall>> captured_;  // the calls captured so far
  size_t replay_at_ = 0;       // the calls of the replayed graph matched so far
  int64_t step_id_ = 0;        // counts graph steps (Scratch::staged_step_)
  std::vector<Scratch*> staged_scratch_;  // the Scratch buffers this graph step staged in
  GraphStats graph_stats_;
};

}  // namespace tandem::engine
