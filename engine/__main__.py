"""Command line: ``python -m engine generate | chat | bench``."""

from __future__ import annotations

import argparse
import json
import sys

from .config import EngineConfig
from .errors import EngineError
from .sampling import SamplingParams


def engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="'default', a .gguf file or a model folder")
    parser.add_argument("--quant", default="none", choices=["none", "int8", "nf4", "fp4"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--kv-blocks", type=int, default=None, help="size of the KV pool in blocks")


def sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--system", default=None, help="a system prompt")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Kvasir's inference engine")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="stream one reply to stdout")
    engine_args(generate)
    sampling_args(generate)
    generate.add_argument("--json", action="store_true", help="end with a JSON line of metrics")
    generate.add_argument("prompt")
    chat = commands.add_parser("chat", help="a terminal chat that keeps the conversation")
    engine_args(chat)
    sampling_args(chat)
    bench = commands.add_parser("bench", help="throughput against transformers on the same model")
    engine_args(bench)
    bench.add_argument("--quick", action="store_true", help="16 chats x 128 tokens and 1 chat x 128 tokens")
    bench.add_argument("--concurrent", type=int, default=16)
    bench.add_argument("--tokens", type=int, default=128)
    bench.add_argument("--json", action="store_true")
    return parser


def config_from(args) -> EngineConfig:
    return EngineConfig(
        model=args.model, quantization=args.quant, dtype=args.dtype, device=args.device, num_kv_blocks=args.kv_blocks
    )


def params_from(args) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed)


def messages_with_system(args, messages: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": args.system}] if args.system else []) + messages


def stream_reply(engine, prompt, params):
    """Print a reply as it streams; returns the final output."""
    engine.add_request(prompt, params)
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            print(out.delta_text, end="", flush=True)
            final = out
    print()
    return final


def metrics_line(out) -> dict:
    m = out.metrics
    return {
        "finish_reason": out.finish_reason, "error": out.error, "ttft_s": m.ttft_s, "queue_time_s": m.queue_time_s,
        "prompt_tokens": m.prompt_tokens, "cached_prompt_tokens": m.cached_prompt_tokens,
        "output_tokens": m.output_tokens, "decode_tokens_per_s": m.decode_tokens_per_s,
    }


def cmd_generate(args) -> int:
    from .engine import Engine

    engine = Engine(config_from(args))
    out = stream_reply(engine, messages_with_system(args, [{"role": "user", "content": args.prompt}]), params_from(args))
    if args.json:
        print(json.dumps(metrics_line(out)))
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
    return 0 if out.finish_reason != "error" else 1


def cmd_chat(args) -> int:
    from .engine import Engine

    print("loading the model...", file=sys.stderr)
    engine = Engine(config_from(args))
    stats = engine.stats()
    print(f"{stats.model_name} on {stats.device} ({stats.device_reason}). Empty line or Ctrl+D to quit.")
    history: list[dict] = []
    while True:
        try:
            text = input("\nyou> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not text:
            return 0
        history.append({"role": "user", "content": text})
        print("kvasir> ", end="", flush=True)
        out = stream_reply(engine, messages_with_system(args, history), params_from(args))
        if out.finish_reason == "error":
            print(f"[error: {out.error}]")
            history.pop()
            continue
        history.append({"role": "assistant", "content": out.text})
        m = out.metrics
        rate = f"{m.decode_tokens_per_s:.1f} tok/s" if m.decode_tokens_per_s else "-"
        print(f"[TTFT {m.ttft_s * 1000:.0f} ms | {m.output_tokens} tokens | {rate} | "
              f"{m.cached_prompt_tokens}/{m.prompt_tokens} prompt tokens from cache]")


def cmd_bench(args) -> int:
    from .bench import print_report, run_quick

    report = run_quick(config_from(args), concurrent=args.concurrent, new_tokens=args.tokens)
    print_report(report, args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"generate": cmd_generate, "chat": cmd_chat, "bench": cmd_bench}[args.command](args)
    except (EngineError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
