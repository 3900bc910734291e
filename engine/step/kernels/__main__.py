"""``python -m engine.step.kernels``: build (or find) the native kernels now and say which ones load."""

from . import status

if __name__ == "__main__":
    result = status()
    print(f"kvasir native kernels: {'loaded, ' + result.detail if result.available else result.detail}")
