// Host side of the warp-specialized sm_90a GEMMs (the kernel and its design notes are in
// gated_gemm_sm90_kernel.cuh): argument checks, TMA descriptors, launch, op registration.
// train_sm90.cu builds the training steps' autograd nodes on these functions.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "activations.h"
#include "down_gemm_sm90_kernel.cuh"
#include "gated_gemm_sm90.h"
#include "gated_gemm_sm90_kernel.cuh"

namespace fused_mlp {
namespace sm90 {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status));
    FUSED_MLP_CHECK(status == cudaDriverEntryPointSuccess && ptr != nullptr,
                    "fused_mlp: the CUDA driver has no cuTensorMapEncodeTiled (a driver for CUDA 12.0 or newer is needed)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// A row-major 2-D tensor as boxes of box_rows x box_cols elements with the 128-byte
// swizzle (swizzle false: none, for the narrow dh kind's g | u buffers, read row by row):
// the K-major operands as box_rows x 64 (one 128-byte row of K per box row), the
// dh kinds' [K, N] weight as 64 x 64 N-major boxes.
CUtensorMap tensor_map(const at::Tensor& t, int box_cols, int box_rows, const char* name, bool swizzle = true) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(t.size(1)), static_cast<cuuint64_t>(t.size(0))};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(t.stride(0)) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const auto dtype = t.scalar_type() == at::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r = encode_fn()(&map, dtype, 2, t.data_ptr(), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FUSED_MLP_CHECK(r == CUDA_SUCCESS, "fused_mlp: the sm_90a kernel could not describe ", name,
                  " for the TMA (cuTensorMapEncodeTiled error ", static_cast<int>(r), ")");
  return map;
}

void check_rows(const char* op, const at::Tensor& t, const char* name, const at::Tensor& x) {
  FUSED_MLP_CHECK(t.device() == x.device(), "fused_mlp: ", op, ": ", name, " is on ", t.device(),
                  " but the first input is on ", x.device());
  FUSED_MLP_CHECK(t.scalar_type() == x.scalar_type(), "fused_mlp: ", op, ": ", name, " has dtype ",
                  t.scalar_type(), " but the first input has ", x.scalar_type());
  FUSED_MLP_CHECK(t.dim() == 2 && t.stride(1) == 1, "fused_mlp: ", op, " needs ", name,
                  " 2-D with unit column stride, got shape ", t.sizes(), " strides ", t.strides());
  FUSED_MLP_CHECK(t.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
                  "fused_mlp: ", op, " needs ", name, "'s rows 16-byte aligned, got row stride ", t.stride(0));
}

void check_bias(const char* op, const c10::optional<at::Tensor>& b, const char* name, const at::Tensor& x, int64_t n) {
  if (!b.has_value()) return;
  FUSED_MLP_CHECK(b->device() == x.device() && b->scalar_type() == x.scalar_type(), "fused_mlp: ", name,
                  " must be on x's device with x's dtype, got ", b->device(), " ", b->scalar_type());
  FUSED_MLP_CHECK(b->dim() == 1 && b->size(0) == n && b->stride(0) == 1, "fused_mlp: ", name,
                  " must be a contiguous [", n, "] vector, got shape ", b->sizes());
  FUSED_MLP_CHECK(reinterpret_cast<uintptr_t>(b->data_ptr()) % 16 == 0, "fused_mlp: ", name,
                  " must be 16-byte aligned for ", op);
}

int sm_count(int device) {
  static int counts[64] = {0};
  if (device < 64 && counts[device] > 0) return counts[device];
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (device < 64) counts[device] = n;
  return n;
}

// An on / off switch in the environment set to 0 (read at every call, like the package's
// other switches).
bool switched_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '0';
}

// gated_forward_hints (kernel header), unless FUSED_MLP_SM90_CACHE_HINTS=0.
uint32_t gated_forward_flags(bool training, int64_t operand_bytes) {
  return switched_off("FUSED_MLP_SM90_CACHE_HINTS") ? 0u : gated_forward_hints(training, operand_bytes);
}

// Row blocks of kBM rows of x (Params::tiles_m): the one count the plans and every op use.
int64_t row_blocks(int64_t M) { return (M + kBM - 1) / kBM; }

// The narrow tail of the gated forward (Params::tail_split, kernel header): column slices per
// tile of the persistent loop's last, partial round, for `tiles` 128-column tiles; 1 for none.
// Only where the loop has at least kNarrowTailMinRounds full rounds (the compute-bound
// shapes: SwiGLU M 4096's 3584 tiles are 27 rounds of 132 and 20 tiles, which then take a
// quarter of a tile's time instead of a whole one), and not with FUSED_MLP_SM90_NARROW_TAIL=0.
// Slices: 4 where the last round has at most a quarter of the SMs' tiles, else 2 where at most
// half, else none.
constexpr int64_t kNarrowTailMinRounds = 4;
int narrow_tail_split(int64_t tiles, int sms) {
  if (switched_off("FUSED_MLP_SM90_NARROW_TAIL") || tiles < kNarrowTailMinRounds * sms) return 1;
  const int64_t rest = tiles % sms;
  if (rest == 0) return 1;
  return rest * 4 <= sms ? 4 : rest * 2 <= sms ? 2 : 1;
}

// Tile width: 112 columns where that needs fewer rounds of the persistent loop for the
// same work, else 128 (cost ~ rounds x width, a narrow tail's round counted as its slice's
// width; 128 on ties).
int pick_block_n(int64_t M, int64_t N, int sms) {
  const auto cost = [&](int64_t bn) {
    const int64_t tiles = row_blocks(M) * ((N + bn - 1) / bn);
    const int split = bn == 128 ? narrow_tail_split(tiles, sms) : 1;
    return split > 1 ? (tiles / sms) * bn + bn / split : ((tiles + sms - 1) / sms) * bn;
  };
  return cost(112) < cost(128) ? 112 : 128;
}

// The gated forward for inference takes the h-only kind (Epi::kGatedFwdH: 4 ring stages) where
// x has at most this many row blocks of 128, unless FUSED_MLP_SM90_H_ONLY=0. With more row
// blocks the weights come mostly from L2 and the 4th stage buys nothing at the power limit,
// while the activation on the MMA groups' path costs (NOTES, sessions 15 and 16).
constexpr int64_t kHOnlyMaxRowBlocks = 4;

// block_n as both ops take it: 0 (the plan below chooses), 112 or 128.
void check_block_n(const char* op, int64_t block_n) {
  FUSED_MLP_CHECK(block_n == 0 || block_n == 112 || block_n == 128, "fused_mlp: ", op,
                  " takes block_n 0 (chosen here), 112 or 128, got ", block_n);
}

// Rows of x's TMA box in the gated forward (GatedPlan::x_rows, Params::x_rows): with fewer rows
// than one row block, M rounded up to 8 (one swizzle atom of 8 x 128 bytes) instead of kBM,
// unless FUSED_MLP_SM90_FIT_X=0. With the full box the copy engine fills the rows past the end of
// x with zeros, and that cost time: on an H100 (Llama-3-8B's gate/up, CUDA graphs) 87.7 us at M 1
// against 83.7 with the same rows zero-padded to 128 in memory; the fitted box 81.0, the same
// bits, and the whole MLP 130.3 -> 123.1 us at M 1, 128.0 -> 124.9 at M 16, unchanged at M 64
// (NOTES, session 79; benchmarks/micro/gate_up_rows.py).
int x_box_rows(int64_t M) {
  if (M >= kBM || switched_off("FUSED_MLP_SM90_FIT_X")) return kBM;
  return static_cast<int>((M + 7) / 8 * 8);
}

// What the gated forward launches for M x N (the choices above, in one place: the op below and
// gated_gemm_sm90_plan, which the GPU tests read, both take them from here).
struct GatedPlan {
  int block_n;     // 112 or 128
  int64_t tiles;   // row blocks x column tiles of the persistent loop
  int tail_split;  // column slices per tile of the last, partial round (1: no narrow tail)
  int tail_first;  // first tile of that round (with tail_split > 1)
  bool h_only;     // the kind: Epi::kGatedFwdH, else Epi::kGatedFwd
  int x_rows;      // rows of x's TMA box (x_box_rows)
};
GatedPlan gated_plan(int64_t M, int64_t N, int64_t block_n, bool training, int sms) {
  GatedPlan r{};
  r.block_n = block_n != 0 ? static_cast<int>(block_n) : pick_block_n(M, N, sms);
  const int64_t blocks = row_blocks(M);
  r.tiles = blocks * ((N + r.block_n - 1) / r.block_n);
  r.tail_split = r.block_n == 128 ? narrow_tail_split(r.tiles, sms) : 1;
  r.tail_first = r.tail_split > 1 ? static_cast<int>((r.tiles / sms) * sms) : 0;  // the grid is sms wide then
  r.h_only = !training && blocks <= kHOnlyMaxRowBlocks && !switched_off("FUSED_MLP_SM90_H_ONLY");
  r.x_rows = x_box_rows(M);
  return r;
}

// Params::group_m: FUSED_MLP_SM90_GROUP_M (a positive integer) where set, else the default.
int group_m_setting() {
  const char* v = std::getenv("FUSED_MLP_SM90_GROUP_M");
  const int g = v != nullptr ? std::atoi(v) : 0;
  return g > 0 ? g : kGroupM;
}

template <typename T, Activation A, int BN, Epi E, bool BNMajor = false>
void launch(const CUtensorMap& ma, const CUtensorMap& mb0, const CUtensorMap& mb1, Params p, cudaStream_t stream,
            int device, const CUtensorMap* mb0_tail = nullptr, const CUtensorMap* mb1_tail = nullptr) {
  auto kernel = gated_gemm_kernel<T, A, BN, E, BNMajor>;
  constexpr int kSmem = KindLayout<E, BN>::kSmemBytes;
  static bool smem_set[64] = {};  // per device; setting it twice in a race is harmless
  if (device >= 64 || !smem_set[device]) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    if (device < 64) smem_set[device] = true;
  }
  constexpr int kTileN = gated_fwd(E) ? BN : 2 * BN;
  p.tiles_n = (p.N + kTileN - 1) / kTileN;
  p.group_m = group_m_setting();
  const int tiles = p.tiles_m * p.tiles_n;
  const int grid = std::min(tiles, sm_count(device));
  // the narrow tail's maps (gated forward, Params::tail_split > 1), else unused copies
  kernel<<<grid, threads<E, BN>(), kSmem, stream>>>(ma, mb0, mb1, mb0_tail != nullptr ? *mb0_tail : mb0,
                                                     mb1_tail != nullptr ? *mb1_tail : mb1, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The checks both ops share: activation id, dtype, device, and an sm_90 GPU. Returns the
// device index.
int check_common(const char* op, const at::Tensor& a, const char* name, int64_t activation) {
  FUSED_MLP_CHECK(activation >= 0 && activation < kNumActivations, "fused_mlp: activation id ", activation,
                  " is not one of 0..", kNumActivations - 1);
  FUSED_MLP_CHECK(a.is_cuda(), "fused_mlp: ", op, " needs ", name, " on a CUDA device, got ", a.device());
  FUSED_MLP_CHECK(a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf, "fused_mlp: ", op,
                  " takes bfloat16 or float16, got ", name, " of dtype ", a.scalar_type());
  const int device = a.get_device();
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  FUSED_MLP_CHECK(major == 9 && minor == 0, "fused_mlp: ", op, " runs on sm_90 GPUs only, this one is sm_",
                  major * 10 + minor);
  return device;
}

// c10's device guard for t's device, and that device's primary context current on this thread
// before the driver call that encodes the TMA descriptors: a thread that has made no runtime
// call yet (autograd's worker thread running the C++ training node's backward first thing in a
// process) has none, and cuTensorMapEncodeTiled then fails with CUDA_ERROR_INVALID_CONTEXT
// (201). The guard skips cudaSetDevice when the device index already matches, so it is called
// here, after the guard took note of the caller's device (which it restores on exit).
struct DeviceScope {
  c10::cuda::CUDAGuard guard;
  explicit DeviceScope(const at::Tensor& t) : guard(t.device()) { C10_CUDA_CHECK(cudaSetDevice(t.get_device())); }
};

void check_sizes(const char* op, int64_t M, int64_t N, int64_t K) {
  FUSED_MLP_CHECK(N % 8 == 0, "fused_mlp: ", op, " needs N (the hidden size) a multiple of 8, got ", N);
  FUSED_MLP_CHECK(M < (int64_t(1) << 31) && N < (int64_t(1) << 30) && K < (int64_t(1) << 31),
                  "fused_mlp: ", op, " shapes must fit 32-bit indices");
}

void gated_gemm_sm90(at::Tensor& out, const at::Tensor& x, const at::Tensor& gate_weight, const at::Tensor& up_weight,
                     const c10::optional<at::Tensor>& gate_bias, const c10::optional<at::Tensor>& up_bias,
                     const c10::optional<at::Tensor>& pre, int64_t activation, int64_t block_n) {
  check_block_n("gated_gemm_sm90", block_n);
  const int device = check_common("gated_gemm_sm90", x, "x", activation);
  const DeviceScope scope(x);
  check_rows("gated_gemm_sm90", x, "x", x);
  check_rows("gated_gemm_sm90", gate_weight, "gate_weight", x);
  check_rows("gated_gemm_sm90", up_weight, "up_weight", x);
  check_rows("gated_gemm_sm90", out, "out", x);
  const int64_t M = x.size(0), K = x.size(1), N = gate_weight.size(0);
  FUSED_MLP_CHECK(gate_weight.size(1) == K && up_weight.size(0) == N && up_weight.size(1) == K,
                  "fused_mlp: gate_weight ", gate_weight.sizes(), " and up_weight ", up_weight.sizes(),
                  " must both be [N, ", K, "]");
  FUSED_MLP_CHECK(out.size(0) == M && out.size(1) == N, "fused_mlp: out must be [", M, ", ", N, "], got ",
                  out.sizes());
  check_sizes("gated_gemm_sm90", M, N, K);
  check_bias("gated_gemm_sm90", gate_bias, "gate_bias", x, N);
  check_bias("gated_gemm_sm90", up_bias, "up_bias", x, N);
  if (pre.has_value()) {
    check_rows("gated_gemm_sm90", *pre, "pre", x);
    FUSED_MLP_CHECK(pre->size(0) == M && pre->size(1) == 2 * N, "fused_mlp: pre must be [", M, ", ", 2 * N,
                    "], got ", pre->sizes());
  }
  if (M == 0 || N == 0) return;

  Params p{};
  p.out = out.data_ptr();
  p.pre = pre.has_value() ? pre->data_ptr() : nullptr;
  p.flags = gated_forward_flags(pre.has_value(), (x.numel() + gate_weight.numel() + up_weight.numel()) *
                                                     static_cast<int64_t>(x.element_size()));
  p.bg = gate_bias.has_value() ? gate_bias->data_ptr() : nullptr;
  p.bu = up_bias.has_value() ? up_bias->data_ptr() : nullptr;
  p.ldo = out.stride(0);
  p.ldp = pre.has_value() ? pre->stride(0) : 0;
  p.M = static_cast<int>(M);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.tiles_m = static_cast<int>(row_blocks(M));
  const GatedPlan plan = gated_plan(M, N, block_n, pre.has_value(), sm_count(device));
  const int bn = plan.block_n, split = plan.tail_split;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device);
  p.x_rows = plan.x_rows;
  const CUtensorMap mx = tensor_map(x, kBK, p.x_rows, "x"), mg = tensor_map(gate_weight, kBK, bn, "gate_weight"),
                    mu = tensor_map(up_weight, kBK, bn, "up_weight");
  // The narrow tail (128-column tiles only): the weights' maps in boxes of the slice's width.
  CUtensorMap mg_tail = mg, mu_tail = mu;
  if (split > 1) {
    p.tail_split = split;
    p.tail_first = plan.tail_first;
    mg_tail = tensor_map(gate_weight, kBK, bn / split, "gate_weight");
    mu_tail = tensor_map(up_weight, kBK, bn / split, "up_weight");
  }
  FUSED_MLP_DISPATCH_ACTIVATION(activation, [&] {
    auto go = [&](auto kind) {
      constexpr Epi E = decltype(kind)::value;
      if (x.scalar_type() == at::kBFloat16) {
        if (bn == 112) launch<__nv_bfloat16, kAct, 112, E>(mx, mg, mu, p, stream, device);
        else launch<__nv_bfloat16, kAct, 128, E>(mx, mg, mu, p, stream, device, &mg_tail, &mu_tail);
      } else {
        if (bn == 112) launch<__half, kAct, 112, E>(mx, mg, mu, p, stream, device);
        else launch<__half, kAct, 128, E>(mx, mg, mu, p, stream, device, &mg_tail, &mu_tail);
      }
    };
    if (plan.h_only) go(std::integral_constant<Epi, Epi::kGatedFwdH>{});
    else go(std::integral_constant<Epi, Epi::kGatedFwd>{});
  });
}

std::vector<int64_t> gated_gemm_sm90_plan(int64_t M, int64_t N, int64_t block_n, bool training) {
  FUSED_MLP_CHECK(M >= 0 && N >= 0, "fused_mlp: gated_gemm_sm90_plan: M and N must be >= 0, got ", M, ", ", N);
  check_block_n("gated_gemm_sm90_plan", block_n);
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const GatedPlan plan = gated_plan(M, N, block_n, training, sm_count(device));
  return {plan.block_n, plan.tiles, plan.tail_split, plan.tail_first, plan.h_only ? 1 : 0, plan.x_rows};
}

// The backward's first GEMM with the activation's derivative in its epilogue (the same
// contract as triton_gemm.linear_dact without its h output):
//   gated: pre = g | u [M, 2N] -> out = dh * u * act'(g) | dh * act(g)   [M, 2N]
//   plain: pre [M, N]          -> out = dh * act'(pre)                  [M, N]
// with dh = dy @ W for dy [M, K] and W [K, N]: weight is W itself (weight_kn: nn.Linear's
// down weight [out, hidden], read N-major) or W^T [N, K] (Conv1D's [hidden, out], K-major;
// plain only). out may be pre (in place).
void dact_gemm_sm90(at::Tensor& out, const at::Tensor& dy, const at::Tensor& weight, const at::Tensor& pre,
                    int64_t activation, bool gated, bool weight_kn) {
  const int device = check_common("dact_gemm_sm90", dy, "dy", activation);
  const DeviceScope scope(dy);
  check_rows("dact_gemm_sm90", dy, "dy", dy);
  check_rows("dact_gemm_sm90", weight, "weight", dy);
  check_rows("dact_gemm_sm90", pre, "pre", dy);
  check_rows("dact_gemm_sm90", out, "out", dy);
  FUSED_MLP_CHECK(weight_kn || !gated, "fused_mlp: dact_gemm_sm90 takes the gated MLP's down weight as [K, N] ",
                  "(weight_kn=True) only");
  const int64_t M = dy.size(0), K = dy.size(1), N = weight_kn ? weight.size(1) : weight.size(0);
  FUSED_MLP_CHECK(weight.size(weight_kn ? 0 : 1) == K, "fused_mlp: weight must be ",
                  weight_kn ? "[K, N] with K = " : "[N, K] with K = ", K, ", got ", weight.sizes());
  const int64_t width = gated ? 2 * N : N;
  FUSED_MLP_CHECK(pre.size(0) == M && pre.size(1) == width, "fused_mlp: pre must be [", M, ", ", width,
                  "], got ", pre.sizes());
  FUSED_MLP_CHECK(out.sizes() == pre.sizes(), "fused_mlp: out must have pre's shape ", pre.sizes(), ", got ",
                  out.sizes());
  check_sizes("dact_gemm_sm90", M, N, K);
  if (M == 0 || N == 0) return;

  Params p{};
  p.out = out.data_ptr();
  p.pre = pre.data_ptr();
  p.ldo = out.stride(0);
  p.ldp = pre.stride(0);
  p.M = static_cast<int>(M);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.tiles_m = static_cast<int>(row_blocks(M));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device);
  const CUtensorMap md = tensor_map(dy, kBK, kBM, "dy");
  const CUtensorMap mw = weight_kn ? tensor_map(weight, 64, kBK, "weight") : tensor_map(weight, kBK, 128, "weight");
  // The narrow gated kind (128 x 128 tiles, g | u loaded by TMA: narrow_gated_dh in the
  // header); FUSED_MLP_SM90_NARROW_DH=0 keeps the wide one. Its third map is pre, unswizzled
  // boxes of kGuRows rows x 128 columns.
  const bool narrow = gated && narrow_gated_dh(K) && !switched_off("FUSED_MLP_SM90_NARROW_DH");
  const CUtensorMap mp = narrow ? tensor_map(pre, 128, kGuRows, "pre", false) : mw;
  FUSED_MLP_DISPATCH_ACTIVATION(activation, [&] {
    if (dy.scalar_type() == at::kBFloat16) {
      if (narrow) launch<__nv_bfloat16, kAct, 64, Epi::kGatedDh, true>(md, mw, mp, p, stream, device);
      else if (gated) launch<__nv_bfloat16, kAct, 128, Epi::kGatedDh, true>(md, mw, mw, p, stream, device);
      else if (weight_kn) launch<__nv_bfloat16, kAct, 128, Epi::kPlainDh, true>(md, mw, mw, p, stream, device);
      else launch<__nv_bfloat16, kAct, 128, Epi::kPlainDh, false>(md, mw, mw, p, stream, device);
    } else {
      if (narrow) launch<__half, kAct, 64, Epi::kGatedDh, true>(md, mw, mp, p, stream, device);
      else if (gated) launch<__half, kAct, 128, Epi::kGatedDh, true>(md, mw, mw, p, stream, device);
      else if (weight_kn) launch<__half, kAct, 128, Epi::kPlainDh, true>(md, mw, mw, p, stream, device);
      else launch<__half, kAct, 128, Epi::kPlainDh, false>(md, mw, mw, p, stream, device);
    }
  });
}

// act(x W + b) for x [M, K] and W [K, N], bias [N] or none; pre (optional, [M, N]) also
// receives x W + b (the training forward of the plain MLP). weight is W^T [N, K] (nn.Linear's
// layout, read K-major) or, with weight_kn, W itself (Conv1D's [in, out], read N-major).
void linear_act_sm90(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& pre,
                     int64_t activation, bool weight_kn) {
  const int device = check_common("linear_act_sm90", x, "x", activation);
  const DeviceScope scope(x);
  check_rows("linear_act_sm90", x, "x", x);
  check_rows("linear_act_sm90", weight, "weight", x);
  check_rows("linear_act_sm90", out, "out", x);
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(weight_kn ? 1 : 0);
  FUSED_MLP_CHECK(weight.size(weight_kn ? 0 : 1) == K, "fused_mlp: weight must be ",
                  weight_kn ? "[K, N] with K = " : "[N, K] with K = ", K, ", got ", weight.sizes());
  FUSED_MLP_CHECK(out.size(0) == M && out.size(1) == N, "fused_mlp: out must be [", M, ", ", N, "], got ",
                  out.sizes());
  check_sizes("linear_act_sm90", M, N, K);
  check_bias("linear_act_sm90", bias, "bias", x, N);
  if (pre.has_value()) {
    check_rows("linear_act_sm90", *pre, "pre", x);
    FUSED_MLP_CHECK(pre->sizes() == out.sizes(), "fused_mlp: pre must be [", M, ", ", N, "], got ", pre->sizes());
  }
  if (M == 0 || N == 0) return;

  Params p{};
  p.out = out.data_ptr();
  p.pre = pre.has_value() ? pre->data_ptr() : nullptr;
  p.bg = p.bu = bias.has_value() ? bias->data_ptr() : nullptr;  // both halves of a tile read it
  p.ldo = out.stride(0);
  p.ldp = pre.has_value() ? pre->stride(0) : 0;
  p.M = static_cast<int>(M);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.tiles_m = static_cast<int>(row_blocks(M));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device);
  const CUtensorMap mx = tensor_map(x, kBK, kBM, "x");
  const CUtensorMap mw = weight_kn ? tensor_map(weight, 64, kBK, "weight") : tensor_map(weight, kBK, 128, "weight");
  FUSED_MLP_DISPATCH_ACTIVATION(activation, [&] {
    if (x.scalar_type() == at::kBFloat16) {
      if (weight_kn) launch<__nv_bfloat16, kAct, 128, Epi::kPlainFwd, true>(mx, mw, mw, p, stream, device);
      else launch<__nv_bfloat16, kAct, 128, Epi::kPlainFwd>(mx, mw, mw, p, stream, device);
    } else {
      if (weight_kn) launch<__half, kAct, 128, Epi::kPlainFwd, true>(mx, mw, mw, p, stream, device);
      else launch<__half, kAct, 128, Epi::kPlainFwd>(mx, mw, mw, p, stream, device);
    }
  });
}

// out = h W^T (+ bias) for h [M, K] with M <= 128 and weight [N, K] (nn.Linear's layout, K
// contiguous), bias [N] or none, in one kernel (down_gemm_sm90_kernel.cuh): the MLP's down
// projection at few tokens, its two K halves reduced in a cluster of 2. pdl: launched with a
// programmatic edge from the previous kernel in the stream, which then must not write weight.
void down_gemm_sm90(at::Tensor& out, const at::Tensor& h, const at::Tensor& weight,
                    const c10::optional<at::Tensor>& bias, bool pdl) {
  const int device = check_common("down_gemm_sm90", h, "h", 0);
  const DeviceScope scope(h);
  check_rows("down_gemm_sm90", h, "h", h);
  check_rows("down_gemm_sm90", weight, "weight", h);
  check_rows("down_gemm_sm90", out, "out", h);
  const int64_t M = h.size(0), K = h.size(1), N = weight.size(0);
  FUSED_MLP_CHECK(weight.size(1) == K, "fused_mlp: weight must be [N, K] with K = ", K, ", got ", weight.sizes());
  FUSED_MLP_CHECK(out.size(0) == M && out.size(1) == N, "fused_mlp: out must be [", M, ", ", N, "], got ",
                  out.sizes());
  FUSED_MLP_CHECK(M <= kDownMaxM, "fused_mlp: down_gemm_sm90 takes at most ", kDownMaxM, " rows of h, got ", M);
  FUSED_MLP_CHECK(K > 0, "fused_mlp: down_gemm_sm90 needs K > 0");
  check_sizes("down_gemm_sm90", M, N, K);
  check_bias("down_gemm_sm90", bias, "bias", h, N);
  if (M == 0 || N == 0) return;

  DownParams p{};
  p.out = out.data_ptr();
  p.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  p.ldo = out.stride(0);
  p.M = static_cast<int>(M);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.pdl = pdl ? 1 : 0;
  const CUtensorMap mw = tensor_map(weight, kBK, 64, "weight"), mh = tensor_map(h, kBK, kDownMaxM, "h");
  const bool bf16 = h.scalar_type() == at::kBFloat16;
  auto kernel = bf16 ? down_gemm_kernel<__nv_bfloat16> : down_gemm_kernel<__half>;
  static bool smem_set[2][64] = {};  // per dtype and device; setting it twice in a race is harmless
  if (device >= 64 || !smem_set[bf16][device]) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDownSmem));
    if (device < 64) smem_set[bf16][device] = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((N + 63) / 64 * 2));  // 2 CTAs (K halves) per 64-row block
  cfg.blockDim = dim3(kDownThreads);
  cfg.dynamicSmemBytes = kDownSmem;
  cfg.stream = c10::cuda::getCurrentCUDAStream(device);
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, mw, mh, p));
}

}  // namespace sm90
}  // namespace fused_mlp

// Registered from this file so that builds without sm_90a (this file not compiled) simply
// lack the op; the Python dispatcher checks for it.
#define FUSED_MLP_LIBRARY_FRAGMENT(NAME, MODULE) TORCH_LIBRARY_FRAGMENT(NAME, MODULE)
FUSED_MLP_LIBRARY_FRAGMENT(TORCH_EXTENSION_NAME, ops) {
  ops.def(
      "gated_gemm_sm90(Tensor! out, Tensor x, Tensor gate_weight, Tensor up_weight, Tensor? gate_bias, "
      "Tensor? up_bias, Tensor(a!)? pre, int activation, int block_n=0) -> ()");
  ops.impl("gated_gemm_sm90", c10::kCUDA, &fused_mlp::sm90::gated_gemm_sm90);
  ops.def(
      "dact_gemm_sm90(Tensor(a!) out, Tensor dy, Tensor weight, Tensor pre, int activation, bool gated, "
      "bool weight_kn) -> ()");
  ops.impl("dact_gemm_sm90", c10::kCUDA, &fused_mlp::sm90::dact_gemm_sm90);
  ops.def(
      "linear_act_sm90(Tensor! out, Tensor x, Tensor weight, Tensor? bias, Tensor(a!)? pre, int activation, "
      "bool weight_kn=False) -> ()");
  ops.impl("linear_act_sm90", c10::kCUDA, &fused_mlp::sm90::linear_act_sm90);
  ops.def("down_gemm_sm90(Tensor! out, Tensor h, Tensor weight, Tensor? bias, bool pdl=False) -> ()");
  ops.impl("down_gemm_sm90", c10::kCUDA, &fused_mlp::sm90::down_gemm_sm90);
  // What gated_gemm_sm90 would launch for M x N on the current device, as integers: block_n,
  // tiles, tail_split, tail_first, h_only (for inference). For tests and benchmarks: the narrow
  // tail and the kinds give the same bits as the plain loop, so only this shows they are taken.
  // No tensor argument, so no dispatch key: one kernel for every backend.
  ops.def("gated_gemm_sm90_plan(int M, int N, int block_n=0, bool training=False) -> int[]",
          &fused_mlp::sm90::gated_gemm_sm90_plan);
}
