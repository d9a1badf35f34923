#include "engine/backend/cuda/cublas_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <tuple>

namespace tandem::gpu {
namespace {

// Row-major y[m, n] = x[m, k] · w[n, k]ᵀ is, read column-major, yᵀ[n, m] =
// w(k x n stored, transposed) · xᵀ(k x m stored): A = w with op T, B = x
// with op N, C = D = y with leading dimension n. No copies, no transposes.

std::string cublasError(const char* call, cublasStatus_t s) {
  return std::string(call) + ": " + cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")";
}

// A layout descriptor destroyed with its scope.
class Layout {
 public:
  Layout(cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
    status_ = cublasLtMatrixLayoutCreate(&layout_, type, rows, cols, ld);
  }
  ~Layout() {
    if (status_ == CUBLAS_STATUS_SUCCESS) cublasLtMatrixLayoutDestroy(layout_);
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  cublasStatus_t status() const { return status_; }
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
  cublasStatus_t status_;
};

}  // namespace

struct CublasGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  void* workspace = nullptr;
  CublasGemmOptions options;
  std::map<std::pair<int32_t, int32_t>, cublasLtMatmulAlgo_t> algos;  // by (n, k)
  // x's and w's element type.
  cudaDataType inputType() const { return options.bf16_inputs ? CUDA_R_16BF : CUDA_R_32F; }
  // The layouts of a call's shape, checked against its algorithm once.
  struct Call {
    Layout a, b, c;
    Call(cudaDataType input, int32_t m, int32_t n, int32_t k)
        : a(input, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
          b(input, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
          c(CUDA_R_32F, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n) {}
  };
  std::map<std::tuple<int32_t, int32_t, int32_t>, std::unique_ptr<Call>> calls;  // by (m, n, k)

  ~Impl() {
    calls.clear();
    if (workspace != nullptr) cudaFree(workspace);
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  // The pinned algorithm of (n, k): the heuristic's first for the reference
  // batch that takes options.split_k (1: split-K off, no reduction scheme).
  std::string algoFor(int32_t n, int32_t k, cublasLtMatmulAlgo_t* out) {
    if (auto it = algos.find({n, k}); it != algos.end()) {
      *out = it->second;
      return "";
    }
    const Layout a(inputType(), static_cast<uint64_t>(k), static_cast<uint64_t>(n), k);
    const Layout b(inputType(), static_cast<uint64_t>(k), kReferenceRows, k);
    const Layout c(CUDA_R_32F, static_cast<uint64_t>(n), kReferenceRows, n);
    if (a.status() != CUBLAS_STATUS_SUCCESS) return cublasError("cublasLtMatrixLayoutCreate", a.status());
    if (b.status() != CUBLAS_STATUS_SUCCESS) return cublasError("cublasLtMatrixLayoutCreate", b.status());
    if (c.status() != CUBLAS_STATUS_SUCCESS) return cublasError("cublasLtMatrixLayoutCreate", c.status());
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    int found = 0;
    if (cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, desc, a.get(), b.get(), c.get(), c.get(), preference,
                                                          kCandidates, results, &found);
        s != CUBLAS_STATUS_SUCCESS) {
      return cublasError("cublasLtMatmulAlgoGetHeuristic", s);
    }
    for (int i = 0; i < found; ++i) {
      cublasLtMatmulAlgo_t algo = results[i].algo;
      const uint32_t splits = options.split_k;
      const uint32_t reduction =
          splits > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits)) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction,
                                               sizeof(reduction)) != CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      cublasLtMatmulHeuristicResult_t checked = {};
      if (cublasLtMatmulAlgoCheck(handle, desc, a.get(), b.get(), c.get(), c.get(), &algo, &checked) !=
              CUBLAS_STATUS_SUCCESS ||
          checked.workspaceSize > kWorkspaceBytes) {
        continue;
      }
      algos.emplace(std::make_pair(n, k), algo);
      *out = algo;
      return "";
    }
    return std::string("cuBLASLt offers no ") + (options.bf16_inputs ? "bf16-input" : "fp32") +
           " algorithm with split-K " + std::to_string(options.split_k) + " for n=" + std::to_string(n) +
           ", k=" + std::to_string(k) + " (" + std::to_string(found) + " candidates)";
  }
};

CublasGemm::CublasGemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CublasGemm::~CublasGemm() = default;

std::unique_ptr<CublasGemm> CublasGemm::create(std::string* error, const CublasGemmOptions& options) {
  if (options.split_k < 1) {
    *error = "CublasGemmOptions::split_k must be at least 1";
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (cublasStatus_t s = cublasLtCreate(&impl->handle); s != CUBLAS_STATUS_SUCCESS) {
    *error = cublasError("cublasLtCreate", s);
    return nullptr;
  }
  if (cublasStatus_t s = cublasLtMatmulDescCreate(&impl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
      s != CUBLAS_STATUS_SUCCESS) {
    *error = cublasError("cublasLtMatmulDescCreate", s);
    return nullptr;
  }
  const cublasOperation_t transpose = CUBLAS_OP_T, plain = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(impl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
  cublasLtMatmulDescSetAttribute(impl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof(plain));
  if (cublasStatus_t s = cublasLtMatmulPreferenceCreate(&impl->preference); s != CUBLAS_STATUS_SUCCESS) {
    *error = cublasError("cublasLtMatmulPreferenceCreate", s);
    return nullptr;
  }
  const size_t workspace = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(impl->preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                       sizeof(workspace));
  if (cudaError_t e = cudaMalloc(&impl->workspace, kWorkspaceBytes); e != cudaSuccess) {
    *error = std::string("cudaMalloc of the GEMM workspace: ") + cudaGetErrorString(e);
    return nullptr;
  }
  return std::unique_ptr<CublasGemm>(new CublasGemm(std::move(impl)));
}

std::string CublasGemm::run(const void* x, const void* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate,
                            void* stream) {
  cublasLtMatmulAlgo_t algo;
  if (std::string e = impl_->algoFor(n, k, &algo); !e.empty()) return e;
  auto found = impl_->calls.find({m, n, k});
  if (found == impl_->calls.end()) {  // first call of this shape: its layouts, checked against the algorithm
    auto made = std::make_unique<Impl::Call>(impl_->inputType(), m, n, k);
    if (made->a.status() != CUBLAS_STATUS_SUCCESS || made->b.status() != CUBLAS_STATUS_SUCCESS ||
        made->c.status() != CUBLAS_STATUS_SUCCESS) {
      return "cublasLtMatrixLayoutCreate failed for m=" + std::to_string(m);
    }
    cublasLtMatmulHeuristicResult_t checked = {};
    if (cublasStatus_t s = cublasLtMatmulAlgoCheck(impl_->handle, impl_->desc, made->a.get(), made->b.get(),
                                                   made->c.get(), made->c.get(), &algo, &checked);
        s != CUBLAS_STATUS_SUCCESS) {
      return cublasError("cublasLtMatmulAlgoCheck (the pinned algorithm for this m)", s);
    }
    if (checked.workspaceSize > kWorkspaceBytes) {
      return "the pinned algorithm for n=" + std::to_string(n) + ", k=" + std::to_string(k) + " needs " +
             std::to_string(checked.workspaceSize) + " bytes of workspace at m=" + std::to_string(m) + ", over the " +
             std::to_string(kWorkspaceBytes) + " it has (split-K " + std::to_string(impl_->options.split_k) + ")";
    }
    // Bounded (a step's m varies): past the bound the cache starts again.
    if (impl_->calls.size() >= kMaxCachedShapes) impl_->calls.clear();
    found = impl_->calls.emplace(std::make_tuple(m, n, k), std::move(made)).first;
  }
  const Impl::Call& call = *found->second;
  const Layout& a = call.a;
  const Layout& b = call.b;
  const Layout& c = call.c;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (cublasStatus_t s = cublasLtMatmul(impl_->handle, impl_->desc, &alpha, w, a.get(), x, b.get(), &beta, y, c.get(),
                                        y, c.get(), &algo, impl_->workspace, kWorkspaceBytes,
                                        static_cast<cudaStream_t>(stream));
      s != CUBLAS_STATUS_SUCCESS) {
    return cublasError("cublasLtMatmul", s);
  }
  return "";
}

}  // namespace tandem::gpu
