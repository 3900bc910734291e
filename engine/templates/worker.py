"""A template worker: a process that renders chat templates for the engine, one request at a time.

It reads frames (:mod:`.frames`) on stdin and answers each on stdout, after a first ``{"ready": true}`` once its
imports are done. Its address space is capped (``memory_bytes`` above what the imports took, where the platform
enforces it) and so is the CPU time of each render: the engine kills a worker at its deadline, and the CPU cap ends
a runaway render even when the engine is gone. Run as ``python -m engine.templates.worker``; the frozen app runs it
as ``kvasir --template-worker``.
"""

from __future__ import annotations

import math
import os
import sys

from .frames import read_frame, write_frame

FLAG = "--template-worker"


def main(argv: list[str] | None = None) -> int:
    """Serve render requests until stdin closes."""
    args = sys.argv[1:] if argv is None else argv
    memory_bytes = int(args[args.index("--memory") + 1]) if "--memory" in args else 0
    replies, requests = sys.stdout.buffer, sys.stdin.buffer
    sys.stdout = sys.stderr  # nothing but frames may reach the engine's pipe
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception as exc:  # a broken install: the engine says so instead of waiting
        write_frame(replies, {"error": "startup", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    if memory_bytes:
        _limit_memory(memory_bytes)
    write_frame(replies, {"ready": True})
    while (request := read_frame(requests)) is not None:
        reply = render(request, render_jinja_template)
        write_frame(replies, reply)
        if reply.get("error") == "memory":
            return 0  # a fresh worker takes over rather than one that ran out mid-allocation
    return 0


def render(request: dict, render_jinja_template) -> dict:
    """One reply: ``{"text"}``, or ``{"error", ...}`` saying why the template gave none."""
    _limit_cpu(request["cpu_s"])
    try:
        texts, _ = render_jinja_template(
            conversations=[request["messages"]], tools=request.get("tools"), chat_template=request["template"],
            add_generation_prompt=request["add_generation_prompt"],
            continue_final_message=request["continue_final_message"], **request["variables"])
    except MemoryError:
        return {"error": "memory"}
    except RecursionError:
        return {"error": "refused", "message": "it calls itself too deeply"}
    except Exception as exc:  # the template's raise_exception, a Jinja error, or transformers' own checks
        return {"error": "refused", "message": str(exc) or type(exc).__name__}
    text = texts[0]
    if len(text) > request["max_chars"]:
        return {"error": "too_long", "chars": len(text)}
    return {"text": text}


def _limit_memory(headroom: int) -> None:
    try:
        import resource

        with open("/proc/self/statm") as statm:  # Linux: where RLIMIT_AS is enforced
            used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (used + headroom, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (ImportError, OSError, ValueError):
        pass  # no such limit here: the deadline still holds


def _limit_cpu(seconds: float) -> None:
    try:
        import resource
    except ImportError:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


if __name__ == "__main__":
    sys.exit(main())
