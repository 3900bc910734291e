"""A chat continued after a restart: its time to first token with the prefix cache's disk tier against a cold
start, each in a fresh process.

``python -m engine.tools.restart_bench`` runs three processes on one empty cache folder: the first answers a long
conversation and exits (its KV blocks written to disk as it closes); the second continues that conversation with a
new message (its earlier turns read back from disk); the third continues it with the disk tier off (every token
computed). It prints the table and writes ``bench/results/restart.json``. The files were just written, so the
second process reads them from the system's page cache, as a restart soon after closing does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HISTORY_WORDS = 3000  # about 4,000 tokens of earlier conversation
REPLY_TOKENS = 32
KV_DTYPES = ("float32", "q8_0")


def conversation(words: int = HISTORY_WORDS) -> list[dict]:
    """A long first turn: the shipped text, repeated to ``words`` words, to be summarised."""
    from .evaluation import eval_text

    text = eval_text().split()
    body = " ".join(text[i % len(text)] for i in range(words))
    return [{"role": "system", "content": "You are a careful reader."},
            {"role": "user", "content": f"Here are my notes:\n{body}\n\nWhat are they about?"}]


def run_phase(phase: str, kv_dtype: str, reply: str) -> dict:
    """One process's part (see the module's docstring); returns what it measured."""
    from .. import Engine, EngineConfig, SamplingParams

    config = EngineConfig(kv_cache_dtype=kv_dtype, kv_disk_cache=phase != "cold")
    engine = Engine(config)
    params = SamplingParams(max_tokens=REPLY_TOKENS, temperature=0.0, ignore_eos=True)
    messages = conversation()
    if phase != "first":
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And in one line?"}]
    started = time.perf_counter()
    out = engine.generate([messages], params)[0]
    wall = time.perf_counter() - started
    disk = engine.stats().disk_cache
    engine.close()
    return {"phase": phase, "kv_dtype": kv_dtype, "ttft_s": out.metrics.ttft_s, "wall_s": wall,
            "prompt_tokens": out.metrics.prompt_tokens, "cached_prompt_tokens": out.metrics.cached_prompt_tokens,
            "disk_tokens": disk.hit_tokens_total if disk else 0, "reply": out.text}


def _in_a_process(phase: str, kv_dtype: str, reply: str, cache: Path) -> dict:
    command = [sys.executable, "-m", "engine.tools.restart_bench", "--phase", phase, "--kv", kv_dtype,
               "--reply", reply]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "KVASIR_CACHE_DIR": str(cache)},
                          timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {phase} process failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(kv_dtype: str, progress=print) -> dict:
    """The three processes for ``kv_dtype`` on a fresh cache folder (the converted GGUF copies are kept)."""
    with tempfile.TemporaryDirectory(prefix="kvasir-restart-") as folder:
        cache = Path(folder)
        first = _in_a_process("first", kv_dtype, "", cache)
        progress(f"{kv_dtype}: first run, {first['prompt_tokens']} prompt tokens, TTFT {first['ttft_s']:.2f} s")
        restarted = _in_a_process("restarted", kv_dtype, first["reply"], cache)
        cold = _in_a_process("cold", kv_dtype, first["reply"], cache)
    earlier = first["prompt_tokens"] + REPLY_TOKENS - 1  # the tokens the first run put in the cache
    return {"kv_dtype": kv_dtype, "prompt_tokens": restarted["prompt_tokens"], "earlier_tokens": earlier,
            "disk_tokens": restarted["disk_tokens"], "share_of_earlier_from_disk": restarted["disk_tokens"] / earlier,
            "ttft_restarted_s": restarted["ttft_s"], "ttft_cold_s": cold["ttft_s"],
            "ttft_ratio": restarted["ttft_s"] / cold["ttft_s"]}


def markdown_table(rows: list[dict]) -> str:
    lines = ["| KV cache | prompt tokens | earlier tokens read from disk | TTFT after a restart | TTFT cold | ratio |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| `{r['kv_dtype']}` | {r['prompt_tokens']:,} | {r['disk_tokens']:,} of {r['earlier_tokens']:,} "
                     f"({r['share_of_earlier_from_disk']:.1%}) | {r['ttft_restarted_s']:.2f} s | "
                     f"{r['ttft_cold_s']:.2f} s | {r['ttft_ratio']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.restart_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=["first", "restarted", "cold"], help=argparse.SUPPRESS)
    parser.add_argument("--kv", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--reply", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    if args.phase:
        print(json.dumps(run_phase(args.phase, args.kv, args.reply)))
        return 0
    from .bench import machine_info

    rows = [measure(kv, progress=lambda m: print(m, file=sys.stderr)) for kv in KV_DTYPES]
    print(markdown_table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "restart.json").write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
