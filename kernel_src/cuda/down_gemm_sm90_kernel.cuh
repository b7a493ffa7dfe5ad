// The MLP's down projection for few tokens on Hopper (sm_90a), in one kernel:
//
//   out[m, n] = h[m] . W[n] (+ b[n]),  h [M, K] with M <= 128, W [N, K] (nn.Linear's layout)
//
// Why (NOTES, sessions 35 and 48): at a few hundred tokens or less the down GEMM streams the
// weight from DRAM and has too few output tiles to fill the GPU, so K is split. cuBLAS's
// split-K adds a reduce kernel (~3.4 us at SwiGLU M 128), the package's split by hand a
// reduction of its own (~2 us with its launch). Here the two K halves of each 64-row block of
// W are a cluster of 2 CTAs that add their partial tiles through distributed shared memory, so
// there is no second kernel and no fp32 partial sums in global memory.
//
// CTA pair (cluster) r owns out[:, 64 r, 64 r + 64), rank p the K steps [S p / 2, S (p + 1) / 2)
// of S = ceil(K / 64). (A form with two row blocks in a cluster of 4 sharing h's loads through
// multicast was measured 14 us slower at N 4096 and dropped: NOTES, sessions 49-52.) 160 threads:
//   warps 0-3  one MMA warp group: per K step four wgmma m64n128k16 with W's 64 x 64 box as A
//              and h's 128 x 64 box as B, i.e. the output tile transposed (64 W rows x 128
//              tokens, 64 fp32 registers a thread; token rows of h past M are the TMA's zeros).
//   warp 4     lane 0 issues the TMA loads into a ring of kDownStages stages (24 KB each).
// After the K loop each CTA hands the half of its partial tile it does not finish to its peer
// (K part 0 finishes tokens 0-63, part 1 tokens 64-127): each sums its own and the peer's part
// (p0 + p1 either way round: the same bits), adds the bias, rounds once and stores through a
// staging tile in 16-byte pieces along out's rows.
// pdl (a launch with a programmatic edge): the first ring of W boxes loads before
// griddepcontrol.wait, h's boxes and every store after it. Only for a caller whose previous
// kernel in the stream writes h and not W (the MLP's first GEMM): the W loads may overlap it.
//
// This header holds the device code only; gated_gemm_sm90.cu has the op (down_gemm_sm90).
#pragma once

#include "gated_gemm_sm90_kernel.cuh"

namespace fused_mlp {
namespace sm90 {

#ifndef FUSED_MLP_SM90_DOWN_STAGES
#define FUSED_MLP_SM90_DOWN_STAGES 8
#endif
constexpr int kDownStages = FUSED_MLP_SM90_DOWN_STAGES;
constexpr int kDownThreads = 160;
constexpr int kDownMaxM = 128;
constexpr uint32_t kDownBytesW = 64 * kBK * 2, kDownBytesH = kDownMaxM * kBK * 2;
constexpr uint32_t kDownStage = kDownBytesW + kDownBytesH;
constexpr int kDownOutStride = 72;  // elements per staged token row (64 + 8: 144 bytes, 16-byte aligned)
constexpr int kDownSmem = kDownStages * int(kDownStage) + 16 * kDownStages;  // the ring and its two barriers a stage
static_assert(32 * 128 * 4 + 64 * kDownOutStride * 2 <= kDownStages * int(kDownStage),
              "the hand-off and the staging tile must fit in the ring");

struct DownParams {
  void* out;
  const void* bias;  // nullptr or [N]
  int64_t ldo;
  int M, N, K;
  int pdl;
};

#if defined(FUSED_MLP_SM90_DEVICE)

// The end of the K loop for the CTA that finishes accumulator registers [Keep, Keep + 32),
// tokens [2 Keep, 2 Keep + 64) (register i holds W row 16 warp + lane / 4 + 8 ((i / 2) % 2) and
// token 8 (i / 4) + 2 (lane % 4) + i % 2); its peer, the other K part of the row block, is
// cluster rank ^ PeerXor. 128 threads (the MMA warp group).
template <typename T, int Keep, unsigned PeerXor>
__device__ __forceinline__ void down_finish(const float (&acc)[64], uint8_t* smem, const DownParams& p, int n0,
                                            int tid) {
  constexpr int kGive = 32 - Keep;
  const int warp = tid / 32, lane = tid % 32;
  float* xchg = reinterpret_cast<float*>(smem);  // [32 registers][128 threads], over the idle ring
#pragma unroll
  for (int j = 0; j < 32; ++j) xchg[j * 128 + tid] = acc[kGive + j];
  cluster_sync();  // both halves handed over
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(xchg)), "r"(cluster_rank() ^ PeerXor));
  const T* bias = static_cast<const T*>(p.bias);
  float b[2];  // this thread's W rows: 16 warp + lane / 4 + {0, 8}, as bias values (0 past N)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int n = n0 + warp * 16 + lane / 4 + 8 * r;
    b[r] = (bias != nullptr && n < p.N) ? static_cast<float>(bias[n]) : 0.0f;
  }
  T* out = reinterpret_cast<T*>(smem + 32 * 128 * 4);  // [64 tokens][kDownOutStride]
  // All 32 of the peer's values in flight at once: one DSMEM round trip instead of 32 (session
  // 51 measured ~4 us for the hand-off with each load behind the previous one's store).
  float v[32];
#pragma unroll
  for (int j = 0; j < 32; ++j)
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v[j]) : "r"(remote + uint32_t(j * 128 + tid) * 4u));
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int i = Keep + j;
    const int token = 8 * (i / 4) + 2 * (lane % 4) + (i % 2) - 2 * Keep;
    const int row = warp * 16 + lane / 4 + 8 * ((i % 4) / 2);
    const float s = acc[i] + v[j] + b[(i % 4) / 2];
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      out[token * kDownOutStride + row] = __float2bfloat16_rn(s);
    } else {
      out[token * kDownOutStride + row] = __float2half_rn(s);
    }
  }
  asm volatile("bar.sync 1, 128;" ::: "memory");
  T* dst = static_cast<T*>(p.out);
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int q = tid + 128 * u, t = q / 8, ch = q % 8, m = t + 2 * Keep, n = n0 + ch * 8;
    if (m < p.M && n < p.N)  // N is a multiple of 8: the piece is in or out as a whole
      *reinterpret_cast<uint4*>(dst + int64_t(m) * p.ldo + n) =
          *reinterpret_cast<const uint4*>(out + t * kDownOutStride + ch * 8);
  }
}

#endif

template <typename T>
__global__ void __launch_bounds__(kDownThreads, 1)
    down_gemm_kernel(const __grid_constant__ CUtensorMap mw, const __grid_constant__ CUtensorMap mh,
                     const DownParams p) {
#if defined(FUSED_MLP_SM90_DEVICE)
  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(kDownStages) * kDownStage);
  uint64_t* empty = full + kDownStages;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int part = int(cluster_rank());
  const int n0 = int(blockIdx.x / 2) * 64;
  const int ksteps = (p.K + kBK - 1) / kBK, kb0 = ksteps * part / 2;
  const int steps = ksteps * (part + 1) / 2 - kb0;
  if (tid == 0) {
    for (int s = 0; s < kDownStages; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 4) {
    if (lane == 0) {
      // with pdl, the first ring's W boxes before the wait (W is not the previous kernel's output)
      const int pre = p.pdl ? (steps < kDownStages ? steps : kDownStages) : 0;
      for (int i = 0; i < pre; ++i) {
        bar_expect_tx(&full[i], kDownStage);
        tma_load(smem + size_t(i) * kDownStage, &mw, &full[i], (kb0 + i) * kBK, n0, 0);
      }
      if (p.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
      for (int i = 0; i < pre; ++i)
        tma_load(smem + size_t(i) * kDownStage + kDownBytesW, &mh, &full[i], (kb0 + i) * kBK, 0, 0);
      for (int i = pre; i < steps; ++i) {
        const int s = i % kDownStages, k = (kb0 + i) * kBK;
        if (i >= kDownStages) bar_wait(&empty[s], ((i / kDownStages) - 1) & 1);
        bar_expect_tx(&full[s], kDownStage);
        uint8_t* st = smem + size_t(s) * kDownStage;
        tma_load(st, &mw, &full[s], k, n0, 0);
        tma_load(st + kDownBytesW, &mh, &full[s], k, 0, 0);
      }
    }
    __syncwarp();
    cluster_sync();  // the producer's part in the hand-off's cluster barrier
  } else {
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int i = 0; i < steps; ++i) {
      const int s = i % kDownStages;
      bar_wait(&full[s], (i / kDownStages) & 1);
      const uint8_t* st = smem + size_t(s) * kDownStage;
      const uint64_t da = smem_desc(st), db = smem_desc(st + kDownBytesW);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) mma<T, 128, false>(acc, da + 2 * kk, db + 2 * kk, 1u);
      wgmma_commit();
      fence_regs(acc);
      wgmma_wait<1>();
      if (i > 0 && tid == 0) bar_arrive(&empty[(i - 1) % kDownStages]);
    }
    wgmma_wait<0>();
    fence_regs(acc);
    // every stage landed and was read: the hand-off and the staging tile go over the ring
    asm volatile("bar.sync 1, 128;\nfence.proxy.async.shared::cta;" ::: "memory");
    if (part == 0) {
      down_finish<T, 0, 1u>(acc, smem, p, n0, tid);
    } else {
      down_finish<T, 32, 1u>(acc, smem, p, n0, tid);
    }
  }
  __syncwarp();
  cluster_sync();  // no CTA leaves while its peer may still read its hand-off
#endif
}

}  // namespace sm90
}  // namespace fused_mlp
