"""CUDA-graph decode steps on the CPU: the device check believes it is on CUDA, and a capture records the
captured function, which each replay calls eagerly. Everything but ``torch.cuda.graph`` itself then runs."""

from __future__ import annotations

import torch

from engine.step import cuda_graphs


class EagerGraph:
    """What is captured instead of a CUDA graph: replaying calls the captured function."""

    def __init__(self, forward) -> None:
        self.forward = forward
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.forward()


def install(monkeypatch) -> dict:
    """Patch :mod:`engine.step.cuda_graphs`; returns the record of captures: ``captured`` (the EagerGraphs) and
    ``buckets`` (their (batch, width))."""
    record = {"captured": [], "buckets": []}
    decide = cuda_graphs.graphs_problem

    def as_if_on_cuda(enabled, device, model):
        return decide(enabled, torch.device("cuda"), model)

    def capture(forward, pool):
        graph = EagerGraph(forward)
        record["captured"].append(graph)
        record["buckets"].append(forward.args[1:])
        return graph, pool or object()

    monkeypatch.setattr(cuda_graphs, "graphs_problem", as_if_on_cuda)
    monkeypatch.setattr(cuda_graphs, "capture_graph", capture)
    return record


def replays(record: dict) -> int:
    """Graph replays so far."""
    return sum(graph.replays for graph in record["captured"])
