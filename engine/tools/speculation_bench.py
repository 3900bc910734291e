"""Speculative decoding against plain decoding, side by side in one run: three workloads x {off, ngram, auto}, one
chat and four, on the default model, greedy; the same with a draft model (the default model at full precision,
``none``, with its own int4 copy drafting: {off, draft, auto}, beside the int4 model alone); and llama-server
on the same one-chat prompts, where ``make peers`` has built it: with and without its own n-gram speculation, and
the same pair as it runs it (the file's weights as float32, with the 4-bit file drafting: ``--model-draft``).

Workloads: (1) rewrite a given 300-line Python file with one function renamed; (2) summarise a given text of
about 1,500 tokens quoting its key sentences; (3) a free story. Each reply is ``REPLY_TOKENS`` tokens. The
prompts are computed once before the timed rounds (the prefix cache keeps them), so the figures are decode
speed: output tokens over the replies' wall time. The modes take turns within each round (in the reverse order
every other round), on one engine (auto keeps what it measured, but no mode drafts from an earlier round's
replies: lookup forgets them before each run), and every mode's replies are checked to be the same tokens as
``off``'s. A mode's figure is its median over the rounds, and its ratio to ``off`` the median of the rounds' own
ratios (:func:`summarise_runs`). llama-server's figures are the best of its rounds.

``python -m engine.tools.speculation_bench`` prints the table and writes ``bench/results/speculation.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from importlib import resources
from pathlib import Path

MODES = ("off", "ngram", "auto")
DRAFT_MODES = ("off", "draft", "auto")
CHATS = (1, 4)
REPLY_TOKENS = 192
# rounds of lookup's modes: a round's ratio to off moves by up to a tenth either way on this machine (twenty rounds
# of the rewrite at four chats, auto against off: 0.83x to 1.11x, median 1.00x), so five rounds' median moved by a
# few percent between runs; eleven halve how far it can stray
ROUNDS = 11
PEER_ROUNDS = 5  # llama-server's: the best of them
# the unquantised model is slow on a CPU: fewer rounds of the draft-model pair; five, not three: its plain decode
# reads 540 MB a step and moves most with this machine's pace (two runs of three rounds on the same code put the
# summary's pair at 2.05x and 1.72x of off, its off at 32.3 and 38.0 tok/s)
DRAFT_ROUNDS = 5
LLAMA_DRAFT_MAX = 16  # llama-server's longest draft for the pair (its default, 3, is for larger targets)
WARM_TOKENS = 4  # tokens of each reply before the timed rounds (more where a draft model has prompts to catch up on)
RENAMES = (("_forget", "_drop_entry"), ("_remember", "_note_entry"), ("_parse_name", "_split_name"),
           ("_used_at", "_last_use_of"))
STORIES = ("a lighthouse keeper who finds a map", "two friends crossing a desert", "a city where it never rains",
           "the last train of the night")
RESULTS = Path("bench/results/speculation.json")


def _data(name: str) -> str:
    return resources.files("engine").joinpath(f"data/{name}").read_text()


def rewrite_prompts(chats: int) -> list[list[dict]]:
    source = _data("rewrite_source.txt")
    return [[{"role": "user", "content": f"Here is a Python file:\n\n```python\n{source}```\n\nRewrite the whole "
                                         f"file with the method `{old}` renamed to `{new}`. Change nothing else."}]
            for old, new in RENAMES[:chats]]


def summary_prompts(chats: int, tokenizer) -> list[list[dict]]:
    ids = tokenizer.encode(_data("eval_text.txt"), add_special_tokens=False)[:1500]
    text = tokenizer.decode(ids)
    asks = ("the key sentences", "the three most important sentences", "its opening and closing sentences",
            "the sentences about people")
    return [[{"role": "user", "content": f"{text}\n\nSummarise the text above, quoting {ask} word for word."}]
            for ask in asks[:chats]]


def story_prompts(chats: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Write a story about {topic}."}] for topic in STORIES[:chats]]


def workloads(chats: int, tokenizer) -> dict[str, list[list[dict]]]:
    return {"rewrite": rewrite_prompts(chats), "summarise": summary_prompts(chats, tokenizer),
            "story": story_prompts(chats)}


def measure_kvasir(rounds: int = ROUNDS, reply_tokens: int = REPLY_TOKENS, progress=print) -> list[dict]:
    """tokens/s of every (workload, chats, mode) with n-gram drafts over ``rounds`` turns, against ``off`` and
    with the draft counts (:func:`summarise_runs`)."""
    from .. import Engine, EngineConfig

    engine = Engine(EngineConfig(kv_disk_cache=False))
    return _measure({mode: (engine, mode) for mode in MODES}, rounds, reply_tokens, progress)


def measure_draft_model(rounds: int = DRAFT_ROUNDS, reply_tokens: int = REPLY_TOKENS, progress=print) -> list[dict]:
    """The same with a draft model: the default model unquantised, drafted for by its int4 copy ({off, draft,
    auto}), and the int4 model alone (``int4``) for what 4-bit speed is."""
    from .. import Engine, EngineConfig

    engine = Engine(EngineConfig(kv_disk_cache=False, quantization="none", draft_model="default",
                                 draft_quantization="int4"))
    int4 = Engine(EngineConfig(kv_disk_cache=False))
    modes = {mode: (engine, mode) for mode in DRAFT_MODES} | {"int4": (int4, "off")}
    return _measure(modes, rounds, reply_tokens, progress, compared=DRAFT_MODES)


def _measure(modes: dict, rounds: int, reply_tokens: int, progress, compared=MODES) -> list[dict]:
    """``modes``: label -> (engine, speculation mode). Each round runs every label in turn; the replies of the
    ``compared`` labels must be the same tokens as ``off``'s."""
    from .. import SamplingParams

    params = SamplingParams(max_tokens=reply_tokens, temperature=0.0, ignore_eos=True)
    tokenizer = next(iter(modes.values()))[0].tokenizer
    rows = []
    for chats in CHATS:
        for name, prompts in workloads(chats, tokenizer).items():
            for engine in {id(e): e for e, _ in modes.values()}.values():
                # the prompts, into the cache: a draft model's too (it computes them in its first passes)
                engine.set_speculation("draft" if engine.draft is not None else "off")
                engine.generate(prompts, SamplingParams(max_tokens=warm_tokens(engine, prompts), temperature=0.0))
            runs: dict[str, list[dict]] = {label: [] for label in modes}
            for turn in range(rounds):
                # every other round in the reverse order: no mode always follows the same one (a machine's pace
                # drifts over a round, and a mode that drafts heavily leaves it warmer for the next)
                order = list(modes.items()) if turn % 2 == 0 else list(modes.items())[::-1]
                for label, (engine, mode) in order:
                    engine.set_speculation(mode)
                    engine.speculator.forget_text()
                    start = time.perf_counter()
                    outputs = engine.generate(prompts, params)
                    seconds = time.perf_counter() - start
                    runs[label].append({"seconds": seconds, "tokens": [o.token_ids for o in outputs],
                                        "drafted": sum(o.metrics.draft_tokens for o in outputs),
                                        "kept": sum(o.metrics.accepted_draft_tokens for o in outputs)})
            reference = runs["off"][0]["tokens"]
            for label, summary in summarise_runs(runs).items():
                rows.append({"workload": name, "chats": chats, "mode": label, **summary,
                             "same_as_off": label not in compared or
                             all(run["tokens"] == reference for run in runs[label])})
                progress(f"{name}, {chats} chat(s), {label}: {summary['tokens_per_s']:.1f} tok/s "
                         f"({summary['vs_off']:.2f}x off)")
    return rows


def warm_tokens(engine, prompts: list[list[dict]]) -> int:
    """Reply tokens before the timed rounds that let a draft model catch up on every prompt: its passes take what
    is left of a step's token budget (a reply drafts only after it has caught up, and only while its reply has
    room), so a long prompt, or four, takes a step for every budget's worth of tokens. (With too few, the first
    timed run caught up 1,553 tokens of the rewrite's prompt: 3 s of a 7 s run.)"""
    from ..serving.speculation import MAX_DRAFT

    if engine.draft is None:
        return WARM_TOKENS
    prompt_tokens = sum(len(engine.encode_prompt(chat)) for chat in prompts)
    per_step = engine.config.max_num_batched_tokens - len(prompts) * (1 + MAX_DRAFT)
    return WARM_TOKENS + 2 * -(-prompt_tokens // per_step)


def summarise_runs(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Each label's median tokens/s over the rounds, with the median over the rounds of its rate against the same
    round's ``off`` run (``vs_off``): this machine's pace drifts by a quarter over minutes (a plain step of four
    chats took 35 ms in one run, 47 ms two runs later, whatever the mode), and a ratio within a round cancels
    that where a ratio of two medians or bests does not. ``drafted``/``kept``: the median round's."""
    def rate(run):
        return sum(len(tokens) for tokens in run["tokens"]) / run["seconds"]

    summary = {}
    for label, turns in runs.items():
        ranked = sorted(turns, key=rate)
        middle = ranked[len(ranked) // 2]
        ratios = [rate(turn) / rate(off) for turn, off in zip(turns, runs["off"], strict=True)]
        summary[label] = {"tokens_per_s": statistics.median(rate(turn) for turn in turns),
                          "vs_off": statistics.median(ratios), "rounds": [round(rate(t), 2) for t in turns],
                          "drafted": middle["drafted"], "kept": middle["kept"]}
    return summary


def measure_llama(reply_tokens: int = REPLY_TOKENS, rounds: int = PEER_ROUNDS, progress=print,
                  draft_rounds: int | None = DRAFT_ROUNDS) -> list[dict] | None:
    """llama-server on the same GGUF file and one-chat prompts, with and without ``--spec-type ngram-simple``; and
    (unless ``draft_rounds`` is None) the draft-model pair as llama.cpp runs it: the file's weights as float32
    alone (``off``) and with the 4-bit file drafting (``draft``, ``--model-draft``). None where it is not built."""
    from ..models.sources import default_model_path
    from . import peers
    from .float_gguf import float32_copy

    if peers.find_tool("llama-server") is None:
        return None
    from .. import Engine, EngineConfig

    tokenizer_engine = Engine(EngineConfig(kv_disk_cache=False))  # the chat template, as Kvasir applies it
    prompts = {name: tokenizer_engine.encode_prompt(chat[0])
               for name, chat in workloads(1, tokenizer_engine.tokenizer).items()}
    del tokenizer_engine
    model = default_model_path()
    runs = [("int4", model, "off", (), rounds), ("int4", model, "ngram", ("--spec-type", "ngram-simple"), rounds)]
    if draft_rounds is not None:
        full = float32_copy(model, peers.cache_root() / "models")
        runs += [("none", full, "off", (), draft_rounds),
                 ("none", full, "draft", ("--model-draft", str(model), "--spec-draft-n-max", str(LLAMA_DRAFT_MAX)),
                  draft_rounds)]
    rows = []
    for precision, path, mode, extra, times in runs:
        with peers.server(path, extra_args=extra) as server:
            for name, ids in prompts.items():
                server.complete(ids, 1)  # the prompt, into its cache
                best = min((server.complete(ids, reply_tokens) for _ in range(times)), key=lambda r: r["seconds"])
                rows.append({"workload": name, "chats": 1, "precision": precision, "mode": mode,
                             "tokens_per_s": len(best["tokens"]) / best["seconds"]})
                progress(f"llama-server {name}, {precision} {mode}: {rows[-1]['tokens_per_s']:.1f} tok/s")
    return rows


def _rate(rows: list[dict] | None, workload: str, chats: int, mode: str, precision: str | None = None
          ) -> float | None:
    return next((r["tokens_per_s"] for r in rows or () if (r["workload"], r["chats"], r["mode"]) ==
                 (workload, chats, mode) and r.get("precision", precision) == precision), None)


def _peer_cells(llama: list[dict] | None, workload: str, chats: int, precision: str, mode: str) -> list[str]:
    """llama-server's plain rate and its rate with ``mode``'s drafts (as a ratio to its plain one)."""
    off, spec = _rate(llama, workload, chats, "off", precision), _rate(llama, workload, chats, mode, precision)
    return [f"{off:.1f}" if off else "–", f"{spec:.1f} ({spec / off:.2f}x)" if off and spec else "–"]


def markdown_table(kvasir: list[dict], llama: list[dict] | None) -> str:
    def rate(rows, workload, chats, mode):
        return _rate(rows, workload, chats, mode, "int4" if rows is llama else None)

    lines = ["| workload | chats | off tok/s | ngram | auto | drafted tokens kept (ngram) | "
             "llama-server off | llama-server ngram-simple |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for workload in ("rewrite", "summarise", "story"):
        for chats in CHATS:
            off = rate(kvasir, workload, chats, "off")
            ngram_row = next(r for r in kvasir if (r["workload"], r["chats"], r["mode"]) == (workload, chats, "ngram"))
            cells = [f"{off:.1f}"]
            for mode in ("ngram", "auto"):
                cells.append(_cell(next(r for r in kvasir if (r["workload"], r["chats"], r["mode"]) ==
                                        (workload, chats, mode))))
            kept = f"{ngram_row['kept']}/{ngram_row['drafted']}" if ngram_row["drafted"] else "–"
            peer = _peer_cells(llama, workload, chats, "int4", "ngram")
            lines.append(f"| {workload} | {chats} | {' | '.join(cells)} | {kept} | {' | '.join(peer)} |")
    return "\n".join(lines)


def _cell(row: dict) -> str:
    return f"{row['tokens_per_s']:.1f} ({row['vs_off']:.2f}x)"


def draft_model_table(rows: list[dict], llama: list[dict] | None = None) -> str:
    """The draft-model pair: the unquantised model alone, with its int4 copy drafting (forced and auto), and the
    int4 model alone; llama-server's float32 file alone and with the 4-bit file drafting."""
    def row(workload, chats, mode):
        return next(r for r in rows if (r["workload"], r["chats"], r["mode"]) == (workload, chats, mode))

    lines = ["| workload | chats | none, off tok/s | none + int4 draft | auto | drafted tokens kept | int4 alone | "
             "llama-server F32 | llama-server F32 + Q4_1 draft |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for workload in ("rewrite", "summarise", "story"):
        for chats in CHATS:
            cells = [f"{row(workload, chats, 'off')['tokens_per_s']:.1f}"]
            for mode in ("draft", "auto", "int4"):
                cells.append(_cell(row(workload, chats, mode)))
            forced = row(workload, chats, "draft")
            cells.insert(3, f"{forced['kept']}/{forced['drafted']}" if forced["drafted"] else "–")
            cells += _peer_cells(llama, workload, chats, "none", "draft")
            lines.append(f"| {workload} | {chats} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--tokens", type=int, default=REPLY_TOKENS)
    parser.add_argument("--no-llama", action="store_true", help="leave llama-server out")
    parser.add_argument("--no-draft-model", action="store_true", help="leave the draft-model pair out")
    args = parser.parse_args(argv)
    from .bench import machine_info

    kvasir = measure_kvasir(args.rounds, args.tokens)
    drafted = [] if args.no_draft_model else measure_draft_model(min(args.rounds, DRAFT_ROUNDS), args.tokens)
    llama = None if args.no_llama else measure_llama(args.tokens, min(args.rounds, PEER_ROUNDS),
                                                     draft_rounds=None if args.no_draft_model else DRAFT_ROUNDS)
    table = markdown_table(kvasir, llama)
    print(table)
    draft_table = draft_model_table(drafted, llama) if drafted else ""
    print(draft_table)
    differing = [r for r in kvasir + drafted if not r["same_as_off"]]
    for row in differing:
        print(f"DIFFERENT OUTPUT: {row['workload']}, {row['chats']} chat(s), {row['mode']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": machine_info(), "kvasir": kvasir, "draft_model": drafted,
                                   "llama_server": llama, "auto_vs_off_min": min(_ratios(kvasir, "auto")),
                                   "draft_auto_vs_off_min": min(_ratios(drafted, "auto")) if drafted else None,
                                   "table": table, "draft_table": draft_table}, indent=2) + "\n")
    return 1 if differing else 0


def _ratios(rows: list[dict], mode: str) -> list[float]:
    return [r["vs_off"] for r in rows if r["mode"] == mode]


if __name__ == "__main__":
    raise SystemExit(main())
