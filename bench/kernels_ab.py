"""A/B timing of the native block kernels: one git revision's kernels against the working tree's, in one process.

Runs the default model's linear layers (30 layers of fused QKV 576->960, O 576->576, gate-up 576->3072 and
down 1536->576 in Q4_1, then the 576->49152 Q8_0 output head) at 1, 4, 16 and 64 activation rows, alternating
A and B pass by pass so that other load on the machine falls on both alike, and prints medians with their
spread. Each side is compiled under its own op namespace, so both load side by side. On a machine others
are using, two threads' timings are mostly waits for a preempted thread: ``--threads 1 --clock cpu`` measures
the kernels' own work.

    python bench/kernels_ab.py --base HEAD~1 --rows 1 4 16 64 --repeats 15
    python bench/kernels_ab.py --base HEAD~1 --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.step import kernels  # noqa: E402
from engine.step.block_linear import interleave, quantize_q4_1, quantize_q8_0  # noqa: E402

FILES = ("block_quant.cpp", "layer_ops.cpp", "decode_step.cpp", "kernels.h")
LAYERS = 30
SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
HEAD = (576, 49152)


def _sources(revision: str | None) -> dict[str, str]:
    folder = "engine/step/kernels"
    if revision is None:
        return {name: (ROOT / folder / name).read_text() for name in FILES}
    return {name: subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{folder}/{name}"], check=True,
                                 capture_output=True, text=True).stdout for name in FILES}


def _build(tag: str, revision: str | None, flags: list[str]) -> object:
    """The kernels of ``revision`` (None: the working tree) as torch.ops.kvasir_kernels_<tag>."""
    sources = _sources(revision)
    key = hashlib.sha256("\0".join([*sources.values(), *flags, tag]).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"kvasir-ab-{key}"
    library = folder / f"lib{tag}.so"
    if not library.exists():
        folder.mkdir(exist_ok=True)
        for name, text in sources.items():
            text = text.replace("kvasir_kernels", f"kvasir_kernels_{tag}")
            text = text.replace("namespace kvasir ", f"namespace kvasir_{tag} ").replace("kvasir::", f"kvasir_{tag}::")
            (folder / name).write_text(text)
        saved = kernels.SOURCES, kernels.HEADER
        kernels.SOURCES = [folder / name for name in FILES if name.endswith(".cpp")]
        kernels.HEADER = folder / "kernels.h"
        try:
            kernels._build(library, flags)
        finally:
            kernels.SOURCES, kernels.HEADER = saved
    torch.ops.load_library(str(library))
    return getattr(torch.ops, f"kvasir_kernels_{tag}")


def _weights() -> tuple[list[dict[str, torch.Tensor]], torch.Tensor]:
    torch.manual_seed(0)
    layers = [{name: interleave(quantize_q4_1(torch.randn(out, inp) * 0.05), "q4_1")
               for name, (inp, out) in SHAPES.items()} for _ in range(LAYERS)]
    inp, out = HEAD
    return layers, interleave(quantize_q8_0(torch.randn(out, inp) * 0.05), "q8_0")


def _pass(ops, layers, head, inputs, clock) -> tuple[float, float]:
    """Seconds for the 30 layers' matrices, and for the head."""
    start = clock()
    for layer in layers:
        for name, (inp, out) in SHAPES.items():
            ops.q4_1_linear(inputs[inp], layer[name], inp, out)
    middle = clock()
    ops.q8_0_linear(inputs[HEAD[0]], head, *HEAD)
    return middle - start, clock() - middle


def _summary(values: list[float]) -> str:
    """The median, and the fastest and the third quartile: on a busy machine the fastest pass is the one
    least disturbed."""
    q3 = statistics.quantiles(values, n=4)[2] if len(values) > 1 else values[0]
    return f"{statistics.median(values) * 1e3:7.2f} ms [min {min(values) * 1e3:.2f}, q3 {q3 * 1e3:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision of side A (B is the working tree)")
    parser.add_argument("--a-flags", default="-mavx2 -mfma -mf16c", help="compiler flags of side A")
    parser.add_argument("--b-flags", default=None, help="compiler flags of side B (default: what the engine picks)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: the process's CPU time, which leaves out time other programs took the cores "
                             "(with --threads 1, the kernels' own time on a busy machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    b_flags = kernels._simd_flags() if args.b_flags is None else shlex.split(args.b_flags)
    sides = {"A": _build("a", args.base, shlex.split(args.a_flags)), "B": _build("b", None, b_flags)}
    print(f"A: {args.base} {args.a_flags}\nB: working tree {' '.join(b_flags)}\n"
          f"{args.threads} threads, {args.clock} clock, {args.repeats} passes each")
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    layers, head = _weights()
    for rows in args.rows:
        inputs = {n: torch.randn(rows, n) for n in (576, 1536)}
        times = {side: ([], []) for side in sides}
        for ops in sides.values():
            _pass(ops, layers, head, inputs, clock)  # warm up
        for _ in range(args.repeats):
            for side, ops in sides.items():
                body, top = _pass(ops, layers, head, inputs, clock)
                times[side][0].append(body)
                times[side][1].append(top)
        for side, (body, top) in times.items():
            total = [a + b for a, b in zip(body, top)]
            print(f"M={rows:3d} {side}: layers {_summary(body)}  head {_summary(top)}  total {_summary(total)}")
        totals = {side: [a + b for a, b in zip(*times[side])] for side in sides}
        print(f"M={rows:3d} A/B total: median {statistics.median(totals['A']) / statistics.median(totals['B']):.2f}x,"
              f" fastest {min(totals['A']) / min(totals['B']):.2f}x")


if __name__ == "__main__":
    main()
