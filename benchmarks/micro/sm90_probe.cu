// Standalone timing of the sm_90a dh kernel (dact_gemm_sm90's gated kind) without torch, so
// that variants of its epilogue can be compiled on a machine without a GPU and only run on
// the device. The variants are the FUSED_MLP_SM90_* switches of gated_gemm_sm90_kernel.cuh:
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DFUSED_MLP_NO_TORCH \
//        -Ikernel_src/common -Ikernel_src/cuda [-DFUSED_MLP_SM90_DH_HELPERS=0] \
//        -o .probe/dh_base benchmarks/micro/sm90_probe.cu
//   [PROBE_HINTS=0..3] .probe/dh_base [label] [inplace | fwd]
//
// "fwd" times the gated forward kind instead (h = act(x Wg^T) * (x Wu^T), and g | u into
// pre for training): GeGLU d768 with and without pre (and with biases), SwiGLU M 4096 with
// and without pre; then the plain forward kind (act(x W1^T + b1), and x W1^T + b1 into pre
// for training) at d768; then SwiGLU M 128 and 512 (inference, 112-column tiles) and M 16384
// (inference). -DPROBE_H_ONLY=1 runs the gated shapes on the h-only kind (inference only).
// PROBE_SHAPES=swiglu_m128,geglu_d768 (environment) runs only the forward shapes named;
// PROBE_GROUP_M=n sets the row blocks that walk the columns together (Params::group_m).
//
// "tall" times the 192-row gated forward experiment (gated_fwd_tall_kernel.cuh, session 24)
// against the 128-row kind, after comparing their outputs bit for bit (run_experiment below).
// "coop" does the same for the 256 x 64 cooperative form (gated_fwd_coop_kernel.cuh, session 33).
//
// -DPROBE_DH_BN=64 times the narrow gated dh kind (128 x 128 tiles, g | u TMA-loaded; session
// 12) instead of the wide one. PROBE_MORE_K=1 (environment) adds two dh shapes with K = 1024
// and 2048, where the host's choice between the two kinds was measured.
//
// For each shape (GeGLU d768: M 8192, K 768, N 3072, gelu_tanh; SwiGLU d4096: M 4096,
// K 4096, N 14336, silu; M 777, K 200, N 1000 with partial tiles everywhere) it checks 512
// sampled outputs against a float64 host computation
// (skipped for the probe variants that do not compute the result), then times 40 runs of
// [256 MiB memset to flush L2; event; kernel; event] and prints the median and minimum.
// Short runs like these see higher clocks than a model's sustained load; PROBE_SUSTAIN_MS=3000
// (environment) runs the kernel back to back for 3 s before them and reports for the second
// half of those launches the time, energy (NVML) and mean power per launch and the SM clock:
// at the H200's 700 W limit energy per launch decides the speed (see time_us).
#include "gated_gemm_sm90_kernel.cuh"
#include "gated_fwd_coop_kernel.cuh"
#include "gated_fwd_tall_kernel.cuh"

#include <cudaTypedefs.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "tma_encode.h"

using bf16 = __nv_bfloat16;
using fused_mlp::Activation;
namespace s = fused_mlp::sm90;

// Row-major [rows, cols] bf16 as box_rows x box_cols boxes, 128-byte swizzle (as the ops do;
// swizzle false: none, for the narrow dh kind's g | u buffers).
static CUtensorMap map2d(void* base, int rows, int cols, int box_cols, int box_rows, bool swizzle = true) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  if (encode()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
    std::exit(2);
  }
  return m;
}

// Params::flags (cache hints) as the ops set them (s::gated_forward_hints for the gated
// forward, none for the other kinds); PROBE_HINTS=0/1/2/3 overrides (bit 0 evict-first stores
// of the gated forward epilogue, bit 1 evict-last TMA loads).
// PROBE_GROUP_M=n: Params::group_m (row blocks walking the columns together), else its default.
static int probe_group_m() {
  const char* v = std::getenv("PROBE_GROUP_M");
  const int g = v != nullptr ? std::atoi(v) : 0;
  return g > 0 ? g : s::kGroupM;
}

static uint32_t probe_flags(uint32_t op_default) {
  const char* v = std::getenv("PROBE_HINTS");
  return v != nullptr ? static_cast<uint32_t>(std::atoi(v)) : op_default;
}

// -DPROBE_H_ONLY=1: the gated forward shapes run the h-only kind (Epi::kGatedFwdH; inference only).
#ifndef PROBE_H_ONLY
#define PROBE_H_ONLY 0
#endif

// PROBE_SHAPES=a,b (environment): only the forward shapes whose names are in the list.
static bool shape_selected(const char* shape) {
  const char* v = std::getenv("PROBE_SHAPES");
  if (v == nullptr) return true;
  const std::string list = std::string(",") + v + ",";
  return list.find(std::string(",") + shape + ",") != std::string::npos;
}

static float bf(bf16 v) { return __bfloat162float(v); }
static double round_bf(double v) { return bf(__float2bfloat16(static_cast<float>(v))); }

static void act_grad(Activation a, double x, double& f, double& d) {
  if (a == Activation::kSilu) {
    const double sg = 1.0 / (1.0 + std::exp(-x));
    f = x * sg;
    d = sg * (1.0 + x * (1.0 - sg));
  } else {  // gelu_tanh
    const double k = 0.7978845608028654, c = 0.044715;
    const double t = std::tanh(k * (x + c * x * x * x));
    f = 0.5 * x * (1.0 + t);
    d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
  }
}

// The probe's check of one sampled output: relative error with a 0.05 floor, bad at >= 0.03.
static void check_value(double got, double want, double& worst, int& bad) {
  const double err = std::fabs(got - want) / (std::fabs(want) + 0.05);
  worst = std::max(worst, err);
  if (!(err < 0.03)) ++bad;
}

// The gated forward's g and u at (m, n) in float64 from the bf16 inputs (x [M, K], weights
// [N, K], biases [N]), each rounded to bf16 before the activation, as the kernels (and eager) do.
static void reference_gu(const std::vector<bf16>& x, const std::vector<bf16>& wg, const std::vector<bf16>& wu,
                         const std::vector<bf16>& bg, const std::vector<bf16>& bu, int K, int m, int n, double& g,
                         double& u) {
  g = bf(bg[n]);
  u = bf(bu[n]);
  for (int k = 0; k < K; ++k) {
    g += double(bf(x[size_t(m) * K + k])) * bf(wg[size_t(n) * K + k]);
    u += double(bf(x[size_t(m) * K + k])) * bf(wu[size_t(n) * K + k]);
  }
  g = round_bf(g);
  u = round_bf(u);
}

// The driver's NVML, opened at run time (no header or library needed to build): the board's
// energy counter and the SM clock, for the sustained phase of time_us. The declarations are
// NVML's C ABI (return 0 = success; energy in mJ since the driver loaded; clock type 1 = SM).
struct Nvml {
  void* dev = nullptr;
  int (*energy)(void*, unsigned long long*) = nullptr;
  int (*clock)(void*, int, unsigned int*) = nullptr;
  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == nullptr) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    auto handle = reinterpret_cast<int (*)(unsigned int, void**)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    energy = reinterpret_cast<int (*)(void*, unsigned long long*)>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    clock = reinterpret_cast<int (*)(void*, int, unsigned int*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    int cuda_dev = 0;
    if (init == nullptr || handle == nullptr || energy == nullptr || clock == nullptr || init() != 0 ||
        cudaGetDevice(&cuda_dev) != cudaSuccess || handle(unsigned(cuda_dev), &dev) != 0)
      dev = nullptr;  // (the NVML index is taken to be the CUDA one: one GPU on the device)
  }
  double millijoules() const {
    unsigned long long mj = 0;
    return dev != nullptr && energy(dev, &mj) == 0 ? double(mj) : -1.0;
  }
  unsigned sm_mhz() const {
    unsigned int mhz = 0;
    return dev != nullptr && clock(dev, 1, &mhz) == 0 ? mhz : 0u;
  }
};

// What the sustained phase of the last time_us measured (n == 0: none ran).
struct Sustained {
  int n = 0;
  double us_per_launch = 0, mj_per_launch = -1, watts = -1;
  unsigned sm_mhz = 0;
};
static Sustained g_sustained;

// " | sustained <launches>: <us>, <mJ>, <W>, SM <MHz>" for the probe's line, or nothing.
static std::string sustained_text() {
  const Sustained& s = g_sustained;
  if (s.n == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, " | sustained %d: %.1f us, %.2f mJ, %.0f W, SM %u MHz", s.n, s.us_per_launch,
                s.mj_per_launch, s.watts, s.sm_mhz);
  return buf;
}

// 40 timed launches (after 3 warm-up ones) of [256 MiB memset to flush L2; event; launch;
// event]: median and minimum in us.
template <typename Launch>
static std::pair<double, double> time_us(Launch launch) {
  void* flush;
  const size_t flush_bytes = size_t(256) << 20;
  CK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  // PROBE_SUSTAIN_MS=n (environment): first n ms of launches back to back, so that the timed
  // runs see the clock the GPU holds at its power limit under sustained load (~1.45 GHz for
  // these GEMMs on the H200, against up to 1.98 in short bursts; NOTES, session 14).
  // The second half of them is measured: time per launch (events), energy per launch and
  // mean power (NVML's energy counter; -1 where NVML is missing) and the SM clock at its end.
  g_sustained = Sustained{};
  if (const char* sustain = std::getenv("PROBE_SUSTAIN_MS")) {
    static const Nvml nvml;
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float one = 0.0f;
    CK(cudaEventElapsedTime(&one, e0, e1));
    const int n = std::max(2, int(std::atof(sustain) / std::max(one, 1e-3f)));
    for (int i = 0; i < n / 2; ++i) launch();
    CK(cudaDeviceSynchronize());
    const double mj0 = nvml.millijoules();
    CK(cudaEventRecord(e0));
    for (int i = n / 2; i < n; ++i) launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    const double mj1 = nvml.millijoules();
    float ms_total = 0.0f;
    CK(cudaEventElapsedTime(&ms_total, e0, e1));
    Sustained& s = g_sustained;
    s.n = n - n / 2;
    s.us_per_launch = ms_total * 1e3 / s.n;
    if (mj0 >= 0 && mj1 >= 0) {
      s.mj_per_launch = (mj1 - mj0) / s.n;
      s.watts = (mj1 - mj0) / ms_total;
    }
    s.sm_mhz = nvml.sm_mhz();
  }
  for (int r = 0; r < 43; ++r) {
    CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (r >= 3) ms.push_back(t);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(flush));
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2] * 1e3, ms[0] * 1e3};
}

// Under -DFUSED_MLP_SM90_PROBE_CLOCKS=1: the mean over CTAs of each ClockSlot of the kernel
// header (cycles waited per role and barrier, and each role's whole time), from the last timed
// launch, in us at the GPU's maximum SM clock; then frees the counters (attach_clocks).
[[maybe_unused]] static void print_clocks(const char* label, const char* shape, const unsigned long long* d_clk, int grid) {
  std::vector<unsigned long long> clk(size_t(grid) * s::kClockSlots);
  CK(cudaMemcpy(clk.data(), d_clk, clk.size() * 8, cudaMemcpyDeviceToHost));
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const char* names[s::kClockSlots] = {"producer<-empty", "mma<-full", "mma<-freed", "mma total",
                                       "epi<-staged",     "epi<-gu",   "loader<-empty", "epi total"};
  std::printf("[clocks] %-22s %-14s", label, shape);
  for (int slot = 0; slot < s::kClockSlots; ++slot) {
    double sum = 0.0;
    for (int b = 0; b < grid; ++b) sum += double(clk[size_t(b) * s::kClockSlots + slot]);
    std::printf("  %s %.1f", names[slot], sum / grid / (khz * 1e-3));
  }
  // How evenly the CTAs finish: MMA group 1's whole time per CTA (each CTA's clock starts with
  // it, and at most one wave runs), its least, median and largest value.
  std::vector<double> total;
  for (int b = 0; b < grid; ++b) total.push_back(double(clk[size_t(b) * s::kClockSlots + s::kClkMmaTotal]));
  std::sort(total.begin(), total.end());
  std::printf("  mma total per CTA min / median / max %.1f / %.1f / %.1f", total.front() / (khz * 1e-3),
              total[total.size() / 2] / (khz * 1e-3), total.back() / (khz * 1e-3));
  std::printf(" (us)\n");
  CK(cudaFree(const_cast<unsigned long long*>(d_clk)));
}

#if FUSED_MLP_SM90_PROBE_CLOCKS
// A zeroed buffer of grid x kClockSlots counters for the kernel's per-role clocks, set in p.
static unsigned long long* attach_clocks(s::Params& p, int grid) {
  unsigned long long* d_clk;
  CK(cudaMalloc(&d_clk, size_t(grid) * s::kClockSlots * 8));
  CK(cudaMemset(d_clk, 0, size_t(grid) * s::kClockSlots * 8));
  p.clocks = d_clk;
  return d_clk;
}
#endif

// BN: 128 (the wide dh kind) or 64 (the narrow one, 128 x 128 tiles: PROBE_DH_BN=64 at build).
#ifndef PROBE_DH_BN
#define PROBE_DH_BN 128
#endif
template <Activation A>
static void run(const char* label, const char* shape, int M, int K, int N, bool inplace) {
  constexpr int BN = PROBE_DH_BN;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<bf16> dy(size_t(M) * K), w(size_t(K) * N), pre(size_t(M) * 2 * N);
  const float ws = 1.0f / std::sqrt(float(K));
  for (auto& v : dy) v = __float2bfloat16(nd(rng));
  for (auto& v : w) v = __float2bfloat16(nd(rng) * ws);
  for (auto& v : pre) v = __float2bfloat16(nd(rng));
  bf16 *d_dy, *d_w, *d_pre, *d_out;
  CK(cudaMalloc(&d_dy, dy.size() * 2));
  CK(cudaMalloc(&d_w, w.size() * 2));
  CK(cudaMalloc(&d_pre, pre.size() * 2));
  CK(cudaMalloc(&d_out, pre.size() * 2));
  CK(cudaMemcpy(d_dy, dy.data(), dy.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_w, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_pre, pre.data(), pre.size() * 2, cudaMemcpyHostToDevice));
  const CUtensorMap md = map2d(d_dy, M, K, s::kBK, s::kBM);
  const CUtensorMap mw = map2d(d_w, K, N, 64, s::kBK);
  // the narrow kind's third map: pre as [M, 2N], 2 BN x kGuRows boxes, no swizzle
  const CUtensorMap mp = map2d(d_pre, M, 2 * N, 2 * BN, s::kGuRows, false);
  s::Params p{};
  p.out = inplace ? d_pre : d_out;  // in place: out = pre, as the training backward calls it
  p.pre = d_pre;
  p.ldo = p.ldp = 2 * N;
  p.M = M;
  p.N = N;
  p.K = K;
  p.tiles_m = (M + s::kBM - 1) / s::kBM;
  p.tiles_n = (N + 2 * BN - 1) / (2 * BN);
  p.group_m = probe_group_m();
  p.flags = probe_flags(0);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto kernel = s::gated_gemm_kernel<bf16, A, BN, s::Epi::kGatedDh, true>;
  constexpr int kSmem = s::KindLayout<s::Epi::kGatedDh, BN>::kSmemBytes;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int grid = std::min(p.tiles_m * p.tiles_n, sms);
#if FUSED_MLP_SM90_PROBE_CLOCKS
  unsigned long long* d_clk = attach_clocks(p, grid);
#endif

  if (!inplace) CK(cudaMemset(d_out, 0xff, pre.size() * 2));  // NaN poison
  kernel<<<grid, s::threads<s::Epi::kGatedDh, BN>(), kSmem>>>(md, mw, mp, mw, mp, p);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  int bad = 0;
  double worst = 0.0;
  if (FUSED_MLP_SM90_PROBE == 0) {
    std::vector<bf16> out(pre.size());
    CK(cudaMemcpy(out.data(), p.out, out.size() * 2, cudaMemcpyDeviceToHost));
    std::uniform_int_distribution<int> um(0, M - 1), un(0, N - 1);
    for (int i = 0; i < 512; ++i) {
      const int m = um(rng), n = un(rng);
      double dh = 0.0;
      for (int k = 0; k < K; ++k) dh += double(bf(dy[size_t(m) * K + k])) * bf(w[size_t(k) * N + n]);
      dh = round_bf(dh);  // the kernel rounds dh to bf16 in its staging tile
      const double g = bf(pre[size_t(m) * 2 * N + n]), u = bf(pre[size_t(m) * 2 * N + N + n]);
      double f, d;
      act_grad(A, g, f, d);
      const double want[2] = {dh * u * d, dh * f};
      const double got[2] = {bf(out[size_t(m) * 2 * N + n]), bf(out[size_t(m) * 2 * N + N + n])};
      for (int j = 0; j < 2; ++j) check_value(got[j], want[j], worst, bad);
    }
  }

  const auto [med, lo] = time_us([&] { kernel<<<grid, s::threads<s::Epi::kGatedDh, BN>(), kSmem>>>(md, mw, mp, mw, mp, p); });
  const double flops = 2.0 * M * K * double(N), bytes = 2.0 * (2.0 * M * 2.0 * N + double(M) * K + double(K) * N);
  std::printf("[probe] %-22s %-14s %s median %7.1f us  min %7.1f  %6.1f TFLOP/s  %5.2f TB/s  check %s (worst %.4f)%s\n",
              label, shape, inplace ? "in place" : "        ", med, lo, flops / med * 1e-6, bytes / med * 1e-6,
              FUSED_MLP_SM90_PROBE == 0 ? (bad == 0 ? "ok" : "FAIL") : "skipped", worst, sustained_text().c_str());
#if FUSED_MLP_SM90_PROBE_CLOCKS
  print_clocks(label, shape, d_clk, grid);  // and frees d_clk
#endif
  cudaFree(d_dy);
  cudaFree(d_w);
  cudaFree(d_pre);
  cudaFree(d_out);
}

// The forward kinds. Gated: x [M, K], Wg and Wu [N, K] (nn.Linear), h [M, N], pre [M, 2N]
// (g | u) if train. Plain: x [M, K], W1 [N, K] (in wg), out = act(x W1^T + b1) [M, N], pre
// [M, N] (x W1^T + b1) if train.
template <Activation A, bool Plain = false, int BN = 128>
static void run_fwd(const char* label, const char* shape, int M, int K, int N, bool train, bool bias) {
  if (!shape_selected(shape)) return;
  if (PROBE_H_ONLY && train && !Plain) return;  // the h-only kind: inference only
  const int pre_cols = Plain ? N : 2 * N;
  std::mt19937 rng(4321);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<bf16> x(size_t(M) * K), wg(size_t(N) * K), wu(size_t(N) * K);
  const float ws = 1.0f / std::sqrt(float(K));
  // PROBE_X_ZERO=1 (environment): x all zeros (the same traffic, idle multipliers: how much of
  // a launch's energy the operands' values decide; NOTES, session 24).
  const bool x_zero = std::getenv("PROBE_X_ZERO") != nullptr;
  for (auto& v : x) v = __float2bfloat16(x_zero ? 0.0f : nd(rng));
  for (auto& v : wg) v = __float2bfloat16(nd(rng) * ws);
  for (auto& v : wu) v = __float2bfloat16(nd(rng) * ws);
  std::vector<bf16> bg(N), bu(N);
  for (int n = 0; n < N; ++n) {
    bg[n] = __float2bfloat16(bias ? nd(rng) : 0.0f);
    bu[n] = __float2bfloat16(bias ? nd(rng) : 0.0f);
  }
  bf16 *d_x, *d_wg, *d_wu, *d_h, *d_pre = nullptr, *d_bg, *d_bu;
  CK(cudaMalloc(&d_bg, size_t(N) * 2));
  CK(cudaMalloc(&d_bu, size_t(N) * 2));
  CK(cudaMemcpy(d_bg, bg.data(), size_t(N) * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_bu, bu.data(), size_t(N) * 2, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&d_x, x.size() * 2));
  CK(cudaMalloc(&d_wg, wg.size() * 2));
  CK(cudaMalloc(&d_wu, wu.size() * 2));
  CK(cudaMalloc(&d_h, size_t(M) * N * 2));
  if (train) CK(cudaMalloc(&d_pre, size_t(M) * pre_cols * 2));
  CK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_wg, wg.data(), wg.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_wu, wu.data(), wu.size() * 2, cudaMemcpyHostToDevice));
  const CUtensorMap mx = map2d(d_x, M, K, s::kBK, s::kBM);
  const CUtensorMap mg = map2d(d_wg, N, K, s::kBK, BN);
  const CUtensorMap mu = Plain ? mg : map2d(d_wu, N, K, s::kBK, BN);
  s::Params p{};
  p.out = d_h;
  p.pre = d_pre;
  p.bg = bias ? d_bg : nullptr;
  p.bu = bias ? (Plain ? d_bg : d_bu) : nullptr;  // plain: both halves of a tile read b1
  p.ldo = N;
  p.ldp = pre_cols;
  p.M = M;
  p.N = N;
  p.K = K;
  p.tiles_m = (M + s::kBM - 1) / s::kBM;
  p.tiles_n = (N + (Plain ? 2 * BN : BN) - 1) / (Plain ? 2 * BN : BN);
  p.group_m = probe_group_m();
  p.flags = probe_flags(Plain ? 0u : s::gated_forward_hints(train, 2 * (int64_t(M) * K + 2 * int64_t(N) * K)));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr s::Epi kKind = Plain ? s::Epi::kPlainFwd : PROBE_H_ONLY ? s::Epi::kGatedFwdH : s::Epi::kGatedFwd;
  auto kernel = s::gated_gemm_kernel<bf16, A, BN, kKind, false>;
  constexpr int kSmem = s::KindLayout<kKind, BN>::kSmemBytes;
  constexpr int kThreadsFwd = s::threads<kKind, BN>();
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  constexpr bool kPair = s::paired<kKind>();
  const int loop = s::loop_tiles<kKind>(p);
  int grid = std::min(loop, sms);
  // CLUSTER=2: clusters of two CTAs, as many as can be resident at once (the loop is persistent)
  cudaLaunchAttribute cluster_attr{};
  cluster_attr.id = cudaLaunchAttributeClusterDimension;
  cluster_attr.val.clusterDim.x = 2;
  cluster_attr.val.clusterDim.y = 1;
  cluster_attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(kThreadsFwd);
  cfg.dynamicSmemBytes = kSmem;
  cfg.attrs = &cluster_attr;
  cfg.numAttrs = 1;
  if (kPair) {
    cfg.gridDim = dim3(2 * sms);
    int clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
    grid = 2 * std::min(loop / 2, clusters);
    std::printf("[probe] clusters of 2: %d resident, grid %d\n", clusters, grid);
  }
  cfg.gridDim = dim3(grid);
  const auto launch = [&] {
    if (kPair) CK(cudaLaunchKernelEx(&cfg, kernel, mx, mg, mu, mg, mu, p));
    else kernel<<<grid, kThreadsFwd, kSmem>>>(mx, mg, mu, mg, mu, p);
  };
#if FUSED_MLP_SM90_PROBE_CLOCKS
  unsigned long long* d_clk = attach_clocks(p, grid);
#endif
  CK(cudaMemset(d_h, 0xff, size_t(M) * N * 2));  // NaN poison
  if (train) CK(cudaMemset(d_pre, 0xff, size_t(M) * pre_cols * 2));
  launch();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  int bad = 0;
  double worst = 0.0;
  if (FUSED_MLP_SM90_PROBE == 0) {
    std::vector<bf16> h(size_t(M) * N), pre(train ? size_t(M) * pre_cols : 0);
    CK(cudaMemcpy(h.data(), d_h, h.size() * 2, cudaMemcpyDeviceToHost));
    if (train) CK(cudaMemcpy(pre.data(), d_pre, pre.size() * 2, cudaMemcpyDeviceToHost));
    std::uniform_int_distribution<int> um(0, M - 1), un(0, N - 1);
    for (int i = 0; i < 512; ++i) {
      const int m = um(rng), n = un(rng);
      double g, u;
      reference_gu(x, wg, wu, bg, bu, K, m, n, g, u);
      double f, d;
      act_grad(A, g, f, d);
      std::vector<std::pair<double, double>> pairs = {{bf(h[size_t(m) * N + n]), Plain ? f : f * u}};
      if (train) {
        pairs.push_back({bf(pre[size_t(m) * pre_cols + n]), g});
        if (!Plain) pairs.push_back({bf(pre[size_t(m) * 2 * N + N + n]), u});
      }
      for (const auto& [got, want] : pairs) check_value(got, want, worst, bad);
    }
  }
  const auto [med, lo] = time_us(launch);
  const double flops = (Plain ? 2.0 : 4.0) * M * K * double(N);
  std::printf("[probe] %-22s %-14s %s%s median %7.1f us  min %7.1f  %6.1f TFLOP/s  check %s (worst %.4f)%s\n", label,
              shape, Plain ? (train ? "plain train" : "plain      ") : (train ? "fwd train  " : "fwd        "), bias ? " bias" : "     ", med, lo, flops / med * 1e-6,
              FUSED_MLP_SM90_PROBE == 0 ? (bad == 0 ? "ok" : "FAIL") : "skipped", worst, sustained_text().c_str());
#if FUSED_MLP_SM90_PROBE_CLOCKS
  print_clocks(label, shape, d_clk, grid);  // and frees d_clk
#endif
  cudaFree(d_x);
  cudaFree(d_wg);
  cudaFree(d_wu);
  cudaFree(d_h);
  if (d_pre) cudaFree(d_pre);
  cudaFree(d_bg);
  cudaFree(d_bu);
}

// "tall" mode: the 192-row gated forward (gated_fwd_tall_kernel.cuh, inference) against the
// 128-row kind the op runs there (kGatedFwd, BN 128): every output compared bit for bit, 512
// sampled against float64, then both timed (and sustained under PROBE_SUSTAIN_MS).
// PROBE_TALL_GROUP_M=n: the tall kernel's row blocks per group (default 11: 2112 rows of x, about
// the 128-row kernel's 16 x 128).
// "coop" mode (kCoop): the same for the 256 x 64 cooperative form (gated_fwd_coop_kernel.cuh);
// PROBE_COOP_GROUP_M=n its row blocks per group (default 8: 2048 rows of x, as the 128-row kernel's).
// kCoopBN: 0 for the tall kernel, else the coop form's tile width (64, 80 or 96).
template <Activation A, int kCoopBN = 0>
static void run_experiment(const char* label, const char* shape, int M, int K, int N, bool bias) {
  constexpr bool kCoop = kCoopBN != 0;
  constexpr int kCoopW = kCoop ? kCoopBN : 64;
  if (!shape_selected(shape)) return;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<bf16> x(size_t(M) * K), wg(size_t(N) * K), wu(size_t(N) * K), bg(N), bu(N);
  const float ws = 1.0f / std::sqrt(float(K));
  for (auto& v : x) v = __float2bfloat16(nd(rng));
  for (auto& v : wg) v = __float2bfloat16(nd(rng) * ws);
  for (auto& v : wu) v = __float2bfloat16(nd(rng) * ws);
  for (int n = 0; n < N; ++n) {
    bg[n] = __float2bfloat16(bias ? nd(rng) : 0.0f);
    bu[n] = __float2bfloat16(bias ? nd(rng) : 0.0f);
  }
  bf16 *d_x, *d_wg, *d_wu, *d_h, *d_ref, *d_bg, *d_bu;
  const auto upload = [](bf16** d, const std::vector<bf16>& h) {
    CK(cudaMalloc(d, h.size() * 2));
    CK(cudaMemcpy(*d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  };
  upload(&d_x, x);
  upload(&d_wg, wg);
  upload(&d_wu, wu);
  upload(&d_bg, bg);
  upload(&d_bu, bu);
  CK(cudaMalloc(&d_h, size_t(M) * N * 2));
  CK(cudaMalloc(&d_ref, size_t(M) * N * 2));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  s::Params p{};
  p.bg = bias ? d_bg : nullptr;
  p.bu = bias ? d_bu : nullptr;
  p.ldo = N;
  p.M = M;
  p.N = N;
  p.K = K;
  p.flags = probe_flags(s::gated_forward_hints(false, 2 * (int64_t(M) * K + 2 * int64_t(N) * K)));
  // the 128-row kind, as the op launches it for inference at these sizes
  s::Params pr = p;
  pr.out = d_ref;
  pr.tiles_m = (M + s::kBM - 1) / s::kBM;
  pr.tiles_n = (N + 127) / 128;
  pr.group_m = probe_group_m();
  const CUtensorMap rx = map2d(d_x, M, K, s::kBK, s::kBM), rg = map2d(d_wg, N, K, s::kBK, 128),
                    ru = map2d(d_wu, N, K, s::kBK, 128);
  auto ref_kernel = s::gated_gemm_kernel<bf16, A, 128, s::Epi::kGatedFwd, false>;
  constexpr int kRefSmem = s::KindLayout<s::Epi::kGatedFwd, 128>::kSmemBytes;
  constexpr int kRefThreads = s::threads<s::Epi::kGatedFwd, 128>();
  CK(cudaFuncSetAttribute(ref_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRefSmem));
  const int ref_grid = std::min(pr.tiles_m * pr.tiles_n, sms);
  const auto launch_ref = [&] { ref_kernel<<<ref_grid, kRefThreads, kRefSmem>>>(rx, rg, ru, rg, ru, pr); };
  // the experiment's kernel (tall, or coop)
  constexpr int kBM = kCoop ? s::kCoopBM : s::kTallBM, kBN = kCoop ? kCoopW : s::kTallBN;
  constexpr int kThreads = kCoop ? s::kCoopThreads : s::kTallThreads;
  constexpr int kExpSmem = kCoop ? s::CoopLayout<kCoopW>::kSmemBytes : s::TallLayout::kSmemBytes;
  const char* kName = !kCoop ? "192-row" : kCoopW == 64 ? "256x64 " : kCoopW == 80 ? "256x80 " : "256x96 ";
  s::Params pt = p;
  pt.out = d_h;
  pt.tiles_m = (M + kBM - 1) / kBM;
  pt.tiles_n = (N + kBN - 1) / kBN;
  const char* gm = std::getenv(kCoop ? "PROBE_COOP_GROUP_M" : "PROBE_TALL_GROUP_M");
  pt.group_m = gm != nullptr ? std::max(1, std::atoi(gm)) : (kCoop ? 8 : 11);
  // (th: the TMA store's map; the coop kernels with 80 or 96 columns store h without it)
  const CUtensorMap tx = map2d(d_x, M, K, s::kBK, kBM), th = map2d(d_h, M, N, 64, kCoop ? s::kCoopStoreRows : kBM);
  // the weights in boxes of the experiment's tile width (the 128-row kind's are 128 rows)
  const CUtensorMap tg = kBN == 128 ? rg : map2d(d_wg, N, K, s::kBK, kBN), tu = kBN == 128 ? ru : map2d(d_wu, N, K, s::kBK, kBN);
  auto exp_kernel = kCoop ? s::gated_fwd_coop_kernel<bf16, A, kCoopW> : s::gated_fwd_tall_kernel<bf16, A>;
  CK(cudaFuncSetAttribute(exp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kExpSmem));
  const int exp_grid = std::min(pt.tiles_m * pt.tiles_n, sms);
#if FUSED_MLP_SM90_PROBE_CLOCKS
  unsigned long long* d_clk = attach_clocks(pt, exp_grid);
  unsigned long long* d_rclk = attach_clocks(pr, ref_grid);
#endif
  const auto launch_exp = [&] { exp_kernel<<<exp_grid, kThreads, kExpSmem>>>(tx, tg, tu, th, pt); };

  CK(cudaMemset(d_h, 0xff, size_t(M) * N * 2));  // NaN poison
  CK(cudaMemset(d_ref, 0xff, size_t(M) * N * 2));
  launch_ref();
  launch_exp();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<bf16> h(size_t(M) * N), ref(size_t(M) * N);
  CK(cudaMemcpy(h.data(), d_h, h.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ref.data(), d_ref, ref.size() * 2, cudaMemcpyDeviceToHost));
  size_t differ = 0;
  for (size_t i = 0; i < h.size(); ++i)
    differ += reinterpret_cast<const uint16_t*>(h.data())[i] != reinterpret_cast<const uint16_t*>(ref.data())[i];
  int bad = 0;
  double worst = 0.0;
  std::uniform_int_distribution<int> um(0, M - 1), un(0, N - 1);
  for (int i = 0; i < 512; ++i) {
    const int m = i < 8 ? M - 1 - i % std::min(M, 4) : um(rng), n = i < 8 ? N - 1 - i / 4 : un(rng);
    double g, u;
    reference_gu(x, wg, wu, bg, bu, K, m, n, g, u);
    double f, d;
    act_grad(A, g, f, d);
    check_value(bf(h[size_t(m) * N + n]), f * u, worst, bad);
  }
  const auto [rmed, rlo] = time_us(launch_ref);
  const std::string ref_sus = sustained_text();
  const auto [tmed, tlo] = time_us(launch_exp);
  const std::string exp_sus = sustained_text();
  const double flops = 4.0 * M * K * double(N);
  std::printf("[probe] %-22s %-14s %s%s bits %s (%zu differ)  check %s (worst %.4f)\n", label, shape,
              kCoop ? "coop" : "tall", bias ? " bias" : "     ", differ == 0 ? "same" : "DIFFER", differ,
              bad == 0 ? "ok" : "FAIL", worst);
  std::printf("[probe] %-22s %-14s 128-row median %7.1f us  min %7.1f  %6.1f TFLOP/s%s\n", label, shape, rmed, rlo,
              flops / rmed * 1e-6, ref_sus.c_str());
  std::printf("[probe] %-22s %-14s %s median %7.1f us  min %7.1f  %6.1f TFLOP/s%s\n", label, shape, kName, tmed,
              tlo, flops / tmed * 1e-6, exp_sus.c_str());
#if FUSED_MLP_SM90_PROBE_CLOCKS
  // the 128-row kind's slots as named; the tall kernel's: producer<-empty = thread 0's waits for
  // empty stages, mma<-full / mma<-freed / epi<-gu = the full waits of threads 0 / 128 / 256, mma
  // total = thread 0's time, epi<-staged = its hand-offs, loader<-empty = its wgmma_wait<1>.
  print_clocks("128-row", shape, d_rclk, ref_grid);
  print_clocks(kName, shape, d_clk, exp_grid);
#endif
  for (bf16* d : {d_x, d_wg, d_wu, d_h, d_ref, d_bg, d_bu}) cudaFree(d);
}

int main(int argc, char** argv) {
  const char* label = argc > 1 ? argv[1] : "variant";
  // "tall" and "coop" modes: the four shapes, the experiment's kernel against the 128-row kind
  // (kCoopBN 0: the tall kernel; m64_bias: biases at M 64, which the tall mode ran without)
  const auto experiment = [&](auto coop_bn, bool m64_bias) {
    constexpr int W = decltype(coop_bn)::value;
    run_experiment<Activation::kSilu, W>(label, "odd_m777_n1000", 777, 200, 1000, true);  // partial tiles everywhere
    run_experiment<Activation::kGeluTanh, W>(label, "m64_n264", 64, 72, 264, m64_bias);   // one row group active
    run_experiment<Activation::kSilu, W>(label, "swiglu_m4096", 4096, 4096, 14336, false);
    run_experiment<Activation::kSilu, W>(label, "swiglu_m16384", 16384, 4096, 14336, false);
  };
  if (argc > 2 && std::string(argv[2]) == "coop") {
    // PROBE_COOP_BN=64 / 80 / 96 (environment): the tile width (default 64)
    const char* bn = std::getenv("PROBE_COOP_BN");
    const int w = bn != nullptr ? std::atoi(bn) : 64;
    if (w == 64) experiment(std::integral_constant<int, 64>{}, true);
    else if (w == 80) experiment(std::integral_constant<int, 80>{}, true);
    else if (w == 96) experiment(std::integral_constant<int, 96>{}, true);
    else {
      std::fprintf(stderr, "PROBE_COOP_BN must be 64, 80 or 96, got '%s'\n", bn);
      return 2;
    }
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "tall") {
    experiment(std::integral_constant<int, 0>{}, false);
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "fwd") {
    run_fwd<Activation::kGeluTanh>(label, "geglu_d768", 8192, 768, 3072, true, false);
    run_fwd<Activation::kGeluTanh>(label, "geglu_d768", 8192, 768, 3072, false, false);
    run_fwd<Activation::kGeluTanh>(label, "geglu_d768", 8192, 768, 3072, true, true);
    run_fwd<Activation::kSilu>(label, "swiglu_m4096", 4096, 4096, 14336, true, false);
    run_fwd<Activation::kSilu>(label, "swiglu_m4096", 4096, 4096, 14336, false, false);
    run_fwd<Activation::kGeluTanh, true>(label, "mlp_d768", 8192, 768, 3072, false, true);
    run_fwd<Activation::kGeluTanh, true>(label, "mlp_d768", 8192, 768, 3072, true, true);
    // the weight-streaming shapes, with the 112-column tiles the op picks there
    run_fwd<Activation::kSilu, false, 112>(label, "swiglu_m128", 128, 4096, 14336, false, false);
    run_fwd<Activation::kSilu, false, 112>(label, "swiglu_m512", 512, 4096, 14336, false, false);
    run_fwd<Activation::kSilu>(label, "swiglu_m16384", 16384, 4096, 14336, false, false);
    return 0;
  }
  const bool inplace = argc > 2 && std::string(argv[2]) == "inplace";
  run<Activation::kGeluTanh>(label, "geglu_d768", 8192, 768, 3072, inplace);
  run<Activation::kSilu>(label, "swiglu_m4096", 4096, 4096, 14336, inplace);
  run<Activation::kSilu>(label, "swiglu_m512", 512, 4096, 14336, inplace);
  run<Activation::kGeluTanh>(label, "odd_m777_n1000", 777, 200, 1000, inplace);  // partial tiles everywhere
  if (std::getenv("PROBE_MORE_K") != nullptr) {  // where the narrow kind stops paying (NOTES, session 12)
    run<Activation::kSilu>(label, "d1024_h4096", 8192, 1024, 4096, inplace);
    run<Activation::kSilu>(label, "d2048_h5632", 8192, 2048, 5632, inplace);
  }
  return 0;
}
