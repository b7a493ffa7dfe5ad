// Is the dh epilogue's memory traffic slow because of its access pattern? (NOTES, session 10:
// alone, without arithmetic, it moves GeGLU d768's 200 MB in ~70 us, 2.9 TB/s, whatever the
// loads in flight; a device copy does 4.2 TB/s.) This streams the same bytes with no GEMM:
// read g | u of pre [M, 2N] bf16, write dg | du (here g ^ u and u) to out [M, 2N], in three orders:
//
//   rows       every thread moves 16-byte pieces of whole rows, grid-stride (a copy's pattern)
//   tiles256   persistent CTAs (one per SM, 224 threads) walk 128 x 256 tiles in the dh
//              kernel's order (groups of 8 row blocks): per tile and row, 512 bytes of g and
//              512 of u, as the kernel's epilogue reads them (and writes dg | du)
//   tiles512   the same with 128 x 512 tiles (rows of 1 KB per array)
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -o .probe/stream_pattern benchmarks/micro/stream_pattern.cu
//   .probe/stream_pattern
//
// Each kernel's output is checked on sampled elements; then 40 runs of [256 MiB memset to
// flush L2; event; kernel; event], median and min, and cudaMemcpyAsync of the same bytes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

constexpr int kM = 8192, kN = 3072;  // GeGLU d768's dh: pre and out are [kM, 2 kN] bf16

__device__ __forceinline__ void move(const uint4* src, uint4* dst, int64_t n_off) {
  // one 16-byte piece of g and the matching piece of u
  const uint4 g = src[0];
  const uint4 u = src[n_off];
  dst[0] = make_uint4(g.x ^ u.x, g.y ^ u.y, g.z ^ u.z, g.w ^ u.w);
  dst[n_off] = u;
}

__global__ void rows_kernel(const uint4* pre, uint4* out) {
  constexpr int64_t kPiecesPerRow = kN / 8;  // 16-byte pieces of g in a row
  const int64_t total = int64_t(kM) * kPiecesPerRow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / kPiecesPerRow, c = i % kPiecesPerRow;
    const int64_t off = m * 2 * kPiecesPerRow + c;
    move(pre + off, out + off, kPiecesPerRow);
  }
}

// 128 x TN tiles in the order of the dh kernel (tile_coords with kGroupM = 8), 224 threads.
template <int TN>
__global__ void __launch_bounds__(224) tiles_kernel(const uint4* pre, uint4* out) {
  constexpr int kChunks = TN / 8;              // 16-byte pieces per tile row (g part)
  constexpr int64_t kRowPieces = 2 * kN / 8;   // pieces per row of pre
  constexpr int tiles_m = kM / 128, tiles_n = (kN + TN - 1) / TN;
  const int tiles = tiles_m * tiles_n;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int per_group = 8 * tiles_n, first_m = (t / per_group) * 8;
    const int rows = min(tiles_m - first_m, 8), r = t % per_group;
    const int m0 = (first_m + r % rows) * 128, n0 = (r / rows) * TN;
    for (int e = threadIdx.x; e < 128 * kChunks; e += blockDim.x) {
      const int row = e / kChunks, chunk = e % kChunks;
      if (n0 + chunk * 8 >= kN) continue;
      const int64_t off = int64_t(m0 + row) * kRowPieces + (n0 / 8 + chunk);
      move(pre + off, out + off, kN / 8);
    }
  }
}

static bool check(const std::vector<uint16_t>& pre, const std::vector<uint16_t>& out) {
  for (int s = 0; s < 4096; ++s) {
    const int64_t m = (int64_t(s) * 7919) % kM, n = (int64_t(s) * 104729) % kN;
    const int64_t g = m * 2 * kN + n, u = g + kN;
    if (out[g] != uint16_t(pre[g] ^ pre[u]) || out[u] != pre[u]) return false;
  }
  return true;
}

int main() {
  const size_t elems = size_t(kM) * 2 * kN, bytes = elems * 2;
  std::vector<uint16_t> host(elems), back(elems);
  for (size_t i = 0; i < elems; ++i) host[i] = uint16_t((i * 2654435761u) >> 7);
  uint4 *pre, *out;
  void* flush;
  CK(cudaMalloc(&pre, bytes));
  CK(cudaMalloc(&out, bytes));
  CK(cudaMalloc(&flush, size_t(256) << 20));
  CK(cudaMemcpy(pre, host.data(), bytes, cudaMemcpyHostToDevice));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const auto time = [&](const char* name, bool checked, auto launch) {
    CK(cudaMemset(out, 0xff, bytes));
    launch();
    CK(cudaGetLastError());
    CK(cudaMemcpy(back.data(), out, bytes, cudaMemcpyDeviceToHost));
    const bool ok = !checked || check(host, back);
    std::vector<float> ms;
    for (int r = 0; r < 43; ++r) {
      CK(cudaMemsetAsync(flush, r & 0xff, size_t(256) << 20));
      CK(cudaEventRecord(e0));
      launch();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (r >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2] * 1e3;
    std::printf("[stream] %-10s median %7.1f us  min %7.1f  %5.2f TB/s (read + write)  check %s\n", name, med,
                ms[0] * 1e3, 2.0 * bytes / med * 1e-6, !checked ? "skipped" : ok ? "ok" : "FAIL");
  };
  time("copy", false, [&] { CK(cudaMemcpyAsync(out, pre, bytes, cudaMemcpyDeviceToDevice)); });
  time("rows", true, [&] { rows_kernel<<<sms * 8, 256>>>(pre, out); });
  time("tiles256", true, [&] { tiles_kernel<256><<<sms, 224>>>(pre, out); });
  time("tiles512", true, [&] { tiles_kernel<512><<<sms, 224>>>(pre, out); });
  return 0;
}
