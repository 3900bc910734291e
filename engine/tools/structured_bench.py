"""What structured output costs: decode speed of 16 chats with half of them held to a JSON schema, against 16 free
chats, side by side in one run on the default model.

Every reply is ``REPLY_TOKENS`` tokens (the schema's array is longer than that, so no constrained reply ends
early and both runs decode the same number of rows per step); the prompts are computed once before the timed
rounds (the prefix cache keeps them), the two runs take turns, and the best of ``ROUNDS`` counts. Compiling each
constrained request's grammar is inside the timed run. Speculation is off, so both runs take the same steps.

``python -m engine.tools.structured_bench`` prints the table and writes ``bench/results/structured.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

CHATS = 16
REPLY_TOKENS = 128
ROUNDS = 3
TARGET = 0.90  # constrained decoding may cost at most 10% of decode tokens/s
RESULTS = Path("bench/results/structured.json")
SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999},
          "minItems": 4 * REPLY_TOKENS, "maxItems": 4 * REPLY_TOKENS}


def prompts() -> list[list[dict]]:
    return [[{"role": "user", "content": f"List {n + 10} numbers between 0 and 999 as a JSON array."}]
            for n in range(CHATS)]


def measure(rounds: int = ROUNDS, progress=print) -> dict:
    from .. import Engine, EngineConfig, SamplingParams, Structure

    engine = Engine(EngineConfig(model="default", speculation="off", kv_disk_cache=False, max_num_seqs=CHATS))
    chats = prompts()
    engine.generate(chats, SamplingParams(max_tokens=1, temperature=0.0))  # the prompts, cached
    free = SamplingParams(max_tokens=REPLY_TOKENS, temperature=0.0, ignore_eos=True)
    held = SamplingParams(max_tokens=REPLY_TOKENS, temperature=0.0, ignore_eos=True,
                          structure=Structure("json_schema", SCHEMA))
    runs = {"free": [free] * CHATS, "half constrained": [held if i % 2 else free for i in range(CHATS)]}
    best: dict[str, float] = {}
    for round_number in range(rounds):
        for name, params in runs.items():
            start = time.perf_counter()
            outs = engine.generate(chats, params)
            seconds = time.perf_counter() - start
            tokens = sum(len(o.token_ids) for o in outs)
            assert all(len(o.token_ids) == REPLY_TOKENS for o in outs), [o.finish_reason for o in outs]
            for out, p in zip(outs, params, strict=True):
                if p.structure is not None:
                    json.loads(out.text + "0]" if out.text.endswith(",") else out.text + "]")  # a prefix of it
            best[name] = max(best.get(name, 0.0), tokens / seconds)
            progress(f"round {round_number + 1}: {name}, {tokens / seconds:.1f} tok/s")
    ratio = best["half constrained"] / best["free"]
    return {"chats": CHATS, "reply_tokens": REPLY_TOKENS, "rounds": rounds, "free_tokens_per_s": best["free"],
            "constrained_tokens_per_s": best["half constrained"], "ratio": ratio, "meets_target": ratio >= TARGET}


def markdown_table(result: dict) -> str:
    return ("| chats | free tok/s | half constrained tok/s | ratio |\n|---:|---:|---:|---:|\n"
            f"| {result['chats']} | {result['free_tokens_per_s']:.1f} | {result['constrained_tokens_per_s']:.1f} | "
            f"{result['ratio']:.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    from .bench import machine_info

    result = measure(args.rounds)
    table = markdown_table(result)
    print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": machine_info(), **result, "table": table}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
