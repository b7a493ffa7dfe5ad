"""Activation-and-multiply workloads for `kernels benchmark org/fused-mlp`.

The runner loads the kernel, calls setup_<w>, checks self.out against verify_<w>
with torch.allclose(atol=1e-2) and times benchmark_<w>.

Sizes: a decode step (16 tokens), a 2k-token prefill at Llama-2-7B's width
(11008), and an 8k-token prefill at Llama-3-8B's width (14336), all bfloat16.

About the verification: the references compute in fp32 and round once to bf16,
as fused-mlp does, so the two differ only where the fp32 values fall on either
side of a bf16 rounding boundary, by one bf16 ulp. The runner's fixed atol=1e-2
exceeds that ulp for |v| < 2; inputs are drawn with standard deviation 0.5, so
|act(gate) * up| >= 2 is rare and a boundary case among those rarer still.
(allclose needs equal dtypes, so the reference is returned as bf16.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark

SIZES = {
    "decode": (16, 14336),
    "prefill_2k": (2048, 11008),
    "prefill_8k": (8192, 14336),
}


def _gelu_tanh(t: torch.Tensor) -> torch.Tensor:
    return F.gelu(t, approximate="tanh")


class _ActAndMulWorkloads:
    """The workloads, shared by the benchmarks below, which name the op and its
    plain-PyTorch activation. Not itself a Benchmark: the runner would collect it."""

    seed: int = 42
    op_name: str = ""

    @staticmethod
    def activation(t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _setup(self, size: str) -> None:
        rows, d = SIZES[size]
        self.x = 0.5 * torch.randn(rows, 2 * d, device=self.device, dtype=torch.bfloat16)
        self.out = torch.empty(rows, d, device=self.device, dtype=torch.bfloat16)

    def _run(self) -> None:
        getattr(self.kernel, self.op_name)(self.out, self.x)

    def _reference(self) -> torch.Tensor:
        x = self.x.float()
        d = x.shape[-1] // 2
        return (type(self).activation(x[..., :d]) * x[..., d:]).to(self.x.dtype)

    def setup_decode(self):
        self._setup("decode")

    def benchmark_decode(self):
        self._run()

    def verify_decode(self) -> torch.Tensor:
        return self._reference()

    def setup_prefill_2k(self):
        self._setup("prefill_2k")

    def benchmark_prefill_2k(self):
        self._run()

    def verify_prefill_2k(self) -> torch.Tensor:
        return self._reference()

    def setup_prefill_8k(self):
        self._setup("prefill_8k")

    def benchmark_prefill_8k(self):
        self._run()

    def verify_prefill_8k(self) -> torch.Tensor:
        return self._reference()


class SiluAndMulBenchmark(_ActAndMulWorkloads, Benchmark):
    op_name = "silu_and_mul"
    activation = staticmethod(F.silu)


class GeluTanhAndMulBenchmark(_ActAndMulWorkloads, Benchmark):
    op_name = "gelu_tanh_and_mul"
    activation = staticmethod(_gelu_tanh)
