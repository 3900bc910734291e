"""The speed peers: llama.cpp's own tools, which every desktop peer (LM Studio, Ollama, Jan) runs.

`make peers` builds them into the user cache folder (bench/build_llama_cpp.sh); this module finds them, runs them
with a timeout, reads their output and the resident memory of each run. A tool that is not built is skipped with
a note, never an error: the benchmark still runs without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ENV_BIN = "KVASIR_LLAMA_CPP_BIN"
TOOLS = ("llama-bench", "llama-batched-bench", "llama-perplexity", "llama-server")
TIMEOUT_S = 300.0
NOT_BUILT = "{tool} is not built (run `make peers`, or set " + ENV_BIN + " to a folder that has it)"
TIME_V = "/usr/bin/time"


def cache_root() -> Path:
    """Where `make peers` puts its builds: the user cache folder (bench/build_llama_cpp.sh uses the same one)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("Kvasir")) / "peers"


def _version_key(folder: Path) -> tuple:
    version = folder.parent.name.removeprefix("llama.cpp-")
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def bin_dir() -> Path | None:
    """The folder of llama.cpp binaries: the override in KVASIR_LLAMA_CPP_BIN, else the newest cached build."""
    override = os.environ.get(ENV_BIN)
    if override:
        return Path(override)
    builds = [b for b in cache_root().glob("llama.cpp-*/bin") if b.is_dir()]
    return max(builds, key=_version_key) if builds else None


def find_tool(tool: str) -> Path | None:
    """The executable of one llama.cpp tool, or None when it is not built."""
    folder = bin_dir()
    path = folder / tool if folder else None
    return path if path and path.is_file() and os.access(path, os.X_OK) else None


def build_info() -> dict | None:
    """What bench/build_llama_cpp.sh recorded next to the binaries (version, build seconds, cmake flags)."""
    folder = bin_dir()
    record = folder.parent / "build.json" if folder else None
    if record is None or not record.is_file():
        return None
    return json.loads(record.read_text())


@dataclass(slots=True)
class PeerRun:
    """One run of a peer tool: its output, how long it took and its peak resident memory."""

    tool: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    max_rss_bytes: int | None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def skipped(tool: str) -> dict:
    """The result of a peer that is not built: a note in place of numbers."""
    return {"skipped": NOT_BUILT.format(tool=tool)}


def run_tool(tool: str, args: list[str], timeout: float = TIMEOUT_S) -> PeerRun:
    """Run a built tool to completion (killed after ``timeout`` seconds) and measure its peak resident memory."""
    path = find_tool(tool)
    if path is None:
        return PeerRun(tool, None, "", "", 0.0, None, NOT_BUILT.format(tool=tool))
    # GNU time reports the child's peak RSS exactly; without it, poll the child.
    if os.access(TIME_V, os.X_OK):
        return _run_with_time_v(tool, [TIME_V, "-v", str(path), *args], timeout)
    return _run_polling(tool, [str(path), *args], timeout)


def _run_with_time_v(tool: str, command: list[str], timeout: float) -> PeerRun:
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        note = f"timed out after {timeout:.0f} s"
        return PeerRun(tool, None, _text(exc.stdout), _text(exc.stderr), timeout, None, note)
    seconds = time.perf_counter() - start
    return PeerRun(tool, done.returncode, done.stdout, done.stderr, seconds, parse_time_v_rss(done.stderr))


def _run_polling(tool: str, command: list[str], timeout: float) -> PeerRun:
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _rss_watch(child.pid) as peak:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            return PeerRun(tool, None, out, err, timeout, peak(), f"timed out after {timeout:.0f} s")
    return PeerRun(tool, child.returncode, out, err, time.perf_counter() - start, peak())


@contextlib.contextmanager
def _rss_watch(pid: int, every: float = 0.05) -> Iterator:
    """Poll a process's RSS in a thread; yields a function that returns the peak seen (None without psutil)."""
    import threading

    try:
        import psutil
    except ImportError:
        yield lambda: None
        return
    peak, stop = [0], threading.Event()

    def poll():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            while not stop.is_set():
                peak[0] = max(peak[0], proc.memory_info().rss)
                stop.wait(every)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield lambda: peak[0] or None
    finally:
        stop.set()
        thread.join()


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


# ---- output parsers -------------------------------------------------------------------------------------------


def parse_time_v_rss(stderr: str) -> int | None:
    """Peak resident memory in bytes from GNU ``time -v`` output (it reports kilobytes)."""
    match = re.search(r"Maximum resident set size \(kbytes\):\s*(\d+)", stderr)
    return int(match.group(1)) * 1024 if match else None


def parse_llama_bench(stdout: str) -> list[dict]:
    """The tests of ``llama-bench -o json``: one dict per test with n_prompt, n_gen and avg_ts / stddev_ts."""
    keep = ("n_prompt", "n_gen", "n_threads", "avg_ts", "stddev_ts", "model_type", "build_number", "cpu_info")
    return [{k: test.get(k) for k in keep} for test in json.loads(stdout)]


def parse_batched_bench(text: str) -> list[dict]:
    """The rows of ``llama-batched-bench --output-format jsonl``: pp, tg, pl (parallel sequences), t_pp, speed_pp,
    t_tg, speed_tg, t, speed. Log lines around them are ignored."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            rows.append(json.loads(line))
    return rows


def parse_perplexity(text: str) -> float | None:
    """The final perplexity printed by ``llama-perplexity``; the last running value when the summary is missing."""
    final = re.search(r"Final estimate: PPL = ([0-9.]+)", text)
    if final:
        return float(final.group(1))
    running = re.findall(r"\[\d+\]([0-9.]+),", text)
    return float(running[-1]) if running else None


# ---- the runs the benchmark uses ------------------------------------------------------------------------------


def _failed(run: PeerRun) -> dict:
    tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
    return {"skipped": run.note or f"{run.tool} exited with {run.returncode}: {' / '.join(tail)}"}


def llama_bench(model: Path, threads: int = 2, prompt: int = 128, gen: int = 128, reps: int = 3) -> dict:
    """Prompt processing and single-stream decode tok/s from llama-bench."""
    args = ["-m", str(model), "-t", str(threads), "-p", str(prompt), "-n", str(gen), "-r", str(reps), "-o", "json"]
    run = run_tool("llama-bench", args)
    if not run.ok:
        return _failed(run)
    tests = parse_llama_bench(run.stdout)
    pp = next((t["avg_ts"] for t in tests if t["n_prompt"] and not t["n_gen"]), None)
    tg = next((t["avg_ts"] for t in tests if t["n_gen"] and not t["n_prompt"]), None)
    return {"prompt_tokens_per_s": pp, "decode_tokens_per_s": tg, "prompt": prompt, "gen": gen,
            "max_rss_bytes": run.max_rss_bytes, "seconds": run.seconds, "tests": tests}


def batched_bench(model: Path, parallel=(1, 4, 16, 64), prompt: int = 64, gen: int = 128, threads: int = 2) -> dict:
    """Throughput with 1..N parallel sequences from llama-batched-bench (one prompt of ``prompt`` tokens each)."""
    args = ["-m", str(model), "-c", "8192", "-b", "2048", "-ub", "512", "-npp", str(prompt), "-ntg", str(gen),
            "-npl", ",".join(map(str, parallel)), "-t", str(threads), "--output-format", "jsonl"]
    run = run_tool("llama-batched-bench", args, timeout=2 * TIMEOUT_S)  # 64 chats x 128 tokens is its longest run
    if not run.ok:
        return _failed(run)
    rows = parse_batched_bench(run.stdout + "\n" + run.stderr)
    return {"rows": rows, "max_rss_bytes": run.max_rss_bytes, "seconds": run.seconds}


def perplexity(model: Path, text_file: Path, context: int = 512, threads: int = 2) -> dict:
    """llama-perplexity on a text file with ``context`` tokens per chunk."""
    args = ["-m", str(model), "-f", str(text_file), "-c", str(context), "-t", str(threads)]
    run = run_tool("llama-perplexity", args)
    if not run.ok:
        return _failed(run)
    return {"perplexity": parse_perplexity(run.stdout + "\n" + run.stderr), "context": context,
            "max_rss_bytes": run.max_rss_bytes, "seconds": run.seconds}


# ---- llama-server, for prompt caching ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(model: Path, context: int = 8192, threads: int = 2, timeout: float = 120.0,
           extra_args: tuple[str, ...] = ()) -> Iterator[LlamaServer]:
    """A llama-server on a free local port with its default slots and prompt cache; stopped on exit.
    ``extra_args``: more flags, such as ``--metrics``, ``--api-key K`` or ``-a NAME``."""
    path = find_tool("llama-server")
    if path is None:
        raise FileNotFoundError(NOT_BUILT.format(tool="llama-server"))
    port = _free_port()
    args = [str(path), "-m", str(model), "-c", str(context), "-t", str(threads), "--host", "127.0.0.1",
            "--port", str(port), *extra_args]
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        peer = LlamaServer(f"http://127.0.0.1:{port}", child.pid)
        peer.wait_ready(child, timeout)
        yield peer
    finally:
        child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(10)
        if child.poll() is None:
            child.kill()
            child.wait()


@dataclass(slots=True)
class LlamaServer:
    """A running llama-server: completions by token ids, and its resident memory."""

    url: str
    pid: int

    def wait_ready(self, child: subprocess.Popen, timeout: float) -> None:
        """Poll /health until the model is loaded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise RuntimeError(f"llama-server exited with {child.returncode} while starting")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            time.sleep(0.2)
        raise TimeoutError(f"llama-server not ready after {timeout:.0f} s")

    def complete(self, tokens: list[int], n_predict: int, ignore_eos: bool = True) -> dict:
        """One greedy completion of a prompt given as token ids: wall seconds, the tokens, and the server's counts
        of prompt tokens computed (prompt_n) and served from its cache (cache_n)."""
        body = {"prompt": tokens, "n_predict": n_predict, "temperature": 0.0, "cache_prompt": True,
                "return_tokens": True, "ignore_eos": ignore_eos}
        request = urllib.request.Request(self.url + "/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            data = json.loads(reply.read())
        timings = data.get("timings", {})
        return {"seconds": time.perf_counter() - start, "tokens": data.get("tokens", []),
                "prompt_n": timings.get("prompt_n"), "cache_n": timings.get("cache_n"),
                "prompt_ms": timings.get("prompt_ms")}

    def max_rss_bytes(self) -> int | None:
        """The server's peak resident memory so far (Linux's VmHWM)."""
        status = Path(f"/proc/{self.pid}/status")
        if not status.is_file():
            return None
        match = re.search(r"VmHWM:\s*(\d+) kB", status.read_text())
        return int(match.group(1)) * 1024 if match else None
