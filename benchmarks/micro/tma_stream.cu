// How fast can TMA stream the gated forward's weights at M 128? (NOTES, session 25.)
//
// At M 128 the gate/up kernel's time is its weights' TMA stream: 235 MB (SwiGLU 4096 x 14336,
// gate and up) at ~3.5 TB/s, with or without MMAs (session 24), while the decode kernel's
// plain loads stream the same bytes at ~3.9. This streams those bytes with TMA and nothing
// else, in the gated kernel's layout (CTA t owns rows [t RB, t RB + RB) of the gate and of the
// up weight and walks K in stages of KB 64-column blocks, a ring of S stages released by a
// consumer warp as soon as they land), and varies what the TMA unit is asked for:
//
//   BR     rows per box (8 = one swizzle atom .. RB); a stage is 2 x KB x RB/BR boxes
//   order  0: k block outer (all rows of block 0, then block 1: the kernel's order);
//          1: row group outer (a row group's KB blocks back to back: KB x 128 contiguous
//          bytes of each row requested together); both give the wgmma layout in shared memory
//   3d     one 3-D box per map and stage (rows x KB blocks x 64; row-consecutive requests, but
//          a layout the MMAs cannot read: a diagnostic of the DRAM side only)
//   tiled  the same bytes read as if the weights were stored pre-tiled (each stage's box one
//          contiguous 14 KB block: what a packed weight layout would stream like)
//
// and plain-load readers of the same bytes (16-byte loads, grid-stride: the ceiling; and in the
// kernel's tile pattern, into registers or by cp.async into a shared-memory ring).
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o .probe/tma_stream benchmarks/micro/tma_stream.cu
//   .probe/tma_stream
// Each configuration: 3 warm-up runs, then 20 of [flush L2 (256 MB memset); event; kernel;
// event]; median and min in us and the median's TB/s. A sampled check of the landed bytes
// runs once per configuration (the consumer sums one word per stage into a sink, compared with
// the host's sum of the same words).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "tma_encode.h"

constexpr int kN = 14336, kK = 4096, kKB = kK / 64;  // each weight [kN, kK] bf16

// 2-D: boxes of br rows x 64 columns, 128-byte swizzle. 3-D: the columns as (64, kKB) and boxes of
// br rows x kb blocks x 64.
static CUtensorMap weight_map(void* base, int br, int kb3d, CUtensorMapL2promotion promo) {
  CUtensorMap m;
  CUresult r;
  if (kb3d < 0) {  // the same bytes as [kN kKB, 64]: a tiled layout where each box is contiguous
    const cuuint64_t dims[2] = {64, cuuint64_t(kN) * kKB};
    const cuuint64_t strides[1] = {128};
    const cuuint32_t box[2] = {64, cuuint32_t(br)}, elem[2] = {1, 1};
    r = encode()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                 CU_TENSOR_MAP_SWIZZLE_128B, promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  } else if (kb3d == 0) {
    const cuuint64_t dims[2] = {kK, kN};
    const cuuint64_t strides[1] = {cuuint64_t(kK) * 2};
    const cuuint32_t box[2] = {64, cuuint32_t(br)}, elem[2] = {1, 1};
    r = encode()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                 CU_TENSOR_MAP_SWIZZLE_128B, promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  } else {
    const cuuint64_t dims[3] = {64, kKB, kN};
    const cuuint64_t strides[2] = {128, cuuint64_t(kK) * 2};
    const cuuint32_t box[3] = {64, cuuint32_t(kb3d), cuuint32_t(br)}, elem[3] = {1, 1, 1};
    r = encode()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                 CU_TENSOR_MAP_SWIZZLE_128B, promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d) br %d kb3d %d\n", int(r), br, kb3d);
    std::exit(2);
  }
  return m;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void load2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void load3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

struct Cfg {
  int rb;     // rows of each weight per CTA
  int br;     // rows per box (2-D)
  int kb;     // 64-column blocks per stage
  int stages;
  int order;  // 0: block outer, 1: row group outer
  int d3;     // > 0: one 3-D box per map and stage; -1: the weights pre-tiled (below)
  int promo = 256;  // the maps' L2 promotion (host side): 0, 128 or 256 bytes
};

// Warp 0 lane 0: producer. Warp 1 lane 0: consumer (waits for a stage, adds one word of each
// weight's part of it to its sum, releases it).
__global__ void __launch_bounds__(64) tma_stream_kernel(const __grid_constant__ CUtensorMap mg,
                                                         const __grid_constant__ CUtensorMap mu, Cfg c,
                                                         unsigned long long* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t half = uint32_t(c.kb) * c.rb * 128;  // one weight's bytes per stage
  const uint32_t stage_bytes = 2 * half;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(c.stages) * stage_bytes);
  uint64_t* empty = full + c.stages;
  const int row0 = blockIdx.x * c.rb, steps = kKB / c.kb;
  if (threadIdx.x == 0) {
    for (int s = 0; s < c.stages; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 0; i < steps; ++i) {
      const int s = i % c.stages;
      if (i >= c.stages) bar_wait(&empty[s], ((i / c.stages) - 1) & 1);
      bar_expect_tx(&full[s], stage_bytes);
      uint8_t* g = smem + size_t(s) * stage_bytes;
      uint8_t* u = g + half;
      const int k0 = i * c.kb;
      if (c.d3 < 0) {  // tile t's block k0 is rows (t kKB + k0) rb .. + rb of the [kN kKB, 64] view
        load2d(g, &mg, &full[s], 0, (blockIdx.x * kKB + k0) * c.rb);
        load2d(u, &mu, &full[s], 0, (blockIdx.x * kKB + k0) * c.rb);
      } else if (c.d3) {
        load3d(g, &mg, &full[s], 0, k0, row0);
        load3d(u, &mu, &full[s], 0, k0, row0);
      } else if (c.order == 0) {
        for (int b = 0; b < c.kb; ++b)
          for (int r = 0; r < c.rb; r += c.br) {
            const uint32_t off = uint32_t(b) * c.rb * 128 + uint32_t(r) * 128;
            load2d(g + off, &mg, &full[s], (k0 + b) * 64, row0 + r);
            load2d(u + off, &mu, &full[s], (k0 + b) * 64, row0 + r);
          }
      } else {
        for (int r = 0; r < c.rb; r += c.br)
          for (int b = 0; b < c.kb; ++b) {
            const uint32_t off = uint32_t(b) * c.rb * 128 + uint32_t(r) * 128;
            load2d(g + off, &mg, &full[s], (k0 + b) * 64, row0 + r);
            load2d(u + off, &mu, &full[s], (k0 + b) * 64, row0 + r);
          }
      }
    }
  } else if (threadIdx.x == 32) {
    unsigned long long acc = 0;
    for (int i = 0; i < steps; ++i) {
      const int s = i % c.stages;
      bar_wait(&full[s], (i / c.stages) & 1);
      const uint8_t* g = smem + size_t(s) * stage_bytes;
      acc += *reinterpret_cast<const uint32_t*>(g) + *reinterpret_cast<const uint32_t*>(g + half);
      bar_arrive(&empty[s]);
    }
    atomicAdd(sink, acc);
  }
}

// The ceiling: every byte of both weights read once with 16-byte loads, grid-stride.
__global__ void __launch_bounds__(512) ld_stream_kernel(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                                        int64_t n, unsigned long long* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w)
                   : "l"(a + i + j * stride));
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[4 + j].x), "=r"(v[4 + j].y), "=r"(v[4 + j].z), "=r"(v[4 + j].w)
                   : "l"(b + i + j * stride));
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) acc ^= a[i].x ^ b[i].y;
  if (acc == 0x12345678u) atomicAdd(sink, 1ull);  // keeps the loads
}

// The same tile pattern with plain loads (is it TMA or the pattern?): CTA t owns rows
// [t 112, t 112 + 112) of each weight; per step of KB 64-column blocks its 256 threads read
// 224 rows x KB x 128 bytes in 16-byte pieces (piece c: row c / (8 KB), the row's pieces
// consecutive), D steps issued before any is used.
template <int KB, int D>
__global__ void __launch_bounds__(256) ld_tile_kernel(const uint4* __restrict__ g, const uint4* __restrict__ u,
                                                      unsigned long long* sink) {
  constexpr int kRows = 112, kPer = 2 * kRows * 8 * KB / 256;  // pieces per thread and step
  constexpr int64_t kRowPieces = kK / 8;
  uint32_t acc = 0;
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  for (int i = 0; i < kKB / KB; i += D) {
    uint4 v[D][kPer];
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const int c = threadIdx.x + 256 * q, row = c / (8 * KB), piece = c % (8 * KB);
        const uint4* base = row < kRows ? g : u;
        const uint4* a = base + (row0 + row % kRows) * kRowPieces + int64_t(i + d) * KB * 8 + piece;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v[d][q].x), "=r"(v[d][q].y), "=r"(v[d][q].z), "=r"(v[d][q].w)
                     : "l"(a));
      }
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int q = 0; q < kPer; ++q)  // volatile, so that no use moves up between the loads
        asm volatile("xor.b32 %0, %0, %1;\n\txor.b32 %0, %0, %2;" : "+r"(acc) : "r"(v[d][q].x), "r"(v[d][q].w));
  }
  if (acc == 0x12345678u) atomicAdd(sink, 1ull);
}

// The tile pattern with cp.async (16 bytes, L2 only) into a ring of S stages of 28 KB: what a
// multi-warp producer of the gated kernel could use instead of TMA.
template <int S>
__global__ void __launch_bounds__(256) cpasync_tile_kernel(const uint4* __restrict__ g, const uint4* __restrict__ u,
                                                           unsigned long long* sink) {
  constexpr int kRows = 112, kPer = 2 * kRows * 8 / 256;
  constexpr int64_t kRowPieces = kK / 8;
  extern __shared__ __align__(1024) uint4 ring[];
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  uint32_t acc = 0;
  auto issue = [&](int i) {
    uint4* st = ring + (i % S) * (2 * kRows * 8);
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int c = threadIdx.x + 256 * q, row = c / 8, piece = c % 8;
      const uint4* base = row < kRows ? g : u;
      const uint4* a = base + (row0 + row % kRows) * kRowPieces + int64_t(i) * 8 + piece;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(st + c)), "l"(a) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  for (int i = 0; i < S - 1; ++i) issue(i);
  for (int i = 0; i < kKB; ++i) {
    if (i + S - 1 < kKB) issue(i + S - 1);
    else asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
    __syncthreads();
    acc ^= ring[(i % S) * (2 * kRows * 8) + threadIdx.x].x;
    __syncthreads();
  }
  if (acc == 0x12345678u) atomicAdd(sink, 1ull);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t wbytes = size_t(kN) * kK * 2;
  std::vector<uint16_t> host(size_t(kN) * kK);
  uint32_t state = 12345u;
  for (auto& h : host) {
    state = state * 1664525u + 1013904223u;
    h = uint16_t(state >> 16);
  }
  void *wg = nullptr, *wu = nullptr, *flush = nullptr;
  unsigned long long* sink = nullptr;
  CK(cudaMalloc(&wg, wbytes));
  CK(cudaMalloc(&wu, wbytes));
  CK(cudaMalloc(&flush, size_t(256) << 20));
  CK(cudaMalloc(&sink, 8));
  CK(cudaMemcpy(wg, host.data(), wbytes, cudaMemcpyHostToDevice));
  for (auto& h : host) h = uint16_t(h * 40503u + 7u);
  CK(cudaMemcpy(wu, host.data(), wbytes, cudaMemcpyHostToDevice));
  std::vector<uint16_t> hu = host;
  // the gate weight's host copy again (for the check)
  std::vector<uint16_t> hg(size_t(kN) * kK);
  CK(cudaMemcpy(hg.data(), wg, wbytes, cudaMemcpyDeviceToHost));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  auto time_it = [&](auto&& launch, const char* name, double bytes) {
    std::vector<float> ts;
    for (int i = 0; i < 23; ++i) {
      CK(cudaMemsetAsync(flush, i & 0xff, size_t(256) << 20));
      CK(cudaEventRecord(e0));
      launch();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 3) ts.push_back(ms * 1000.f);
    }
    CK(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    const double med = ts[ts.size() / 2];
    std::printf("%-44s median %7.1f us  min %7.1f us  %5.2f TB/s\n", name, med, ts[0], bytes / med * 1e-6);
  };

  // The ceiling first.
  {
    const int64_t n = int64_t(wbytes / 16);
    for (int blocks : {sms, 2 * sms, 4 * sms})
      time_it([&] { ld_stream_kernel<<<blocks, 512>>>((const uint4*)wg, (const uint4*)wu, n, sink); },
              (std::string("ld grid-stride ") + std::to_string(blocks) + "x512").c_str(), 2.0 * wbytes);
  }
  {
    const uint4 *g = (const uint4*)wg, *u = (const uint4*)wu;
    const int grid = kN / 112;
    time_it([&] { ld_tile_kernel<1, 2><<<grid, 256>>>(g, u, sink); }, "ld tile kb1 D2", 2.0 * wbytes);
    time_it([&] { ld_tile_kernel<1, 4><<<grid, 256>>>(g, u, sink); }, "ld tile kb1 D4", 2.0 * wbytes);
    time_it([&] { ld_tile_kernel<1, 8><<<grid, 256>>>(g, u, sink); }, "ld tile kb1 D8", 2.0 * wbytes);
    time_it([&] { ld_tile_kernel<4, 2><<<grid, 256>>>(g, u, sink); }, "ld tile kb4 D2", 2.0 * wbytes);
    auto cp = [&](auto kern, int stages, const char* name) {
      const int smem = stages * 2 * 112 * 128;
      CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      time_it([&] { kern<<<grid, 256, smem>>>(g, u, sink); }, name, 2.0 * wbytes);
    };
    cp(cpasync_tile_kernel<4>, 4, "cp.async tile s4");
    cp(cpasync_tile_kernel<7>, 7, "cp.async tile s7");
  }

  std::vector<std::pair<std::string, Cfg>> cfgs = {
      {"kernel: rb112 br112 kb1 s6 (~ ring 168KB)", {112, 112, 1, 6, 0, 0}},
      {"rb112 br112 kb1 s4", {112, 112, 1, 4, 0, 0}},
      {"rb112 br112 kb1 s4 promotion none", {112, 112, 1, 4, 0, 0, 0}},
      {"rb112 br112 kb1 s4 promotion 128", {112, 112, 1, 4, 0, 0, 128}},
      {"rb112 br112 kb2 s3 promotion none", {112, 112, 2, 3, 0, 0, 0}},
      {"rb112 br112 kb1 s7", {112, 112, 1, 7, 0, 0}},
      {"rb112 br112 kb2 s3", {112, 112, 2, 3, 0, 0}},
      {"rb112 br112 kb4 s1", {112, 112, 4, 1, 0, 0}},
      {"rb112 br56 kb1 s6", {112, 56, 1, 6, 0, 0}},
      {"rb112 br8 kb1 s6", {112, 8, 1, 6, 0, 0}},
      {"rb112 br8 kb2 s3 row-outer", {112, 8, 2, 3, 1, 0}},
      {"rb112 br8 kb4 s1 row-outer", {112, 8, 4, 1, 1, 0}},
      {"rb112 br16 kb2 s3 row-outer", {112, 16, 2, 3, 1, 0}},
      {"rb112 br56 kb2 s3 row-outer", {112, 56, 2, 3, 1, 0}},
      {"rb112 3d kb2 s3 (diagnostic)", {112, 112, 2, 3, 0, 2}},
      {"rb112 3d kb4 s1 (diagnostic)", {112, 112, 4, 1, 0, 4}},
      {"rb56 br56 kb1 s6 (256 CTAs, 2/SM)", {56, 56, 1, 6, 0, 0}},
      {"rb56 br56 kb1 s3 (256 CTAs, 2/SM)", {56, 56, 1, 3, 0, 0}},
      {"rb56 br8 kb2 s3 row-outer (256 CTAs)", {56, 8, 2, 3, 1, 0}},
      {"rb128 br128 kb1 s5 (112 CTAs)", {128, 128, 1, 5, 0, 0}},
      {"pre-tiled rb112 kb1 s4 (each box contiguous)", {112, 112, 1, 4, 0, -1}},
      {"pre-tiled rb112 kb1 s6 (each box contiguous)", {112, 112, 1, 6, 0, -1}},
  };
  for (auto& nc : cfgs) {
    const std::string& name = nc.first;
    const Cfg c = nc.second;
    const CUtensorMapL2promotion promo = c.promo == 0     ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                                         : c.promo == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                          : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
    const CUtensorMap mg = weight_map(wg, c.d3 != 0 ? c.rb : c.br, c.d3, promo),
                      mu = weight_map(wu, c.d3 != 0 ? c.rb : c.br, c.d3, promo);
    const size_t smem = size_t(c.stages) * 2 * c.kb * c.rb * 128 + 16 * c.stages + 64;
    CK(cudaFuncSetAttribute(tma_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const int grid = kN / c.rb;
    auto launch = [&] { tma_stream_kernel<<<grid, 64, smem>>>(mg, mu, c, sink); };
    // check: the consumer's sum of the first word of each weight's part of every stage
    CK(cudaMemset(sink, 0, 8));
    launch();
    CK(cudaDeviceSynchronize());
    unsigned long long got = 0, want = 0;
    CK(cudaMemcpy(&got, sink, 8, cudaMemcpyDeviceToHost));
    for (int t = 0; t < grid; ++t)
      for (int i = 0; i < kKB / c.kb; ++i) {
        // the first 4 bytes of a stage: row t*rb, columns (i kb) 64 .. +1 (swizzle leaves row 0's
        // first 16 bytes in place; the 3-D box's first bytes are the same row and block)
        const size_t e = c.d3 < 0 ? (size_t(t) * kKB + i) * c.rb * 64 : size_t(t) * c.rb * kK + size_t(i) * c.kb * 64;
        want += (uint32_t(hg[e]) | (uint32_t(hg[e + 1]) << 16)) + (uint32_t(hu[e]) | (uint32_t(hu[e + 1]) << 16));
      }
    std::printf("%s check %s\n", name.c_str(), got == want ? "ok" : "WRONG");
    time_it(launch, name.c_str(), 2.0 * wbytes);
  }
  return 0;
}
