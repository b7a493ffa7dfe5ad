// The gated forward (inference: h only) in the form of cuBLAS's large-M GEMMs: an experiment of
// session 33, built only into benchmarks/micro/sm90_probe.cu ("coop" mode); the ops do not use it.
//
//   h[m, n] = act(x[m] . gate_weight[n] + bg[n]) * (x[m] . up_weight[n] + bu[n])
//
// Why: at SwiGLU M 4096 / 16384 our 128 x 128-column kernel (two MMA groups of 64 rows over
// g | u, an epilogue warp group fed through a staging tile of g and u) takes 4-5% more time
// than cuBLAS's GEMM of the same FLOPs at the 700 W limit, ~5% more cycles at about the same
// clock (NOTES, sessions 14 and 29). Every lever around the main loop was measured; the form
// cuBLAS itself runs there was not (NOTES, plan of session 29): a 256-row tile cooperatively
// computed by two consumer warp groups of 128 rows, each with the epilogue on its own
// accumulators, and one producer thread.
//
// Here a tile is 256 rows x 64 columns of h (256 x 128 of g | u: the same 48 KB per K step for the
// same MMAs as the 128-row tile, so the same bytes per FLOP):
//   WG0   producer: one thread issues the TMA loads of x [256 x 64], Wg [64 x 64] and Wu [64 x 64]
//         per K step into a ring of kCoopStages stages (128-byte swizzle); 40 registers.
//   WG1, WG2  consumers: group c owns rows [128 c, 128 c + 128) as two 64-row blocks, each with
//         one m64n128k16 wgmma per 16 K over Wg's 64 rows and Wu's 64 rows back to back (the
//         accumulator's first 32 registers are g, the last 32 u, for the same columns), so
//         act(g) * u is computed in the thread's own registers (stage_h: g and u rounded to T
//         first, the same bits as the op's kinds) into one staging tile of h that one thread
//         stores with a TMA store; the producer meanwhile fills the ring with the next tile.
//   No g | u staging, no epilogue warp group, no `freed` hand-off.
// Requirements as the 128-row kinds' (gated_gemm_sm90_kernel.cuh), inference only.
#pragma once

#include "gated_fwd_tall_kernel.cuh"  // tma_store

namespace fused_mlp {
namespace sm90 {

constexpr int kCoopBM = 256;
constexpr int kCoopBN = 64;
#ifndef FUSED_MLP_COOP_STAGES
#define FUSED_MLP_COOP_STAGES 4
#endif
constexpr int kCoopStages = FUSED_MLP_COOP_STAGES;
constexpr int kCoopThreads = 384;

struct CoopLayout {
  static constexpr int kX = kCoopBM * kBK * 2;   // 32 KB of x per stage
  static constexpr int kW = kCoopBN * kBK * 2;   // 8 KB of Wg (and of Wu)
  static constexpr int kStage = kX + 2 * kW;     // 48 KB
  static constexpr int kStg = kCoopBM * 128;     // h: 256 rows of 128 bytes (64 columns)
  static constexpr int kBarOffset = kCoopStages * kStage + kStg;
  static constexpr int kSmemBytes = kBarOffset + 8 * 2 * kCoopStages + 1024;
  static_assert(kX % 1024 == 0 && kStage % 1024 == 0, "swizzled tiles stay 1024-byte aligned");
  static_assert(kSmemBytes <= 232448, "fits the 227 KB of shared memory a CTA may have");
};

#if defined(FUSED_MLP_SM90_DEVICE)

__device__ __forceinline__ void coop_coords(int t, const Params& p, int& m0, int& n0) {
  const int per_group = p.group_m * p.tiles_n;
  const int first_m = (t / per_group) * p.group_m;
  const int rows = min(p.tiles_m - first_m, p.group_m);
  const int r = t % per_group;
  m0 = (first_m + r % rows) * kCoopBM;
  n0 = (r / rows) * kCoopBN;
}

template <typename T, Activation A>
__global__ void __launch_bounds__(kCoopThreads, 1)
    gated_fwd_coop_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_g,
                          const __grid_constant__ CUtensorMap map_u, const __grid_constant__ CUtensorMap map_h,
                          const Params p) {
  using L = CoopLayout;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* stg = smem + kCoopStages * L::kStage;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarOffset);
  uint64_t* empty = full + kCoopStages;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kCoopStages; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], 2);  // one arrival per consumer group
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int tiles = p.tiles_m * p.tiles_n;
  const int ksteps = (p.K + kBK - 1) / kBK;
  const int mine = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;  // the grid is at most the tile count
  // FUSED_MLP_SM90_PROBE_CLOCKS slots (coop mode): 0 the producer's waits for empty stages, 1 / 2
  // consumer thread 128's / 256's waits for full stages, 3 thread 128's whole time, 4 its
  // epilogues (last K step's wait to the store), 7 the producer's whole time.
  long long clk_wait = 0, clk_hand = 0;
  const long long clk_start = clock_now();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_g)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_u)) : "memory");
      uint64_t policy = 0;
      if (p.flags & kHintEvictLast) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
      uint32_t c = 0;
      for (int i = 0; i < mine; ++i) {
        int m0, n0;
        coop_coords(blockIdx.x + i * gridDim.x, p, m0, n0);
        for (int kb = 0; kb < ksteps; ++kb, ++c) {
          const int s = c % kCoopStages;
          bar_wait_timed(&empty[s], ((c / kCoopStages) & 1) ^ 1, clk_wait);
          bar_expect_tx(&full[s], L::kStage);
          uint8_t* st = smem + s * L::kStage;
          tma_load(st, &map_x, &full[s], kb * kBK, m0, policy);
          tma_load(st + L::kX, &map_g, &full[s], kb * kBK, n0, policy);
          tma_load(st + L::kX + L::kW, &map_u, &full[s], kb * kBK, n0, policy);
        }
      }
      clock_store(p, kClkProducerEmpty, clk_wait, true);
      clock_store(p, kClkEpiTotal, clock_now() - clk_start, true);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int cg = wg - 1;  // rows [128 cg, 128 cg + 128) of the tile
  if (threadIdx.x == 128) asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_h)) : "memory");
  float g0[32], u0[32], g1[32], u1[32];  // rows 128 cg + [0, 64) and + [64, 128)
  const T* bg = static_cast<const T*>(p.bg);
  const T* bu = static_cast<const T*>(p.bu);
  uint32_t c = 0;
  for (int i = 0; i < mine; ++i) {
    int m0, n0;
    coop_coords(blockIdx.x + i * gridDim.x, p, m0, n0);
    // the biases of the tile's 64 columns: word w (columns n0 + 2 w, + 1) in lane w
    const int bcol = n0 + 2 * lane;
    const uint32_t bias_g = (bcol < p.N && bg != nullptr) ? *reinterpret_cast<const uint32_t*>(bg + bcol) : 0u;
    const uint32_t bias_u = (bcol < p.N && bu != nullptr) ? *reinterpret_cast<const uint32_t*>(bu + bcol) : 0u;
    // Both blocks' MMAs always run, also over rows past M (zeros from the TMA): a branch around
    // wgmma makes ptxas serialize them (C7518, session 24).
    for (int kb = 0; kb < ksteps; ++kb, ++c) {
      const int s = c % kCoopStages;
      bar_wait_timed(&full[s], (c / kCoopStages) & 1, clk_wait);
      const uint8_t* st = smem + s * L::kStage;
      const uint64_t da0 = smem_desc(st + (2 * cg) * 8192);      // 64 rows of x: 8 KB
      const uint64_t da1 = smem_desc(st + (2 * cg + 1) * 8192);
      const uint64_t db = smem_desc(st + L::kX);                  // Wg's 64 rows, then Wu's: one n128 operand
      fence_regs(g0);
      fence_regs(u0);
      fence_regs(g1);
      fence_regs(u1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint32_t accumulate = (kb > 0 || kk > 0) ? 1u : 0u;
        mma_both<T, 64, false>(g0, u0, da0 + 2 * kk, db + 2 * kk, accumulate);
        mma_both<T, 64, false>(g1, u1, da1 + 2 * kk, db + 2 * kk, accumulate);
      }
      wgmma_commit();
      fence_regs(g0);
      fence_regs(u0);
      fence_regs(g1);
      fence_regs(u1);
      wgmma_wait<1>();
      if (kb > 0 && tid == 0) bar_arrive(&empty[(c - 1) % kCoopStages]);
    }
    const long long h0 = clock_now();
    wgmma_wait<0>();
    fence_regs(g0);
    fence_regs(u0);
    fence_regs(g1);
    fence_regs(u1);
    if (tid == 0) bar_arrive(&empty[(c - 1) % kCoopStages]);

    // h into the staging tile once the previous tile's store has read it
    if (threadIdx.x == 128) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    asm volatile("bar.sync 1, 256;" ::: "memory");
    {
      const int q = lane / 8;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int row = 128 * cg + 64 * b + warp * 16 + (q & 1) * 8 + lane % 8;
#pragma unroll
        for (int j = 0; j < kCoopBN / 16; ++j) {
          const int chunk = 2 * j + (q >> 1);  // 16-byte chunk (8 columns) of the row
          const uint32_t addr = smem_addr(stg + row * 128 + ((chunk ^ (row & 7)) << 4));
          const int l0 = 8 * j + lane % 4;
          const uint32_t bg0 = __shfl_sync(0xffffffffu, bias_g, l0), bg1 = __shfl_sync(0xffffffffu, bias_g, l0 + 4);
          const uint32_t bu0 = __shfl_sync(0xffffffffu, bias_u, l0), bu1 = __shfl_sync(0xffffffffu, bias_u, l0 + 4);
          if (b == 0) stage_h<T, A>(addr, g0, u0, j, bg0, bg1, bu0, bu1);
          else stage_h<T, A>(addr, g1, u1, j, bg0, bg1, bu0, bu1);
        }
      }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the writes, seen by the TMA store
    asm volatile("bar.sync 1, 256;" ::: "memory");
    if (threadIdx.x == 128) {
      tma_store(stg, &map_h, n0, m0);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    clk_hand += clock_now() - h0;
  }
  if (threadIdx.x == 128) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  clock_store(p, kClkMmaFull, clk_wait, threadIdx.x == 128);
  clock_store(p, kClkMmaFreed, clk_wait, threadIdx.x == 256);
  clock_store(p, kClkMmaTotal, clock_now() - clk_start, threadIdx.x == 128);
  clock_store(p, kClkEpiStaged, clk_hand, threadIdx.x == 128);
}

#else  // not compiled for sm_90a

template <typename T, Activation A>
__global__ void gated_fwd_coop_kernel(const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                                      const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                                      const Params) {}

#endif

}  // namespace sm90
}  // namespace fused_mlp
