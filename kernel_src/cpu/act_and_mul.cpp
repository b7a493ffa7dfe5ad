// CPU activation-and-multiply: out[r, i] = act(x[r, i]) * x[r, d + i].
//
// As in the CUDA kernel, the activation and the product are computed in fp32 and rounded
// once into out. The arithmetic is ATen's own CPU kernels (on fp32 scratch for bf16 / fp16
// outputs, in out itself for fp32): they choose the vector ISA at run time (AVX2 or AVX-512
// where the CPU has them, with vectorized exp / tanh / erf). This extension is compiled for
// the baseline x86-64 ISA, where at::vec's transcendental functions are scalar loops: the
// per-lane form this file had before (the activations.h formula applied lane by lane) ran
// 7-10x slower than eager PyTorch's act(g) * u on the same rows (benchmarks/NOTES.md,
// session 56). The formulas are the same ones (activations.h):
// ATen's silu, tanh- and erf-GELU, relu and sigmoid, which differ from the scalar libm
// versions by fp32 ulps, below the rounding to bf16 / fp16.
//
// Rows go through in chunks of about kChunkElems elements, so the scratch stays small and
// in cache; each ATen call spreads its chunk over torch's intra-op threads.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <algorithm>

#include "activations.h"
#include "torch_binding.h"

namespace {

using fused_mlp::Activation;

constexpr int64_t kChunkElems = int64_t{1} << 18;  // 1 MB of fp32 per scratch buffer

// g = act(g), in place, fp32.
void activate_(at::Tensor& g, Activation act) {
  switch (act) {
    case Activation::kIdentity:
      return;
    case Activation::kSilu:
      at::silu_(g);
      return;
    case Activation::kGeluTanh:
      at::gelu_(g, "tanh");
      return;
    case Activation::kGelu:
      at::gelu_(g, "none");
      return;
    case Activation::kRelu:
      at::relu_(g);
      return;
    case Activation::kRelu2:
      at::relu_(g);
      g.mul_(g);
      return;
    case Activation::kQuickGelu: {
      at::Tensor s = g.mul(1.702);
      s.sigmoid_();
      g.mul_(s);
      return;
    }
  }
  FUSED_MLP_CHECK(false, "fused_mlp: act_and_mul_cpu: unknown activation id ", static_cast<int>(act));
}

// dst = act(src) where both are fp32: one pass for the activations ATen has an out= form of.
void activate_into(at::Tensor& dst, const at::Tensor& src, Activation act) {
  switch (act) {
    case Activation::kSilu:
      at::silu_out(dst, src);
      return;
    case Activation::kGeluTanh:
      at::gelu_out(dst, src, "tanh");
      return;
    case Activation::kGelu:
      at::gelu_out(dst, src, "none");
      return;
    default:
      dst.copy_(src);
      activate_(dst, act);
  }
}

}  // namespace

// The arguments (activation id, dtypes, shapes, contiguity, no empty input) were checked by
// check_act_and_mul_args before this runs (torch_binding.cpp).
void act_and_mul_cpu(torch::Tensor& out, const torch::Tensor& input, int64_t activation) {
  const int64_t d = out.size(-1);
  const int64_t rows = out.numel() / d;
  const auto act = static_cast<Activation>(activation);
  // [rows, 2d] and [rows, d] views of the contiguous tensors.
  const at::Tensor x = input.view({rows, 2 * d});
  at::Tensor o = out.view({rows, d});
  const int64_t chunk = std::max<int64_t>(1, kChunkElems / d);
  // fp32 output, sharing no memory with input (the usual case): the activation and the product
  // run in out itself. Otherwise in an fp32 scratch chunk (the gate half copied there exactly),
  // rounded once into out at the end: bf16 / fp16 outputs, and an out that is a one-row
  // input's own gate or up half (writing the gate into it first could clobber the up half).
  // The up half is read where it lies. (Writing the product straight into a bf16 out with
  // at::mul_out measured ~12% slower than the product in scratch and a copy.)
  const bool overlaps = at::get_overlap_status(out, input) != at::MemOverlapStatus::No;
  const bool in_place = out.scalar_type() == at::kFloat && !overlaps;
  at::Tensor g_buf;
  if (!in_place) g_buf = at::empty({std::min(rows, chunk), d}, input.options().dtype(at::kFloat));
  for (int64_t r = 0; r < rows; r += chunk) {
    const int64_t n = std::min(chunk, rows - r);
    const at::Tensor xs = x.narrow(0, r, n);
    at::Tensor os = o.narrow(0, r, n);
    at::Tensor g = in_place ? os : g_buf.narrow(0, 0, n);
    if (in_place) {
      activate_into(g, xs.narrow(1, 0, d), act);
    } else {
      g.copy_(xs.narrow(1, 0, d));  // to fp32, exact
      activate_(g, act);
    }
    g.mul_(xs.narrow(1, d, d));  // in fp32 (a bf16 / fp16 up half promoted exactly)
    if (!in_place) os.copy_(g);   // the one rounding to out's dtype
  }
}
