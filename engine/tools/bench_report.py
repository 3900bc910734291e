"""The full benchmark's report: Markdown tables, the files under bench/results/, the plots and the README table.

Every number shown is read from a report that ``bench.run_full`` measured; none is typed by hand.
"""

from __future__ import annotations

import re
from pathlib import Path

from .bench import report_json

PEERS = ("llama.cpp", "transformers")
ENGINES = ("kvasir", *PEERS)
README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"
MIB = 1024**2


def _num(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ms(value) -> str:
    return "–" if value is None else f"{value * 1000:,.0f}"


def _x(value) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _loads(engine: dict) -> dict[int, dict]:
    return {r["chats"]: r for r in engine.get("loads", [])} if isinstance(engine.get("loads"), list) else {}


def machine_line(report: dict) -> str:
    """One line: CPU, cores, memory, torch, and the llama.cpp build."""
    m, model = report["machine"], report["model"]
    ram = f"{m['ram_bytes'] / 1024**3:.0f} GiB" if m.get("ram_bytes") else "? GiB"
    build = (report["engines"]["llama.cpp"].get("build") or {}).get("llama_cpp_build")
    return (f"{m['cpu']}, {m['cores']} cores, {ram} RAM, {m['os']}; torch {m['torch']} ({m['torch_threads']} "
            f"threads), transformers {m['transformers']}; llama.cpp build {build or 'not built'}; "
            f"{model['name']} ({model['file']}) on {model['device']}, {model['dtype']}; {report['date']}")


def throughput_table(report: dict) -> list[str]:
    """Decode tok/s per number of chats on each engine, and Kvasir's ratio to each peer."""
    engines = report["engines"]
    loads = {name: _loads(engines[name]) for name in ENGINES}
    tokens = report["settings"]["new_tokens"]
    lines = [f"| chats x {tokens} tokens | Kvasir tok/s | llama.cpp tok/s | transformers tok/s | "
             "Kvasir / llama.cpp | Kvasir / transformers |", "|---:|---:|---:|---:|---:|---:|"]
    for n in report["settings"]["chats"]:
        row = [_num(loads[name].get(n, {}).get("decode_tokens_per_s")) for name in ENGINES]
        shares = [_x(report["ratios"][peer]["decode_tokens_per_s"].get(str(n))) for peer in PEERS]
        lines.append(f"| {n} | " + " | ".join(row + shares) + " |")
    return lines


def latency_table(report: dict) -> list[str]:
    """TTFT and inter-token latency (p50 / p95, ms) per number of chats, Kvasir and llama.cpp."""
    kvasir, llama = _loads(report["engines"]["kvasir"]), _loads(report["engines"]["llama.cpp"])
    lines = ["| chats | Kvasir TTFT p50 / p95 ms | llama.cpp TTFT ms | Kvasir ITL p50 / p95 ms | llama.cpp ITL ms |",
             "|---:|---:|---:|---:|---:|"]
    for n in report["settings"]["chats"]:
        k, q = kvasir.get(n, {}), llama.get(n, {})
        lines.append(f"| {n} | {_ms(k.get('ttft_p50_s'))} / {_ms(k.get('ttft_p95_s'))} | {_ms(q.get('ttft_p50_s'))} | "
                     f"{_ms(k.get('itl_p50_s'))} / {_ms(k.get('itl_p95_s'))} | {_ms(q.get('itl_p50_s'))} |")
    return lines


def _cell(engine: dict, part: str, key: str, fmt) -> str:
    value = engine.get(part, {})
    return "–" if not isinstance(value, dict) or value.get(key) is None else fmt(value[key])


def other_table(report: dict) -> list[str]:
    """Prompt processing, the shared system prompt, multi-turn caching, memory and perplexity side by side."""
    s = report["settings"]
    e = [report["engines"][name] for name in ENGINES]
    pct = lambda v: f"{v * 100:.0f}%"  # noqa: E731
    mib = lambda v: f"{v / MIB:,.0f}"  # noqa: E731
    rows = [
        (f"prompt processing, {s['pp_tokens']}-token prompt (tok/s)", "prompt", "prompt_tokens_per_s", _num),
        (f"{s['system_tokens']}-token system prompt, cold TTFT (ms)", "system_prompt", "cold_ttft_s", _ms),
        ("same system prompt, next question, cached TTFT (ms)", "system_prompt", "cached_ttft_s", _ms),
        ("  its prompt tokens from cache", "system_prompt", "cached_share", pct),
        ("8 chats x 4 turns: prompt tokens from cache", "conversations", "cached_share", pct),
        ("the same, turns 2-4 only", "conversations", "cached_share_later_turns", pct),
        ("perplexity, shipped text, 512-token chunks scored as llama-perplexity does", "perplexity_chunks",
         "perplexity", lambda v: f"{v:.2f}"),
        ("perplexity, 512-token window sliding by 256 (eval-quant's)", "perplexity", "perplexity",
         lambda v: f"{v:.2f}"),
        ("Kvasir's greedy replies llama.cpp repeats (first 16 tokens)", "greedy_agreement", "identical", str),
        ("  their mean common prefix (tokens)", "greedy_agreement", "mean_common_prefix", _num),
    ]
    lines = ["| measure | Kvasir | llama.cpp | transformers |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | " + " | ".join(_cell(x, part, key, fmt) for x in e) + " |"
              for label, part, key, fmt in rows]
    rss = ["–" if not x.get("max_rss_bytes") else mib(x["max_rss_bytes"]) for x in e]
    return [*lines, "| peak resident memory (MiB) | " + " | ".join(rss) + " |"]


def notes(report: dict) -> list[str]:
    """What was skipped and how each figure was taken."""
    found = [f"- {name}: {part}: {value['skipped']}" for name in ENGINES for part, value in report["engines"][name]
             .items() if isinstance(value, dict) and "skipped" in value]
    if "skipped" in report["engines"]["llama.cpp"]:
        found.append(f"- llama.cpp: {report['engines']['llama.cpp']['skipped']}")
    return sorted(set(found)) + [
        "- Kvasir: decode tok/s counts the tokens after every chat has its first one, over that time; TTFT and "
        "ITL from per-request metrics and per-step timestamps.",
        "- llama.cpp: llama-batched-bench (`-npp 64 -ntg 128`, no shared prompt): decode tok/s is S_TG, TTFT the "
        "time to process all prompts, ITL the mean step time; prompt processing from llama-bench; caching through "
        "llama-server with its default slots, requests one at a time; memory is the peak of its runs.",
        "- transformers: `generate` for 1 chat, `generate_batch` beyond, on Kvasir's model object, prompt time "
        "included; its memory is the shared process's peak.",
        "- Perplexity: the first row scores the second half of each whole 512-token chunk on both sides (each chunk "
        "from BOS, as llama-perplexity does); the second row is Kvasir's eval-quant measure (every token scored).",
    ]


def markdown(report: dict) -> str:
    """The whole report as Markdown (the README's Benchmark table is this text)."""
    took = f" The whole run took {report['bench_seconds'] / 60:.1f} min." if report.get("bench_seconds") else ""
    return "\n".join([
        f"Machine: {machine_line(report)}.{took}", "",
        *throughput_table(report), "", *latency_table(report), "", *other_table(report), "",
        "Ratios above 1 mean Kvasir is faster. Notes:", *notes(report),
    ]) + "\n"


def file_stem(report: dict) -> str:
    """Date and machine, for the report's file names: e.g. 2025-01-31-amd-epyc-2c."""
    cpu = re.sub(r"[^a-z0-9]+", "-", report["machine"]["cpu"].lower()).strip("-")[:32]
    return f"{report['date'][:10]}-{cpu}-{report['machine']['cores']}c"


def write_results(report: dict, folder: Path, progress=print) -> list[Path]:
    """JSON, Markdown and plots under ``folder``, dated and as latest.*; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    stem, text = file_stem(report), markdown(report)
    written = []
    for name in (stem, "latest"):
        for suffix, content in ((".json", report_json(report)), (".md", text)):
            path = folder / f"{name}{suffix}"
            path.write_text(content)
            written.append(path)
    return written + plot(report, folder, progress)


def plot(report: dict, folder: Path, progress=print) -> list[Path]:
    """throughput.png (decode tok/s vs chats) and ttft.png (TTFT p50 vs chats); skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress("plots skipped: matplotlib is not installed (pip install -e '.[bench]')")
        return []
    paths = []
    for key, name, label in (("decode_tokens_per_s", "throughput", "decode tokens/s (all chats)"),
                             ("ttft_p50_s", "ttft", "time to first token, p50 (s)")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for engine in ENGINES:
            points = sorted((n, r[key]) for n, r in _loads(report["engines"][engine]).items() if r.get(key))
            if points:
                ax.plot(*zip(*points), marker="o", label=engine)
        ax.set(xscale="log", xlabel="chats at once", ylabel=label, title=f"{report['model']['name']}, "
               f"{report['machine']['cores']} cores")
        ax.set_xticks(report["settings"]["chats"], [str(n) for n in report["settings"]["chats"]])
        ax.legend()
        fig.tight_layout()
        paths.append(folder / f"{name}.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def update_readme(readme: Path, latest_md: Path) -> None:
    """Replace what lies between the README's bench markers with the latest report."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise ValueError(f"{readme.name} has no {README_START} ... {README_END} markers")
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    readme.write_text(f"{head}{README_START}\n{latest_md.read_text().strip()}\n{README_END}{tail}")
