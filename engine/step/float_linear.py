"""Float32 linear layers on the CPU that send a few rows of activations through the native kernel
(:file:`kernels/float_linear.cpp`) and many through torch's gemm.

A decode step has one row per reply, and speculative decoding's check of a k-token draft has k + 1. torch's CPU
gemm reads the weights at well under half its one-row speed for two to sixty-four rows (the default model's
49152 x 576 output head on AMD EPYC: 13 GB/s for one row, 4 to 6 for two to sixty-four), so a check of a few
rows cost as much as several plain steps. The kernel reads each weight once per step whatever the rows (25 GB/s
for one row, 20 for four, 8 for thirty-two), and a row's result does not depend on the rows beside it, so a
reply's check computes exactly what its plain step does. The AVX-512 build holds six rows' sums in its 32
registers where AVX2 holds three: every weight of the default model (537 MB) times six rows took 17-20 ms on AMD
EPYC against 24-26 ms for the AVX2 build on the same machine (13-15 ms for one row in either). Prefill (many
rows) keeps the gemm, which is as fast or faster from about a hundred rows. The rounding differs from torch's
(both sum in float32, in another order): relative differences of about 1e-7 in each output, the tolerance
tests/engine/test_native_kernels.py holds the kernel to.
"""

from __future__ import annotations

import torch
from torch import nn

from . import kernels

# up to this many rows go to the kernel: faster than the gemm for 1 to 64 rows of every shape of the default model
# on AMD EPYC (AVX2), even or slower from 96 (python -m engine.tools.float_linear_bench)
FEW_ROWS = 64


class FewRowsLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters, same state dict) whose calls with few rows use the native kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        if rows > FEW_ROWS or rows == 0 or x.dtype != torch.float32 or x.device.type != "cpu" or x.requires_grad:
            return super().forward(x)
        out = torch.ops.kvasir_kernels.float_linear(x.reshape(rows, x.shape[-1]), self.weight, self.bias)
        return out.view(*x.shape[:-1], self.out_features)


def use_few_rows_kernel(model: nn.Module, device: torch.device) -> int:
    """Make every float32 ``nn.Linear`` of ``model`` on the CPU a :class:`FewRowsLinear` (the head included, tied
    or not: the parameters stay where they are); returns how many. Nothing changes on CUDA or without the native
    kernels."""
    if device.type != "cpu" or not kernels.available():
        return 0
    changed = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.float32:
            module.__class__ = FewRowsLinear
            changed += 1
    return changed
