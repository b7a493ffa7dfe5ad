// Few-token ("decode") MLP projections: out = f(x W^T) for M = 1..64 rows of x.
//
// At decode time an MLP is a matrix-vector product: its cost is reading the weights
// once. These kernels stream every weight row exactly once for all M rows of x and
// keep x (a few KB to 1.8 MB, L1/L2 resident) out of the way:
//
//   decode_gate_up: out[m, n] = act(x[m] . gate_weight[n] + bg[n]) * (x[m] . up_weight[n] + bu[n])
//   decode_linear:  out[m, n] = act(x[m] . weight[n] + b[n])          (act 0 = identity)
//
// Two implementations:
//
// * decode_mma_kernel (bf16/fp16, 16-byte aligned rows, sm_80+): the weights are the
//   A operand of mma.sync m16n8k16 (16 weight rows x 16 k) and x^T the B operand
//   (16 k x 8 tokens), fp32 accumulators ("swap AB": tokens are the n = 8 side, so one
//   pass covers 8 tokens per group, up to 8 groups = 64 tokens). The reduction order
//   over k is free, so lane (g = lane/4, t = lane%4) loads 8 *contiguous* k of weight
//   rows g and g+8 and of token g with one 16-byte load each and the fragments are
//   taken straight from those registers (no ldmatrix, no shuffles): a 32-wide k chunk
//   is two mma k-steps whose k order is permuted identically in A and B.
//   Per warp and step: 4 x 16 B weight loads per lane (2 KB per warp: 32 weight rows x
//   64 B). A batch of U steps is issued back to back (U x 2 KB in flight per warp,
//   U x 64 contiguous bytes per row), weights straight into registers with
//   L1::no_allocate (x keeps L1), x with cp.async into the lane's own shared-memory
//   slots (no registers held while in flight; each lane reads back only what it
//   copied, so no barrier). Batch b+1 is issued right after batch b's products, so
//   the x wait at the top of a batch overlaps the weights' latency.
//   A warp owns one row tile:
//     gate_up  : 16 outputs = 16 gate rows + 16 up rows (two accumulator tiles)
//     linear32 : 32 rows (two accumulator tiles)
//     linear16 : 16 rows, a step covers 64 k (one accumulator tile; for small N)
//   A block is RW x KS warps: RW row tiles side by side (they read the same x at the
//   same time, so x comes from L2 once per block and from L1 for the others) and KS
//   warps splitting the reduction dimension K of each row tile; the KS partial sums
//   are added in shared memory (no workspace, no atomics, deterministic), then bias,
//   activation, gate*up and the rounding to the output dtype. M up to 64 is one pass
//   over the weights (MG = ceil(M/8) token groups, accumulators 8*MG per tile).
//   Block shape from choose_config(); FUSED_MLP_DECODE_KS / _RW / _LINEAR_ROWS
//   override it and FUSED_MLP_DECODE_FORCE_SIMT=1 forces the SIMT kernel (tuning aids,
//   read at every call).
//
// * decode_simt_kernel (fp32, unaligned or odd sizes, or GPUs older than sm_80): CUDA
//   cores, fp32 FMAs, a warp per 2 rows (2 gate + 2 up for gate_up), 16-byte vector
//   loads when rows are aligned, else scalar; M is covered in passes of 8 tokens, each
//   pass re-reading the warp's rows (from L1/L2 after the first).
//
// Everything runs on the current stream, allocates nothing and never synchronizes the
// host, so both ops can be captured in CUDA graphs.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>

#include "activations.h"
#include "torch_binding.h"

namespace fused_mlp {
namespace decode {

constexpr int kMaxM = 64;
constexpr int kRedStride = 20;  // floats per token row of a warp's reduction tile (16 + pad)

enum class Mode : int { kGateUp = 0, kLinear32 = 1, kLinear16 = 2 };

struct Params {
  const void* w0;  // gate_weight (gate_up) or weight (linear)
  const void* w1;  // up_weight (gate_up only)
  int64_t ldw0;    // row strides of w0 / w1 in elements
  int64_t ldw1;
  const void* x;   // [M, K] contiguous
  const void* b0;  // gate_bias / bias, or nullptr
  const void* b1;  // up_bias, or nullptr
  void* out;       // [M, N] contiguous
  int M, N, K;
  int rw, ks;           // mma kernel: row-tile warps and K-split warps per block
  int steps_per_split;  // mma kernel: k steps per K-split warp
  int act;              // fused_mlp::Activation id
};

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

template <int MG>
struct MmaTune {
  // Registers per thread: accumulators 8*MG, weights in flight 16*U, plus addressing.
  // Every variant fits the 128 registers that 512-thread blocks allow (16 warps/SM).
  static constexpr int kMaxThreads = 512;
  static constexpr int kMinBlocks = 1;
  static constexpr int kUnroll = MG <= 2 ? 4 : (MG <= 4 ? 3 : 2);  // steps per batch
};

template <Mode kMode>
struct ModeTraits {
  static constexpr int kAcc = kMode == Mode::kLinear16 ? 1 : 2;      // accumulator tiles
  static constexpr int kXPerStep = kMode == Mode::kLinear16 ? 2 : 1;  // x loads per group and step
  static constexpr int kStepK = 32 * kXPerStep;                       // k covered per step
  static constexpr int kRows = kMode == Mode::kLinear32 ? 32 : 16;    // output rows per warp tile
};

// ----------------------------------------------------------------------------- device helpers

// 16-byte streaming load of weights: read-only path, not kept in L1 (x lives there),
// 256-byte L2 prefetch (the next steps of this row). Zero when !pred.
__device__ __forceinline__ uint4 ld_weight(const void* ptr, bool pred) {
  uint4 r;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %5, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  mov.b32 %2, 0;\n"
      "  mov.b32 %3, 0;\n"
      "  @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(ptr), "r"(static_cast<int>(pred)));
  return r;
}

// 16-byte asynchronous copy global -> shared of activations (x), cached in L1 (.ca) so
// the row-tile warps of a block share it; zero-filled when !pred (src is not read).
__device__ __forceinline__ void cp_async_act(uint32_t smem_addr, const void* gptr, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gptr),
               "r"(pred ? 16 : 0)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

template <typename T>
struct MmaInstr;

template <>
struct MmaInstr<c10::BFloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();
#endif
  }
};

template <>
struct MmaInstr<c10::Half> {
  __device__ __forceinline__ static void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();
#endif
  }
};

// acc += W[16 rows x 32 k] . X[8 tokens x 32 k]^T for one lane's share:
// lo = row g, hi = row g+8 (8 contiguous k each), xv = token g (the same 8 k).
// Words 0,1 of each vector form the first mma k-step, words 2,3 the second; within a
// step, fragment columns 2t,2t+1 hold k 0,1 (resp. 4,5) of the lane's 8 and columns
// 2t+8,2t+9 hold k 2,3 (resp. 6,7) -- the same permutation for A and B.
template <typename T>
__device__ __forceinline__ void mma_32k(float (&acc)[4], const uint4& lo, const uint4& hi,
                                        const uint4& xv) {
  MmaInstr<T>::run(acc, lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
  MmaInstr<T>::run(acc, lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
}

__device__ __forceinline__ float act_fn(int act, float v) {
  return ::fused_mlp::apply_activation(static_cast<::fused_mlp::Activation>(act), v);
}

template <typename T>
__device__ __forceinline__ float load_f(const T* p) {
  return static_cast<float>(*p);
}

// ----------------------------------------------------------------------------- mma kernel

// Shared memory per warp: the x stage of one batch (U steps x MG groups x kXPerStep
// vectors x 32 lanes x 16 B), reused after the main loop as the warp's reduction tile.
template <Mode kMode, int MG, int U>
constexpr int warp_smem_bytes() {
  constexpr int stage = U * MG * ModeTraits<kMode>::kXPerStep * 32 * 16;
  constexpr int red = ModeTraits<kMode>::kAcc * 8 * kRedStride * 4;
  return stage > red ? stage : red;
}

template <typename T, Mode kMode, int MG, int U>
__global__ void __launch_bounds__(MmaTune<MG>::kMaxThreads, MmaTune<MG>::kMinBlocks)
    decode_mma_kernel(const Params p) {
  using Tr = ModeTraits<kMode>;
  constexpr int kAcc = Tr::kAcc;
  constexpr int kXPer = Tr::kXPerStep;
  constexpr int kStepK = Tr::kStepK;
  constexpr int kRows = Tr::kRows;
  constexpr int kWarpSmem = warp_smem_bytes<kMode, MG, U>();
  extern __shared__ __align__(16) unsigned char smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int rw = warp % p.rw;
  const int ks = warp / p.rw;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int M = p.M, N = p.N, K = p.K;
  const int ngroups = (M + 7) >> 3;
  const int n0 = (blockIdx.x * p.rw + rw) * kRows;
  unsigned char* wsmem = smem + warp * kWarpSmem;
  const uint32_t xstage = static_cast<uint32_t>(__cvta_generic_to_shared(wsmem)) + lane * 16;
  const uint4* xstage_v = reinterpret_cast<const uint4*>(wsmem) + lane;  // same slots, C++ view

  float acc[kAcc][MG][4];
#pragma unroll
  for (int a = 0; a < kAcc; ++a)
#pragma unroll
    for (int j = 0; j < MG; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][j][e] = 0.f;

  const int nsteps = ceil_div(K, kStepK);
  const int s_begin = ks * p.steps_per_split;
  const int s_end = min(s_begin + p.steps_per_split, nsteps);

  if (n0 < N && s_begin < s_end) {  // warp-uniform
    // The 4 weight vectors a lane loads per step: j = 2 * tile + half (rows g / g+8).
    const T* wp[4];
    int kofs[4];
#pragma unroll
    for (int a = 0; a < 2; ++a) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int row;
        const T* base = static_cast<const T*>(p.w0);
        int64_t ld = p.ldw0;
        int ko = 0;
        if constexpr (kMode == Mode::kGateUp) {
          row = n0 + g + 8 * h;
          if (a == 1) {
            base = static_cast<const T*>(p.w1);
            ld = p.ldw1;
          }
        } else if constexpr (kMode == Mode::kLinear32) {
          row = n0 + 16 * a + g + 8 * h;
        } else {
          row = n0 + g + 8 * h;
          ko = 32 * a;
        }
        row = min(row, N - 1);  // rows past N compute a copy of row N-1, never stored
        wp[2 * a + h] = base + static_cast<int64_t>(row) * ld + ko + t * 8;
        kofs[2 * a + h] = ko + t * 8;
      }
    }
    // Lane (g, t) of group j reads token j*8+g (tokens past M: copies of token M-1).
    const T* xp = static_cast<const T*>(p.x) + t * 8;
    int xoff[MG];
#pragma unroll
    for (int j = 0; j < MG; ++j) xoff[j] = min(j * 8 + g, M - 1) * K;

    // Batch b = U steps. Its weight loads (registers) and x copies (cp.async into this
    // lane's own shared-memory slots, no registers held) are issued at the end of
    // batch b-1, so the x wait at the top of batch b overlaps the weight latency.
    uint4 w[U][4];
    auto issue_batch = [&](int s0) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int s = s0 + u;
        const int kk = s * kStepK;
#pragma unroll
        for (int q = 0; q < 4; ++q) w[u][q] = ld_weight(wp[q] + kk, s < s_end && kk + kofs[q] < K);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int s = s0 + u;
#pragma unroll
        for (int j = 0; j < MG; ++j) {
#pragma unroll
          for (int xi = 0; xi < kXPer; ++xi) {
            const int kx = s * kStepK + 32 * xi;
            const bool ok = s < s_end && j < ngroups && kx + t * 8 < K;
            const T* src = ok ? xp + xoff[j] + kx : xp;
            cp_async_act(xstage + ((u * MG + j) * kXPer + xi) * 512, src, ok);
          }
        }
      }
      cp_async_commit();
    };

    issue_batch(s_begin);
    for (int s0 = s_begin; s0 < s_end; s0 += U) {
      cp_async_wait_all();
      // Tensor-core products as the weights arrive. Each lane reads back only the x
      // slots it copied itself, so no warp or block synchronization is needed.
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (s0 + u < s_end) {
#pragma unroll
          for (int j = 0; j < MG; ++j) {
            if (j < ngroups) {
#pragma unroll
              for (int xi = 0; xi < kXPer; ++xi) {
                const uint4 xv = xstage_v[((u * MG + j) * kXPer + xi) * 32];
                if constexpr (kMode == Mode::kLinear16) {
                  mma_32k<T>(acc[0][j], w[u][2 * xi], w[u][2 * xi + 1], xv);
                } else {
#pragma unroll
                  for (int a = 0; a < 2; ++a) mma_32k<T>(acc[a][j], w[u][2 * a], w[u][2 * a + 1], xv);
                }
              }
            }
          }
        }
      }
      // The next batch (past s_end: no loads, no copies). Its x copies overwrite the
      // slots just read: program order (and the mma's use of those values) puts the
      // reads first.
      issue_batch(s0 + U);
    }
    cp_async_wait_all();  // the slots become the reduction tile below
  }

  // K-split reduction through shared memory (each warp's slot, reused), one 8-token
  // group at a time, then the epilogue (bias, activation, gate * up, rounding) with
  // consecutive threads on consecutive output columns.
  float* mine = reinterpret_cast<float*>(wsmem);
  const int block_rows = p.rw * kRows;
  const T* b0 = static_cast<const T*>(p.b0);
  const T* b1 = static_cast<const T*>(p.b1);
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int j = 0; j < MG; ++j) {
    if (j >= ngroups) break;  // block-uniform
    if (j > 0) __syncthreads();  // the previous group's sums have been read
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      float* s = mine + a * 8 * kRedStride;
      s[(2 * t) * kRedStride + g] = acc[a][j][0];
      s[(2 * t + 1) * kRedStride + g] = acc[a][j][1];
      s[(2 * t) * kRedStride + g + 8] = acc[a][j][2];
      s[(2 * t + 1) * kRedStride + g + 8] = acc[a][j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < block_rows * 8; i += blockDim.x) {
      const int r = i % block_rows;
      const int tok = i / block_rows;
      const int m = j * 8 + tok;
      const int rwi = r / kRows;
      const int rr = r % kRows;
      const int n = (blockIdx.x * p.rw + rwi) * kRows + rr;
      if (m < M && n < N) {
        int tile = 0, row16 = rr;
        if constexpr (kMode == Mode::kLinear32) {
          tile = rr >> 4;
          row16 = rr & 15;
        }
        float s0 = 0.f, s1 = 0.f;
        for (int q = 0; q < p.ks; ++q) {
          const float* s = reinterpret_cast<const float*>(smem + (q * p.rw + rwi) * kWarpSmem);
          s0 += s[(tile * 8 + tok) * kRedStride + row16];
          if constexpr (kMode == Mode::kGateUp) s1 += s[(8 + tok) * kRedStride + row16];
        }
        float v;
        if constexpr (kMode == Mode::kGateUp) {
          const float gate = s0 + (b0 != nullptr ? load_f(b0 + n) : 0.f);
          const float up = s1 + (b1 != nullptr ? load_f(b1 + n) : 0.f);
          v = act_fn(p.act, gate) * up;
        } else {
          v = act_fn(p.act, s0 + (b0 != nullptr ? load_f(b0 + n) : 0.f));
        }
        out[static_cast<int64_t>(m) * N + n] = static_cast<T>(v);
      }
    }
  }
}

// ----------------------------------------------------------------------------- SIMT kernel

// VEC elements at ptr as fp32: one 16-byte load (VEC * sizeof(T) == 16) or one scalar.
template <typename T, int VEC>
__device__ __forceinline__ void load_vec_f(const T* ptr, float (&v)[VEC]);

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float f16_bits(uint32_t bits) {
  return static_cast<float>(c10::Half(static_cast<unsigned short>(bits), c10::Half::from_bits()));
}

template <>
__device__ __forceinline__ void load_vec_f<float, 1>(const float* ptr, float (&v)[1]) {
  v[0] = __ldg(ptr);
}
template <>
__device__ __forceinline__ void load_vec_f<float, 4>(const float* ptr, float (&v)[4]) {
  const float4 q = __ldg(reinterpret_cast<const float4*>(ptr));
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}
template <>
__device__ __forceinline__ void load_vec_f<c10::BFloat16, 1>(const c10::BFloat16* ptr, float (&v)[1]) {
  v[0] = bf16_lo(__ldg(reinterpret_cast<const unsigned short*>(ptr)));
}
template <>
__device__ __forceinline__ void load_vec_f<c10::BFloat16, 8>(const c10::BFloat16* ptr, float (&v)[8]) {
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(ptr));
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = bf16_lo(w[i]);
    v[2 * i + 1] = bf16_hi(w[i]);
  }
}
template <>
__device__ __forceinline__ void load_vec_f<c10::Half, 1>(const c10::Half* ptr, float (&v)[1]) {
  v[0] = f16_bits(__ldg(reinterpret_cast<const unsigned short*>(ptr)));
}
template <>
__device__ __forceinline__ void load_vec_f<c10::Half, 8>(const c10::Half* ptr, float (&v)[8]) {
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(ptr));
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = f16_bits(w[i] & 0xffffu);
    v[2 * i + 1] = f16_bits(w[i] >> 16);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kSimtThreads = 256;
constexpr int kSimtRowsPerWarp = 2;
constexpr int kSimtTokens = 8;

template <typename T, bool kGateUp, int VEC>
__global__ void __launch_bounds__(kSimtThreads) decode_simt_kernel(const Params p) {
  constexpr int RPW = kSimtRowsPerWarp;
  constexpr int MT = kSimtTokens;
  constexpr int NR = kGateUp ? 2 * RPW : RPW;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int M = p.M, N = p.N, K = p.K;
  const int n0 = (blockIdx.x * (kSimtThreads / 32) + warp) * RPW;
  if (n0 >= N) return;  // no block barriers in this kernel

  const T* wr[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const bool up = kGateUp && r >= RPW;
    const T* base = static_cast<const T*>(up ? p.w1 : p.w0);
    const int64_t ld = up ? p.ldw1 : p.ldw0;
    const int row = min(n0 + r % RPW, N - 1);
    wr[r] = base + static_cast<int64_t>(row) * ld;
  }
  const T* x = static_cast<const T*>(p.x);
  const T* b0 = static_cast<const T*>(p.b0);
  const T* b1 = static_cast<const T*>(p.b1);
  T* out = static_cast<T*>(p.out);

  for (int m0 = 0; m0 < M; m0 += MT) {
    float acc[NR][MT];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int tt = 0; tt < MT; ++tt) acc[r][tt] = 0.f;

    for (int k = lane * VEC; k < K; k += 32 * VEC) {
      float wv[NR][VEC];
#pragma unroll
      for (int r = 0; r < NR; ++r) load_vec_f<T, VEC>(wr[r] + k, wv[r]);
#pragma unroll
      for (int tt = 0; tt < MT; ++tt) {
        if (m0 + tt < M) {
          float xv[VEC];
          load_vec_f<T, VEC>(x + static_cast<int64_t>(m0 + tt) * K + k, xv);
#pragma unroll
          for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[r][tt] = fmaf(wv[r][v], xv[v], acc[r][tt]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int tt = 0; tt < MT; ++tt) acc[r][tt] = warp_sum(acc[r][tt]);

    // Lane (rr * MT + tt) finishes output (m0 + tt, n0 + rr).
    float gsum = 0.f, usum = 0.f;
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
#pragma unroll
      for (int tt = 0; tt < MT; ++tt) {
        if (lane == rr * MT + tt) {
          gsum = acc[rr][tt];
          if constexpr (kGateUp) usum = acc[RPW + rr][tt];
        }
      }
    }
    const int n = n0 + lane / MT;
    const int m = m0 + lane % MT;
    if (lane < RPW * MT && n < N && m < M) {
      float v;
      if constexpr (kGateUp) {
        const float gate = gsum + (b0 != nullptr ? load_f(b0 + n) : 0.f);
        const float up = usum + (b1 != nullptr ? load_f(b1 + n) : 0.f);
        v = act_fn(p.act, gate) * up;
      } else {
        v = act_fn(p.act, gsum + (b0 != nullptr ? load_f(b0 + n) : 0.f));
      }
      out[static_cast<int64_t>(m) * N + n] = static_cast<T>(v);
    }
  }
}

// ----------------------------------------------------------------------------- host side

int env_int(const char* name, int fallback) {
  // Tuning knobs (read on every call, so a benchmark can sweep them in one process;
  // CUDA-graph replays keep the configuration they were captured with).
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  return std::atoi(s);
}

// SM count and compute capability major of a device, queried once per device
// (cudaDeviceGetAttribute does not synchronize and is safe during graph capture).
struct DeviceInfo {
  int index;
  int sms;
  int major;
  int smem_optin;  // bytes of shared memory a block may opt in to
};

DeviceInfo device_info(int device) {
  // Lock-free cache (no std::call_once: pthread_once would raise the glibc floor
  // above manylinux_2_28). Racing first calls store identical values.
  constexpr int kMaxDevices = 64;
  FUSED_MLP_CHECK(device >= 0 && device < kMaxDevices, "fused_mlp.decode: CUDA device index ", device,
              " is out of range (0 to ", kMaxDevices - 1, ")");
  static std::atomic<int> sms[kMaxDevices], major[kMaxDevices], optin[kMaxDevices];
  DeviceInfo info{};
  info.index = device;
  info.sms = sms[device].load(std::memory_order_acquire);
  if (info.sms > 0) {
    info.major = major[device].load(std::memory_order_relaxed);
    info.smem_optin = optin[device].load(std::memory_order_relaxed);
    return info;
  }
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(
      cudaDeviceGetAttribute(&info.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  major[device].store(info.major, std::memory_order_relaxed);
  optin[device].store(info.smem_optin, std::memory_order_relaxed);
  sms[device].store(info.sms, std::memory_order_release);
  return info;
}

struct Config {
  int rw;
  int ks;
};

// Choose the block shape for `tiles` warp row tiles of `nsteps` k steps each.
// KS (warps splitting K) grows until there are ~12 warps per SM with at least two
// batches of work each; RW (row tiles per block, sharing x through L1) grows while
// the grid keeps at least two blocks per SM.
Config choose_config(int tiles, int nsteps, int max_warps, int sms, int unroll) {
  int ks = 1;
  const int64_t target_warps = 12LL * sms;
  while (ks * 2 <= max_warps && ks < 16 && static_cast<int64_t>(tiles) * ks < target_warps &&
         nsteps >= ks * 2 * 2 * unroll) {
    ks *= 2;
  }
  int rw = 1;
  while (rw < 4 && rw * 2 * ks <= max_warps && ceil_div(tiles, rw * 2) >= 2 * sms) rw *= 2;
  // Overrides (powers of two are not required).
  const int env_ks = env_int("FUSED_MLP_DECODE_KS", 0);
  const int env_rw = env_int("FUSED_MLP_DECODE_RW", 0);
  if (env_ks > 0) ks = env_ks;
  if (env_rw > 0) rw = env_rw;
  ks = std::max(1, std::min(ks, std::max(1, nsteps)));
  if (rw * ks > max_warps) rw = std::max(1, max_warps / ks);
  if (rw * ks > max_warps) ks = max_warps;
  return {rw, ks};
}

template <typename T, Mode kMode, int MG>
void launch_mma(Params p, const DeviceInfo& dev, cudaStream_t stream) {
  using Tr = ModeTraits<kMode>;
  constexpr int U = MmaTune<MG>::kUnroll;
  constexpr int kWarpSmem = warp_smem_bytes<kMode, MG, U>();
  const int max_warps = std::max(1, std::min(MmaTune<MG>::kMaxThreads / 32, dev.smem_optin / kWarpSmem));
  const int tiles = ceil_div(p.N, Tr::kRows);
  const int nsteps = ceil_div(p.K, Tr::kStepK);
  const Config c = choose_config(tiles, nsteps, max_warps, dev.sms, U);
  p.rw = c.rw;
  p.ks = c.ks;
  // Whole batches per split (the last split may be shorter).
  p.steps_per_split = std::max(1, ceil_div(ceil_div(nsteps, c.ks), U) * U);
  const int warps = c.rw * c.ks;
  const dim3 grid(ceil_div(tiles, c.rw));
  const dim3 block(32 * warps);
  const int smem = warps * kWarpSmem;
  auto kernel = decode_mma_kernel<T, kMode, MG, U>;
  if (smem > 48 * 1024) {
    // Opt in to more than 48 KB of dynamic shared memory, once per device (a function
    // attribute, not a stream operation), up to the device's limit.
    static std::atomic<uint64_t> opted_in{0};
    const uint64_t bit = uint64_t{1} << (dev.index & 63);
    if ((opted_in.load(std::memory_order_relaxed) & bit) == 0) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dev.smem_optin));
      opted_in.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  kernel<<<grid, block, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, Mode kMode>
void launch_mma_m(const Params& p, const DeviceInfo& dev, cudaStream_t stream) {
  if (p.M <= 8) {
    launch_mma<T, kMode, 1>(p, dev, stream);
  } else if (p.M <= 16) {
    launch_mma<T, kMode, 2>(p, dev, stream);
  } else if (p.M <= 32) {
    launch_mma<T, kMode, 4>(p, dev, stream);
  } else {
    launch_mma<T, kMode, 8>(p, dev, stream);
  }
}

template <typename T, bool kGateUp>
void launch_simt(const Params& p, bool vec, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int warps = ceil_div(p.N, kSimtRowsPerWarp);
  const dim3 grid(ceil_div(warps, kSimtThreads / 32));
  if (vec) {
    decode_simt_kernel<T, kGateUp, kVec><<<grid, kSimtThreads, 0, stream>>>(p);
  } else {
    decode_simt_kernel<T, kGateUp, 1><<<grid, kSimtThreads, 0, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }


// ----------------------------------------------------------------------------- checks

void check_activation(const char* op, int64_t activation) {
  FUSED_MLP_CHECK(activation >= 0 && activation < ::fused_mlp::kNumActivations, "fused_mlp.", op,
              ": activation id ", activation, " is not one of 0..",
              ::fused_mlp::kNumActivations - 1);
}

void check_x(const char* op, const torch::Tensor& x) {
  FUSED_MLP_CHECK(x.is_cuda(), "fused_mlp.", op, ": x must be a CUDA tensor, got device ", x.device());
  FUSED_MLP_CHECK(x.dim() == 2, "fused_mlp.", op, ": x must be 2-D [M, K], got shape ", x.sizes());
  const auto st = x.scalar_type();
  FUSED_MLP_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, "fused_mlp.", op,
              ": x has dtype ", st, "; supported: float32, float16, bfloat16");
  FUSED_MLP_CHECK(x.size(0) <= kMaxM, "fused_mlp.", op, ": x has ", x.size(0),
              " rows; the decode kernels take at most ", kMaxM,
              " (use the general path, e.g. fused_mlp.gated_mlp / fused_mlp.mlp, for more)");
  FUSED_MLP_CHECK(x.is_contiguous(), "fused_mlp.", op, ": x must be contiguous (call .contiguous())");
  FUSED_MLP_CHECK(x.size(1) <= INT_MAX / kMaxM, "fused_mlp.", op, ": x.shape[1] = ", x.size(1),
              " is larger than the kernel supports (", INT_MAX / kMaxM, ")");
}

void check_same(const char* op, const char* name, const torch::Tensor& t, const torch::Tensor& x) {
  FUSED_MLP_CHECK(t.device() == x.device(), "fused_mlp.", op, ": ", name, " is on ", t.device(),
              " but x is on ", x.device(), "; all tensors must be on the same CUDA device");
  FUSED_MLP_CHECK(t.scalar_type() == x.scalar_type(), "fused_mlp.", op, ": ", name, " has dtype ",
              t.scalar_type(), " but x has dtype ", x.scalar_type(), "; they must match");
}

void check_weight(const char* op, const char* name, const torch::Tensor& w, const torch::Tensor& x,
                  int64_t rows) {
  check_same(op, name, w, x);
  FUSED_MLP_CHECK(w.dim() == 2, "fused_mlp.", op, ": ", name, " must be 2-D [out, in] (nn.Linear layout), got shape ",
              w.sizes());
  FUSED_MLP_CHECK(w.size(1) == x.size(1), "fused_mlp.", op, ": ", name, " has shape ", w.sizes(),
              " but x has ", x.size(1), " columns; expected [", rows < 0 ? w.size(0) : rows,
              ", ", x.size(1), "]");
  if (rows >= 0) {
    FUSED_MLP_CHECK(w.size(0) == rows, "fused_mlp.", op, ": ", name, " has shape ", w.sizes(),
                ", expected [", rows, ", ", x.size(1), "]");
  }
  FUSED_MLP_CHECK(w.size(0) <= INT_MAX, "fused_mlp.", op, ": ", name, " has ", w.size(0), " rows, more than the kernel supports (", INT_MAX, ")");
  FUSED_MLP_CHECK(w.size(1) <= 1 || w.stride(1) == 1, "fused_mlp.", op, ": ", name,
              " must have unit stride in its last dimension (got strides ", w.strides(),
              "); rows may be strided (e.g. slices of a packed weight)");
}

void check_bias(const char* op, const char* name, const c10::optional<torch::Tensor>& b,
                const torch::Tensor& x, int64_t n) {
  if (!b.has_value()) return;
  check_same(op, name, *b, x);
  FUSED_MLP_CHECK(b->dim() == 1 && b->size(0) == n, "fused_mlp.", op, ": ", name, " has shape ",
              b->sizes(), ", expected [", n, "]");
  FUSED_MLP_CHECK(n <= 1 || b->stride(0) == 1, "fused_mlp.", op, ": ", name, " must be contiguous");
}

void check_out(const char* op, const torch::Tensor& out, const torch::Tensor& x, int64_t n) {
  check_same(op, "out", out, x);
  FUSED_MLP_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == n, "fused_mlp.", op,
              ": out has shape ", out.sizes(), ", expected [", x.size(0), ", ", n, "]");
  FUSED_MLP_CHECK(out.is_contiguous(), "fused_mlp.", op, ": out must be contiguous");
}

bool use_mma(const torch::Tensor& x, const torch::Tensor& w0, const torch::Tensor* w1,
             const DeviceInfo& dev) {
  if (x.scalar_type() != at::kHalf && x.scalar_type() != at::kBFloat16) return false;
  if (env_int("FUSED_MLP_DECODE_FORCE_SIMT", 0) != 0) return false;
  if (dev.major < 8) return false;
  const int64_t K = x.size(1);
  if (K % 8 != 0) return false;
  if (!aligned16(x.data_ptr())) return false;
  if (!aligned16(w0.data_ptr()) || w0.stride(0) % 8 != 0) return false;
  if (w1 != nullptr && (!aligned16(w1->data_ptr()) || w1->stride(0) % 8 != 0)) return false;
  return true;
}

bool simt_vec_ok(const torch::Tensor& x, const torch::Tensor& w0, const torch::Tensor* w1) {
  const int64_t vec = 16 / x.element_size();
  const int64_t K = x.size(1);
  if (K % vec != 0) return false;
  if (!aligned16(x.data_ptr())) return false;
  if (!aligned16(w0.data_ptr()) || w0.stride(0) % vec != 0) return false;
  if (w1 != nullptr && (!aligned16(w1->data_ptr()) || w1->stride(0) % vec != 0)) return false;
  return true;
}

}  // namespace decode
}  // namespace fused_mlp

void decode_gate_up_cuda(torch::Tensor& out, const torch::Tensor& x,
                         const torch::Tensor& gate_weight, const torch::Tensor& up_weight,
                         const c10::optional<torch::Tensor>& gate_bias,
                         const c10::optional<torch::Tensor>& up_bias, int64_t activation) {
  using namespace fused_mlp::decode;
  constexpr const char* op = "decode_gate_up";
  check_activation(op, activation);
  check_x(op, x);
  FUSED_MLP_CHECK(gate_weight.dim() == 2, "fused_mlp.decode_gate_up: gate_weight must be 2-D [hidden, dim], got shape ",
              gate_weight.sizes());
  const int64_t H = gate_weight.size(0);
  check_weight(op, "gate_weight", gate_weight, x, -1);
  check_weight(op, "up_weight", up_weight, x, H);
  check_bias(op, "gate_bias", gate_bias, x, H);
  check_bias(op, "up_bias", up_bias, x, H);
  check_out(op, out, x, H);
  FUSED_MLP_CHECK(x.size(0) * H <= INT_MAX, "fused_mlp.decode_gate_up: out would have ", x.size(0) * H,
                  " elements, more than the kernel supports (2^31 - 1)");
  if (x.size(0) == 0 || H == 0) return;

  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const DeviceInfo dev = device_info(x.get_device());
  Params p{};
  p.w0 = gate_weight.data_ptr();
  p.w1 = up_weight.data_ptr();
  p.ldw0 = gate_weight.stride(0);
  p.ldw1 = up_weight.stride(0);
  p.x = x.data_ptr();
  p.b0 = gate_bias.has_value() ? gate_bias->data_ptr() : nullptr;
  p.b1 = up_bias.has_value() ? up_bias->data_ptr() : nullptr;
  p.out = out.data_ptr();
  p.M = static_cast<int>(x.size(0));
  p.N = static_cast<int>(H);
  p.K = static_cast<int>(x.size(1));
  p.act = static_cast<int>(activation);

  const bool mma = use_mma(x, gate_weight, &up_weight, dev);
  const bool vec = !mma && simt_vec_ok(x, gate_weight, &up_weight);
  switch (x.scalar_type()) {
    case at::kBFloat16:
      if (mma) {
        launch_mma_m<c10::BFloat16, Mode::kGateUp>(p, dev, stream);
      } else {
        launch_simt<c10::BFloat16, true>(p, vec, stream);
      }
      break;
    case at::kHalf:
      if (mma) {
        launch_mma_m<c10::Half, Mode::kGateUp>(p, dev, stream);
      } else {
        launch_simt<c10::Half, true>(p, vec, stream);
      }
      break;
    default:
      launch_simt<float, true>(p, vec, stream);
      break;
  }
}

void decode_linear_cuda(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& weight,
                        const c10::optional<torch::Tensor>& bias, int64_t activation) {
  using namespace fused_mlp::decode;
  constexpr const char* op = "decode_linear";
  check_activation(op, activation);
  check_x(op, x);
  FUSED_MLP_CHECK(weight.dim() == 2, "fused_mlp.decode_linear: weight must be 2-D [out, in], got shape ",
              weight.sizes());
  const int64_t N = weight.size(0);
  check_weight(op, "weight", weight, x, -1);
  check_bias(op, "bias", bias, x, N);
  check_out(op, out, x, N);
  FUSED_MLP_CHECK(x.size(0) * N <= INT_MAX, "fused_mlp.decode_linear: out would have ", x.size(0) * N,
                  " elements, more than the kernel supports (2^31 - 1)");
  if (x.size(0) == 0 || N == 0) return;

  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const DeviceInfo dev = device_info(x.get_device());
  const int sms = dev.sms;
  Params p{};
  p.w0 = weight.data_ptr();
  p.w1 = nullptr;
  p.ldw0 = weight.stride(0);
  p.ldw1 = 0;
  p.x = x.data_ptr();
  p.b0 = bias.has_value() ? bias->data_ptr() : nullptr;
  p.b1 = nullptr;
  p.out = out.data_ptr();
  p.M = static_cast<int>(x.size(0));
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(x.size(1));
  p.act = static_cast<int>(activation);

  const bool mma = use_mma(x, weight, nullptr, dev);
  const bool vec = !mma && simt_vec_ok(x, weight, nullptr);
  // 32-row warp tiles read x half as often per weight byte; 16-row tiles give twice
  // as many warps, for projections with few output rows (fewer than ~3/4 of the SMs
  // would get a 32-row tile).
  const int rows_env = env_int("FUSED_MLP_DECODE_LINEAR_ROWS", 0);
  const bool rows16 = rows_env == 16 || (rows_env != 32 && ceil_div(p.N, 32) * 4 < sms * 3);
  switch (x.scalar_type()) {
    case at::kBFloat16:
      if (!mma) {
        launch_simt<c10::BFloat16, false>(p, vec, stream);
      } else if (rows16) {
        launch_mma_m<c10::BFloat16, Mode::kLinear16>(p, dev, stream);
      } else {
        launch_mma_m<c10::BFloat16, Mode::kLinear32>(p, dev, stream);
      }
      break;
    case at::kHalf:
      if (!mma) {
        launch_simt<c10::Half, false>(p, vec, stream);
      } else if (rows16) {
        launch_mma_m<c10::Half, Mode::kLinear16>(p, dev, stream);
      } else {
        launch_mma_m<c10::Half, Mode::kLinear32>(p, dev, stream);
      }
      break;
    default:
      launch_simt<float, false>(p, vec, stream);
      break;
  }
}
