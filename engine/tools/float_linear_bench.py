"""What a float32 linear layer costs on this CPU for 1 to 128 rows of activations: torch's gemm against the native
few-rows kernel, on the default model's shapes: ``python -m engine.tools.float_linear_bench``.

Each shape has enough copies of its weight (200 MB in all) that every call reads its weights from memory, as a
decode step does; a line gives both times, the weight bytes read per second, and the ratio. The choice of
:data:`engine.step.float_linear.FEW_ROWS` comes from this.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = {"output head": (49152, 576), "MLP gate/up": (1536, 576), "MLP down": (576, 1536), "attention": (576, 576)}
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
COPIES_BYTES = 200e6


def best_time(call, weights, repeats: int) -> float:
    """The best of ``repeats`` passes over every copy, per call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for weight in weights:
            call(weight)
        best = min(best, (time.perf_counter() - start) / len(weights))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.float_linear_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    from ..devices import cpu_name
    from ..step import kernels

    if not kernels.available():
        print(f"the native kernels are not available: {kernels.status().detail}")
        return 1
    kernel = torch.ops.kvasir_kernels.float_linear
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, kernels: {kernels.status().detail}")
    print(f"{'shape':<12} {'rows':>4} {'torch ms':>9} {'GB/s':>5} {'kernel ms':>9} {'GB/s':>5} {'ratio':>6}")
    generator = torch.Generator().manual_seed(0)
    for name, (outputs, inputs) in SHAPES.items():
        size = outputs * inputs * 4
        weights = [torch.randn(outputs, inputs, generator=generator) for _ in range(max(1, int(COPIES_BYTES // size)))]
        for rows in ROWS:
            x = torch.randn(rows, inputs, generator=generator)
            with torch.inference_mode():
                gemm = best_time(lambda w, x=x: F.linear(x, w), weights, args.repeats)
                native = best_time(lambda w, x=x: kernel(x, w, None), weights, args.repeats)
            print(f"{name:<12} {rows:>4} {gemm * 1e3:>9.3f} {size / gemm / 1e9:>5.1f} {native * 1e3:>9.3f} "
                  f"{size / native / 1e9:>5.1f} {gemm / native:>5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
