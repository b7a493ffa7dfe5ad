// Activation functions shared by the CUDA and CPU kernels of fused-mlp.
//
// The integer ids are part of the op schemas (the `activation` argument of the
// compiled ops) and must stay in step with `ACTIVATION_IDS` in
// torch-ext/fused_mlp/activations.py. Every function works on fp32: the kernels
// load bf16/fp16/fp32, compute here in fp32 and round once on the store.
#pragma once

#include <cmath>

// Standalone probes (benchmarks/micro) build without torch; FUSED_MLP_CHECK and with it
// FUSED_MLP_DISPATCH_ACTIVATION need check.h.
#ifndef FUSED_MLP_NO_TORCH
#include "check.h"
#endif

#if defined(__CUDACC__)
#define FUSED_MLP_HD __host__ __device__ __forceinline__
#else
#define FUSED_MLP_HD inline
#endif

namespace fused_mlp {

enum class Activation : int {
  kIdentity = 0,
  kSilu = 1,
  kGeluTanh = 2,  // also transformers' gelu_new / gelu_fast / gelu_pytorch_tanh
  kGelu = 3,      // exact, erf based
  kRelu = 4,
  kRelu2 = 5,     // squared ReLU
  kQuickGelu = 6, // x * sigmoid(1.702 x)
};

constexpr int kNumActivations = 7;

FUSED_MLP_HD float sigmoidf_(float x) {
#if defined(__CUDA_ARCH__)
  // Hardware exp and approximate division: a few ulp in fp32, far below the bf16/fp16
  // rounding of the outputs, and it keeps the memory-bound kernels at copy speed (with the
  // IEEE division silu_and_mul took 171.0 instead of 168.1 us on the H200, 8192 x 2 x 14336
  // bf16: benchmarks/NOTES.md, "act-and-mul (CUDA), measured"). For
  // x << 0, 1 + exp(-x) overflows to inf and __fdividef returns 0, the right limit.
  return __fdividef(1.0f, 1.0f + __expf(-x));
#else
  return 1.0f / (1.0f + expf(-x));
#endif
}

FUSED_MLP_HD float apply_activation(Activation act, float x) {
  switch (act) {
    case Activation::kIdentity:
      return x;
    case Activation::kSilu:
      return x * sigmoidf_(x);
    case Activation::kGeluTanh: {
      // sqrt(2/pi) = 0.7978845608...
      const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + tanhf(inner));
    }
    case Activation::kGelu:
      // 1/sqrt(2) = 0.7071067811...
      return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case Activation::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Activation::kRelu2: {
      const float r = x > 0.0f ? x : 0.0f;
      return r * r;
    }
    case Activation::kQuickGelu:
      return x * sigmoidf_(1.702f * x);
  }
  return x;
}

// Compile-time dispatch: kernels are templated on the activation so the switch
// above folds away inside the hot loop.
template <Activation A>
FUSED_MLP_HD float activate(float x) {
  return apply_activation(A, x);
}

}  // namespace fused_mlp

// Expands BODY once per activation with `kAct` bound to the compile-time value.
#define FUSED_MLP_DISPATCH_ACTIVATION(ACT_ID, ...)                                  \
  [&] {                                                                             \
    switch (static_cast<::fused_mlp::Activation>(ACT_ID)) {                         \
      case ::fused_mlp::Activation::kIdentity: {                                    \
        constexpr auto kAct = ::fused_mlp::Activation::kIdentity; return __VA_ARGS__(); } \
      case ::fused_mlp::Activation::kSilu: {                                        \
        constexpr auto kAct = ::fused_mlp::Activation::kSilu; return __VA_ARGS__(); } \
      case ::fused_mlp::Activation::kGeluTanh: {                                    \
        constexpr auto kAct = ::fused_mlp::Activation::kGeluTanh; return __VA_ARGS__(); } \
      case ::fused_mlp::Activation::kGelu: {                                        \
        constexpr auto kAct = ::fused_mlp::Activation::kGelu; return __VA_ARGS__(); } \
      case ::fused_mlp::Activation::kRelu: {                                        \
        constexpr auto kAct = ::fused_mlp::Activation::kRelu; return __VA_ARGS__(); } \
      case ::fused_mlp::Activation::kRelu2: {                                       \
        constexpr auto kAct = ::fused_mlp::Activation::kRelu2; return __VA_ARGS__(); } \
      case ::fused_mlp::Activation::kQuickGelu: {                                   \
        constexpr auto kAct = ::fused_mlp::Activation::kQuickGelu; return __VA_ARGS__(); } \
    }                                                                               \
    FUSED_MLP_CHECK(false, "fused_mlp: unknown activation id ", ACT_ID);               \
  }()
