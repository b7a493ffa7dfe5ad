// Every algorithm cuBLASLt's heuristic offers for the MLP's down projection y = h W^T
// (h [M, K], W [N, K], bf16, fp32 accumulation, no bias), timed one by one: does any beat the
// heuristic's first choice, which is what torch's F.linear runs? (NOTES, session 22.)
// Each call is timed alone with CUDA events after a 256 MB write that flushes L2; median of
// --reps calls. Each algorithm's output is compared with the first one's (max |difference|).
//   nvcc -O2 -std=c++17 -arch=sm_90 -I<cublas include> -L<cublas lib> -lcublasLt \
//     -o /tmp/lt_algos benchmarks/micro/lt_algos.cu
//   /tmp/lt_algos M N K [reps] [algos] ...   (one triple per shape)
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
  std::vector<__nv_bfloat16> host0((size_t)M * N), host((size_t)M * N);
  double best = 1e30, first = 0;
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    __nv_bfloat16* out = i == 0 ? y0 : y;
    CK(cudaMemset(out, 0xff, sizeof(__nv_bfloat16) * M * N));  // NaN poison
    if (cublasLtMatmul(lt, op, &one, w, la, h, lb, &zero, out, lc, out, lc, &res[i].algo, ws, ws_bytes, 0) !=
        CUBLAS_STATUS_SUCCESS) {
      std::printf("algo %2d: launch failed\n", i);
      continue;
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < reps + 3; ++r) {
      scribble<<<1024, 256>>>(flush, flush_ints, r);
      CK(cudaEventRecord(e0));
      LK(cublasLtMatmul(lt, op, &one, w, la, h, lb, &zero, out, lc, out, lc, &res[i].algo, ws, ws_bytes, 0));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 3) t.push_back(ms * 1000.0f);
    }
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2];
    CK(cudaMemcpy(i == 0 ? host0.data() : host.data(), out, sizeof(__nv_bfloat16) * M * N, cudaMemcpyDeviceToHost));
    double maxdiff = 0;
    bool nan = false;
    if (i > 0) {
      for (size_t j = 0; j < host.size(); ++j) {
        const float a = __bfloat162float(host[j]), b = __bfloat162float(host0[j]);
        if (std::isnan(a)) nan = true;
        maxdiff = std::max(maxdiff, (double)std::fabs(a - b));
      }
    }
    int tile = -1, stages = -1, splitk = -1, red = -1, swz = -1, cta = -1;
    size_t sz;
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof(swz), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cta, sizeof(cta), &sz);
    if (i == 0) first = med;
    best = std::min(best, med);
    std::printf("algo %2d: %8.2f us  (%.3f of the first)  tile %d stages %d splitk %d reduction %d swizzle %d cluster %d"
                "  workspace %zu  waves %.2f  max|diff| %.3g%s\n",
                i, med, med / first, tile, stages, splitk, red, swz, cta, res[i].workspaceSize, res[i].wavesCount,
                maxdiff, nan ? " NaN" : "");
  }
  std::printf("# first %.2f us, best %.2f us\n", first, best);
  return 0;
}
