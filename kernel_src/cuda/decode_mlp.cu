// Placeholder until the decode kernels land (issue 5); the schemas are in torch_binding.cpp.
#include <torch/library.h>
#include "torch_binding.h"

void decode_gate_up_cuda(torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                         const torch::Tensor&, const c10::optional<torch::Tensor>&,
                         const c10::optional<torch::Tensor>&, int64_t) {
  TORCH_CHECK(false, "fused_mlp: decode_gate_up is not implemented yet");
}
void decode_linear_cuda(torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                        const c10::optional<torch::Tensor>&, int64_t) {
  TORCH_CHECK(false, "fused_mlp: decode_linear is not implemented yet");
}
