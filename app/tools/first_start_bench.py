"""``python -m app.tools.first_start_bench``: how long from launch until a new user can chat, first time and second.

Each round runs ``kvasir --self-test`` (the window offscreen, the bundled model, one message) in a fresh process
with a fresh home folder, so nothing a previous start left (the GGUF headers, settings, chats) is there; only the
native kernels are copied in, as ``make install`` builds them and a packaged app ships them. ``ready_s`` is the
self-test's own figure: from the process's start until the model can take a message. The second round reuses the
first round's folder (what every later start sees). Beside them, llama-server's load of the same GGUF: from its
launch until its ``/health`` answers. Prints a table and writes ``bench/results/first_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.models.gguf_cache import cache_root
from engine.models.sources import default_model_path
from engine.tools import peers
from engine.tools.bench import machine_info

RESULTS = Path("bench/results/first_start.json")
TIMEOUT_S = 600


def self_test(home: Path) -> dict:
    """One ``kvasir --self-test`` with ``home`` as the user's home: its JSON line, and the wall time around it."""
    env = {**os.environ, "HOME": str(home), "QT_QPA_PLATFORM": "offscreen",
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local/share")}
    for inherited in ("KVASIR_CACHE_DIR", "KVASIR_DATA_DIR"):
        env.pop(inherited, None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "app", "--self-test"], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the self-test failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(lines[-1])
    return {"ready_s": report["ready_s"], "wall_s": round(wall, 2), "ttft_s": round(report["ttft_s"], 3)}


def fresh_home(root: Path) -> Path:
    """A home folder holding only this machine's built kernels."""
    home = root / "home"
    kernels = cache_root() / "kernels"
    if kernels.is_dir():
        shutil.copytree(kernels, home / ".cache" / "Kvasir" / "kernels")
    return home


def llama_server_load() -> dict:
    """Seconds from llama-server's launch until it serves the bundled GGUF, or why it was not run."""
    if peers.find_tool("llama-server") is None:
        return {"skipped": "llama-server is not built (make peers)"}
    started = time.perf_counter()
    with peers.server(default_model_path(), context=8192):
        ready = time.perf_counter() - started
    return {"ready_s": round(ready, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="fresh folders to start from (each started twice)")
    args = parser.parse_args(argv)
    rows = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="kvasir-first-start-") as root:
            home = fresh_home(Path(root))
            rows.append({"first": self_test(home), "second": self_test(home)})
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(), "kvasir": rows,
              "llama-server": llama_server_load()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"{'start':<12}{'ready (s)':>10}{'wall (s)':>10}")
    for row in rows:
        for which in ("first", "second"):
            print(f"{which:<12}{row[which]['ready_s']:>10.2f}{row[which]['wall_s']:>10.2f}")
    server = report["llama-server"]
    print(f"{'llama-server':<12}{server.get('ready_s', float('nan')):>10.2f}   {server.get('skipped', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
