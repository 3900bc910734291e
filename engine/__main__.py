"""``python -m engine``: the command line in :mod:`engine.tools.cli`."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
