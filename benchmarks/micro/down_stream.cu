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
// The GEMM itself is here too (probe_gemm_kernel, below: the same ring with wgmma and the two
// K parts reduced in the kernel, in two forms), so that one device call answers both questions.
// Device helpers (TMA, mbarriers, wgmma) come from the package's gated_gemm_sm90_kernel.cuh, the
// cluster forms' hand-off and stores from its down_gemm_sm90_kernel.cuh (down_finish).
//
//   bash tools/gpu_session.sh stage micro-down    (on the device: builds this, then runs
//                                                  benchmarks/micro/down_stream.py)
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DFUSED_MLP_NO_TORCH \
//        -Ikernel_src/common -Ikernel_src/cuda -Ibenchmarks/micro -Xcompiler -fPIC -shared \
//        -o .probe/libdown_stream.so benchmarks/micro/down_stream.cu
#include "down_gemm_sm90_kernel.cuh"  // and through it gated_gemm_sm90_kernel.cuh

#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>

#include "cuda_check.h"
#include "tma_encode.h"

namespace {

using namespace fused_mlp::sm90;

struct Cfg {
  int rb;      // W_down rows per CTA (64 or 128)
  int parts;   // K parts (1 to 4)
  int hmode;   // 0: no h; 1: each CTA loads h; 2: CTA pairs multicast h
  int stages;  // ring stages
  int ksteps;  // K / 64
};

#if defined(FUSED_MLP_SM90_DEVICE)
// tma_load_multicast without an L2 cache policy.
__device__ __forceinline__ void load2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                 uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
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
#endif

__global__ void __launch_bounds__(64) down_stream_kernel(const __grid_constant__ CUtensorMap mw,
                                                         const __grid_constant__ CUtensorMap mh,
                                                         const __grid_constant__ CUtensorMap mh_half, Cfg c,
                                                         unsigned long long* sink) {
#if defined(FUSED_MLP_SM90_DEVICE)
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
      for (int r = 0; r < c.rb; r += 64) tma_load(st + r * 128, &mw, &full[s], k, rowblock * c.rb + r, 0);
      if (c.hmode == 1) tma_load(st + wbytes, &mh, &full[s], k, 0, 0);
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
      if (c.hmode == 2) bar_arrive_cluster(&empty[s], rank ^ 1u);
    }
    atomicAdd(sink, acc);
  }
  __syncwarp();
  if (c.hmode == 2) cluster_sync();  // no CTA leaves while its peer may still write into it
#endif
}

// The GEMM itself, y = h W^T (bf16, fp32 sums), for M <= 128 tokens, N a multiple of 64:
// CTA pair (cluster of 2) r computes y[:, 64 r, 64 r + 64), rank p over K steps
// [ksteps p / 2, ksteps (p + 1) / 2). Warps 0-3 (one MMA warp group): per K step four wgmma
// m64n128k16 with W's 64 x 64 box as A and h's 128 x 64 box as B (the output tile transposed:
// 64 W rows x 128 tokens, 64 fp32 registers a thread). Warp 4, lane 0: the TMA producer. After
// the K loop each CTA hands the half of its partial tile it does not finish to its peer through
// shared memory (DSMEM): rank 0 finishes tokens 0-63, rank 1 tokens 64-127, each as its own
// partial plus the peer's (p0 + p1 either way round: the same bits), rounds once, and stores
// through a staging tile in 16-byte pieces along y's rows (the package's down_finish, since
// session 51: the probe times the package's hand-off). pdl: launched with a programmatic
// edge; the producer loads the first ring's W boxes before griddepcontrol.wait (W is not the
// previous kernel's output, h is).
// Three forms (kMode):
//   kPair   the above: cluster = one row block's two K parts.
//   kGlobal the clusters pair adjacent row blocks of one K part instead (each CTA loads 64 of
//           h's 128 rows and multicasts them to both: h's L2 reads halved, as in cuBLAS's 1x2
//           clusters), so the two K parts of a row block meet through global memory: each CTA
//           writes its fp32 partial tile to a workspace and counts itself in; the second to
//           arrive adds the first one's tile, rounds and stores all 128 tokens, and zeroes the
//           count for the next launch.
//   kQuad   both in a cluster of 4 (session 49): rank 2 p + j computes K part p of row block
//           2 c + j (cluster c); CTAs r and r ^ 1 (one K part, adjacent row blocks) multicast h's halves to each
//           other, CTAs r and r ^ 2 (one row block, the two K parts) add their partial tiles
//           through DSMEM as kPair does. No workspace; 32 clusters of 4 must be resident at
//           once for N 4096 to be one wave.
struct GemmCfg {
  int M, N, K;
  int64_t ldy;
  int stages;
  int pdl;
  float* ws;     // kGlobal: [N / 64][2 K parts][64 registers][128 threads] partial tiles
  int* counts;   // kGlobal: [N / 64] arrivals per row block, zero between launches
};
constexpr int kGemmThreads = 160;
constexpr uint32_t kGemmW = 64 * 128, kGemmH = 128 * 128, kGemmStage = kGemmW + kGemmH;
enum GemmMode { kPair = 0, kGlobal = 1, kQuad = 2 };  // see above
// Diagnostic variants of the pair form (session 51: where do the GEMM's ~6 us over its own
// stream go?), bits of the template argument kDiag; only kDiagWait0 keeps the result right.
//   kDiagNoMma     no wgmma: the ring with the GEMM's release lag, the hand-off and the stores
//   kDiagNoFinish  no hand-off and no stores (a cluster barrier in their place)
//   kDiagWait0     each stage freed as soon as its own MMAs retire (wgmma_wait<0>), instead of
//                  when the next stage's MMAs are issued and this one's retired (wait<1>)
enum GemmDiag { kDiagNoMma = 1, kDiagNoFinish = 2, kDiagWait0 = 4 };

#if defined(FUSED_MLP_SM90_DEVICE)
// kGlobal's end: the partial tile through global memory (see GemmCfg); all 128 MMA threads.
__device__ __forceinline__ void gemm_finish_global(const float (&acc)[64], uint8_t* smem, const GemmCfg& c,
                                                   __nv_bfloat16* y, int rowblock, int part, int tid) {
  __shared__ int arrived;
  const int warp = tid / 32, lane = tid % 32, n0 = rowblock * 64;
  float* mine = c.ws + (size_t(rowblock) * 2 + part) * (64 * 128);
#pragma unroll
  for (int i = 0; i < 64; ++i) mine[i * 128 + tid] = acc[i];
  __threadfence();
  asm volatile("bar.sync 1, 128;" ::: "memory");
  if (tid == 0) arrived = atomicAdd(c.counts + rowblock, 1);
  asm volatile("bar.sync 1, 128;" ::: "memory");
  if (arrived == 0) return;  // the peer part finishes the tile
  __threadfence();
  const float* other = c.ws + (size_t(rowblock) * 2 + (part ^ 1)) * (64 * 128);
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(smem);  // [128 tokens][kDownOutStride], over the idle ring
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const float v = __ldcg(other + i * 128 + tid);
    const int token = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    const int row = warp * 16 + lane / 4 + 8 * ((i % 4) / 2);
    out[token * kDownOutStride + row] = __float2bfloat16_rn(acc[i] + v);
  }
  asm volatile("bar.sync 1, 128;" ::: "memory");
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int q = tid + 128 * u, t = q / 8, ch = q % 8;
    if (t < c.M)
      *reinterpret_cast<uint4*>(y + int64_t(t) * c.ldy + n0 + ch * 8) =
          *reinterpret_cast<const uint4*>(out + t * kDownOutStride + ch * 8);
  }
  if (tid == 0) c.counts[rowblock] = 0;
}

#endif

template <int kMode, int kDiag = 0>
__global__ void __launch_bounds__(kGemmThreads, 1) probe_gemm_kernel(const __grid_constant__ CUtensorMap mw,
                                                                    const __grid_constant__ CUtensorMap mh, GemmCfg c,
                                                                    __nv_bfloat16* y) {
#if defined(FUSED_MLP_SM90_DEVICE)
  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(c.stages) * kGemmStage);
  uint64_t* empty = full + c.stages;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t rank = cluster_rank();
  // kPair: cluster = row block, rank = K part. kGlobal: cluster = (row block pair, K part),
  // rank = which row block. kQuad: cluster = row block pair, rank = 2 K part + which row block.
  constexpr bool kMcast = kMode != kPair;  // h's halves multicast between ranks r and r ^ 1
  const int part = kMode == kPair ? int(rank) : kMode == kGlobal ? int(blockIdx.x / 2) % 2 : int(rank / 2);
  const int rowblock = kMode == kPair ? int(blockIdx.x / 2) : int(blockIdx.x / 4) * 2 + int(rank % 2);
  const uint32_t half = rank % 2;                                // kMcast: the half of h this CTA loads
  const uint16_t pair_mask = uint16_t(0x3u << (rank & ~1u));     // kMcast: ranks r and r ^ 1
  const int n0 = rowblock * 64;
  const int ksteps = (c.K + 63) / 64, kb0 = ksteps * part / 2, steps = ksteps * (part + 1) / 2 - kb0;
  if (tid == 0) {
    for (int s = 0; s < c.stages; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], kMcast ? 2 : 1);  // kMcast: both CTAs' MMA groups free a stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if constexpr (kMcast) cluster_sync();  // the peer's barriers exist before anything lands there
  if (warp == 4) {
    if (lane == 0) {
      const int pre = c.pdl ? (steps < c.stages ? steps : c.stages) : 0;
      // kMcast with M <= 64: the second half of h is wholly past M and not loaded (no TMA box
      // wholly outside its tensor; the stale rows reach only tokens that are never stored), as
      // the package's kernel does
      const bool my_half = !kMcast || int(half) * 64 < c.M;
      const uint32_t stage_tx = (kMcast && c.M <= 64) ? kGemmStage - kGemmH / 2 : kGemmStage;
      for (int i = 0; i < pre; ++i) {
        bar_expect_tx(&full[i], stage_tx);
        tma_load(smem + size_t(i) * kGemmStage, &mw, &full[i], (kb0 + i) * 64, n0, 0);
      }
      if (c.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
      // h's box of step i into stage s: by itself, or (kMcast) its half to both CTAs of the pair
      auto load_h = [&](uint8_t* st, uint64_t* bar, int k) {
        if constexpr (kMcast) {
          if (my_half) load2d_multicast(st + kGemmW + half * 8192u, &mh, bar, k, int(half) * 64, pair_mask);
        } else {
          tma_load(st + kGemmW, &mh, bar, k, 0, 0);
        }
      };
      for (int i = 0; i < pre; ++i) load_h(smem + size_t(i) * kGemmStage, &full[i], (kb0 + i) * 64);
      for (int i = pre; i < steps; ++i) {
        const int s = i % c.stages, k = (kb0 + i) * 64;
        if (i >= c.stages) bar_wait(&empty[s], ((i / c.stages) - 1) & 1);
        bar_expect_tx(&full[s], stage_tx);
        uint8_t* st = smem + size_t(s) * kGemmStage;
        tma_load(st, &mw, &full[s], k, n0, 0);
        load_h(st, &full[s], k);
      }
    }
    __syncwarp();
    if constexpr (kMode != kGlobal) cluster_sync();  // the producer's part in the hand-off's cluster barrier
  } else {
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int i = 0; i < steps; ++i) {
      const int s = i % c.stages;
      bar_wait(&full[s], (i / c.stages) & 1);
      const uint8_t* st = smem + size_t(s) * kGemmStage;
      const uint64_t da = smem_desc(st), db = smem_desc(st + kGemmW);
      wgmma_fence();
      if constexpr (!(kDiag & kDiagNoMma)) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) mma<__nv_bfloat16, 128, false>(acc, da + 2 * kk, db + 2 * kk, 1u);
      }
      wgmma_commit();
      fence_regs(acc);
      if constexpr (kDiag & kDiagWait0) {
        wgmma_wait<0>();
        if (tid == 0) bar_arrive(&empty[s]);
        continue;
      }
      wgmma_wait<1>();
      if (i > 0 && tid == 0) {
        bar_arrive(&empty[(i - 1) % c.stages]);
        if constexpr (kMcast) bar_arrive_cluster(&empty[(i - 1) % c.stages], rank ^ 1u);
      }
    }
    wgmma_wait<0>();
    fence_regs(acc);
    // The ring is idle (every stage landed and was read): the hand-off goes over it.
    asm volatile("bar.sync 1, 128;\nfence.proxy.async.shared::cta;" ::: "memory");
    constexpr unsigned kPeer = kMode == kQuad ? 2u : 1u;  // the other K part's rank
    if constexpr (kDiag & kDiagNoFinish) {
      // the registers still feed a store that never happens (M >= 1), else the compiler drops the MMAs
      float t = 0.0f;
#pragma unroll
      for (int i = 0; i < 64; ++i) t += acc[i];
      if (c.M < 0) y[tid] = __float2bfloat16_rn(t);
      cluster_sync();  // the hand-off's cluster barrier, with nothing handed off
    } else if constexpr (kMode == kGlobal) {
      gemm_finish_global(acc, smem, c, y, rowblock, part, tid);
    } else {
      // the package kernel's hand-off (no bias; N is a multiple of 64 here)
      const DownParams dp{y, nullptr, c.ldy, c.M, c.N, c.K, c.pdl};
      if (part == 0) {
        down_finish<__nv_bfloat16, 0, kPeer>(acc, smem, dp, n0, tid);
      } else {
        down_finish<__nv_bfloat16, 32, kPeer>(acc, smem, dp, n0, tid);
      }
    }
  }
  __syncwarp();
  cluster_sync();  // no CTA leaves while its peer may still read its hand-off (or, kMcast, write into it)
#endif
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

// w: [n, k] bf16, h: [128, k] bf16 (k a multiple of 64; part p of P streams K steps [S p / P, S (p + 1) / P)), sink: one u64.
// Returns 0, or -1 for a configuration it does not take.
extern "C" int down_stream_launch(void* w, void* h, int n, int k, int rb, int parts, int hmode, int stages,
                                  unsigned long long* sink, cudaStream_t stream) {
  if ((rb != 64 && rb != 128) || parts < 1 || parts > 4 || n % (rb * (hmode == 2 ? 2 : 1)) || k % 64 || hmode < 0 ||
      hmode > 2)
    return -1;
  const CUtensorMap mw = map2d(w, k, n, 64), mh = map2d(h, k, 128, 128), mh_half = map2d(h, k, 128, 64);
  const Cfg c{rb, parts, hmode, stages, k / 64};
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

// y [M, n] (row stride ldy) = h [M, k] w [n, k]^T, bf16; M <= 128, n a multiple of 64 (128
// for the multicast forms), k a multiple of 8 (two K parts of at least one step each). mode: a
// GemmMode. Returns 0, or -1 for what it does not take.
// ws / counts: kGlobal's workspace (GemmCfg; counts zeroed once by the caller), else null.
// diag: GemmDiag bits (the pair form only; 0 is the GEMM itself).
extern "C" int down_gemm_launch(void* w, void* h, void* y, int m, int n, int k, int64_t ldy, int stages, int pdl,
                                int mode, float* ws, int* counts, int diag, cudaStream_t stream) {
  const bool mcast = mode != kPair;
  if (m < 1 || m > 128 || n % (mcast ? 128 : 64) || k % 8 || k < 128 || stages < 2 || stages > 9) return -1;
  if (mode < kPair || mode > kQuad || ((mode == kGlobal) != (ws != nullptr && counts != nullptr))) return -1;
  const CUtensorMap mw = map2d(w, k, n, 64), mh = map2d(h, k, m, mcast ? 64 : 128);
  const GemmCfg c{m, n, k, ldy, stages, pdl, ws, counts};
  const int smem = stages * int(kGemmStage) + 16 * stages;
  if (diag && mode != kPair) return -1;
  decltype(&probe_gemm_kernel<kPair>) kernel = nullptr;
  switch (diag) {
    case 0: kernel = mode == kPair ? probe_gemm_kernel<kPair> : mode == kGlobal ? probe_gemm_kernel<kGlobal>
                                                                                : probe_gemm_kernel<kQuad>; break;
    case kDiagNoMma: kernel = probe_gemm_kernel<kPair, kDiagNoMma>; break;
    case kDiagNoFinish: kernel = probe_gemm_kernel<kPair, kDiagNoFinish>; break;
    case kDiagNoMma | kDiagNoFinish: kernel = probe_gemm_kernel<kPair, kDiagNoMma | kDiagNoFinish>; break;
    case kDiagWait0: kernel = probe_gemm_kernel<kPair, kDiagWait0>; break;
    default: return -1;
  }
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(n / 64 * 2));
  cfg.blockDim = dim3(kGemmThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = mode == kQuad ? 4 : 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  CK(cudaLaunchKernelEx(&cfg, kernel, mw, mh, c, static_cast<__nv_bfloat16*>(y)));
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
