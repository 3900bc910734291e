"""The thread governor on a fake clock and a fake machine: it gives cores up to other processes and takes them
back, holds still on bursts and readings near its lines, and never moves a count the user chose."""

from __future__ import annotations

import os

import pytest

from engine.serving.cpu_share import WINDOW_S, CpuSample, ThreadGovernor, read_sample


class FakeMachine:
    """Busy seconds that grow as the test says other processes and this one use the cores."""

    def __init__(self) -> None:
        self.now, self.busy, self.own = 100.0, 0.0, 0.0

    def clock(self) -> float:
        return self.now

    def sample(self) -> CpuSample:
        return CpuSample(self.now, self.busy, self.own)

    def run(self, governor: ThreadGovernor, seconds: float, others: float, own: float = 1.0) -> list[int]:
        """``seconds`` of steps, every 10 ms, with ``others`` and ``own`` cores in use; the counts it changed to."""
        changes = []
        for _ in range(round(seconds / 0.01)):
            self.now += 0.01
            self.busy += 0.01 * (others + own)
            self.own += 0.01 * own
            change = governor.tick()
            if change is not None:
                changes.append(change)
        return changes


def governor(machine: FakeMachine, cores: int = 2, fixed: int | None = None) -> ThreadGovernor:
    return ThreadGovernor(cores, fixed, machine.sample, machine.clock)


def test_an_idle_machine_keeps_every_core_and_says_no_contention():
    machine = FakeMachine()
    g = governor(machine)
    assert machine.run(g, 10, others=0.05, own=2.0) == []
    assert g.threads == 2 and g.contention_seen_at is None
    assert g.others_cores == pytest.approx(0.05, abs=1e-6)


def test_one_busy_process_takes_a_core_and_gets_it_back_when_it_stops():
    machine = FakeMachine()
    g = governor(machine)
    machine.run(g, 2, others=0.0, own=2.0)
    assert machine.run(g, 3, others=0.8, own=1.2) == [1]  # it got 0.8 of a core from two spinning threads
    seen = g.contention_seen_at
    assert seen is not None and g.state().threads == 1 and not g.state().fixed
    assert machine.run(g, 5, others=1.0, own=1.0) == []  # with one thread each has a core: nothing swings
    assert machine.run(g, 3, others=0.02, own=1.0) == [2]
    assert g.contention_seen_at >= seen and g.threads == 2


def test_four_cores_give_up_one_per_busy_process_and_stop_there():
    machine = FakeMachine()
    g = governor(machine, cores=4)
    changes = machine.run(g, 3, others=1.35, own=2.65)  # two busy processes beside four threads
    changes += machine.run(g, 3, others=1.7, own=2.3)  # ... beside three
    assert changes == [3, 2]
    assert machine.run(g, 6, others=2.0, own=2.0) == []  # each process a core, the steps two


def test_a_burst_shorter_than_the_windows_moves_nothing():
    machine = FakeMachine()
    g = governor(machine)
    machine.run(g, 2, others=0.0, own=2.0)
    changes = machine.run(g, WINDOW_S, others=1.0, own=1.0) + machine.run(g, 3, others=0.0, own=2.0)
    assert changes == [] and g.threads == 2


def test_readings_between_the_lines_hold_the_count_either_way():
    machine = FakeMachine()
    g = governor(machine)
    assert machine.run(g, 5, others=0.5, own=1.5) == []  # half a core: two threads still do better
    machine.run(g, 3, others=0.9, own=1.1)
    assert g.threads == 1
    assert machine.run(g, 5, others=0.5, own=1.0) == []  # and it is not enough to take the core back


def test_a_count_the_user_chose_never_moves_but_contention_is_still_reported():
    machine = FakeMachine()
    g = governor(machine, fixed=2)
    assert machine.run(g, 5, others=1.0, own=1.0) == []
    assert g.threads == 2 and g.state().fixed and g.contention_seen_at is not None
    assert governor(FakeMachine(), cores=2, fixed=8).threads == 2  # never more threads than cores


def test_without_proc_nothing_is_measured_or_changed():
    machine = FakeMachine()
    g = ThreadGovernor(2, None, lambda: None, machine.clock)
    assert machine.run(g, 5, others=1.0) == [] and g.others_cores is None and g.threads == 2


def test_the_real_sample_reads_this_machine():
    first = read_sample()
    if first is None:
        pytest.skip("no /proc/stat here")
    # CPU time of our own, until the process's clock (counted in ticks of 10 ms) has moved on: a fixed amount of
    # work was sometimes less than one tick on a fast machine
    start = os.times()
    while os.times().user + os.times().system <= start.user + start.system:
        sum(i * i for i in range(20_000))
    second = read_sample()
    assert second.at > first.at and second.own_s > first.own_s and second.busy_s >= first.busy_s


def test_the_engine_uses_the_threads_asked_for_says_so_and_writes_the_same_tokens(tiny_llama):
    import torch

    from engine import Engine, EngineConfig, SamplingParams
    from engine.serving.engine import CPU_THREADS

    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    engine = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=32, max_model_len=128, threads=1))
    try:
        assert torch.get_num_threads() == 1
        cpu = engine.stats().cpu
        assert (cpu.threads, cpu.cores, cpu.threads_fixed) == (1, CPU_THREADS, True)
        one_thread = engine.generate(["Hello there"], params)[0].token_ids
        engine.set_cpu_options(None, False)
        assert torch.get_num_threads() == CPU_THREADS and not engine.stats().cpu.threads_fixed
        assert engine.generate(["Hello there"], params)[0].token_ids == one_thread
    finally:
        torch.set_num_threads(CPU_THREADS)


def test_bad_thread_counts_are_refused_in_words():
    from engine import EngineConfig

    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match="threads must be"):
            EngineConfig(threads=bad)
    with pytest.raises(ValueError, match="lower_priority"):
        EngineConfig(lower_priority="yes")


LOWERED = """
import json, threading
from engine.serving import priority
ready, done = threading.Event(), threading.Event()
seen = {}
def worker():
    ready.set(); done.wait(); seen["worker"] = priority.current_nice()
thread = threading.Thread(target=worker); thread.start(); ready.wait()
note = priority.apply(True)
done.set(); thread.join()
print(json.dumps({"note": note, "main": priority.current_nice(), **seen}))
"""


def test_lower_priority_renices_every_thread_but_the_main_one():
    import json
    import subprocess
    import sys
    from pathlib import Path

    if not Path("/proc/self/task").is_dir():
        pytest.skip("threads are reniced through /proc/self/task")
    done = subprocess.run([sys.executable, "-c", LOWERED], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["note"] == "" and seen["worker"] == min(19, seen["main"] + 10)


def test_an_async_engine_takes_new_cpu_options_between_steps_on_its_own_thread(tiny_llama):
    import torch

    from engine import AsyncEngine, EngineConfig

    engine = AsyncEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=32, max_model_len=128))
    try:
        assert not engine.call(lambda e: e.stats().cpu.threads_fixed).result(60)
        engine.call(lambda e: e.set_cpu_options(1, False)).result(60)
        seen = engine.call(lambda e: (e.stats().cpu.threads, e.stats().cpu.threads_fixed, torch.get_num_threads()))
        assert seen.result(60) == (1, True, 1)  # the engine thread's own OpenMP setting
    finally:
        engine.shutdown()
