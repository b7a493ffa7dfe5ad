// Every algorithm cuBLASLt's heuristic offers for the MLP's down projection y = h W^T
// (h [M, K], W [N, K], bf16, fp32 accumulation, no bias), timed one by one: does any beat the
// heuristic's first choice, which is what torch's F.linear runs? (NOTES, session 22.)
// Each call is timed alone with CUDA events after a 256 MB write that flushes L2; median of
// --reps calls. Each algorithm's output is compared with the first one's (max |difference|).
//   nvcc -O2 -std=c++17 -arch=sm_90 -I<cublas include> -L<cublas lib> -lcublasLt \
//     -o /tmp/lt_algos benchmarks/micro/lt_algos.cu
//   /tmp/lt_algos M N K [reps] [algos] ...   (one triple per shape)
// LT_CONTEXT=mlp (environment): before each call, instead of a 256 MB write (whose dirty lines
// the GEMM then competes with), a 256 MB read evicts W from L2 and h is copied in (3.7 MB of
// dirty lines at M 128), as right after the gate/up kernel in the MLP. Every heuristic
// algorithm with split-K is also tried with the two other reduction schemes (in place: partial
// sums through the output and counters, no second kernel; in the output type), and the
// no-split ones with split-K 2 / 3 / 4 in place, where cublasLtMatmulAlgoCheck accepts them
// (NOTES, session 29).
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "cuda_check.h"

#define LK(x)                                                                        \
  do {                                                                               \
    cublasStatus_t s_ = (x);                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, (int)s_); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 32768.0f - 1.0f) * scale);
  }
}

__global__ void read_all(const int4* p, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const int4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;  // never (the buffer holds small values): keeps the loads
}

__global__ void scribble(int* p, size_t n, int v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s M N K [reps] [algos]\n", argv[0]);
    return 2;
  }
  const int M = std::atoi(argv[1]), N = std::atoi(argv[2]), K = std::atoi(argv[3]);
  const int reps = argc > 4 ? std::atoi(argv[4]) : 30;
  const int want = argc > 5 ? std::atoi(argv[5]) : 32;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s, M %d N %d K %d, reps %d (median), L2 flushed before each call\n", prop.name, M, N, K, reps);

  __nv_bfloat16 *h, *w, *y, *y0;
  CK(cudaMalloc(&h, sizeof(__nv_bfloat16) * M * K));
  CK(cudaMalloc(&w, sizeof(__nv_bfloat16) * (size_t)N * K));
  CK(cudaMalloc(&y, sizeof(__nv_bfloat16) * M * N));
  CK(cudaMalloc(&y0, sizeof(__nv_bfloat16) * M * N));
  const size_t flush_ints = 64u << 20;  // 256 MB
  int* flush;
  CK(cudaMalloc(&flush, flush_ints * sizeof(int)));
  fill<<<1024, 256>>>(h, (size_t)M * K, 1u, 1.0f);
  fill<<<1024, 256>>>(w, (size_t)N * K, 2u, 1.0f / std::sqrt((float)K));
  CK(cudaDeviceSynchronize());

  const size_t ws_bytes = 64u << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  cublasLtHandle_t lt;
  LK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op;
  LK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major view: y^T [N, M] = W [N, K] (stored [K, N], transposed) x h^T [K, M].
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtMatrixLayout_t la, lb, lc;
  LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
  LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
  LK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> res(want);
  int found = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, want, res.data(), &found));
  std::printf("# heuristic results: %d\n", found);

  const float one = 1.0f, zero = 0.0f;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const bool mlp_context = std::getenv("LT_CONTEXT") != nullptr && std::string(std::getenv("LT_CONTEXT")) == "mlp";
  __nv_bfloat16* h_src = nullptr;
  int* sink = nullptr;
  if (mlp_context) {
    CK(cudaMalloc(&h_src, sizeof(__nv_bfloat16) * M * K));
    CK(cudaMemcpy(h_src, h, sizeof(__nv_bfloat16) * M * K, cudaMemcpyDeviceToDevice));
    CK(cudaMalloc(&sink, sizeof(int)));
    scribble<<<1024, 256>>>(flush, flush_ints, 1);
    CK(cudaDeviceSynchronize());
  }
  std::printf("# context: %s\n", mlp_context ? "mlp (256 MB read, then h copied in)" : "256 MB written before each call");
  std::vector<__nv_bfloat16> host0((size_t)M * N), host((size_t)M * N);
  double best = 1e30, first = 0;
  bool have_first = false;
  const auto attr = [](const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t what) {
    int v = -1;
    size_t sz;
    cublasLtMatmulAlgoConfigGetAttribute(&a, what, &v, sizeof(v), &sz);
    return v;
  };
  // Times one algorithm (after a check), prints its line; false where it cannot run.
  const auto time_algo = [&](const cublasLtMatmulAlgo_t& algo, const char* label) {
    cublasLtMatmulHeuristicResult_t chk{};
    if (cublasLtMatmulAlgoCheck(lt, op, la, lb, lc, lc, &algo, &chk) != CUBLAS_STATUS_SUCCESS ||
        chk.workspaceSize > ws_bytes) {
      std::printf("%-14s: not supported\n", label);
      return false;
    }
    __nv_bfloat16* out = have_first ? y : y0;
    CK(cudaMemset(out, 0xff, sizeof(__nv_bfloat16) * M * N));  // NaN poison
    if (cublasLtMatmul(lt, op, &one, w, la, h, lb, &zero, out, lc, out, lc, &algo, ws, ws_bytes, 0) !=
        CUBLAS_STATUS_SUCCESS) {
      std::printf("%-14s: launch failed\n", label);
      return false;
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < reps + 3; ++r) {
      if (mlp_context) {
        read_all<<<1024, 256>>>(reinterpret_cast<const int4*>(flush), flush_ints / 4, sink);
        CK(cudaMemcpyAsync(h, h_src, sizeof(__nv_bfloat16) * M * K, cudaMemcpyDeviceToDevice));
      } else {
        scribble<<<1024, 256>>>(flush, flush_ints, r);
      }
      CK(cudaEventRecord(e0));
      LK(cublasLtMatmul(lt, op, &one, w, la, h, lb, &zero, out, lc, out, lc, &algo, ws, ws_bytes, 0));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 3) t.push_back(ms * 1000.0f);
    }
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2];
    CK(cudaMemcpy(have_first ? host.data() : host0.data(), out, sizeof(__nv_bfloat16) * M * N, cudaMemcpyDeviceToHost));
    double maxdiff = 0;
    bool nan = false;
    if (have_first) {
      for (size_t j = 0; j < host.size(); ++j) {
        const float a = __bfloat162float(host[j]), b = __bfloat162float(host0[j]);
        if (std::isnan(a)) nan = true;
        maxdiff = std::max(maxdiff, (double)std::fabs(a - b));
      }
    } else {
      first = med;
      have_first = true;
    }
    best = std::min(best, med);
    std::printf("%-14s: %8.2f us  (%.3f of the first)  tile %d stages %d splitk %d reduction %d swizzle %d cluster %d"
                "  workspace %zu  max|diff| %.3g%s\n",
                label, med, med / first, attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                attr(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), attr(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), chk.workspaceSize, maxdiff, nan ? " NaN" : "");
    return true;
  };
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    char label[64];
    std::snprintf(label, sizeof(label), "algo %2d", i);
    if (!time_algo(res[i].algo, label) && i == 0) return 1;
    const int splitk = attr(res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    // the other reduction schemes for split-K algorithms; split-K in place for the others
    std::vector<std::pair<int, int>> variants;  // (splitk, reduction scheme)
    if (splitk > 1) variants = {{splitk, CUBLASLT_REDUCTION_SCHEME_INPLACE}, {splitk, CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE}};
    else variants = {{2, CUBLASLT_REDUCTION_SCHEME_INPLACE}, {3, CUBLASLT_REDUCTION_SCHEME_INPLACE},
                     {4, CUBLASLT_REDUCTION_SCHEME_INPLACE}};
    for (const auto& [sk, red] : variants) {
      cublasLtMatmulAlgo_t a = res[i].algo;
      cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof(sk));
      const uint32_t r32 = red;
      cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &r32, sizeof(r32));
      std::snprintf(label, sizeof(label), "algo %2d k%d r%d", i, sk, red);
      time_algo(a, label);
    }
  }
  std::printf("# first %.2f us, best %.2f us\n", first, best);
  return 0;
}
