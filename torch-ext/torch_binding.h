#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include "check.h"

namespace torch {
using at::Tensor;
}

// Argument checks shared by every backend (torch_binding.cpp).
void check_act_and_mul_args(const torch::Tensor& out, const torch::Tensor& input,
                            int64_t activation);

// out[..., d] = act(input[..., :d]) * input[..., d:], activation ids from
// kernel_src/common/activations.h. Arguments are checked before these run.
#if defined(CUDA_KERNEL)
void act_and_mul_cuda(torch::Tensor& out, const torch::Tensor& input, int64_t activation);

// Small-M ("decode") projections that stream each weight row once for all rows
// of x (kernel_src/cuda/decode_mlp.cu).
//   out[m, n] = act(x[m] . gate_weight[n] + gate_bias[n]) * (x[m] . up_weight[n] + up_bias[n])
void decode_gate_up_cuda(torch::Tensor& out, const torch::Tensor& x,
                         const torch::Tensor& gate_weight, const torch::Tensor& up_weight,
                         const c10::optional<torch::Tensor>& gate_bias,
                         const c10::optional<torch::Tensor>& up_bias, int64_t activation);
//   out[m, n] = act(x[m] . weight[n] + bias[n])
void decode_linear_cuda(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& weight,
                        const c10::optional<torch::Tensor>& bias, int64_t activation);
#endif

#if defined(CPU_KERNEL)
void act_and_mul_cpu(torch::Tensor& out, const torch::Tensor& input, int64_t activation);
#endif
