// CUDA activation-and-multiply: out[r, i] = act(x[r, i]) * x[r, d + i].
//
// The op is a pure stream (read 2d, write d per row, a handful of flops per
// element), so the kernel is written around memory throughput:
//   * 16-byte loads/stores whenever every row start is 16-byte aligned, which
//     holds when d * sizeof(T) is a multiple of 16 and both base pointers are
//     16-byte aligned; otherwise a one-element path that is correct for any d;
//   * for cheap activations (silu, relu, ...) with 16-byte accesses, the output is
//     one flat array of accesses, one per thread in small blocks, so that many
//     threads per SM keep loads in flight;
//   * otherwise a block owns one column chunk of one group of rows (worked out once
//     per block, no division in the element loop) and each thread issues all its
//     loads before it computes;
//   * all arithmetic is fp32 (kernel_src/common/activations.h), with a single
//     rounding on the store, the same as the CPU kernel.
//
// Includes stay at the c10 level: ATen/cuda/CUDAContext.h would drag in the
// cuBLAS/cuSPARSE/cuSOLVER headers, which a minimal CUDA toolkit lacks, for
// nothing this file uses (at::cuda::getCurrentCUDAStream is c10's function).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "activations.h"
#include "torch_binding.h"

namespace {

using fused_mlp::Activation;

constexpr int kBlockThreads = 256;
// Accesses per thread and row half in row chunks: four 16-byte vectors (8 loads, 128
// bytes in flight per thread) or eight single elements.
constexpr int kVectorUnroll = 4;
constexpr int kScalarUnroll = 8;

// Conversions between the storage type and fp32. The 16-bit types also have a
// paired form so that two results round and pack in one instruction.
template <typename T>
struct Convert;

template <>
struct Convert<float> {
  static __device__ __forceinline__ float to_float(float x) { return x; }
  static __device__ __forceinline__ float from_float(float x) { return x; }
};

template <>
struct Convert<__half> {
  using Pair = __half2;
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ float2 pair_to_float(__half2 x) { return __half22float2(x); }
  static __device__ __forceinline__ __half2 pair_from_float(float a, float b) {
    return __floats2half2_rn(a, b);
  }
};

template <>
struct Convert<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
  static __device__ __forceinline__ float2 pair_to_float(__nv_bfloat162 x) {
    return __bfloat1622float2(x);
  }
  static __device__ __forceinline__ __nv_bfloat162 pair_from_float(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
};

// kVec consecutive elements moved as one memory access: a uint4 (16 bytes) on
// the vector path, the element itself on the one-element path.
template <typename T, int kVec>
struct Access {
  static_assert(kVec == 1 || kVec * sizeof(T) == 16, "an access is one element or 16 bytes");
  using Raw = std::conditional_t<kVec == 1, T, uint4>;
  // 16-bit types with an even count convert two lanes at a time.
  static constexpr bool kPaired = !std::is_same_v<T, float> && kVec % 2 == 0;

  static __device__ __forceinline__ Raw load(const T* p) {
    // Read-only path: the input is never written by this kernel.
    return __ldg(reinterpret_cast<const Raw*>(p));
  }
  static __device__ __forceinline__ void store(T* p, const Raw& r) {
    *reinterpret_cast<Raw*>(p) = r;
  }

  static __device__ __forceinline__ void unpack(const Raw& r, float (&f)[kVec]) {
    if constexpr (kPaired) {
      using Pair = typename Convert<T>::Pair;
      const Pair* e = reinterpret_cast<const Pair*>(&r);
#pragma unroll
      for (int j = 0; j < kVec / 2; ++j) {
        const float2 v = Convert<T>::pair_to_float(e[j]);
        f[2 * j] = v.x;
        f[2 * j + 1] = v.y;
      }
    } else {
      const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[j] = Convert<T>::to_float(e[j]);
    }
  }

  static __device__ __forceinline__ Raw pack(const float (&f)[kVec]) {
    Raw r;
    if constexpr (kPaired) {
      using Pair = typename Convert<T>::Pair;
      Pair* e = reinterpret_cast<Pair*>(&r);
#pragma unroll
      for (int j = 0; j < kVec / 2; ++j) e[j] = Convert<T>::pair_from_float(f[2 * j], f[2 * j + 1]);
    } else {
      T* e = reinterpret_cast<T*>(&r);
#pragma unroll
      for (int j = 0; j < kVec; ++j) e[j] = Convert<T>::from_float(f[j]);
    }
    return r;
  }
};

// Block layout: blockDim.x threads walk the columns of a row, blockDim.y rows
// share the block (so short rows still fill a block). The linear block index
// names (row group, column chunk), chunk fastest, so consecutive blocks stream
// consecutive memory. A thread touches columns col0 + k * step, k < kUnroll:
// for each k the warp's accesses are contiguous (coalesced).
template <typename T, int kVec, int kUnroll, Activation A>
__global__ void __launch_bounds__(kBlockThreads)
    act_and_mul_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t rows, int32_t d,
                       int32_t col_chunks, int64_t num_blocks) {
  using Acc = Access<T, kVec>;
  using Raw = typename Acc::Raw;
  const int32_t step = static_cast<int32_t>(blockDim.x) * kVec;
  const int32_t chunk = step * kUnroll;

  // Normally one iteration; the loop only matters if the grid had to be capped.
  for (int64_t b = blockIdx.x; b < num_blocks; b += gridDim.x) {
    const int64_t row_group = b / col_chunks;
    const int32_t c_chunk = static_cast<int32_t>(b - row_group * col_chunks);
    const int64_t row = row_group * blockDim.y + threadIdx.y;
    if (row >= rows) continue;  // no block-level sync below, so idle rows may leave

    const T* gate = in + row * 2 * d;
    const T* up = gate + d;
    T* o = out + row * d;
    const int32_t col0 = c_chunk * chunk + static_cast<int32_t>(threadIdx.x) * kVec;

    // Issue every load first so they overlap; compute only afterwards. On the
    // vector path d % kVec == 0, so c < d means the whole access is in the row.
    Raw g[kUnroll];
    Raw u[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int32_t c = col0 + k * step;
      if (c < d) {
        g[k] = Acc::load(gate + c);
        u[k] = Acc::load(up + c);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int32_t c = col0 + k * step;
      if (c < d) {
        float gf[kVec];
        float uf[kVec];
        Acc::unpack(g[k], gf);
        Acc::unpack(u[k], uf);
#pragma unroll
        for (int j = 0; j < kVec; ++j) gf[j] = fused_mlp::activate<A>(gf[j]) * uf[j];
        Acc::store(o + c, Acc::pack(gf));
      }
    }
  }
}

// The vector path's layout: the output seen as one flat array of 16-byte accesses, one
// per thread (its gate and up loads issued together), 128-thread blocks. Many small
// blocks keep ~2048 threads per SM resident, which hides DRAM latency as well as more
// loads per thread did and leaves no partly used row chunks: on the H200 this measured
// 165.9 us against 166.8 for 4 accesses per thread in 256-thread row chunks, 8192 x
// 2 x 14336 bf16, silu (benchmarks/micro/act_and_mul_variants.cu,
// benchmarks/results/act_and_mul_variants_h200.txt).
constexpr int kFlatThreads = 128;

// Division of 32-bit indices by a divisor fixed at launch, as a multiply-high and a
// shift (the round-up method of Granlund and Montgomery): exact for 0 <= n < 2^31 and
// 1 <= d < 2^31. The host works out (magic, shift) once; the kernel then needs two
// instructions per division instead of the ~20 of a division by a runtime value.
struct Divisor32 {
  uint32_t magic;
  uint32_t shift;
};

Divisor32 make_divisor32(uint32_t d) {
  uint32_t shift = 0;
  while ((uint64_t{1} << shift) < d) ++shift;  // ceil(log2(d))
  const uint64_t magic = ((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1;
  return {static_cast<uint32_t>(magic), shift};
}

__device__ __forceinline__ uint32_t divide(uint32_t n, Divisor32 d) {
  return (__umulhi(n, d.magic) + n) >> d.shift;  // n < 2^31: the sum cannot wrap
}

// Index: int64_t in general; uint32_t when the input has fewer than 2^31 elements (every
// offset below then fits), with the row found through a Divisor32 as Inductor's kernels
// index in 32 bits. Measured on the H200: see benchmarks/NOTES.md, session 4.
template <typename T, Activation A, typename Index>
__global__ void __launch_bounds__(kFlatThreads)
    act_and_mul_flat_kernel(T* __restrict__ out, const T* __restrict__ in, Index accesses,
                            Index per_row, Divisor32 per_row_div) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  using Acc = Access<T, kVec>;
  // One access per thread: the grid covers the output (the launch checks it fits).
  const Index i = static_cast<Index>(blockIdx.x) * kFlatThreads + threadIdx.x;
  if (i >= accesses) return;
  Index row;
  if constexpr (std::is_same_v<Index, uint32_t>) {
    row = divide(i, per_row_div);
  } else {
    row = i / per_row;
  }
  const Index col = i - row * per_row;
  const T* gate = in + (row * 2 * per_row + col) * kVec;
  const auto g = Acc::load(gate);
  const auto u = Acc::load(gate + per_row * kVec);
  float gf[kVec];
  float uf[kVec];
  Acc::unpack(g, gf);
  Acc::unpack(u, uf);
#pragma unroll
  for (int j = 0; j < kVec; ++j) gf[j] = fused_mlp::activate<A>(gf[j]) * uf[j];
  Acc::store(out + i * kVec, Acc::pack(gf));
}

// Which layout the vector path takes. One access per thread leaves each thread's
// activation latency exposed: fine for exp/max-based activations, not for the tanh and
// erf ones, which keep 4 accesses per thread in row chunks. Measured on the H200
// (8192 x 2 x 14336 bf16; benchmarks/results/act_and_mul_h200_flat_all.json against
// act_and_mul_h200_session2.json): silu 166.9 us flat vs 168.5 in row chunks; gelu_tanh
// 176.2 flat vs 169.2 in row chunks.
template <Activation A>
constexpr bool kFlatLayout = !(A == Activation::kGeluTanh || A == Activation::kGelu);

// SM count of the current device (the caller holds a device guard), looked up
// once per device: launches stay free of extra runtime calls, also while a CUDA
// graph is being captured.
int64_t multiprocessor_count() {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> cached{};  // 0: not looked up yet
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kMaxDevices) {
    if (const int n = cached[device].load(std::memory_order_relaxed)) return n;
  }
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (device < kMaxDevices) cached[device].store(count, std::memory_order_relaxed);
  return count;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

template <typename T, int kVec, int kUnroll, Activation A>
void launch(T* out, const T* in, int64_t rows, int64_t d, cudaStream_t stream) {
  const int64_t accesses = d / kVec;  // per row half; exact on the vector path

  // Just enough column threads for one row (a power of two up to a full block),
  // and as many rows per block as fit, but not more rows than exist.
  int64_t tx = std::min<int64_t>(kBlockThreads, pow2_at_least(ceil_div(accesses, kUnroll)));
  const int64_t ty = std::min<int64_t>(kBlockThreads / tx, pow2_at_least(rows));
  const int64_t row_groups = ceil_div(rows, ty);
  int64_t chunks = ceil_div(accesses, tx * kUnroll);
  // With few rows (decode-sized inputs) a handful of blocks would carry the whole
  // job: cut the rows into narrower chunks, down to one warp wide, so that more
  // SMs take part. Rows per block stay as they are, so the block count grows.
  const int64_t sms = multiprocessor_count();
  while (tx > 32 && row_groups * chunks < sms) {
    tx /= 2;
    chunks = ceil_div(accesses, tx * kUnroll);
  }
  const int64_t blocks = row_groups * chunks;

  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  const int64_t grid = std::min<int64_t>(blocks, std::numeric_limits<int32_t>::max());
  act_and_mul_kernel<T, kVec, kUnroll, A><<<static_cast<unsigned>(grid), block, 0, stream>>>(
      out, in, rows, static_cast<int32_t>(d), static_cast<int32_t>(chunks), blocks);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, Activation A>
void launch_for_layout(T* out, const T* in, int64_t rows, int64_t d, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool aligned = d % kVec == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (aligned && kFlatLayout<A>) {
    const int64_t accesses = rows * (d / kVec);
    const int64_t grid = ceil_div(accesses, kFlatThreads);
    // 2^31 - 1 blocks of 128 accesses: 4 TiB of output, more than any GPU holds.
    FUSED_MLP_CHECK(grid <= std::numeric_limits<int32_t>::max(), "fused_mlp: act_and_mul: out has ", accesses * kVec,
                    " elements, more than the kernel supports (", int64_t{std::numeric_limits<int32_t>::max()} * kFlatThreads * kVec, ")");
    const int64_t per_row = d / kVec;
    if (rows * 2 * d < (int64_t{1} << 31)) {  // every element offset of the input fits in 31 bits
      act_and_mul_flat_kernel<T, A, uint32_t><<<static_cast<unsigned>(grid), kFlatThreads, 0, stream>>>(
          out, in, static_cast<uint32_t>(accesses), static_cast<uint32_t>(per_row),
          make_divisor32(static_cast<uint32_t>(per_row)));
    } else {
      act_and_mul_flat_kernel<T, A, int64_t><<<static_cast<unsigned>(grid), kFlatThreads, 0, stream>>>(
          out, in, accesses, per_row, Divisor32{});
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else if (aligned) {
    launch<T, kVec, kVectorUnroll, A>(out, in, rows, d, stream);
  } else {
    // Row starts fall between 16-byte boundaries: move one element at a time.
    launch<T, 1, kScalarUnroll, A>(out, in, rows, d, stream);
  }
}

template <typename T>
void dispatch_activation(torch::Tensor& out, const torch::Tensor& input, int64_t activation,
                         int64_t rows, int64_t d, cudaStream_t stream) {
  // at::Half / at::BFloat16 share the bit layout of the CUDA types.
  T* o = reinterpret_cast<T*>(out.mutable_data_ptr());
  const T* x = reinterpret_cast<const T*>(input.const_data_ptr());
  FUSED_MLP_DISPATCH_ACTIVATION(activation,
                                [&] { launch_for_layout<T, kAct>(o, x, rows, d, stream); });
}

}  // namespace

void act_and_mul_cuda(torch::Tensor& out, const torch::Tensor& input, int64_t activation) {
  const int64_t d = out.size(-1);
  const int64_t rows = out.numel() / d;
  // Column offsets are 32-bit in the kernel; the headroom covers the last chunk's overshoot.
  FUSED_MLP_CHECK(d <= (int64_t{1} << 30), "fused_mlp: act_and_mul: d = ", d,
              " is larger than the CUDA kernel supports (2^30)");
  FUSED_MLP_CHECK(input.is_cuda(), "fused_mlp: act_and_mul_cuda: input must be a CUDA tensor");

  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  switch (input.scalar_type()) {
    case at::kFloat:
      dispatch_activation<float>(out, input, activation, rows, d, stream);
      break;
    case at::kHalf:
      dispatch_activation<__half>(out, input, activation, rows, d, stream);
      break;
    case at::kBFloat16:
      dispatch_activation<__nv_bfloat16>(out, input, activation, rows, d, stream);
      break;
    default:
      FUSED_MLP_CHECK(false, "fused_mlp: act_and_mul_cuda: unsupported dtype ", input.scalar_type());
  }
}
