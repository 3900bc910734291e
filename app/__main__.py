"""The ``kvasir`` command. Until the desktop window lands, it starts the terminal chat on the engine."""

from __future__ import annotations

import sys

from . import __version__


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        print(f"kvasir {__version__}")
        return 0
    from engine.__main__ import main as engine_main

    return engine_main(["chat", *argv])


if __name__ == "__main__":
    sys.exit(main())
