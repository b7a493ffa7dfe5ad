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
//   cp.async  the loads in flight held in a shared-memory ring instead of registers
//             (stream_async_kernel; not run yet: NOTES, plan of session 11)
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

// The tile walk with the loads in flight held in shared memory instead of registers: each
// thread copies its g and u pieces with cp.async (16 bytes each, no registers held) into its
// own slots of a Stages-deep ring, Stages - 1 items ahead of the one it stores, across tile
// boundaries (the CTA's items in order: tile, then row). A thread only reads what it copied
// itself, so cp.async.wait_group is the only synchronization. Shared memory: Stages x 2 x 16
// bytes per thread (224 threads: 7 KB per stage). The kernel's dh epilogue would need this
// ring beside its staging tile (NOTES, plan of session 11).
template <int TN, int Stages>
__global__ void stream_async_kernel(const uint4* __restrict__ pre, uint4* __restrict__ out, int group_m) {
  extern __shared__ uint4 ring[];  // [Stages][2][blockDim.x]
  constexpr int64_t kItems = 128 * (TN / 8);
  const int tiles = (kM / 128) * (kN / TN);
  const int per_tile = int((kItems + blockDim.x - 1) / blockDim.x);
  const int my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int total = my_tiles * per_tile;
  // item q of this thread: its offset in pieces, or -1 past the tile's items
  const auto offset = [&](int q) -> int64_t {
    const int t = blockIdx.x + (q / per_tile) * gridDim.x;
    const int64_t e = threadIdx.x + int64_t(q % per_tile) * blockDim.x;
    return e < kItems ? item_offset<TN>(e, t, group_m) : -1;
  };
  const auto slot = [&](int q, int half) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ring + (size_t(q % Stages) * 2 + half) * blockDim.x + threadIdx.x));
  };
  const auto issue = [&](int q) {
    if (q < total) {
      const int64_t off = offset(q);
      if (off >= 0) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(slot(q, 0)), "l"(pre + off) : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(slot(q, 1)), "l"(pre + off + kHalf) : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");  // empty groups keep the count aligned
  };
  for (int q = 0; q + 1 < Stages; ++q) issue(q);
  for (int q = 0; q < total; ++q) {
    issue(q + Stages - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(Stages - 1) : "memory");
    const int64_t off = offset(q);
    if (off < 0) continue;
    const uint4 g = ring[(size_t(q % Stages) * 2) * blockDim.x + threadIdx.x];
    const uint4 u = ring[(size_t(q % Stages) * 2 + 1) * blockDim.x + threadIdx.x];
    out[off] = make_uint4(g.x ^ u.x, g.y ^ u.y, g.z ^ u.z, g.w ^ u.w);
    out[off + kHalf] = u;
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
  // the ring in shared memory (cp.async), in place as the dh kernel runs: Stages x 7 KB per CTA
  const auto run_async = [&](const char* name, auto kernel, int stages) {
    const int smem = stages * 2 * 16 * 224;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    time(name, true, true, [&](uint4* src, uint4* dst) { kernel<<<sms, 224, smem>>>(src, dst, 8); });
  };
  run_async("tiles256 g8 1x224 cp.async 2 stages inplace", stream_async_kernel<256, 2>, 2);
  run_async("tiles256 g8 1x224 cp.async 3 stages inplace", stream_async_kernel<256, 3>, 3);
  run_async("tiles256 g8 1x224 cp.async 4 stages inplace", stream_async_kernel<256, 4>, 4);
  run_async("tiles256 g8 1x224 cp.async 6 stages inplace", stream_async_kernel<256, 6>, 6);
  run_async("tiles256 g8 1x224 cp.async 8 stages inplace", stream_async_kernel<256, 8>, 8);
  run("rows     1x224 d4 read only", false, stream_kernel<0, 4, 1>, 1, 224, 1, 1);
  run("rows     1x224 d4 write only", false, stream_kernel<0, 4, 2>, 1, 224, 1, 1);
  run("tiles256 g8 1x224 d4 read only", false, stream_kernel<256, 4, 1>, 1, 224, 8, 1);
  run("tiles256 g8 1x224 d4 write only", false, stream_kernel<256, 4, 2>, 1, 224, 8, 1);
  return 0;
}
