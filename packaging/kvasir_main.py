"""The frozen app's entry point: the same ``kvasir`` command as the pip-installed one."""

import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
