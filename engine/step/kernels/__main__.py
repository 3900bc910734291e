"""``python -m engine.step.kernels``: build (or find) the native kernels now and say which ones load.

``--prebuilt FOLDER`` instead builds every SIMD flavour into FOLDER, for a packaged app."""

import sys
from pathlib import Path

from . import build_prebuilt, status

if __name__ == "__main__":
    if sys.argv[1:2] == ["--prebuilt"] and len(sys.argv) == 3:
        for library in build_prebuilt(Path(sys.argv[2])):
            print(library)
    else:
        result = status()
        print(f"kvasir native kernels: {'loaded, ' + result.detail if result.available else result.detail}")
