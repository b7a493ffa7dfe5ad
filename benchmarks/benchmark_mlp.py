"""Benchmarks for `kernels benchmark org/fused-mlp` (kernels.benchmark.Benchmark).

Each workload has setup_X (inputs), benchmark_X (the timed call, writing self.out)
and verify_X (the reference, which the runner compares with self.out at atol=1e-2, and
times: its "Speedup" column is the reference's time over ours).

The reference is the eager PyTorch MLP in the inputs' dtype (bf16), the code fused-mlp
replaces, so that "Speedup" reads as the speedup over eager PyTorch; an fp32 reference
would make it a speedup over fp32 GEMMs. The weights are scaled so that outputs have a
standard deviation of about 0.06, where a bf16 unit in the last place is 2^-12 and the two
differ by a few of them (rounding order), far inside the runner's atol. The project's
correctness tests check against float64 (tests/).
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark


def _gated_inputs(bench, m, d, h, dtype=torch.bfloat16):
    dev = bench.device
    bench.x = torch.randn(m, d, device=dev, dtype=dtype)
    bench.wg = torch.randn(h, d, device=dev, dtype=dtype) * d**-0.5
    bench.wu = torch.randn(h, d, device=dev, dtype=dtype) * d**-0.5
    bench.wd = torch.randn(d, h, device=dev, dtype=dtype) * (0.1 * h**-0.5)
    bench.out = torch.empty(m, d, device=dev, dtype=dtype)


def _gated_reference(bench, act):
    x, wg, wu, wd = bench.x, bench.wg, bench.wu, bench.wd
    return F.linear(act(F.linear(x, wg)) * F.linear(x, wu), wd)


def _gelu_tanh(t):
    return F.gelu(t, approximate="tanh")


class GeGLUMLPBenchmark(Benchmark):
    """Gemma / GPT-style GeGLU MLP: down(gelu_tanh(gate(x)) * up(x))."""

    seed: int = 42

    def setup_d768_m8192(self):
        _gated_inputs(self, 8192, 768, 3072)

    def benchmark_d768_m8192(self):
        self.out = self.kernel.gated_mlp(self.x, self.wg, self.wu, self.wd, "gelu_tanh")

    def verify_d768_m8192(self) -> torch.Tensor:
        return _gated_reference(self, _gelu_tanh)

    def setup_d2048_m4096(self):
        _gated_inputs(self, 4096, 2048, 16384)

    def benchmark_d2048_m4096(self):
        self.out = self.kernel.gated_mlp(self.x, self.wg, self.wu, self.wd, "gelu_tanh")

    def verify_d2048_m4096(self) -> torch.Tensor:
        return _gated_reference(self, _gelu_tanh)


class SwiGLUMLPBenchmark(Benchmark):
    """Llama-style SwiGLU MLP: down(silu(gate(x)) * up(x)), Llama-3-8B sizes."""

    seed: int = 42

    def setup_m512(self):
        _gated_inputs(self, 512, 4096, 14336)

    def benchmark_m512(self):
        self.out = self.kernel.gated_mlp(self.x, self.wg, self.wu, self.wd, "silu")

    def verify_m512(self) -> torch.Tensor:
        return _gated_reference(self, F.silu)

    def setup_m4096(self):
        _gated_inputs(self, 4096, 4096, 14336)

    def benchmark_m4096(self):
        self.out = self.kernel.gated_mlp(self.x, self.wg, self.wu, self.wd, "silu")

    def verify_m4096(self) -> torch.Tensor:
        return _gated_reference(self, F.silu)

    def setup_packed_m4096(self):
        _gated_inputs(self, 4096, 4096, 14336)
        self.wgu = torch.cat([self.wg, self.wu])  # Phi-3 style packed gate_up

    def benchmark_packed_m4096(self):
        self.out = self.kernel.gated_mlp_packed(self.x, self.wgu, self.wd, "silu")

    def verify_packed_m4096(self) -> torch.Tensor:
        return _gated_reference(self, F.silu)
