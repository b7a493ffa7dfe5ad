// Is the dh epilogue's memory traffic slow because of its access pattern? (NOTES, session 10:
// alone, without arithmetic, it moves GeGLU d768's 200 MB in ~70 us, 2.9 TB/s, whatever the
// loads in flight; a device copy does 4.2 TB/s.) This streams the same bytes with no GEMM:
// read g | u of pre [M, 2N] bf16, write dg | du (here g ^ u and u) to out [M, 2N] (or in place).
// One kernel, three knobs, so that the access pattern and the parallelism are varied apart:
//
//   order   rows: the whole array as one grid-stride stream of 16-byte pieces (a copy's pattern)
//           tiles: CTAs walk 128 x TN tiles (TN = 256 as the dh kernel, or 512) in the dh
//           kernel's grouped order (G row blocks per group: 8 as the kernel, 1 = row-major,
//           64 = column-major); per tile and row, TN * 2 bytes of g and of u, rows 12 KB apart
//   depth   pieces (of g and of u) each thread loads before it stores any: bytes in flight
//   grid    CTAs x threads: one 224-thread CTA per SM as the kernel's epilogue, or more
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

constexpr int kM = 8192, kN = 3072;          // GeGLU d768's dh: pre and out are [kM, 2 kN] bf16
constexpr int64_t kRowPieces = 2 * kN / 8;   // 16-byte pieces per row of pre
constexpr int64_t kHalf = kN / 8;            // from a piece of g to the matching piece of u

// Offset (in 16-byte pieces) of the g piece of item e: rows order when TN == 0, else item e of
// tile t (128 rows x TN / 8 pieces, row-major inside the tile) in the grouped tile order.
template <int TN>
__device__ __forceinline__ int64_t item_offset(int64_t e, int t, int group_m) {
  if constexpr (TN == 0) {
    return (e / kHalf) * kRowPieces + e % kHalf;
  } else {
    constexpr int kChunks = TN / 8, tiles_m = kM / 128, tiles_n = kN / TN;
    const int per_group = group_m * tiles_n, first_m = (t / per_group) * group_m;
    const int rows = min(tiles_m - first_m, group_m), r = t % per_group;
    const int m0 = (first_m + r % rows) * 128, n0 = (r / rows) * TN;
    return int64_t(m0 + e / kChunks) * kRowPieces + n0 / 8 + e % kChunks;
  }
}

// Mode 0: read g | u, write both; 1: read only (an impossible test keeps the loads); 2: write only.
// Lead > 0 (tiles only): before each batch, bulk L2 prefetches of the g and u row pieces Lead
// rows ahead of the batch's first row (into the CTA's next tile past row 127): bytes requested
// ahead without registers.
template <int TN, int Depth, int Mode = 0, int Lead = 0>
__global__ void stream_kernel(const uint4* __restrict__ pre, uint4* __restrict__ out, int group_m) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  static_assert(TN == 0 || kN % (TN == 0 ? 1 : TN) == 0, "whole tiles only");
  // rows: one "tile" holding every item, walked by the whole grid
  const int64_t items = TN == 0 ? int64_t(kM) * kHalf : 128 * (TN / 8);
  const int tiles = TN == 0 ? 1 : (kM / 128) * (kN / TN);
  const int64_t first = TN == 0 ? int64_t(blockIdx.x) * blockDim.x + threadIdx.x : threadIdx.x;
  const int64_t stride = TN == 0 ? int64_t(gridDim.x) * blockDim.x : blockDim.x;
  for (int t = TN == 0 ? 0 : blockIdx.x; t < tiles; t += TN == 0 ? 1 : gridDim.x) {
    for (int64_t e0 = first; e0 < items; e0 += stride * Depth) {
      if constexpr (Lead > 0 && TN > 0) {
        constexpr int kChunks = TN / 8;
        const int batch_rows = int(stride) * Depth / kChunks, i = threadIdx.x;
        if (i < 2 * batch_rows) {
          int row = int((e0 - first) / kChunks) + Lead + i / 2, tile = t;
          if (row >= 128) row -= 128, tile += gridDim.x;
          if (tile < tiles) {
            const uint4* p = pre + item_offset<TN>(int64_t(row) * kChunks, tile, group_m) + (i % 2) * kHalf;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(TN * 2) : "memory");
          }
        }
      }
      uint4 g[Depth], u[Depth];
      int64_t off[Depth];
#pragma unroll
      for (int j = 0; j < Depth; ++j) {
        const int64_t e = e0 + j * stride;
        off[j] = e < items ? item_offset<TN>(e, t, group_m) : -1;
        if (off[j] >= 0 && Mode != 2) {
          g[j] = pre[off[j]];
          u[j] = pre[off[j] + kHalf];
        }
        if (Mode == 2) {
          g[j] = make_uint4(uint32_t(off[j]), 1, 2, 3);
          u[j] = make_uint4(4, 5, 6, uint32_t(off[j]));
        }
      }
#pragma unroll
      for (int j = 0; j < Depth; ++j) {
        if (Mode == 1 && off[j] >= 0) {
          acc.x ^= g[j].x ^ u[j].w;
          acc.y += g[j].y ^ u[j].z;
        } else if (off[j] >= 0) {
          out[off[j]] = make_uint4(g[j].x ^ u[j].x, g[j].y ^ u[j].y, g[j].z ^ u[j].z, g[j].w ^ u[j].w);
          out[off[j] + kHalf] = u[j];
        }
      }
    }
  }
  if (Mode == 1 && acc.x == 0x9e3779b9u && acc.y == 0x7f4a7c15u) out[threadIdx.x] = acc;
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
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // launch(src, dst): dst == src for the in-place variants (out holds a copy of pre then)
  // traffic: 2 = read and write (all bytes twice), 1 = read only or write only
  const auto time = [&](const char* name, bool checked, bool inplace, auto launch, int traffic = 2) {
    CK(cudaMemcpy(pre, host.data(), bytes, cudaMemcpyHostToDevice));
    if (inplace) CK(cudaMemcpy(out, pre, bytes, cudaMemcpyDeviceToDevice));
    else CK(cudaMemset(out, 0xff, bytes));
    launch(inplace ? out : pre, out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(back.data(), out, bytes, cudaMemcpyDeviceToHost));
    const bool ok = !checked || check(host, back);
    std::vector<float> ms;
    for (int r = 0; r < 43; ++r) {  // in place, g toggles between g and g ^ u: same traffic
      CK(cudaMemsetAsync(flush, r & 0xff, size_t(256) << 20));
      CK(cudaEventRecord(e0));
      launch(inplace ? out : pre, out);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (r >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2] * 1e3;
    std::printf("[stream] %-32s median %7.1f us  min %7.1f  %5.2f TB/s  check %s\n", name, med,
                ms[0] * 1e3, traffic * double(bytes) / med * 1e-6, !checked ? "skipped" : ok ? "ok" : "FAIL");
  };
  time("copy", false, false, [&](uint4* src, uint4* dst) {
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  });
  // kernel: a stream_kernel instance (order TN, depth, mode, lead); grid: CTAs per SM x threads
  const auto run = [&](const char* name, bool inplace, auto kernel, int ctas_per_sm, int threads, int group,
                       int traffic = 2) {
    time(name, traffic == 2, inplace, [&](uint4* src, uint4* dst) {
      kernel<<<sms * ctas_per_sm, threads>>>(src, dst, group);
    }, traffic);
  };
  run("rows     8x256 d1", false, stream_kernel<0, 1>, 8, 256, 1);
  run("rows     1x224 d1", false, stream_kernel<0, 1>, 1, 224, 1);
  run("rows     1x224 d4", false, stream_kernel<0, 4>, 1, 224, 1);
  run("rows     1x224 d4 inplace", true, stream_kernel<0, 4>, 1, 224, 1);
  run("tiles256 g8 1x224 d1", false, stream_kernel<256, 1>, 1, 224, 8);
  run("tiles256 g8 1x224 d4", false, stream_kernel<256, 4>, 1, 224, 8);
  run("tiles256 g8 1x224 d4 inplace", true, stream_kernel<256, 4>, 1, 224, 8);
  run("tiles256 g8 1x224 d8", false, stream_kernel<256, 8>, 1, 224, 8);
  run("tiles256 g8 4x224 d4", false, stream_kernel<256, 4>, 4, 224, 8);
  run("tiles256 g1 1x224 d4", false, stream_kernel<256, 4>, 1, 224, 1);
  run("tiles256 g64 1x224 d4", false, stream_kernel<256, 4>, 1, 224, 64);
  run("tiles512 g8 1x224 d4", false, stream_kernel<512, 4>, 1, 224, 8);
  run("tiles256 g8 1x224 d2 inplace", true, stream_kernel<256, 2>, 1, 224, 8);
  run("tiles256 g8 1x224 d2 inplace pf16", true, stream_kernel<256, 2, 0, 16>, 1, 224, 8);
  run("tiles256 g8 1x224 d2 inplace pf32", true, stream_kernel<256, 2, 0, 32>, 1, 224, 8);
  run("tiles256 g8 1x224 d2 inplace pf64", true, stream_kernel<256, 2, 0, 64>, 1, 224, 8);
  run("tiles256 g8 1x224 d4 inplace pf32", true, stream_kernel<256, 4, 0, 32>, 1, 224, 8);
  run("tiles256 g8 1x224 d1 inplace pf32", true, stream_kernel<256, 1, 0, 32>, 1, 224, 8);
  run("rows     1x224 d4 read only", false, stream_kernel<0, 4, 1>, 1, 224, 1, 1);
  run("rows     1x224 d4 write only", false, stream_kernel<0, 4, 2>, 1, 224, 1, 1);
  run("tiles256 g8 1x224 d4 read only", false, stream_kernel<256, 4, 1>, 1, 224, 8, 1);
  run("tiles256 g8 1x224 d4 write only", false, stream_kernel<256, 4, 2>, 1, 224, 8, 1);
  return 0;
}
