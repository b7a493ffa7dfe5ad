// The gated forward (inference: h only) with 192-row tiles: an experiment of session 24, built
// only into benchmarks/micro/sm90_probe.cu ("tall" mode); the ops do not use it (NOTES, session 24:
// bit-identical to the 128-row kind, and 8% slower under sustained load at SwiGLU M 4096 / 16384).
//
//   h[m, n] = act(x[m] . gate_weight[n] + bg[n]) * (x[m] . up_weight[n] + bu[n])
//
// Why: at the H200's 700 W limit the time of the 128-row kernel follows its energy, and session
// 24's probe measured the operand bytes a stage brings into the SM as a large part of it: a third
// of a stage's bytes (x's 16 KB, or Wu's) left out took 7-8% off the sustained time. A tile of
// 192 x 128 h columns (192 x 256 of g | u) brings 56 KB per K step for 1.5 x the MMAs of the
// 128-row tile's 48 KB: 20% fewer bytes per FLOP.
//
// The registers set the form: three MMA warp groups of 64 rows, each with the 128 fp32
// accumulators of one m64n256k16 over g | u, leave no room for a producer or an epilogue group
// (384 threads x 168 registers). So:
//   - thread 0 (of MMA group 0) also issues the TMA loads, kStages - 1 K steps ahead, after the
//     three groups have released the stage (empty barrier: one arrival per group);
//   - after a tile's last K step the groups compute h = act(g) * u from their accumulators (g
//     and u rounded to T first: stage_h, the same bits as the 128-row kinds) into a staging tile
//     in the TMA's 128-byte swizzle layout (two 64-column halves), and thread 0 stores it with
//     two TMA stores, which run while the next tile's main loop starts;
//   - every group issues its MMAs, also where its 64 rows lie past M (the last row block).
// Requirements as the 128-row kinds' (gated_gemm_sm90_kernel.cuh), inference only.
#pragma once

#include "gated_gemm_sm90_kernel.cuh"

namespace fused_mlp {
namespace sm90 {

constexpr int kTallBM = 192;
constexpr int kTallBN = 128;
constexpr int kTallStages = 3;
constexpr int kTallThreads = 384;

struct TallLayout {
  static constexpr int kX = kTallBM * kBK * 2;              // 24 KB of x per stage
  static constexpr int kW = kTallBN * kBK * 2;              // 16 KB of Wg (and of Wu)
  static constexpr int kStage = kX + 2 * kW;                // 56 KB
  static constexpr int kStgHalf = kTallBM * 128;            // one 64-column half of h: 192 rows of 128 bytes
  static constexpr int kStg = 2 * kStgHalf;                 // 48 KB
  static constexpr int kBarOffset = kTallStages * kStage + kStg;
  static constexpr int kSmemBytes = kBarOffset + 8 * 2 * kTallStages + 1024;
  static_assert(kX % 1024 == 0 && kStage % 1024 == 0 && kStgHalf % 1024 == 0, "swizzled tiles stay 1024-byte aligned");
};

#if defined(FUSED_MLP_SM90_DEVICE)

__device__ __forceinline__ void tma_store(const void* src, const CUtensorMap* map, int col, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(col), "r"(row)
               : "memory");
}

// The probe kernels' start (tall and coop): the 1024-byte aligned base of the dynamic shared
// memory, and, by thread 0, the ring's barriers (full: the producer's expect_tx arrival; empty:
// one arrival per group that reads a stage) made visible before the __syncthreads that follows.
__device__ __forceinline__ uint8_t* aligned_smem(uint8_t* raw) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty, int stages, uint32_t readers) {
  for (int s = 0; s < stages; ++s) {
    bar_init(&full[s], 1);
    bar_init(&empty[s], readers);
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

template <typename T, Activation A>
__global__ void __launch_bounds__(kTallThreads, 1)
    gated_fwd_tall_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_g,
                          const __grid_constant__ CUtensorMap map_u, const __grid_constant__ CUtensorMap map_h,
                          const Params p) {
  using L = TallLayout;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  uint8_t* stg = smem + kTallStages * L::kStage;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarOffset);
  uint64_t* empty = full + kTallStages;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  if (threadIdx.x == 0) {
    init_ring(full, empty, kTallStages, 3);  // one arrival per MMA group
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_g)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_u)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_h)) : "memory");
  }
  __syncthreads();

  const int tiles = p.tiles_m * p.tiles_n;
  const int ksteps = (p.K + kBK - 1) / kBK;
  const int mine = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;  // the grid is at most the tile count
  const int steps = mine * ksteps;
  uint64_t policy = 0;
  if (threadIdx.x == 0 && (p.flags & kHintEvictLast))
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  // FUSED_MLP_SM90_PROBE_CLOCKS: the probe's clock slots, here (tall mode): 0 thread 0's waits for
  // empty stages, 1 / 2 / 5 the waits for full stages of thread 0 / 128 / 256 (one per group),
  // 3 thread 0's whole time, 4 thread 0's hand-offs (last K step to the stores), 6 thread 0's
  // wgmma_wait<1>, 7 thread 128's whole time.
  long long clk_empty = 0, clk_full = 0, clk_hand = 0, clk_mma_wait = 0;
  const long long clk_start = clock_now();
  // The loads of the CTA's K step c (its tiles' steps counted one after another).
  const auto issue = [&](int c) {
    if (c >= steps) return;
    const int i = c / ksteps, kb = c % ksteps;
    int m0, n0;
    tile_coords<kTallBN, false, kTallBM>(blockIdx.x + i * gridDim.x, p, m0, n0);
    const int s = c % kTallStages;
    bar_wait_timed(&empty[s], ((c / kTallStages) & 1) ^ 1, clk_empty);
    bar_expect_tx(&full[s], L::kStage - (FUSED_MLP_SM90_PROBE_NOX ? L::kX : 0));
    uint8_t* st = smem + s * L::kStage;
    if (!FUSED_MLP_SM90_PROBE_NOX) tma_load(st, &map_x, &full[s], kb * kBK, m0, policy);
    tma_load(st + L::kX, &map_g, &full[s], kb * kBK, n0, policy);
    tma_load(st + L::kX + L::kW, &map_u, &full[s], kb * kBK, n0, policy);
  };
  if (threadIdx.x == 0)
    for (int c = 0; c < kTallStages - 1; ++c) issue(c);

  float acc_g[kTallBN / 2], acc_u[kTallBN / 2];
  const T* bg = static_cast<const T*>(p.bg);
  const T* bu = static_cast<const T*>(p.bu);
  int c = 0;
  for (int i = 0; i < mine; ++i) {
    int m0, n0;
    tile_coords<kTallBN, false, kTallBM>(blockIdx.x + i * gridDim.x, p, m0, n0);
    // Every group issues its MMAs, also over rows past M (zeros from the TMA): a branch around
    // them made ptxas serialize every wgmma (C7518: its dependence barriers in a divergent path;
    // session 24's first form ran 28-53% slower for it).
    // The biases of the tile's columns, as in the 128-row kinds: word w of each in lane w % 32,
    // register w / 32 (g's words, then u's).
    uint32_t bias_w[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int w = 32 * (b % 2) + lane;
      const int col = n0 + 2 * w;
      const T* bias = b < 2 ? bg : bu;
      bias_w[b] = (col < p.N && bias != nullptr) ? *reinterpret_cast<const uint32_t*>(bias + col) : 0u;
    }
    for (int kb = 0; kb < ksteps; ++kb, ++c) {
      const int s = c % kTallStages;
      bar_wait_timed(&full[s], (c / kTallStages) & 1, clk_full);
      {
        const uint8_t* st = smem + s * L::kStage;
        const uint64_t da = smem_desc(st + wg * (L::kX / 3));  // this group's 64 rows of x
        const uint64_t db = smem_desc(st + L::kX);             // Wg's 128 rows, then Wu's: one n256 operand
        fence_regs(acc_g);
        fence_regs(acc_u);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          mma_both<T, kTallBN, false>(acc_g, acc_u, da + 2 * kk, db + 2 * kk, (kb > 0 || kk > 0) ? 1u : 0u);
        wgmma_commit();
        fence_regs(acc_g);
        fence_regs(acc_u);
        const long long w0 = clock_now();
        wgmma_wait<1>();
        clk_mma_wait += clock_now() - w0;
      }
      if (kb > 0 && tid == 0) bar_arrive(&empty[(c - 1) % kTallStages]);
      if (threadIdx.x == 0) issue(c + kTallStages - 1);
    }
    const long long h0 = clock_now();
    {
      wgmma_wait<0>();
      fence_regs(acc_g);
      fence_regs(acc_u);
    }
    if (tid == 0) bar_arrive(&empty[(c - 1) % kTallStages]);

    // h into the staging tile, once the previous tile's stores have read it.
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    asm volatile("bar.sync 1, %0;" ::"n"(kTallThreads) : "memory");
    {
      const int q = lane / 8;
      const int row = wg * 64 + warp * 16 + (q & 1) * 8 + lane % 8;
#pragma unroll
      for (int j = 0; j < kTallBN / 16; ++j) {
        const int chunk = 2 * j + (q >> 1);  // 16-byte chunk (8 columns) of the tile's row
        const uint32_t addr =
            smem_addr(stg + (chunk >> 3) * L::kStgHalf + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
        const int l0 = 8 * (j % 4) + lane % 4;
        const uint32_t bg0 = __shfl_sync(0xffffffffu, bias_w[j / 4], l0);
        const uint32_t bg1 = __shfl_sync(0xffffffffu, bias_w[j / 4], l0 + 4);
        const uint32_t bu0 = __shfl_sync(0xffffffffu, bias_w[2 + j / 4], l0);
        const uint32_t bu1 = __shfl_sync(0xffffffffu, bias_w[2 + j / 4], l0 + 4);
        stage_h<T, A>(addr, acc_g, acc_u, j, bg0, bg1, bu0, bu1);
      }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the writes, seen by the TMA store
    asm volatile("bar.sync 1, %0;" ::"n"(kTallThreads) : "memory");
    if (threadIdx.x == 0) {
      tma_store(stg, &map_h, n0, m0);
      tma_store(stg + L::kStgHalf, &map_h, n0 + 64, m0);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    clk_hand += clock_now() - h0;
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  clock_store(p, kClkProducerEmpty, clk_empty, threadIdx.x == 0);
  clock_store(p, kClkMmaFull, clk_full, threadIdx.x == 0);
  clock_store(p, kClkMmaFreed, clk_full, threadIdx.x == 128);
  clock_store(p, kClkEpiGu, clk_full, threadIdx.x == 256);
  clock_store(p, kClkMmaTotal, clock_now() - clk_start, threadIdx.x == 0);
  clock_store(p, kClkEpiStaged, clk_hand, threadIdx.x == 0);
  clock_store(p, kClkLoaderEmpty, clk_mma_wait, threadIdx.x == 0);
  clock_store(p, kClkEpiTotal, clock_now() - clk_start, threadIdx.x == 128);
}

#else  // not compiled for sm_90a

template <typename T, Activation A>
__global__ void gated_fwd_tall_kernel(const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                                      const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                                      const Params) {}

#endif

}  // namespace sm90
}  // namespace fused_mlp
