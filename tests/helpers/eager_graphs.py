"""CUDA-graph decode steps on the CPU: the device check believes it is on CUDA, and a capture records the
captured function, which each replay calls eagerly. Everything but ``torch.cuda.graph`` itself then runs.

The capture is simulated as CUDA's is strict: the captured function runs once while any read of a tensor back to
the host (``item``, ``tolist``, ``int(tensor)``, ...) raises :class:`HostReadDuringCapture`, as "operation not
permitted when stream is capturing" does on a GPU. A kernel's own work is not the host's: stand-ins for device
kernels run theirs inside :func:`kernel_side`, where reads are allowed.
"""

from __future__ import annotations

import contextlib

import torch

from engine.step import cuda_graphs
from tests.helpers.sync_counter import SYNCING

_STATE = {"capturing": False, "kernel": 0}


class HostReadDuringCapture(RuntimeError):
    """A tensor was read back to the host while a graph was being captured."""


class EagerGraph:
    """What is captured instead of a CUDA graph: replaying calls the captured function."""

    def __init__(self, forward) -> None:
        self.forward = forward
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.forward()


@contextlib.contextmanager
def simulated_capture():
    """Host reads raise inside this block (outside :func:`kernel_side`); needs :func:`refuse_host_reads`."""
    _STATE["capturing"] = True
    try:
        yield
    finally:
        _STATE["capturing"] = False


@contextlib.contextmanager
def kernel_side():
    """A device kernel's own computation, stood in for on the host: its reads are not the caller's."""
    _STATE["kernel"] += 1
    try:
        yield
    finally:
        _STATE["kernel"] -= 1


def refuse_host_reads(monkeypatch) -> None:
    """Patch ``torch.Tensor`` so that a host read inside :func:`simulated_capture` raises."""
    for name in SYNCING:
        original = getattr(torch.Tensor, name)

        def guarded(self, *args, _original=original, _name=name, **kwargs):
            if _STATE["capturing"] and not _STATE["kernel"]:
                raise HostReadDuringCapture(f"Tensor.{_name}() reads the device while a graph is captured")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, guarded)


def install(monkeypatch) -> dict:
    """Patch :mod:`engine.step.cuda_graphs`; returns the record of captures: ``captured`` (the EagerGraphs),
    ``buckets`` (their (batch, width)) and ``devices`` (the device each capture was made on)."""
    record = {"captured": [], "buckets": [], "devices": []}
    decide = cuda_graphs.graphs_problem
    refuse_host_reads(monkeypatch)

    def as_if_on_cuda(enabled, device, model, backend="torch"):
        return decide(enabled, torch.device("cuda"), model, backend)

    def capture(forward, pool, device):
        with simulated_capture():
            forward()  # what a capture records; it must not read anything back
        graph = EagerGraph(forward)
        record["captured"].append(graph)
        record["buckets"].append(forward.args[1:])
        record["devices"].append(device)
        return graph, pool or object()

    monkeypatch.setattr(cuda_graphs, "graphs_problem", as_if_on_cuda)
    monkeypatch.setattr(cuda_graphs, "capture_graph", capture)
    return record


def replays(record: dict) -> int:
    """Graph replays so far."""
    return sum(graph.replays for graph in record["captured"])
