// Op schemas of fused-mlp and their per-backend implementations.
//
// Each compiled variant registers its ops under its own namespace
// (TORCH_EXTENSION_NAME, e.g. _fused_mlp_cuda_1a2b3c4), so two builds of the
// package can live in one process. The Python face is torch-ext/fused_mlp.
#include <torch/library.h>

#include "activations.h"
#include "registration.h"
#include "torch_binding.h"

void check_act_and_mul_args(const torch::Tensor& out, const torch::Tensor& input,
                            int64_t activation) {
  FUSED_MLP_CHECK(activation >= 0 && activation < fused_mlp::kNumActivations,
              "fused_mlp: activation id ", activation, " is not one of 0..",
              fused_mlp::kNumActivations - 1);
  FUSED_MLP_CHECK(input.dim() >= 1, "fused_mlp: input must have at least one dimension, got a scalar");
  FUSED_MLP_CHECK(out.device() == input.device(), "fused_mlp: out is on ", out.device(),
              " but input is on ", input.device(), "; both must be on the same device");
  FUSED_MLP_CHECK(out.scalar_type() == input.scalar_type(), "fused_mlp: out has dtype ",
              out.scalar_type(), " but input has dtype ", input.scalar_type(),
              "; they must match");
  const auto st = input.scalar_type();
  FUSED_MLP_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
              "fused_mlp: input dtype ", st, " is not supported (float32, float16, bfloat16)");
  const int64_t two_d = input.size(-1);
  FUSED_MLP_CHECK(two_d % 2 == 0, "fused_mlp: the last dimension of input must be even (gate and up "
              "halves), got ", two_d);
  FUSED_MLP_CHECK(out.dim() == input.dim(), "fused_mlp: out has ", out.dim(),
              " dimensions but input has ", input.dim());
  for (int64_t i = 0; i + 1 < input.dim(); ++i) {
    FUSED_MLP_CHECK(out.size(i) == input.size(i), "fused_mlp: out.shape ", out.sizes(),
                " does not match input.shape ", input.sizes(), " in dimension ", i);
  }
  FUSED_MLP_CHECK(out.size(-1) * 2 == two_d, "fused_mlp: the last dimension of out must be half of "
              "input's (", two_d / 2, "), got ", out.size(-1));
  FUSED_MLP_CHECK(input.is_contiguous(), "fused_mlp: input must be contiguous (call .contiguous())");
  FUSED_MLP_CHECK(out.is_contiguous(), "fused_mlp: out must be contiguous");
}

namespace {

void act_and_mul(torch::Tensor& out, const torch::Tensor& input, int64_t activation) {
  check_act_and_mul_args(out, input, activation);
  if (input.numel() == 0) return;
#if defined(CUDA_KERNEL)
  act_and_mul_cuda(out, input, activation);
#elif defined(CPU_KERNEL)
  act_and_mul_cpu(out, input, activation);
#endif
}

template <fused_mlp::Activation A>
void named_act_and_mul(torch::Tensor& out, const torch::Tensor& input) {
  act_and_mul(out, input, static_cast<int64_t>(A));
}

}  // namespace

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // Activation-and-multiply: out = act(input[..., :d]) * input[..., d:].
  // The named forms follow kernels-community/activation's `op(out, input)`.
  ops.def("act_and_mul(Tensor! out, Tensor input, int activation) -> ()");
  ops.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  ops.def("gelu_tanh_and_mul(Tensor! out, Tensor input) -> ()");
  ops.def("gelu_and_mul(Tensor! out, Tensor input) -> ()");
  ops.def("relu_and_mul(Tensor! out, Tensor input) -> ()");
  ops.def("relu2_and_mul(Tensor! out, Tensor input) -> ()");
  ops.def("quick_gelu_and_mul(Tensor! out, Tensor input) -> ()");

#if defined(CUDA_KERNEL)
  constexpr auto kDev = c10::kCUDA;
#elif defined(CPU_KERNEL)
  constexpr auto kDev = c10::kCPU;
#endif
  using fused_mlp::Activation;
  ops.impl("act_and_mul", kDev, &act_and_mul);
  ops.impl("silu_and_mul", kDev, &named_act_and_mul<Activation::kSilu>);
  ops.impl("gelu_tanh_and_mul", kDev, &named_act_and_mul<Activation::kGeluTanh>);
  ops.impl("gelu_and_mul", kDev, &named_act_and_mul<Activation::kGelu>);
  ops.impl("relu_and_mul", kDev, &named_act_and_mul<Activation::kRelu>);
  ops.impl("relu2_and_mul", kDev, &named_act_and_mul<Activation::kRelu2>);
  ops.impl("quick_gelu_and_mul", kDev, &named_act_and_mul<Activation::kQuickGelu>);

#if defined(CUDA_KERNEL)
  // Few-token MLP path (issue: decode). Checks live in decode_mlp.cu.
  ops.def(
      "decode_gate_up(Tensor! out, Tensor x, Tensor gate_weight, Tensor up_weight, "
      "Tensor? gate_bias, Tensor? up_bias, int activation) -> ()");
  ops.impl("decode_gate_up", c10::kCUDA, &decode_gate_up_cuda);
  ops.def(
      "decode_linear(Tensor! out, Tensor x, Tensor weight, Tensor? bias, int activation) -> ()");
  ops.impl("decode_linear", c10::kCUDA, &decode_linear_cuda);
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
