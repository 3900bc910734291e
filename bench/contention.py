"""Decode speed with the CPU to itself and with one core taken by another busy process, per OpenMP setting.

OpenMP threads that wait at a barrier spin by default; when another process holds one of the cores, the
thread the barrier waits for runs only when the scheduler gives it a timeslice, and every step pays that at
each barrier. This measures how much, for the settings that change the waiting: each variant in a fresh
process (the settings are read once, when torch loads), 1 and 16 chats x 96 greedy tokens on
``Engine(EngineConfig(model="default"))``, first with the machine otherwise idle, then beside a busy loop.

    .venv/bin/python bench/contention.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = {
    "default": {},
    "GOMP_SPINCOUNT=20000": {"GOMP_SPINCOUNT": "20000"},
    "GOMP_SPINCOUNT=2000": {"GOMP_SPINCOUNT": "2000"},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
}
TOKENS = 96
CHATS = (1, 16)

MEASURE = f"""
import json, time
from engine import Engine, EngineConfig, SamplingParams
engine = Engine(EngineConfig(model="default"))
prompts = [f"Write a short story about lighthouse keeper number {{i}}." for i in range(max({CHATS}))]
engine.generate(prompts[:2], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))  # warm-up
params = SamplingParams(max_tokens={TOKENS}, temperature=0.0, ignore_eos=True)
rates = {{}}
for chats in {CHATS}:
    started = time.perf_counter()
    engine.generate(prompts[:chats], params)
    rates[chats] = chats * {TOKENS} / (time.perf_counter() - started)
print(json.dumps(rates))
"""


def measure(settings: dict[str, str]) -> dict[str, float]:
    """Tokens a second for each chat count, in a fresh process with ``settings`` in its environment."""
    done = subprocess.run([sys.executable, "-c", MEASURE], env={**os.environ, **settings}, capture_output=True,
                          text=True, timeout=900, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="times each variant runs in each condition")
    args = parser.parse_args()
    results: dict[str, dict[str, list[dict[str, float]]]] = {name: {"idle": [], "busy": []} for name in VARIANTS}
    for condition in ("idle", "busy"):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if condition == "busy" else None
        try:
            time.sleep(1 if busy else 0)
            for _ in range(args.rounds):  # variants interleaved, so a change in the machine shows in every row
                for name, settings in VARIANTS.items():
                    results[name][condition].append(measure(settings))
                    print(name, condition, results[name][condition][-1], file=sys.stderr, flush=True)
        finally:
            if busy:
                busy.kill()
    print(table(results))


def table(results) -> str:
    """Markdown: per variant, the range of tok/s over the rounds for each chat count, idle and with one core busy."""
    def span(runs, chats) -> str:
        rates = sorted(run[str(chats)] for run in runs)
        return f"{rates[0]:.0f}" if len(rates) == 1 or round(rates[0]) == round(rates[-1]) else \
            f"{rates[0]:.0f}-{rates[-1]:.0f}"

    header = " / ".join(f"{c} chat{'s' if c > 1 else ''}" for c in CHATS)
    lines = [f"| variant | idle: {header} (tok/s) | one core busy: {header} (tok/s) |", "|---|---:|---:|"]
    for name, runs in results.items():
        cells = [" / ".join(span(runs[condition], chats) for chats in CHATS) for condition in ("idle", "busy")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
