"""Decode speed with the CPU to itself and beside one and two busy processes: Kvasir and llama.cpp, side by side.

A desktop is never idle. With every core given a thread, a step's parallel regions wait at each barrier for the
thread that shares its core with another program; Kvasir's engine measures what others take between steps and
gives their cores up (engine/serving/cpu_share.py). Each condition runs, in turn and in fresh processes:
- Kvasir as it ships (threads adapt), 1 and 16 chats x ``--tokens`` greedy tokens on the bundled model;
- Kvasir with its threads fixed at every core (how it ran before it adapted);
- llama.cpp's ``llama-batched-bench`` on the same GGUF with its default threads (every core), 1 and 16 sequences.
A busy process is a Python loop (``while True: pass``). The table gives tok/s, the share of each one's idle speed,
and the threads Kvasir chose; the JSON goes to ``bench/results/contention.json``.

    .venv/bin/python bench/contention.py [--rounds 2] [--tokens 96]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.models.sources import default_model_path  # noqa: E402
from engine.tools import peers  # noqa: E402
from engine.tools.bench import machine_info  # noqa: E402

CHATS = (1, 16)
CONDITIONS = {"idle": 0, "1 busy": 1, "2 busy": 2}
RESULTS = ROOT / "bench" / "results" / "contention.json"
SETTLE_S = 2.0  # the warm-up lasts this long at least, so the engine has measured the machine before the run

MEASURE = """
import json, sys, time
from engine import Engine, EngineConfig, SamplingParams
threads = None if sys.argv[1] == "auto" else int(sys.argv[1])
tokens, chats, settle = int(sys.argv[2]), [int(c) for c in sys.argv[3].split(",")], float(sys.argv[4])
engine = Engine(EngineConfig(model="default", threads=threads))
prompts = [f"Write a short story about lighthouse keeper number {i}." for i in range(max(chats))]
warm = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
started = time.perf_counter()
while time.perf_counter() - started < settle:
    engine.generate(prompts[:2], warm)
params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
rows = {}
for n in chats:
    began = time.perf_counter()
    engine.generate(prompts[:n], params)
    cpu = engine.stats().cpu
    rows[n] = {"tokens_per_s": n * tokens / (time.perf_counter() - began), "threads": cpu.threads,
               "others_cores": cpu.others_cores}
print(json.dumps(rows))
"""


def kvasir(threads: str, tokens: int) -> dict:
    """Kvasir's decode tok/s per chat count, in a fresh process; ``threads``: "auto" or a count."""
    done = subprocess.run([sys.executable, "-c", MEASURE, threads, str(tokens), ",".join(map(str, CHATS)),
                           str(SETTLE_S)], capture_output=True, text=True, timeout=1200, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"the Kvasir run failed: {done.stderr[-2000:]}")
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def llama_cpp(tokens: int) -> dict:
    """llama-batched-bench's decode tok/s per sequence count, with its default threads (one per core)."""
    result = peers.batched_bench(default_model_path(), CHATS, prompt=24, gen=tokens, threads=os.cpu_count() or 1)
    if "skipped" in result:
        return {"skipped": result["skipped"]}
    return {row["pl"]: {"tokens_per_s": row["speed_tg"]} for row in result["rows"]}


@contextmanager
def busy_processes(count: int):
    """``count`` processes that each keep a core busy until the block ends."""
    children = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5 if children else 0)
        yield
    finally:
        for child in children:
            child.kill()
            child.wait()


def run(rounds: int, tokens: int) -> dict:
    """Every engine in every condition, interleaved, ``rounds`` times; the best of each (a busy machine only
    ever makes a run slower)."""
    engines = {"kvasir": lambda: kvasir("auto", tokens),
               "kvasir, all threads": lambda: kvasir(str(os.cpu_count() or 1), tokens),
               "llama.cpp": lambda: llama_cpp(tokens)}
    best: dict = {name: {} for name in engines}
    for _ in range(rounds):
        for condition, count in CONDITIONS.items():
            with busy_processes(count):
                for name, measure in engines.items():
                    result = measure()
                    print(name, condition, result, file=sys.stderr, flush=True)
                    kept = best[name].setdefault(condition, result)
                    if "skipped" not in result:
                        for chats, row in result.items():
                            if row["tokens_per_s"] > kept[chats]["tokens_per_s"]:
                                kept[chats] = row
    return best


def table(best: dict) -> str:
    """Markdown: tok/s and the share of idle per engine, condition and chat count."""
    header = " | ".join(f"{c} chat{'s' if c > 1 else ''}" for c in CHATS)
    lines = [f"| engine | condition | {header} | share of idle | threads |", "|---|---|" + "---:|" * (len(CHATS) + 2)]
    for name, conditions in best.items():
        idle = conditions.get("idle", {})
        for condition, result in conditions.items():
            if "skipped" in result:
                lines.append(f"| {name} | {condition} | {result['skipped']} |")
                continue
            rates = " | ".join(f"{result[c]['tokens_per_s']:.1f}" for c in CHATS)
            shares = " / ".join(f"{result[c]['tokens_per_s'] / idle[c]['tokens_per_s']:.0%}" for c in CHATS)
            threads = " / ".join(str(result[c].get("threads", "-")) for c in CHATS)
            lines.append(f"| {name} | {condition} | {rates} | {shares} | {threads} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="times each engine runs in each condition")
    parser.add_argument("--tokens", type=int, default=96, help="greedy tokens per chat")
    args = parser.parse_args()
    best = run(args.rounds, args.tokens)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(),
                                   "tokens": args.tokens, "results": best}, indent=2, default=str))
    print(table(best))


if __name__ == "__main__":
    main()
