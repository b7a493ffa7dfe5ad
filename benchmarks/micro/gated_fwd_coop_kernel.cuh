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
// BN (the tile's columns of h) 80 or 96 instead of 64: one m64n160k16 / m64n192k16 per block
// (160 / 192 accumulators a consumer thread, 240 registers), 52 / 56 KB stages for 1.25 / 1.5 x
// the MMAs of the 64-column tile: 15% / 22% fewer bytes into the SM per FLOP (session 24: those
// bytes are ~22% of the energy at the power limit). There h goes straight from the registers to
// global memory (4-byte stores, masked), as no staging tile fits beside four such stages.
// Requirements as the 128-row kinds' (gated_gemm_sm90_kernel.cuh), inference only.
#pragma once

#include "gated_fwd_tall_kernel.cuh"  // tma_store, aligned_smem, init_ring

namespace fused_mlp {
namespace sm90 {

constexpr int kCoopBM = 256;
constexpr int kCoopBN = 64;  // the first form's tile width (staged h, one TMA store)
#ifndef FUSED_MLP_COOP_STAGES
#define FUSED_MLP_COOP_STAGES 4
#endif
constexpr int kCoopStages = FUSED_MLP_COOP_STAGES;
constexpr int kCoopThreads = 384;
// FUSED_MLP_COOP_SPLIT_STORE=1: each consumer group stores its own 128 rows of h (its own TMA
// store, a named barrier of its own 128 threads), so the groups need not wait for each other
// after a tile: while one runs its epilogue the other can go on with the next tile's first K
// steps (as far as the ring holds them). 0: one store of all 256 rows after a barrier of both.
#ifndef FUSED_MLP_COOP_SPLIT_STORE
#define FUSED_MLP_COOP_SPLIT_STORE 0
#endif
constexpr int kCoopStoreRows = FUSED_MLP_COOP_SPLIT_STORE ? 128 : 256;  // rows of h per TMA store (the map's box)

// BN: columns of h per tile (64, 80 or 96); kDirect: h stored from the registers (no staging tile).
template <int BN>
struct CoopLayout {
  static constexpr bool kDirect = BN != 64;
  static constexpr int kX = kCoopBM * kBK * 2;   // 32 KB of x per stage
  static constexpr int kW = BN * kBK * 2;        // 8 / 10 / 12 KB of Wg (and of Wu)
  static constexpr int kStage = kX + 2 * kW;     // 48 / 52 / 56 KB
  static constexpr int kStg = kDirect ? 0 : kCoopBM * 128;  // h: 256 rows of 128 bytes (64 columns)
  static constexpr int kBarOffset = kCoopStages * kStage + kStg;
  static constexpr int kSmemBytes = kBarOffset + 8 * 2 * kCoopStages + 1024;
  static_assert(kX % 1024 == 0 && kW % 1024 == 0 && kStage % 1024 == 0, "swizzled tiles stay 1024-byte aligned");
  static_assert(kSmemBytes <= 232448, "fits the 227 KB of shared memory a CTA may have");
};

#if defined(FUSED_MLP_SM90_DEVICE)

// The accumulator operands of m64n160k16 / m64n192k16 over g | u (40 / 48 registers each).
#define FUSED_MLP_COOP_R80 FUSED_MLP_WGMMA_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define FUSED_MLP_COOP_R96 FUSED_MLP_COOP_R80 ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define FUSED_MLP_COOP_ACC40(d) FUSED_MLP_WGMMA_ACC32(d), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define FUSED_MLP_COOP_ACC48(d) FUSED_MLP_COOP_ACC40(d), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])

// One wgmma m64n(2 BN)k16 over g | u (Wg's BN rows, then Wu's, back to back in the stage).
template <typename T, int BN>
__device__ __forceinline__ void coop_mma(float (&g)[BN / 2], float (&u)[BN / 2], uint64_t da, uint64_t db,
                                         uint32_t accumulate) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool BNMajor = false;
  if constexpr (BN == 64) {
    mma_both<T, 64, false>(g, u, da, db, accumulate);
  } else if constexpr (BN == 80) {
    FUSED_MLP_WGMMA_TYPED(160, FUSED_MLP_COOP_R80, FUSED_MLP_COOP_ACC40(g) FUSED_MLP_COMMA FUSED_MLP_COOP_ACC40(u),
                          "80", "81", "82")
  } else {
    static_assert(BN == 96, "coop tile widths: 64, 80 or 96");
    FUSED_MLP_WGMMA_TYPED(192, FUSED_MLP_COOP_R96, FUSED_MLP_COOP_ACC48(g) FUSED_MLP_COMMA FUSED_MLP_COOP_ACC48(u),
                          "96", "97", "98")
  }
}

// h of one 64-row block straight from the accumulators: rows row0 + lane / 4 (+ 8), columns
// n0 + 8 j + 2 (lane % 4) (+ 1) for the BN / 8 column groups j; g and u (biases added) rounded to
// T before act(g) * u (gated_pair, as stage_h: the same bits). Bias word w (columns n0 + 2 w, + 1) sits in
// lane w % 32 of bias_g[w / 32] / bias_u[w / 32].
template <typename T, Activation A, int BN>
__device__ __forceinline__ void coop_store_h(const Params& p, const float (&g)[BN / 2], const float (&u)[BN / 2],
                                             int row0, int n0, int lane, const uint32_t (&bias_g)[2],
                                             const uint32_t (&bias_u)[2]) {
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int w = 4 * j + lane % 4;  // the bias word of this thread's column pair
    const float2 bgj = unpack2<T>(__shfl_sync(0xffffffffu, bias_g[(4 * j) / 32], w % 32));
    const float2 buj = unpack2<T>(__shfl_sync(0xffffffffu, bias_u[(4 * j) / 32], w % 32));
    const int col = n0 + 2 * w;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + lane / 4 + 8 * h;
      const uint32_t hv = gated_pair<T, A>(g[4 * j + 2 * h], g[4 * j + 2 * h + 1], u[4 * j + 2 * h],
                                           u[4 * j + 2 * h + 1], bgj, buj);
      if (row < p.M && col < p.N)  // N is a multiple of 8: col + 1 is in too
        *reinterpret_cast<uint32_t*>(out + int64_t(row) * p.ldo + col) = hv;
    }
  }
}

template <typename T, Activation A, int BN = kCoopBN>
__global__ void __launch_bounds__(kCoopThreads, 1)
    gated_fwd_coop_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_g,
                          const __grid_constant__ CUtensorMap map_u, const __grid_constant__ CUtensorMap map_h,
                          const Params p) {
  using L = CoopLayout<BN>;
  constexpr bool kDirect = L::kDirect;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  uint8_t* stg = smem + kCoopStages * L::kStage;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarOffset);
  uint64_t* empty = full + kCoopStages;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  if (threadIdx.x == 0) init_ring(full, empty, kCoopStages, 2);  // one arrival per consumer group
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
    if constexpr (kDirect) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_g)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_u)) : "memory");
      uint64_t policy = 0;
      if (p.flags & kHintEvictLast) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
      uint32_t c = 0;
      for (int i = 0; i < mine; ++i) {
        int m0, n0;
        tile_coords<BN, false, kCoopBM>(blockIdx.x + i * gridDim.x, p, m0, n0);
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

  // 384 x 168 registers at launch: the producer's 128 threads give 144 (or 128) each to the consumers
  if constexpr (kDirect) asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int cg = wg - 1;  // rows [128 cg, 128 cg + 128) of the tile
  if (threadIdx.x == 128) asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_h)) : "memory");
  float g0[BN / 2], u0[BN / 2], g1[BN / 2], u1[BN / 2];  // rows 128 cg + [0, 64) and + [64, 128)
  const T* bg = static_cast<const T*>(p.bg);
  const T* bu = static_cast<const T*>(p.bu);
  uint32_t c = 0;
  for (int i = 0; i < mine; ++i) {
    int m0, n0;
    tile_coords<BN, false, kCoopBM>(blockIdx.x + i * gridDim.x, p, m0, n0);
    // the biases of the tile's BN columns: word w (columns n0 + 2 w, + 1) in lane w % 32 of [w / 32]
    uint32_t bias_gw[2], bias_uw[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int w = 32 * r + lane, bcol = n0 + 2 * w;
      const bool in = 2 * w < BN && bcol < p.N;
      bias_gw[r] = (in && bg != nullptr) ? *reinterpret_cast<const uint32_t*>(bg + bcol) : 0u;
      bias_uw[r] = (in && bu != nullptr) ? *reinterpret_cast<const uint32_t*>(bu + bcol) : 0u;
    }
    const uint32_t bias_g = bias_gw[0], bias_u = bias_uw[0];
    // Both blocks' MMAs always run, also over rows past M (zeros from the TMA): a branch around
    // wgmma makes ptxas serialize them (C7518, session 24).
    for (int kb = 0; kb < ksteps; ++kb, ++c) {
      const int s = c % kCoopStages;
      bar_wait_timed(&full[s], (c / kCoopStages) & 1, clk_wait);
      const uint8_t* st = smem + s * L::kStage;
      const uint64_t da0 = smem_desc(st + (2 * cg) * 8192);      // 64 rows of x: 8 KB
      const uint64_t da1 = smem_desc(st + (2 * cg + 1) * 8192);
      const uint64_t db = smem_desc(st + L::kX);                  // Wg's BN rows, then Wu's: one n(2 BN) operand
      fence_regs(g0);
      fence_regs(u0);
      fence_regs(g1);
      fence_regs(u1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint32_t accumulate = (kb > 0 || kk > 0) ? 1u : 0u;
        coop_mma<T, BN>(g0, u0, da0 + 2 * kk, db + 2 * kk, accumulate);
        coop_mma<T, BN>(g1, u1, da1 + 2 * kk, db + 2 * kk, accumulate);
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

    if constexpr (kDirect) {
      coop_store_h<T, A, BN>(p, g0, u0, m0 + 128 * cg + warp * 16, n0, lane, bias_gw, bias_uw);
      coop_store_h<T, A, BN>(p, g1, u1, m0 + 128 * cg + 64 + warp * 16, n0, lane, bias_gw, bias_uw);
      clk_hand += clock_now() - h0;
      continue;
    }
    // h into the staging tile once the previous tile's store has read it (the store of both
    // groups' rows, or with SPLIT_STORE this group's own)
    constexpr bool kSplit = FUSED_MLP_COOP_SPLIT_STORE != 0;
    const int storer = kSplit ? 128 * wg : 128;  // the thread that issues the store
    if (threadIdx.x == storer) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    if constexpr (kSplit) asm volatile("bar.sync %0, 128;" ::"r"(wg) : "memory");
    else asm volatile("bar.sync 1, 256;" ::: "memory");
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
    if constexpr (kSplit) asm volatile("bar.sync %0, 128;" ::"r"(wg) : "memory");
    else asm volatile("bar.sync 1, 256;" ::: "memory");
    if (threadIdx.x == storer) {
      if constexpr (kSplit) tma_store(stg + cg * 128 * 128, &map_h, n0, m0 + 128 * cg);
      else tma_store(stg, &map_h, n0, m0);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    clk_hand += clock_now() - h0;
  }
  if (threadIdx.x == (FUSED_MLP_COOP_SPLIT_STORE ? 128 * wg : 128)) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  clock_store(p, kClkMmaFull, clk_wait, threadIdx.x == 128);
  clock_store(p, kClkMmaFreed, clk_wait, threadIdx.x == 256);
  clock_store(p, kClkMmaTotal, clock_now() - clk_start, threadIdx.x == 128);
  clock_store(p, kClkEpiStaged, clk_hand, threadIdx.x == 128);
}

#else  // not compiled for sm_90a

template <typename T, Activation A, int BN = kCoopBN>
__global__ void gated_fwd_coop_kernel(const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                                      const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                                      const Params) {}

#endif

}  // namespace sm90
}  // namespace fused_mlp
