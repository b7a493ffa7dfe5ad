// Layout experiments for the CUDA silu_and_mul on the H200 (issue 2): which way of
// cutting an 8192 x (2 x 14336) bf16 stream into blocks and threads moves memory
// fastest. A standalone program (no torch), so one nvcc call builds it on the device:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/amv benchmarks/micro/act_and_mul_variants.cu && /tmp/amv
//
// Each variant is checked against a host fp32 computation on sampled elements, then
// timed: 60 runs of [256 MiB memset to flush L2; event; kernel; event], median. The
// same is done for cudaMemcpyAsync of a 1 GiB buffer (the copy ceiling the package's
// benchmark also uses). Output: one line per variant with us, GB/s, fraction of copy.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

using bf16 = __nv_bfloat16;
constexpr int kVec = 8;  // bf16 per 16-byte access

__device__ __forceinline__ float silu(float x) { return x * __fdividef(1.0f, 1.0f + __expf(-x)); }

template <bool kStreaming>
__device__ __forceinline__ uint4 load16(const bf16* p) {
  if constexpr (kStreaming) return __ldcs(reinterpret_cast<const uint4*>(p));
  return __ldg(reinterpret_cast<const uint4*>(p));
}
template <bool kStreaming>
__device__ __forceinline__ void store16(bf16* p, uint4 v) {
  if constexpr (kStreaming) {
    __stcs(reinterpret_cast<uint4*>(p), v);
  } else {
    *reinterpret_cast<uint4*>(p) = v;
  }
}

__device__ __forceinline__ uint4 combine(uint4 g, uint4 u) {
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
  const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&u);
  uint4 r;
  __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 a = __bfloat1622float2(g2[j]);
    const float2 b = __bfloat1622float2(u2[j]);
    r2[j] = __floats2bfloat162_rn(silu(a.x) * b.x, silu(a.y) * b.y);
  }
  return r;
}

// The shipped layout: a block owns `unroll` strided accesses per thread of one row
// chunk (blockDim.x threads across the row), chunk index fastest.
template <int kUnroll, bool kStreaming>
__global__ void row_chunk(bf16* out, const bf16* in, int64_t rows, int32_t d, int32_t chunks) {
  const int64_t b = blockIdx.x;
  const int64_t row = b / chunks;
  const int32_t chunk = static_cast<int32_t>(b - row * chunks);
  if (row >= rows) return;
  const int32_t step = blockDim.x * kVec;
  const int32_t col0 = chunk * step * kUnroll + threadIdx.x * kVec;
  const bf16* gate = in + row * 2 * d;
  const bf16* up = gate + d;
  uint4 g[kUnroll], u[kUnroll];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int32_t c = col0 + k * step;
    if (c < d) {
      g[k] = load16<kStreaming>(gate + c);
      u[k] = load16<kStreaming>(up + c);
    }
  }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int32_t c = col0 + k * step;
    if (c < d) store16<kStreaming>(out + row * d + c, combine(g[k], u[k]));
  }
}

// Inductor's layout: the output flattened, each thread `unroll` 16-byte accesses spread
// by blockDim (coalesced), one division per access. `base` is the thread's first access.
template <int kUnroll, bool kStreaming>
__device__ __forceinline__ void flat_step(bf16* out, const bf16* in, int64_t base, int64_t n_vec,
                                          int32_t vec_per_row) {
  uint4 g[kUnroll], u[kUnroll];
  int64_t o[kUnroll];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
    o[k] = -1;
    if (i < n_vec) {
      const int64_t row = i / vec_per_row;
      const int64_t col = i - row * vec_per_row;
      const bf16* gate = in + (row * 2 * vec_per_row + col) * kVec;
      g[k] = load16<kStreaming>(gate);
      u[k] = load16<kStreaming>(gate + static_cast<int64_t>(vec_per_row) * kVec);
      o[k] = i * kVec;
    }
  }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k)
    if (o[k] >= 0) store16<kStreaming>(out + o[k], combine(g[k], u[k]));
}

template <int kUnroll, bool kStreaming>
__global__ void flat(bf16* out, const bf16* in, int64_t n_vec, int32_t vec_per_row) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
  flat_step<kUnroll, kStreaming>(out, in, base, n_vec, vec_per_row);
}

// Persistent grid-stride version of the flat layout: a fixed grid walks the whole output.
template <int kUnroll, bool kStreaming>
__global__ void grid_stride(bf16* out, const bf16* in, int64_t n_vec, int32_t vec_per_row) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; base < n_vec;
       base += stride)
    flat_step<kUnroll, kStreaming>(out, in, base, n_vec, vec_per_row);
}

struct Timer {
  void* flush = nullptr;
  size_t flush_bytes = size_t{256} << 20;
  cudaEvent_t a, b;
  Timer() {
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  template <typename F>
  float median_us(F&& f, int reps = 60) {
    std::vector<float> t;
    for (int r = 0; r < reps + 5; ++r) {
      CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
      CK(cudaEventRecord(a));
      f();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      if (r >= 5) t.push_back(ms * 1e3f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

int main() {
  const int64_t rows = 8192, d = 14336;
  const int64_t n_in = rows * 2 * d, n_out = rows * d;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<bf16> h_in(n_in);
  uint32_t s = 12345;
  for (int64_t i = 0; i < n_in; ++i) {
    s = s * 1664525u + 1013904223u;
    h_in[i] = __float2bfloat16((static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 8.0f);
  }
  bf16 *in, *out;
  CK(cudaMalloc(&in, n_in * sizeof(bf16)));
  CK(cudaMalloc(&out, n_out * sizeof(bf16)));
  CK(cudaMemcpy(in, h_in.data(), n_in * sizeof(bf16), cudaMemcpyHostToDevice));
  Timer timer;

  const size_t copy_bytes = size_t{1} << 30;
  void *src, *dst;
  CK(cudaMalloc(&src, copy_bytes));
  CK(cudaMalloc(&dst, copy_bytes));
  const float copy_us = timer.median_us([&] { CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbps = 2.0 * copy_bytes / (copy_us * 1e3);
  const double bytes = 3.0 * n_out * sizeof(bf16);
  std::printf("copy 1 GiB: %.1f us, %.1f GB/s (read + write)\n", copy_us, copy_gbps);
  std::printf("SMs %d; act_and_mul %lld x %lld bf16, %.1f MB moved\n", sms, (long long)rows, (long long)d, bytes / 1e6);

  std::vector<bf16> h_out(n_out);
  auto run = [&](const char* name, auto&& launch) {
    CK(cudaMemset(out, 0xff, n_out * sizeof(bf16)));  // poison
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h_out.data(), out, n_out * sizeof(bf16), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int64_t i = 0; i < n_out; i += 997) {
      const int64_t r = i / d, c = i % d;
      const float g = __bfloat162float(h_in[r * 2 * d + c]), u = __bfloat162float(h_in[r * 2 * d + d + c]);
      const float ref = g / (1.0f + std::exp(-g)) * u;
      const float got = __bfloat162float(h_out[i]);
      worst = std::max(worst, static_cast<double>(std::fabs(got - ref) / (std::fabs(ref) + 1e-2f)));
    }
    if (!(worst < 1e-2)) {
      std::printf("%-34s WRONG (worst rel. error %.3g)\n", name, worst);
      return;
    }
    const float us = timer.median_us(launch);
    const double gbps = bytes / (us * 1e3);
    std::printf("%-34s %8.1f us %8.1f GB/s %6.2f%% of copy\n", name, us, gbps, 100.0 * gbps / copy_gbps);
  };

  const int32_t vpr = static_cast<int32_t>(d / kVec);
  const int64_t n_vec = rows * vpr;
  auto rc = [&](auto kernel, int threads, int unroll) {
    const int32_t chunks = static_cast<int32_t>((vpr + threads * unroll - 1) / (threads * unroll));
    return [=] { kernel<<<static_cast<unsigned>(rows * chunks), threads>>>(out, in, rows, static_cast<int32_t>(d), chunks); };
  };
  auto fl = [&](auto kernel, int threads, int unroll) {
    const int64_t blocks = (n_vec + int64_t{threads} * unroll - 1) / (int64_t{threads} * unroll);
    return [=] { kernel<<<static_cast<unsigned>(blocks), threads>>>(out, in, n_vec, vpr); };
  };
  auto gs = [&](auto kernel, int threads, int blocks_per_sm) {
    return [=] { kernel<<<static_cast<unsigned>(sms * blocks_per_sm), threads>>>(out, in, n_vec, vpr); };
  };

  for (int pass = 0; pass < 2; ++pass) {  // twice: the spread between passes is the noise
    std::printf("-- pass %d\n", pass);
    run("row_chunk 256t u4 (shipped)", rc(row_chunk<4, false>, 256, 4));
    run("row_chunk 256t u4 streaming", rc(row_chunk<4, true>, 256, 4));
    run("row_chunk 256t u2", rc(row_chunk<2, false>, 256, 2));
    run("row_chunk 128t u4", rc(row_chunk<4, false>, 128, 4));
    run("row_chunk 448t u4 (exact row)", rc(row_chunk<4, false>, 448, 4));
    run("row_chunk 224t u8 (exact row)", rc(row_chunk<8, false>, 224, 8));
    run("flat 128t u1 (inductor-like)", fl(flat<1, false>, 128, 1));
    run("flat 256t u2", fl(flat<2, false>, 256, 2));
    run("flat 256t u4", fl(flat<4, false>, 256, 4));
    run("flat 256t u2 streaming", fl(flat<2, true>, 256, 2));
    run("grid_stride 256t u2 x8/SM", gs(grid_stride<2, false>, 256, 8));
    run("grid_stride 256t u4 x4/SM", gs(grid_stride<4, false>, 256, 4));
    run("grid_stride 512t u2 x4/SM streaming", gs(grid_stride<2, true>, 512, 4));
  }
  return 0;
}
