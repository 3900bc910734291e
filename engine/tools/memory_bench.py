"""Resident memory after one reply: Kvasir's engine (each KV format) against llama-server on the same GGUF file,
each in a process of its own, and what Kvasir holds after switching models twice.

``python -m engine.tools.memory_bench`` prints the table and writes ``bench/results/memory.json``. Kvasir's figure
comes with its parts as the panel shows them (weights, KV pool pages written, runtime).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPLY_TOKENS = 128
KV_DTYPES = ("float32", "q8_0")
QUESTION = [{"role": "user", "content": "Tell me about the history of paper."}]


def _rss_bytes() -> int:
    from ..models.memory import resident_bytes

    return resident_bytes()


def kvasir_part(kv_dtype: str) -> dict:
    """One reply on the default model, then two switches (to the other KV format and back)."""
    from .. import Engine, EngineConfig, SamplingParams

    config = EngineConfig(kv_cache_dtype=kv_dtype, kv_disk_cache=False)
    engine = Engine(config)
    params = SamplingParams(max_tokens=REPLY_TOKENS, temperature=0.0, ignore_eos=True)
    engine.generate([QUESTION], params)
    stats = engine.stats()
    after_reply = stats.process_resident_bytes
    other = "q8_0" if kv_dtype != "q8_0" else "float32"
    for each in (other, kv_dtype):
        engine.switch_model(EngineConfig(kv_cache_dtype=each, kv_disk_cache=False))
        engine.generate([QUESTION], params)
    return {"kv_dtype": kv_dtype, "resident_bytes": after_reply, "weights_bytes": stats.model_memory_bytes,
            "kv_bytes": stats.kv_touched_bytes, "kv_reserved_bytes": stats.kv_cache_memory_bytes,
            "after_two_switches_bytes": _rss_bytes()}


def llama_part(threads: int = 2) -> dict:
    """llama-server with its defaults on the default GGUF file, after one reply of the same length."""
    from ..models.sources import default_model_path
    from . import peers

    model = default_model_path()
    with peers.server(model, threads=threads) as server:
        server.complete(list(range(1, 40)), REPLY_TOKENS)  # a prompt as long as QUESTION's in the template
        status = Path(f"/proc/{server.pid}/status").read_text()
        rss = int(status.split("VmRSS:")[1].split()[0]) * 1024
    return {"resident_bytes": rss}


def _in_a_process(*args: str) -> dict:
    command = [sys.executable, "-m", "engine.tools.memory_bench", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown_table(kvasir: list[dict], llama: dict | None) -> str:
    mib = 1024**2
    lines = ["| engine | resident after one reply | of which weights | KV written (reserved) | runtime | "
             "vs llama-server | after two switches |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in kvasir:
        runtime = r["resident_bytes"] - r["weights_bytes"] - r["kv_bytes"]
        ratio = f"{r['resident_bytes'] / llama['resident_bytes']:.2f}x" if llama else "–"
        change = r["after_two_switches_bytes"] / r["resident_bytes"] - 1
        kv = f"{r['kv_bytes'] / mib:.1f} ({r['kv_reserved_bytes'] / mib:,.0f}) MiB"
        lines.append(f"| Kvasir, KV `{r['kv_dtype']}` | {r['resident_bytes'] / mib:.0f} MiB | "
                     f"{r['weights_bytes'] / mib:.0f} MiB | {kv} | {runtime / mib:.0f} MiB | {ratio} | {change:+.1%} |")
    if llama:
        lines.append(f"| llama-server (its defaults) | {llama['resident_bytes'] / mib:.0f} MiB | | | | 1.00x | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.memory_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["kvasir", "llama"], help=argparse.SUPPRESS)
    parser.add_argument("--kv", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    if args.part == "kvasir":
        print(json.dumps(kvasir_part(args.kv)))
        return 0
    if args.part == "llama":
        print(json.dumps(llama_part()))
        return 0
    from . import peers
    from .bench import machine_info

    kvasir = [_in_a_process("--part", "kvasir", "--kv", kv) for kv in KV_DTYPES]
    llama = _in_a_process("--part", "llama") if peers.find_tool("llama-server") else None
    print(markdown_table(kvasir, llama))
    if llama is None:
        print("llama-server is not built here: `make peers` builds it", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory.json").write_text(json.dumps({"machine": machine_info(), "kvasir": kvasir, "llama": llama},
                                                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
