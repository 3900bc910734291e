"""``python -m app.tools.idle_bench``: is an idle window idle?

The real window offscreen on the default model: one reply, then 60 s of nothing, with the engine panel hidden and
then shown. Prints the process's CPU time over each minute as a share of one core (the target: under 1%).
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time

from .offscreen import start_offscreen

IDLE_S = 60.0
SETTLE_S = 3.0  # after the reply and after showing the panel, before measuring


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    session = start_offscreen("kvasir-idle-bench-")

    async def run() -> dict:
        await session.load(model="default")
        await session.window.send("Hello!")
        results = {}
        for shown in (False, True):
            session.window.model_bar.panel_button.setChecked(shown)
            await asyncio.sleep(SETTLE_S)
            cpu, wall = cpu_seconds(), time.perf_counter()
            await asyncio.sleep(IDLE_S)
            share = 100 * (cpu_seconds() - cpu) / (time.perf_counter() - wall)
            results["panel_shown" if shown else "panel_hidden"] = {"percent_of_a_core": round(share, 2)}
        return results

    print(json.dumps(session.run(run())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
