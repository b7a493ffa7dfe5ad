// Can a down GEMM of ours stream W_down at cuBLAS's rate without splitting K across kernels?
// (NOTES, session 48; a probe: nothing here is used by the package.)
//
// At SwiGLU M 128 the down projection (y = h W_down^T, h [128, 14336], W_down [4096, 14336])
// runs as cuBLAS's strided-batched GEMM over two K halves (128 x 64 tiles, 128 CTAs, fp32
// partial sums) and a reduction kernel of ours: the reduction and its launch are the ~2 us a
// single kernel could save if it streamed W_down as fast. This streams the bytes such a kernel
// would read, with TMA and nothing else (no MMAs: session 24 found the M 128 gated kernel's
// time is its TMA stream), in the tile pattern it would use: CTA (row block r, K part p) loads
// per K step of 64 columns the rb x 64 box of W_down's rows [r rb, r rb + rb) and, unless
// hmode is 0, the 128 x 64 box of h (hmode 1: by itself; hmode 2: CTA pairs of one K part and
// adjacent row blocks form a cluster of 2, each loading 64 of h's rows and multicasting them
// to both). A consumer thread releases each stage as soon as it lands and sums one word of
// each box into `sink` (the Python side checks it).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared \
//        -o .probe/libdown_stream.so benchmarks/micro/down_stream.cu
//   (driven by benchmarks/micro/down_stream.py)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda_check.h"
#include "tma_encode.h"

namespace {

struct Cfg {
  int rb;      // W_down rows per CTA (64 or 128)
  int parts;   // K parts (1, 2 or 4)
  int hmode;   // 0: no h; 1: each CTA loads h; 2: CTA pairs multicast h
  int stages;  // ring stages
  int ksteps;  // K / 64
  int n;       // W_down rows
};

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
__device__ __forceinline__ void bar_arrive_peer(uint64_t* bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
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
__device__ __forceinline__ void load2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                 uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Which row block and K part CTA b streams (the Python check mirrors it).
__device__ __forceinline__ void coords(const Cfg& c, int b, int& rowblock, int& part, int& rank) {
  if (c.hmode == 2) {
    rank = int(cluster_rank());  // b % 2: 1-D clusters of 2 along a 1-D grid
    const int cl = b / 2;
    part = cl % c.parts;
    rowblock = (cl / c.parts) * 2 + rank;
  } else {
    rank = 0;
    part = b % c.parts;
    rowblock = b / c.parts;
  }
}

__global__ void __launch_bounds__(64) down_stream_kernel(const __grid_constant__ CUtensorMap mw,
                                                         const __grid_constant__ CUtensorMap mh,
                                                         const __grid_constant__ CUtensorMap mh_half, Cfg c,
                                                         unsigned long long* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t wbytes = uint32_t(c.rb) * 128, hbytes = c.hmode ? 128u * 128u : 0u;
  const uint32_t stage_bytes = wbytes + hbytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(c.stages) * stage_bytes);
  uint64_t* empty = full + c.stages;
  int rowblock, part, rank;
  coords(c, blockIdx.x, rowblock, part, rank);
  const int kb0 = c.ksteps * part / c.parts, kb1 = c.ksteps * (part + 1) / c.parts, steps = kb1 - kb0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < c.stages; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], c.hmode == 2 ? 2 : 1);  // multicast: both CTAs' consumers free a stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (c.hmode == 2) cluster_sync();  // the peer's barriers exist before anything lands there
  if (threadIdx.x == 0) {
    for (int i = 0; i < steps; ++i) {
      const int s = i % c.stages, k = (kb0 + i) * 64;
      if (i >= c.stages) bar_wait(&empty[s], ((i / c.stages) - 1) & 1);
      bar_expect_tx(&full[s], stage_bytes);
      uint8_t* st = smem + size_t(s) * stage_bytes;
      for (int r = 0; r < c.rb; r += 64) load2d(st + r * 128, &mw, &full[s], k, rowblock * c.rb + r);
      if (c.hmode == 1) load2d(st + wbytes, &mh, &full[s], k, 0);
      if (c.hmode == 2) load2d_multicast(st + wbytes + rank * 8192, &mh_half, &full[s], k, rank * 64, 0x3);
    }
  } else if (threadIdx.x == 32) {
    unsigned long long acc = 0;
    for (int i = 0; i < steps; ++i) {
      const int s = i % c.stages;
      bar_wait(&full[s], (i / c.stages) & 1);
      const uint8_t* st = smem + size_t(s) * stage_bytes;
      acc += *reinterpret_cast<const uint32_t*>(st);
      if (c.hmode) acc += *reinterpret_cast<const uint32_t*>(st + wbytes);
      bar_arrive(&empty[s]);
      if (c.hmode == 2) bar_arrive_peer(&empty[s], rank ^ 1u);
    }
    atomicAdd(sink, acc);
  }
  __syncwarp();
  if (c.hmode == 2) cluster_sync();  // no CTA leaves while its peer may still write into it
}

// The ceiling: W_down's bytes read once with 16-byte loads, grid-stride.
__global__ void __launch_bounds__(512) ld_stream_kernel(const uint4* __restrict__ a, int64_t n,
                                                        unsigned long long* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w)
                   : "l"(a + i + j * stride));
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) acc ^= a[i].x;
  if (acc == 0x12345678u) atomicAdd(sink, 1ull);  // keeps the loads
}

CUtensorMap map2d(void* base, int cols, int rows, int box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, elem[2] = {1, 1};
  const CUresult r = encode()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, elem,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", int(r));
    std::exit(2);
  }
  return m;
}

}  // namespace

// w: [n, k] bf16, h: [128, k] bf16 (k a multiple of 64 and of 64 x parts), sink: one u64.
// Returns 0, or -1 for a configuration it does not take.
extern "C" int down_stream_launch(void* w, void* h, int n, int k, int rb, int parts, int hmode, int stages,
                                  unsigned long long* sink, cudaStream_t stream) {
  if ((rb != 64 && rb != 128) || n % (rb * (hmode == 2 ? 2 : 1)) || k % 64 || hmode < 0 || hmode > 2) return -1;
  const CUtensorMap mw = map2d(w, k, n, 64), mh = map2d(h, k, 128, 128), mh_half = map2d(h, k, 128, 64);
  const Cfg c{rb, parts, hmode, stages, k / 64, n};
  const int smem = stages * (rb * 128 + (hmode ? 128 * 128 : 0)) + 16 * stages;
  CK(cudaFuncSetAttribute(down_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(n / rb * parts));
  cfg.blockDim = dim3(64);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = hmode == 2 ? 2 : 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, down_stream_kernel, mw, mh, mh_half, c, sink));
  return 0;
}

extern "C" int down_stream_ceiling(void* w, int64_t bytes, int blocks, unsigned long long* sink, cudaStream_t stream) {
  ld_stream_kernel<<<blocks, 512, 0, stream>>>(static_cast<const uint4*>(w), bytes / 16, sink);
  CK(cudaGetLastError());
  return 0;
}

// How many clusters of `size` CTAs of `smem` bytes can be resident at once.
extern "C" int down_stream_max_clusters(int size, int smem) {
  CK(cudaFuncSetAttribute(down_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(size * 64));
  cfg.blockDim = dim3(64);
  cfg.dynamicSmemBytes = size_t(smem);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(size);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, down_stream_kernel, &cfg));
  return clusters;
}
