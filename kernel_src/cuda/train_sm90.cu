// Eager training steps of the MLPs on sm_90 as C++ autograd nodes over the warp-specialized
// GEMMs (gated_gemm_sm90.cu) and cuBLAS: the kernels of the Python path (triton_backward.py with
// sm90.py's kernels) in the same order, so the same bits, with no Python between them in the
// forward or on autograd's worker thread in the backward. On the device's host the Python
// forward and backward of that path cost ~240 us of a d768 step's ~730, and Python runs about
// twice as slow on autograd's worker thread (NOTES, sessions 18 and 19).
//
// gated_mlp_train_sm90(x, gate_weight, up_weight?, down_weight, gate_bias?, up_bias?, down_bias?,
//                      ones?, activation, unfused_forward=False) -> y
//   Forward: gated_gemm_sm90 writes h and the pre-activations g | u (or, unfused_forward,
//   cuBLAS writes g | u and act_and_mul h from them), cuBLAS y = h Wd^T + bd.
//   Backward: bd's gradient (GEMV), dact_gemm_sm90 writes dg | du (over the saved g | u unless
//   the graph is kept for another backward), cuBLAS dWd = dy^T h, [dWg; dWu] = (dg | du)^T x in
//   one GEMM, [dbg; dbu] in one GEMV, dx = dg Wg + du Wu (one GEMM over K = 2H for the packed
//   weight, else mm + addmm_). up_weight absent: gate_weight is the packed [2H, D] gate_up
//   weight (gate first; Phi-3) and gate_bias, if any, its [2H] bias; their gradients come back
//   whole.
// mlp_train_sm90(x, fc_weight, fc_bias?, proj_weight, proj_bias?, ones?, activation, conv1d) -> y
//   The plain MLP, weights in nn.Linear's layout ([out, in]) or with conv1d in GPT-2 Conv1D's
//   ([in, out]), each read as it is. Forward: linear_act_sm90 writes h and pre, cuBLAS
//   y = h W2^T + b2. Backward: b2's gradient, dact_gemm_sm90 writes dpre (over pre unless the
//   graph is kept), cuBLAS dW2 = dy^T h, dW1 = dpre^T x (each in its weight's layout), b1's
//   gradient, dx = dpre W1.
// ones: M ones for the bias gradients, computed as GEMVs t^T ones (triton_backward.column_sum:
// PyTorch's column sum of a 16-bit tensor allocates 2.75 x its input); needed where a bias is.
//
// dispatch.py decides when a node is taken (eager, saved pre-activations, shapes both sm_90a
// kernels take); everything else stays on the Python path. create_graph=True (a double
// backward): the gradients come from autograd over PyTorch ops recomputing the forward from
// the saved inputs, as the Python path does.
#include <ATen/core/Tensor.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "activations.h"
#include "gated_gemm_sm90.h"

// act_and_mul.cu (the fused_mlp_cuda kernel table, linked into the same extension).
void act_and_mul_cuda(at::Tensor& out, const at::Tensor& input, int64_t activation);

namespace fused_mlp {
namespace sm90 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = c10::optional<at::Tensor>;

OptTensor opt(const at::Tensor& t) { return t.defined() ? OptTensor(t) : c10::nullopt; }

// act(g) in PyTorch ops (differentiable), for the double-backward path.
at::Tensor torch_activation(const at::Tensor& g, int64_t activation) {
  switch (static_cast<Activation>(activation)) {
    case Activation::kIdentity:
      return g;
    case Activation::kSilu:
      return at::silu(g);
    case Activation::kGeluTanh:
      return at::gelu(g, "tanh");
    case Activation::kGelu:
      return at::gelu(g);
    case Activation::kRelu:
      return at::relu(g);
    case Activation::kRelu2: {
      const at::Tensor r = at::relu(g);
      return at::mul(r, r);
    }
    case Activation::kQuickGelu:
      return at::mul(g, at::sigmoid(at::mul(g, 1.702)));
  }
  FUSED_MLP_CHECK(false, "fused_mlp: activation id ", activation, " is not one of 0..", kNumActivations - 1);
  return g;
}

// t as 2-D rows [M, last] (itself when 2-D already: no reshape on the hot path).
at::Tensor rows(const at::Tensor& t) { return t.dim() == 2 ? t : t.reshape({-1, t.size(-1)}); }

// The 2-D result t [M, n] with like's leading dimensions.
at::Tensor unrows(const at::Tensor& t, const at::Tensor& like) {
  if (like.dim() == 2) return t;
  std::vector<int64_t> shape(like.sizes().begin(), like.sizes().end() - 1);
  shape.push_back(t.size(1));
  return t.view(shape);
}

// A tensor the sm_90a kernels read as it is: unit column stride, 16-byte aligned rows (else a
// contiguous copy: dy of y.sum() is an expanded tensor with zero strides).
at::Tensor kernel_rows(const at::Tensor& t) {
  const bool ok = t.dim() == 2 && t.stride(1) == 1 && t.stride(0) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  return ok ? t : t.contiguous();
}

// A bias gradient t.sum(0) as the GEMV t^T ones (triton_backward.column_sum's).
at::Tensor column_sum(const at::Tensor& t, const at::Tensor& ones) { return at::mv(t.t(), ones); }

void check_ones(const char* op, const OptTensor& ones, int64_t m, bool any_bias) {
  if (!any_bias) return;
  FUSED_MLP_CHECK(ones.has_value() && ones->dim() == 1 && ones->size(0) == m, "fused_mlp: ", op,
                  " needs ones, a vector of ", m, " ones (x's rows), where a bias is given");
}

// needs_input_grad by argument position. Autograd numbers only the tensor arguments that were
// given (an absent optional one has no edge), so the saved arguments, absent ones undefined,
// tell which edge each position has.
std::vector<bool> needs_by_position(AutogradContext* ctx, const variable_list& args) {
  std::vector<bool> need(args.size(), false);
  size_t edge = 0;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].defined()) need[i] = ctx->needs_input_grad(edge++);
  return need;
}

// create_graph=True: differentiable gradients of y (recomputed in PyTorch ops) for the
// arguments that need one; undefined elsewhere.
variable_list differentiable_grads(const at::Tensor& y, const at::Tensor& dy, const variable_list& args,
                                   const std::vector<bool>& need) {
  variable_list inputs, out(args.size());
  std::vector<size_t> which;
  for (size_t i = 0; i < args.size(); ++i)
    if (need[i]) {
      inputs.push_back(args[i]);
      which.push_back(i);
    }
  if (inputs.empty()) return out;
  const auto got = torch::autograd::grad({y}, inputs, {dy}, /*retain_graph=*/true, /*create_graph=*/true,
                                         /*allow_unused=*/true);
  for (size_t j = 0; j < which.size(); ++j) out[which[j]] = got[j];
  return out;
}

// A node's state between its forward and backward: its tensor arguments by position (absent
// optional ones undefined), the ones vector, the pre-activations and h.
void save(AutogradContext* ctx, const variable_list& args, const OptTensor& ones, const at::Tensor& pre,
          const at::Tensor& h, int64_t activation) {
  variable_list all = args;
  all.insert(all.end(), {ones.value_or(at::Tensor()), pre, h});
  ctx->save_for_backward(all);
  ctx->saved_data["activation"] = activation;
}

struct Saved {
  variable_list args;  // by position, absent ones undefined
  at::Tensor ones, pre, h;
  std::vector<bool> need;  // which arguments need a gradient, by position
  int64_t activation;
};

Saved unpack(AutogradContext* ctx, size_t n_args) {
  Saved s;
  s.args = ctx->get_saved_variables();
  s.ones = s.args[n_args];
  s.pre = s.args[n_args + 1];
  s.h = s.args[n_args + 2];
  s.args.resize(n_args);
  s.need = needs_by_position(ctx, s.args);
  s.activation = ctx->saved_data["activation"].toInt();
  return s;
}

// The gate and up halves of the gated node's weight (or bias) arguments: themselves, or the row
// halves of the packed gate one.
std::pair<at::Tensor, at::Tensor> halves(bool packed, const at::Tensor& gate, const at::Tensor& up, int64_t hidden) {
  if (!packed || !gate.defined()) return {gate, up};
  return {gate.narrow(0, 0, hidden), gate.narrow(0, hidden, hidden)};
}

// Argument positions of the gated node (as saved).
enum Gated { kX, kWg, kWu, kWd, kBg, kBu, kBd, kGatedArgs };

struct GatedTrainSm90 : public torch::autograd::Function<GatedTrainSm90> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& wg, const OptTensor& wu,
                            const at::Tensor& wd, const OptTensor& bg, const OptTensor& bu, const OptTensor& bd,
                            const OptTensor& ones, int64_t activation, bool unfused_forward) {
    const bool packed = !wu.has_value();
    const int64_t hidden = packed ? wg.size(0) / 2 : wg.size(0);
    const at::Tensor x2 = rows(x);
    const int64_t m = x2.size(0);
    check_ones("gated_mlp_train_sm90", ones, m, bg.has_value() || bu.has_value() || bd.has_value());
    const auto [g_w, u_w] = halves(packed, wg, wu.value_or(at::Tensor()), hidden);
    const auto [g_b, u_b] = halves(packed, bg.value_or(at::Tensor()), bu.value_or(at::Tensor()), hidden);
    at::Tensor gu = at::empty({m, 2 * hidden}, x.options());
    at::Tensor h = at::empty({m, hidden}, x.options());
    if (unfused_forward && !g_b.defined() && !u_b.defined()) {
      // cuBLAS's GEMMs into g | u's halves (their rows strided), then act(g) * u: the Python
      // path's calls (sm90.gate_up), so the same bits; the dispatcher's choice where that
      // measured faster than the fused kernel (sm90.train_forward_unfused; never with biases).
      at::Tensor g = gu.narrow(1, 0, hidden), u = gu.narrow(1, hidden, hidden);
      at::mm_out(g, x2, g_w.t());
      at::mm_out(u, x2, u_w.t());
      act_and_mul_cuda(h, gu, activation);
    } else {
      gated_gemm_sm90(h, x2, g_w, u_w, opt(g_b), opt(u_b), gu, activation, 0);
    }
    const at::Tensor y = at::linear(h, wd, bd);
    save(ctx, {x, wg, wu.value_or(at::Tensor()), wd, bg.value_or(at::Tensor()), bu.value_or(at::Tensor()),
               bd.value_or(at::Tensor())},
         ones, gu, h, activation);
    return unrows(y, x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(kGatedArgs + 3);  // + ones, activation, unfused_forward: no gradients
    const at::Tensor& dy_in = grads[0];
    if (!dy_in.defined()) return out;
    const Saved st = unpack(ctx, kGatedArgs);
    const variable_list& saved = st.args;
    const std::vector<bool>& need = st.need;
    const at::Tensor &gu = st.pre, &ones = st.ones, &h = st.h;
    const int64_t activation = st.activation;
    const at::Tensor &x = saved[kX], &wg = saved[kWg], &wu = saved[kWu], &wd = saved[kWd];
    const bool packed = !wu.defined();
    const int64_t hidden = packed ? wg.size(0) / 2 : wg.size(0);
    const auto [g_w, u_w] = halves(packed, wg, wu, hidden);
    const auto [g_b, u_b] = halves(packed, saved[kBg], saved[kBu], hidden);
    const at::Tensor x2 = rows(x);
    const at::Tensor dy = kernel_rows(rows(dy_in));
    if (at::GradMode::is_enabled()) {
      const at::Tensor g = at::linear(x2, g_w, opt(g_b)), u = at::linear(x2, u_w, opt(u_b));
      const at::Tensor y = at::linear(at::mul(torch_activation(g, activation), u), wd, opt(saved[kBd]));
      const variable_list got = differentiable_grads(y, dy, saved, need);
      std::copy(got.begin(), got.end(), out.begin());  // x's gradient has x's shape already
      return out;
    }
    if (need[kBd]) out[kBd] = column_sum(dy, ones);
    // dg | du over the saved g | u unless another backward will read them (retain_graph=True).
    at::Tensor dgu = torch::autograd::get_current_graph_task_keep_graph() ? at::empty_like(gu) : gu;
    dact_gemm_sm90(dgu, dy, wd, gu, activation, /*gated=*/true, /*weight_kn=*/true);
    if (need[kWd]) out[kWd] = at::mm(dy.t(), h);
    if (need[kWg] || need[kWu]) {
      const at::Tensor dwgu = at::mm(dgu.t(), x2);  // [2H, D]: both weight gradients in one GEMM
      if (packed) {
        out[kWg] = dwgu;
      } else {
        if (need[kWg]) out[kWg] = dwgu.narrow(0, 0, hidden);
        if (need[kWu]) out[kWu] = dwgu.narrow(0, hidden, hidden);
      }
    }
    if (need[kBg] || need[kBu]) {
      const at::Tensor dbgu = column_sum(dgu, ones);  // [2H]
      if (packed) {
        out[kBg] = dbgu;
      } else {
        if (need[kBg]) out[kBg] = dbgu.narrow(0, 0, hidden);
        if (need[kBu]) out[kBu] = dbgu.narrow(0, hidden, hidden);
      }
    }
    if (need[kX]) {
      at::Tensor dx;
      if (packed) {
        dx = at::mm(dgu, wg);  // K = 2H over the packed weight
      } else {
        dx = at::mm(dgu.narrow(1, 0, hidden), wg);
        dx.addmm_(dgu.narrow(1, hidden, hidden), wu);
      }
      out[kX] = unrows(dx, x);
    }
    return out;
  }
};

// Argument positions of the plain node.
enum Plain { kPx, kW1, kB1, kW2, kB2, kPlainArgs };

struct PlainTrainSm90 : public torch::autograd::Function<PlainTrainSm90> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1, const OptTensor& b1,
                            const at::Tensor& w2, const OptTensor& b2, const OptTensor& ones, int64_t activation,
                            bool conv1d) {
    const at::Tensor x2 = rows(x);
    const int64_t m = x2.size(0), hidden = w1.size(conv1d ? 1 : 0);
    check_ones("mlp_train_sm90", ones, m, b1.has_value() || b2.has_value());
    at::Tensor pre = at::empty({m, hidden}, x.options());
    at::Tensor h = at::empty({m, hidden}, x.options());
    linear_act_sm90(h, x2, w1, b1, pre, activation, /*weight_kn=*/conv1d);
    const at::Tensor y = at::linear(h, conv1d ? w2.t() : w2, b2);
    save(ctx, {x, w1, b1.value_or(at::Tensor()), w2, b2.value_or(at::Tensor())}, ones, pre, h, activation);
    ctx->saved_data["conv1d"] = conv1d;
    return unrows(y, x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(kPlainArgs + 3);  // + ones, activation, conv1d: no gradients
    const at::Tensor& dy_in = grads[0];
    if (!dy_in.defined()) return out;
    const Saved st = unpack(ctx, kPlainArgs);
    const bool conv1d = ctx->saved_data["conv1d"].toBool();
    const variable_list& saved = st.args;
    const std::vector<bool>& need = st.need;
    const at::Tensor &pre = st.pre, &ones = st.ones, &h = st.h;
    const int64_t activation = st.activation;
    const at::Tensor &x = saved[kPx], &w1 = saved[kW1], &w2 = saved[kW2];
    const at::Tensor x2 = rows(x);
    const at::Tensor dy = kernel_rows(rows(dy_in));
    if (at::GradMode::is_enabled()) {
      const at::Tensor p = at::linear(x2, conv1d ? w1.t() : w1, opt(saved[kB1]));
      const at::Tensor y = at::linear(torch_activation(p, activation), conv1d ? w2.t() : w2, opt(saved[kB2]));
      const variable_list got = differentiable_grads(y, dy, saved, need);
      std::copy(got.begin(), got.end(), out.begin());
      return out;
    }
    if (need[kB2]) out[kB2] = column_sum(dy, ones);
    at::Tensor dpre = torch::autograd::get_current_graph_task_keep_graph() ? at::empty_like(pre) : pre;
    // dh = dy W2 with W2 [K, N]: nn.Linear's proj weight [out, hidden] as it is (N-major), or
    // Conv1D's [hidden, out] = W2^T (K-major).
    dact_gemm_sm90(dpre, dy, w2, pre, activation, /*gated=*/false, /*weight_kn=*/!conv1d);
    // Weight gradients in each weight's own layout; the GEMMs of triton_backward.mlp_backward.
    if (need[kW2]) out[kW2] = conv1d ? at::mm(h.t(), dy) : at::mm(dy.t(), h);
    if (need[kW1]) out[kW1] = conv1d ? at::mm(x2.t(), dpre) : at::mm(dpre.t(), x2);
    if (need[kB1]) out[kB1] = column_sum(dpre, ones);
    if (need[kPx]) out[kPx] = unrows(at::mm(dpre, conv1d ? w1.t() : w1), x);
    return out;
  }
};

at::Tensor gated_mlp_train_sm90(const at::Tensor& x, const at::Tensor& gate_weight, const OptTensor& up_weight,
                                const at::Tensor& down_weight, const OptTensor& gate_bias, const OptTensor& up_bias,
                                const OptTensor& down_bias, const OptTensor& ones, int64_t activation,
                                bool unfused_forward) {
  FUSED_MLP_CHECK(up_weight.has_value() || !up_bias.has_value(), "fused_mlp: gated_mlp_train_sm90: with the ",
                  "packed gate_up weight (up_weight None) the bias is gate_bias [2H] alone, got an up_bias");
  return GatedTrainSm90::apply(x, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias, ones,
                               activation, unfused_forward);
}

at::Tensor mlp_train_sm90(const at::Tensor& x, const at::Tensor& fc_weight, const OptTensor& fc_bias,
                          const at::Tensor& proj_weight, const OptTensor& proj_bias, const OptTensor& ones,
                          int64_t activation, bool conv1d) {
  return PlainTrainSm90::apply(x, fc_weight, fc_bias, proj_weight, proj_bias, ones, activation, conv1d);
}

}  // namespace
}  // namespace sm90
}  // namespace fused_mlp

// Above autograd (their own C++ nodes): eager training only; torch.compile traces the Python ops.
// Registered from this file so that builds without sm_90a (this file not compiled) lack them.
#define FUSED_MLP_LIBRARY_FRAGMENT(NAME, MODULE) TORCH_LIBRARY_FRAGMENT(NAME, MODULE)
FUSED_MLP_LIBRARY_FRAGMENT(TORCH_EXTENSION_NAME, ops) {
  ops.def(
      "gated_mlp_train_sm90(Tensor x, Tensor gate_weight, Tensor? up_weight, Tensor down_weight, Tensor? gate_bias, "
      "Tensor? up_bias, Tensor? down_bias, Tensor? ones, int activation, bool unfused_forward=False) -> Tensor");
  ops.impl("gated_mlp_train_sm90", c10::DispatchKey::CompositeImplicitAutograd,
           &fused_mlp::sm90::gated_mlp_train_sm90);
  ops.def(
      "mlp_train_sm90(Tensor x, Tensor fc_weight, Tensor? fc_bias, Tensor proj_weight, Tensor? proj_bias, "
      "Tensor? ones, int activation, bool conv1d=False) -> Tensor");
  ops.impl("mlp_train_sm90", c10::DispatchKey::CompositeImplicitAutograd, &fused_mlp::sm90::mlp_train_sm90);
}
