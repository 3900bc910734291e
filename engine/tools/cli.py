"""Command line: ``python -m engine generate | chat | serve | bench``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

from ..config import (
    AUTO_QUANTIZATION_RULE,
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    SPECULATION_MODES,
    WEIGHT_MODES,
    EngineConfig,
)
from ..errors import EngineError
from ..sampling_params import CHAT_SAMPLING
from ..step.attention_backend import ATTENTION_BACKENDS
from .reply_args import ReplyPrinter, assistant_message, chat_from, params_from, reply_record


def engine_args(parser: argparse.ArgumentParser, several_models: bool = False) -> None:
    if several_models:
        parser.add_argument("--model", action="append", default=None, metavar="MODEL[@QUANT]",
                            help="a model to serve; give it again for more, all resident at once (the first is "
                                 "the default for requests naming none). 'default', a library name, a .gguf file, "
                                 "a model folder or a Hub repo id, with @QUANT to pick its quantisation "
                                 "(--model default --model default@none: the bundled model twice)")
    else:
        parser.add_argument("--model", default=None, metavar="MODEL[@QUANT]",
                            help="'default', a library name, a .gguf file, a model folder or a Hub repo id (@QUANT "
                                 "picks the quantisation); with --remote, one of the server's models (optional "
                                 "when it serves one)")
    parser.add_argument("--quant", "--quantization", dest="quant", default="auto", choices=QUANTIZATIONS,
                        help=AUTO_QUANTIZATION_RULE)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--kv-blocks", type=int, default=None, help="size of the KV pool in blocks")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                        help="how the KV cache stores keys and values (auto: the smallest format measured to keep "
                             "quality and speed on this model, see eval-quant --kv)")
    parser.add_argument("--speculation", default="auto", choices=SPECULATION_MODES,
                        help="speculative decoding: auto drafts where measurement says it pays (with the draft "
                             "model if one is given, else from earlier text), ngram whenever lookup finds a draft, "
                             "draft always with the draft model, off never")
    parser.add_argument("--draft-model", default=None,
                        help="a model to write drafts, loaded beside --model; its tokenizer must be the same "
                             "(for example the same model: --quant none --draft-model default --draft-quant int4)")
    parser.add_argument("--draft-quant", default="auto", choices=QUANTIZATIONS, help="the draft model's quantisation")
    parser.add_argument("--no-kv-disk-cache", dest="kv_disk_cache", action="store_false",
                        help="keep no KV blocks on disk (by default recent conversations' are, so a restart "
                             "computes nothing again)")
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                        help="run every step eagerly on a GPU (decode steps replay from CUDA graphs by default)")
    parser.add_argument("--attention", default="auto", choices=ATTENTION_BACKENDS,
                        help="auto: flash-attn on CUDA where it can run the model, else torch; flex when asked for")


def sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=CHAT_SAMPLING.max_tokens)
    parser.add_argument("--temperature", type=float, default=CHAT_SAMPLING.temperature)
    parser.add_argument("--top-p", type=float, default=CHAT_SAMPLING.top_p)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--system", default=None, help="a system prompt")
    parser.add_argument("--no-think", dest="think", action="store_false",
                        help="ask a model whose chat template can be asked (enable_thinking) to answer without "
                             "reasoning first")


def serve_args(parser: argparse.ArgumentParser) -> None:
    from ..api import API_KEY_ENV, DEFAULT_HOST, DEFAULT_PORT

    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to listen on (default {DEFAULT_HOST}: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0 takes a free one")
    parser.add_argument("--api-key", default=None,
                        help=f"clients must send it as a Bearer token; needed for any host but loopback "
                             f"(default: the {API_KEY_ENV} environment variable)")
    parser.add_argument("--routes", default=None, metavar="FILE",
                        help="routing rules for requests naming the model 'auto' (JSON: rules and a fallback); "
                             "by default code, long messages and questions asking for reasoning go to the largest "
                             "model, the rest to the smallest")
    parser.add_argument("--idle-unload", type=float, default=None, metavar="SECONDS",
                        help="unload a model other than the first once no request has used it for this long")
    parser.add_argument("--no-load-on-demand", dest="load_on_demand", action="store_false",
                        help="answer a request naming a library model that is not loaded with a 404 (by default it "
                             "is loaded, idle models used least recently unloaded first where it would not fit)")


def remote_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remote", metavar="URL", default=None,
                        help="an OpenAI-compatible server (vLLM, SGLang, llama-server, Ollama, Kvasir) instead of "
                             "the local engine, e.g. http://localhost:8000")
    parser.add_argument("--api-key", default=None,
                        help="the server's API key (default: the KVASIR_API_KEY environment variable)")


def build_parser(prog: str = "python -m engine") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Kvasir's inference engine")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="stream one reply to stdout")
    engine_args(generate)
    remote_args(generate)
    sampling_args(generate)
    generate.add_argument("--json", action="store_true", help="end with a JSON line of metrics")
    generate.add_argument("prompt")
    chat = commands.add_parser("chat", help="a terminal chat that keeps the conversation")
    engine_args(chat)
    remote_args(chat)
    sampling_args(chat)
    serve = commands.add_parser("serve", help="an OpenAI-compatible endpoint over the engine, no window")
    engine_args(serve, several_models=True)
    serve_args(serve)
    bench = commands.add_parser("bench", help="speed against llama.cpp and transformers on the same model")
    engine_args(bench)
    bench.add_argument("--quick", action="store_true",
                       help="only 16 chats x 128 tokens and 1 chat x 128 tokens, against transformers")
    bench.add_argument("--concurrent", type=int, default=16, help="--quick: chats at once")
    bench.add_argument("--tokens", type=int, default=128, help="new tokens per chat")
    bench.add_argument("--chats", default="1,4,16,64", help="numbers of chats at once, comma-separated")
    bench.add_argument("--no-peers", action="store_true", help="leave llama.cpp out")
    bench.add_argument("--out", default="bench/results", help="folder for the JSON, Markdown and plots")
    bench.add_argument("--readme", metavar="README", nargs="?", const="README.md", default=None,
                       help="only rewrite the README's bench table from OUT/latest.md, measure nothing")
    bench.add_argument("--json", action="store_true")
    models = commands.add_parser("models", help="the model library")
    actions = models.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="the models in the library")
    add = actions.add_parser("add", help="add a .gguf file, a model folder or a Hub repo id (downloaded)")
    add.add_argument("spec")
    remove = actions.add_parser("remove", help="forget a model (its files stay)")
    remove.add_argument("name")
    info = actions.add_parser("info", help="what a model is, and how it fits in each quantisation")
    info.add_argument("name")
    fit = actions.add_parser("fit", help="memory needed and context that fits, before loading")
    fit.add_argument("name")
    fit.add_argument("--quant", default="auto", choices=QUANTIZATIONS)
    fit.add_argument("--device", default="auto")
    fit.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    fit.add_argument("--json", action="store_true")
    search = actions.add_parser("search", help="chat models on the Hugging Face Hub, most downloaded first")
    search.add_argument("query", nargs="?", default="")
    search.add_argument("--format", choices=["gguf", "safetensors"], default=None)
    files = actions.add_parser("files", help="a Hub repository's files: quantisation, size, fit (before download)")
    files.add_argument("repo")
    files.add_argument("--quant", default="auto", choices=QUANTIZATIONS)
    files.add_argument("--device", default="auto")
    download = actions.add_parser("download", help="download a file of a Hub repository into the library "
                                  "(resumes an interrupted download; Ctrl+C stops and keeps what arrived)")
    download.add_argument("repo")
    download.add_argument("file", help="a GGUF file's name, or 'safetensors'")
    evaluate = commands.add_parser("eval-quant", help="perplexity, memory and speed of each quantisation")
    evaluate.add_argument("--model", default="default")
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument("--modes", default=",".join(WEIGHT_MODES))
    evaluate.add_argument("--json", action="store_true")
    evaluate.add_argument("--kv", action="store_true",
                          help="the KV cache formats instead: quality against a float32 cache and decode speed, "
                               "kept for kv_cache_dtype=auto")
    evaluate.add_argument("--quant", default="auto", choices=QUANTIZATIONS, help="the weights' quantisation (--kv)")
    route = commands.add_parser("eval-route", help="accuracy, TTFT and speed of each model of a route on a small task "
                                "set, and what the router chooses (kept for the app's routing dialog)")
    engine_args(route, several_models=True)
    route.add_argument("--routes", default=None, metavar="FILE",
                       help="the routing rules (JSON, as for serve); by default the default routes for the models")
    route.add_argument("--per-category", type=int, default=None, metavar="N",
                       help="only the first N tasks of each kind")
    route.add_argument("--json", action="store_true", help="end with the whole evaluation as JSON")
    route.add_argument("--no-save", dest="save", action="store_false", help="keep no copy for the app")
    return parser


def model_spec(name_or_spec: str) -> str:
    """A library name becomes the setting that loads it; anything else is passed through."""
    from ..models.library import ModelLibrary

    for entry in ModelLibrary().entries():
        if entry.name == name_or_spec:
            return entry.spec
    return name_or_spec


def config_from(args, model: str | None = None) -> EngineConfig:
    """The engine's configuration from the arguments; ``model``: one of several ``--model`` values (by default
    the only one). ``NAME@QUANT`` overrides ``--quant``."""
    from ..serving.resident import split_model_spec

    given = args.model[0] if isinstance(args.model, list) else args.model  # serve takes several
    name, quant = split_model_spec(model or given or "default")
    return EngineConfig(
        model=model_spec(name),
        quantization=args.quant if quant == "auto" else quant,
        dtype=args.dtype,
        device=args.device,
        num_kv_blocks=args.kv_blocks,
        kv_cache_dtype=args.kv_cache_dtype,
        speculation=args.speculation,
        draft_model=model_spec(args.draft_model) if args.draft_model else None,
        draft_quantization=args.draft_quant,
        kv_disk_cache=args.kv_disk_cache,
        cuda_graphs=args.cuda_graphs,
        attention_backend=args.attention,
    )


def stream_reply(engine, prompt, params):
    """Print a reply as it streams; returns the final output."""
    engine.add_request(prompt, params)
    final, printer = None, ReplyPrinter()
    while engine.has_unfinished():
        for out in engine.step():
            printer.show(out)
            final = out
    printer.end()
    return final


def cmd_generate(args) -> int:
    from ..serving.engine import Engine

    if args.remote:
        from .remote_cli import remote_generate

        return remote_generate(args)

    engine = Engine(config_from(args))
    out = stream_reply(engine, chat_from(args, [{"role": "user", "content": args.prompt}]), params_from(args))
    if args.json:
        print(json.dumps(reply_record(out)))
    else:
        print(out.metrics.summary(), file=sys.stderr)
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
    return 0 if out.finish_reason != "error" else 1


def cmd_chat(args) -> int:
    from ..serving.engine import Engine

    if args.remote:
        from .remote_cli import remote_chat

        return remote_chat(args)

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
        out = stream_reply(engine, chat_from(args, history), params_from(args))
        if out.finish_reason == "error":
            print(f"[error: {out.error}]")
            history.pop()
            continue
        history.append(assistant_message(out))
        print(out.metrics.summary())


def cmd_serve(args) -> int:
    """Listen first (a port in use fails at once), then load the model; requests meanwhile get a 503."""
    from ..api import API_KEY_ENV, ApiConfig, ApiConfigError, ApiServer, ServerStartError
    from ..api.model_loader import OnDemandModels
    from ..routing.evaluation import load_saved
    from ..serving.async_engine import AsyncEngine

    try:
        api = ApiConfig(args.host, args.port, args.api_key or os.environ.get(API_KEY_ENV))
    except ApiConfigError as exc:
        print(f"error: {exc} (give one with --api-key K, or the {API_KEY_ENV} environment variable)",
              file=sys.stderr)
        return 2
    try:
        configs = resident_configs(args, ["default"])
        routes = _read_routes(args.routes) if args.routes else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    serving: list[AsyncEngine] = []
    loader = OnDemandModels(configs[0]) if args.load_on_demand else None
    evaluated = load_saved()  # rules with min_score read the latest eval-route
    server = ApiServer(lambda: serving[0] if serving else None, api, access_log=True, configure_logging=True,
                       routes=routes, loader=loader, scores=evaluated.scores() if evaluated else None)
    try:
        url = server.start()
    except ServerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"listening on {url}; loading {'the model' if len(configs) == 1 else f'{len(configs)} models'}...",
          file=sys.stderr, flush=True)
    try:
        serving.append(AsyncEngine(configs[0]))
        serving[0].idle_unload_s = args.idle_unload
        for config in configs[1:]:
            asyncio.run(serving[0].load_model(config))
        served = ", ".join(f"{i} ({serving[0].stats(i).quantization}, {serving[0].stats(i).device})"
                           for i in serving[0].model_ids())
        print(f"Kvasir serves {served} at {url}", flush=True)
        print("OpenAI-compatible: GET /v1/models, POST /v1/chat/completions, POST /v1/completions. "
              "Ctrl-C stops.", file=sys.stderr, flush=True)
        server.wait()
    except KeyboardInterrupt:
        print("stopping (Ctrl-C again to stop at once)", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    finally:
        if serving:  # the engine first: it ends every open stream, so the server has none left to wait for
            serving[0].shutdown()
        server.stop()
    return 0


def resident_configs(args, default: list[str]) -> list[EngineConfig]:
    """One configuration per ``--model`` (``default`` where none is given). A model after the first drafts by
    lookup at most: ``--draft-model`` drafts for the first."""
    configs = [config_from(args, spec) for spec in args.model or default]
    return configs[:1] + [dataclasses.replace(c, draft_model=None, speculation="auto" if c.speculation == "draft"
                                              else c.speculation) for c in configs[1:]]


def _read_routes(path: str):
    """``--routes``: the JSON file's rules; ``ValueError`` naming the file and what is wrong."""
    from ..routing.router import Routes

    try:
        return Routes.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except OSError as exc:
        raise ValueError(f"could not read the routes in {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"the routes in {path}: {exc}") from None


def cmd_bench(args) -> int:
    from pathlib import Path

    from . import bench, bench_report

    out = Path(args.out)
    if args.readme:
        bench_report.update_readme(Path(args.readme), out / "latest.md")
        print(f"{args.readme}: bench table rewritten from {out / 'latest.md'}")
        return 0
    if args.quick:
        bench.print_report(bench.run_quick(config_from(args), concurrent=args.concurrent, new_tokens=args.tokens),
                           args.json)
        return 0
    chats = tuple(int(n) for n in args.chats.split(",") if n.strip())
    progress = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    report = bench.run_full(config_from(args), chats, args.tokens, not args.no_peers, progress)
    written = bench_report.write_results(report, out, progress)
    print(bench_report.markdown(report))
    print("written: " + ", ".join(str(p) for p in written), file=sys.stderr)
    if args.json:
        print(bench.report_json(report))
    return 0


def cmd_models(args) -> int:
    from ..models.library import ModelLibrary

    library = ModelLibrary()
    if args.action == "list":
        print(f"{'name':32} {'architecture':12} {'parameters':>11} {'context':>8} {'on disk':>9}  source")
        for e in library.entries():
            i = e.info
            print(f"{e.name:32} {i.architecture:12} {i.parameter_count / 1e6:10.1f}M {i.context_length:8,} "
                  f"{i.size_on_disk / 1024**2:7.0f}MB  {e.spec}")
    elif args.action == "add":
        entry = library.add(args.spec)
        print(f"added {entry.name} ({entry.info.architecture}, {entry.info.parameter_count / 1e6:.1f}M parameters)")
    elif args.action == "remove":
        print(f"removed {library.remove(args.name).name} (its files were left where they are)")
    elif args.action == "info":
        entry = library.get(args.name)
        for key, value in entry.info.to_dict().items():
            print(f"{key:24} {value}")
        for mode in WEIGHT_MODES:
            print(f"fit {mode:20} {estimate_for(entry.spec, mode, 'auto', 'auto').summary()}")
    elif args.action == "fit":
        fit = estimate_for(library.get(args.name).spec, args.quant, args.device, args.dtype)
        print(json.dumps(fit.to_dict()) if args.json else fit.summary())
        return 0 if fit.fits else 1
    elif args.action in ("search", "files", "download"):
        return cmd_hub(args, library)
    return 0


def cmd_hub(args, library) -> int:
    """``models search``, ``models files`` and ``models download``: the app's Discover tab in a terminal."""
    from ..models.hub_download import HubDownload
    from ..models.hub_fit import fit_options
    from ..models.hub_search import repo_options, search_models

    if args.action == "search":
        for m in search_models(args.query, args.format):
            updated = m.updated.strftime("%Y-%m-%d") if m.updated else "-"
            print(f"{m.repo_id:60} {m.downloads:>10,} downloads {m.likes:>6,} likes  {updated}  {','.join(m.formats)}")
        return 0
    repo = repo_options(args.repo)
    if args.action == "files":
        fits = fit_options(repo, args.quant, args.device)
        for o in repo.options:
            print(f"{o.name:56} {o.quantization:9} {o.size / 1024**2:9.1f}MB  {o.problem or fits[o.name].label()}")
        return 0
    try:
        option = repo.option(args.file)
    except KeyError:
        raise ValueError(f"{args.repo} has no {args.file!r}; 'models files {args.repo}' lists its files") from None
    download = HubDownload(repo, option, library, progress=lambda p: print(
        f"\r{p.done / 1024**2:,.1f} of {p.total / 1024**2:,.1f} MB", end="", file=sys.stderr, flush=True))
    try:
        entry = download.run()
    except KeyboardInterrupt:
        print(f"\nstopped; {download.partial_bytes() / 1024**2:,.1f} MB kept, the same command continues",
              file=sys.stderr)
        return 130
    print(f"\nadded {entry.name} ({entry.spec})")
    return 0


def estimate_for(spec: str, quant: str, device: str, dtype: str):
    from ..models.fit import estimate

    return estimate(EngineConfig(model=spec, quantization=quant, device=device, dtype=dtype))


def cmd_eval_quant(args) -> int:
    if args.kv:
        return _eval_kv(args)
    from .evaluation import evaluate, markdown_table, to_json

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    results = evaluate(model_spec(args.model), args.device, modes, progress=lambda m: print(m, file=sys.stderr))
    from ..devices import resolve_device

    print(markdown_table(results, args.model, str(resolve_device(args.device)[0])))
    if args.json:
        print(to_json(results))
    return 0


def _eval_kv(args) -> int:
    from dataclasses import asdict

    from ..devices import resolve_device
    from .kv_evaluation import evaluate_kv, markdown_table

    rows = evaluate_kv(model_spec(args.model), args.device, args.quant, progress=lambda m: print(m, file=sys.stderr))
    print(markdown_table(rows, args.model, str(resolve_device(args.device)[0])))
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
    return 0


def cmd_eval_route(args) -> int:
    from ..routing import evaluation

    configs = resident_configs(args, ["default", "default@none"])
    routes = _read_routes(args.routes) if args.routes else None
    result = evaluation.run(configs, routes, args.per_category, progress=lambda m: print(m, file=sys.stderr))
    print(result.markdown())
    if args.save:
        print(f"saved for the app: {evaluation.save(result)}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m engine") -> int:
    args = build_parser(prog).parse_args(argv)
    commands = {"generate": cmd_generate, "chat": cmd_chat, "serve": cmd_serve, "bench": cmd_bench,
                "models": cmd_models, "eval-quant": cmd_eval_quant, "eval-route": cmd_eval_route}
    try:
        return commands[args.command](args)
    except (EngineError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


