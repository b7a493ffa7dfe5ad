// CPU activation-and-multiply: out[r, i] = act(x[r, i]) * x[r, d + i].
//
// Rows are split across threads; inside a row, at::vec::Vectorized loads
// bf16/fp16/fp32, converts to fp32 vectors, applies the activation and rounds
// once on the store. The activation itself is evaluated lane by lane in fp32
// with the same formulas as the CUDA kernel (kernel_src/common/activations.h),
// so both backends compute the same function.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "activations.h"
#include "torch_binding.h"

namespace {

using fused_mlp::Activation;
using at::vec::Vectorized;

template <Activation A>
inline Vectorized<float> activate_vec(const Vectorized<float>& v) {
  // map() applies the scalar fp32 activation to every lane.
  return v.map([](float x) { return fused_mlp::activate<A>(x); });
}

template <typename T, Activation A>
void act_and_mul_rows(T* out, const T* x, int64_t row_begin, int64_t row_end, int64_t d) {
  using fVec = Vectorized<float>;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const T* gate = x + r * 2 * d;
    const T* up = gate + d;
    T* o = out + r * d;
    int64_t i = 0;
    if constexpr (std::is_same_v<T, float>) {
      for (; i + fVec::size() <= d; i += fVec::size()) {
        fVec g = fVec::loadu(gate + i);
        fVec u = fVec::loadu(up + i);
        (activate_vec<A>(g) * u).store(o + i);
      }
    } else {
      // bf16/fp16: one reduced-precision vector holds two fp32 vectors.
      using rVec = Vectorized<T>;
      for (; i + rVec::size() <= d; i += rVec::size()) {
        auto [g0, g1] = at::vec::convert_to_float<T>(rVec::loadu(gate + i));
        auto [u0, u1] = at::vec::convert_to_float<T>(rVec::loadu(up + i));
        at::vec::convert_from_float<T>(activate_vec<A>(g0) * u0, activate_vec<A>(g1) * u1)
            .store(o + i);
      }
    }
    for (; i < d; ++i) {
      o[i] = static_cast<T>(fused_mlp::activate<A>(static_cast<float>(gate[i])) *
                            static_cast<float>(up[i]));
    }
  }
}

// Splits rows over up to at::get_num_threads() threads. The extension is built
// without OpenMP (it must not bring its own runtime next to torch's), so it
// starts plain threads; small inputs stay on the calling thread.
template <typename F>
void parallel_rows(int64_t rows, int64_t row_elems, const F& fn) {
  constexpr int64_t kMinElemsPerThread = 1 << 16;
  const int64_t total = rows * row_elems;
  int64_t threads = std::min<int64_t>(at::get_num_threads(), rows);
  threads = std::min<int64_t>(threads, std::max<int64_t>(1, total / kMinElemsPerThread));
  if (threads <= 1) {
    fn(0, rows);
    return;
  }
  const int64_t chunk = (rows + threads - 1) / threads;
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(rows, b + chunk);
    if (b < e) pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(0, std::min(rows, chunk));
  for (auto& th : pool) th.join();
}

}  // namespace

void act_and_mul_cpu(torch::Tensor& out, const torch::Tensor& input, int64_t activation) {
  const int64_t d = out.size(-1);
  const int64_t rows = out.numel() / d;
  auto run = [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    FUSED_MLP_DISPATCH_ACTIVATION(activation, [&] {
      parallel_rows(rows, 2 * d, [&](int64_t b, int64_t e) {
        act_and_mul_rows<scalar_t, kAct>(o, x, b, e, d);
      });
    });
  };
  switch (input.scalar_type()) {
    case at::kFloat: run(float{}); break;
    case at::kHalf: run(at::Half{}); break;
    case at::kBFloat16: run(at::BFloat16{}); break;
    default: FUSED_MLP_CHECK(false, "fused_mlp: act_and_mul_cpu: unsupported dtype ", input.scalar_type());
  }
}
