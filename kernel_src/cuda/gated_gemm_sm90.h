// Host entry points of the warp-specialized sm_90a GEMMs (gated_gemm_sm90.cu), for the other
// host code of the sm_90a kernel table (train_sm90.cu's autograd nodes call them directly,
// without the dispatcher). Their contracts are written above each definition.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

namespace fused_mlp {
namespace sm90 {

void gated_gemm_sm90(at::Tensor& out, const at::Tensor& x, const at::Tensor& gate_weight, const at::Tensor& up_weight,
                     const c10::optional<at::Tensor>& gate_bias, const c10::optional<at::Tensor>& up_bias,
                     const c10::optional<at::Tensor>& pre, int64_t activation, int64_t block_n);

void dact_gemm_sm90(at::Tensor& out, const at::Tensor& dy, const at::Tensor& weight, const at::Tensor& pre,
                    int64_t activation, bool gated, bool weight_kn);

void linear_act_sm90(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& pre,
                     int64_t activation, bool weight_kn);

void down_gemm_sm90(at::Tensor& out, const at::Tensor& h, const at::Tensor& weight,
                    const c10::optional<at::Tensor>& bias, bool pdl);

}  // namespace sm90
}  // namespace fused_mlp
