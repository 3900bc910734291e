"""Native CPU kernels for the decode step, built once per machine and torch version.

``block_quant.cpp`` multiplies activations by GGUF's Q4_1 and Q8_0 blocks as llama.cpp does (activations
quantised to 8 bits per 32 values, integer dot products, AVX-512 VNNI or AVX2 where the CPU has them: one
build, a "flavour", for each, see :data:`SIMD_FLAVOURS`); ``layer_ops.cpp`` holds the rest of a llama-family
layer (RMSNorm, rotary embedding, gated activation, paged decode attention), each one pass instead of many
dispatched torch operations; ``decode_step.cpp`` runs every layer of a decode step in one call. They are
compiled with the system's C++ compiler against the installed torch into the user cache folder the first time
it is needed (about half a minute; ``python -m engine.step.kernels`` does it ahead of time, and ``make install``
calls that), then loaded in a fraction of a second. Without a compiler the engine keeps torch's own packed
kernels (:mod:`engine.step.packed_linear`), slower on CPUs without AVX-512, and :func:`status` says why.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCES = [Path(__file__).with_name(name)
           for name in ("block_quant.cpp", "layer_ops.cpp", "decode_step.cpp", "float_linear.cpp")]
HEADER = Path(__file__).with_name("kernels.h")
LIBRARY_NAMESPACE = "kvasir_kernels"
PREBUILT = Path(__file__).with_name("prebuilt")  # a packaged app's copies (packaging/build.py): users have no compiler
AVX2_FLAGS = ["-mavx2", "-mfma", "-mf16c"]


@dataclass(frozen=True, slots=True)
class SimdFlavour:
    """One build of the kernels: the compiler flags, and the CPU features (torch.cpu's names) it needs."""

    name: str
    flags: tuple[str, ...]
    needs: tuple[str, ...]


FLAVOUR_ENV = "KVASIR_KERNEL_FLAVOUR"
# best first; the last needs nothing (plain C++)
SIMD_FLAVOURS = (
    SimdFlavour("AVX-512 VNNI", (*AVX2_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
                ("avx2", "fma3", "f16c", "avx512_f", "avx512_bw", "avx512_vl", "avx512_vnni")),
    SimdFlavour("AVX2", tuple(AVX2_FLAGS), ("avx2", "fma3", "f16c")),
    SimdFlavour("portable C++", (), ()),
)
# torch's libraries seen from PREBUILT in a PyInstaller bundle (_internal/engine/step/kernels/prebuilt)
BUNDLED_TORCH_LIB = "$ORIGIN/../../../../torch/lib"
COMPILE_TIMEOUT_S = 600


@dataclass(frozen=True, slots=True)
class KernelStatus:
    """Whether the native kernels are loaded, and why not when they aren't."""

    available: bool
    detail: str  # the flavour's name ("AVX-512 VNNI", "AVX2", "portable C++") when available, else the reason


_lock = threading.Lock()
_status: KernelStatus | None = None


def status() -> KernelStatus:
    """Load the kernels (building them first if this machine has no copy yet); never raises."""
    global _status
    with _lock:
        if _status is None:
            _status = _load()
        return _status


def available() -> bool:
    return status().available


def is_ready() -> bool:
    """Whether :func:`status` would answer at once (the kernels are loaded, or known to be unavailable)."""
    try:
        return _status is not None or _library_path(list(flavour().flags)).exists()
    except ValueError:  # a flavour asked for that this CPU can't run: status() says so at once
        return True


def _load() -> KernelStatus:
    if os.environ.get("KVASIR_NATIVE_KERNELS", "1") == "0":
        return KernelStatus(False, "turned off by KVASIR_NATIVE_KERNELS=0")
    if sys.platform == "win32":
        return KernelStatus(False, "not built on Windows yet")
    try:
        chosen = flavour()
        simd = list(chosen.flags)
        library = _library_path(simd)
        if not library.exists():
            _build(library, simd)
        torch.ops.load_library(str(library))
    except Exception as exc:  # a missing compiler, a failed build: the torch kernels take over
        return KernelStatus(False, f"native kernels unavailable ({_short(exc)})")
    return KernelStatus(True, chosen.name)


def flavour() -> SimdFlavour:
    """The fastest flavour this CPU runs, or the one named by ``KVASIR_KERNEL_FLAVOUR`` (to compare flavours, or
    to test the slower ones); ValueError where this CPU can't run that one."""
    runnable = runnable_flavours()
    wanted = os.environ.get(FLAVOUR_ENV, "").strip()
    if not wanted:
        return runnable[0]
    for each in runnable:
        if each.name.lower() == wanted.lower():
            return each
    raise ValueError(f"{FLAVOUR_ENV}={wanted!r} is not one this CPU runs "
                     f"({', '.join(repr(f.name) for f in runnable)})")


def runnable_flavours() -> list[SimdFlavour]:
    """The flavours this CPU runs, fastest first (x86-64 only; elsewhere plain C++)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return [SIMD_FLAVOURS[-1]]
    features = _cpu_features()
    return [f for f in SIMD_FLAVOURS if all(features.get(need, False) for need in f.needs)]


def _cpu_features() -> dict[str, bool]:
    """The CPU's instruction sets as torch.cpu detects them; on a torch without that list, AVX2 where torch's
    own kernels chose AVX2 or better."""
    detect = getattr(torch.cpu, "get_capabilities", None)
    if detect is not None:
        return dict(detect())
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        return dict.fromkeys(SIMD_FLAVOURS[-2].needs, True)
    return {}


def _simd_flags() -> list[str]:
    """The compiler flags of :func:`flavour`."""
    return list(flavour().flags)


def _library_path(simd: list[str]) -> Path:
    """The packaged copy when there is one, else this machine's build in the user cache."""
    from platformdirs import user_cache_path

    name = _library_name(simd)
    if (PREBUILT / name).is_file():
        return PREBUILT / name
    return user_cache_path("Kvasir") / "kernels" / name


def _library_name(simd: list[str]) -> str:
    """One build per source text, torch version, compiler flags and Python ABI."""
    key = hashlib.sha256(
        b"\0".join([*(source.read_bytes() for source in [*SOURCES, HEADER]), torch.__version__.encode(),
                    " ".join(simd).encode(), sys.implementation.cache_tag.encode()])
    ).hexdigest()[:16]
    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    return f"kvasir_kernels-{key}{suffix}"


def build_prebuilt(folder: Path) -> list[Path]:
    """Every SIMD flavour this platform can run, built into ``folder`` (what a packaged app ships)."""
    flavours = SIMD_FLAVOURS if platform.machine().lower() in ("x86_64", "amd64") else SIMD_FLAVOURS[-1:]
    built = []
    for each in flavours:
        target = folder / _library_name(list(each.flags))
        if not target.exists():
            _build(target, list(each.flags), rpath=BUNDLED_TORCH_LIB)
        built.append(target)
    return built


def _build(library: Path, simd: list[str], rpath: str | None = None) -> None:
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (install g++ or clang)")
    torch_lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    command = [
        compiler, *map(str, SOURCES), "-o", "{output}", "-shared", "-fPIC", "-O3", "-std=c++17", "-fopenmp",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *simd,
        *[f"-I{path}" for path in cpp_extension.include_paths()],
        f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{rpath or torch_lib}",
    ]
    library.parent.mkdir(parents=True, exist_ok=True)
    staging = library.with_name(f"{library.name}.{os.getpid()}.tmp")
    command[command.index("{output}")] = str(staging)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"the compiler failed: {done.stderr.strip()[-500:]}")
        os.replace(staging, library)  # atomic: another process never loads half a library
    finally:
        staging.unlink(missing_ok=True)


def _short(exc: Exception) -> str:
    cause = f" ({exc.__cause__})" if exc.__cause__ else ""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}{cause}"[:400]
