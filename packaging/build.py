"""Build Kvasir's binaries: PyInstaller's one-folder app, then the files a user downloads.

Linux: dist/kvasir-<version>-linux-x86_64.tar.gz and dist/kvasir_<version>_amd64.deb; Windows: a zipped folder;
macOS: Kvasir.app in a .dmg. ``--variant cuda`` builds over the installed CUDA torch (names gain ``-cuda``).
Run through ``make package`` (packaging/README.md has the steps for each system).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
WORK = ROOT / "build" / "package"
sys.path.insert(0, str(ROOT))
from app.version import read_version  # noqa: E402


def step(name: str, started: list[float]) -> None:
    """Say how long the step since the last one took."""
    now = time.perf_counter()
    print(f"[package] {name}: {now - started[-1]:.0f} s", flush=True)
    started.append(now)


def nice(command: list[str]) -> list[str]:
    """Heavy steps run at low priority where the system has ``nice``."""
    return ["nice", "-n", "10", *command] if shutil.which("nice") else command


def prebuilt_kernels(variant: str) -> Path | None:
    """Native CPU kernels for every SIMD flavour, shipped so users need no compiler (not on Windows yet)."""
    if sys.platform == "win32":
        return None
    folder = WORK / "kernels"  # kept between builds: the file names carry a hash of sources, torch and flags
    built = subprocess.run(nice([sys.executable, "-m", "engine.step.kernels", "--prebuilt", str(folder)]), cwd=ROOT,
                           capture_output=True, text=True, check=False)
    if built.returncode != 0:  # e.g. no compiler, or one without OpenMP: the app uses torch's kernels
        print(f"[package] the native kernels did not build ({built.stderr.strip()[-300:]}); the bundle uses "
              "torch's kernels", file=sys.stderr)
        return None
    current = {Path(line).name for line in built.stdout.split()}
    for stale in folder.iterdir():
        if stale.name not in current:
            stale.unlink()
    return folder


def pyinstaller(variant: str, kernels: Path | None) -> Path:
    """Run the spec; the app's folder (``kvasir/``, or ``Kvasir.app`` on macOS) under build/package/dist."""
    env = {**os.environ, "KVASIR_VARIANT": variant, "KVASIR_KERNELS": str(kernels or ""), "PYTHONPATH": str(ROOT)}
    subprocess.run(nice([sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
                         "--distpath", str(WORK / "dist"), "--workpath", str(WORK / "work"),
                         str(ROOT / "packaging" / "kvasir.spec")]), cwd=ROOT, env=env, check=True)
    return WORK / "dist" / ("Kvasir.app" if sys.platform == "darwin" else "kvasir")


def tarball(bundle: Path, output: Path) -> Path:
    """``kvasir/`` in a .tar.gz: unpack anywhere and run kvasir/kvasir."""
    with tarfile.open(output, "w:gz", compresslevel=6) as tar:
        tar.add(bundle, arcname="kvasir")
    return output


def zipped(bundle: Path, output: Path) -> Path:
    """The Windows folder as a .zip (kvasir\\kvasir.exe, and kvasir-cli.exe for the console)."""
    return Path(shutil.make_archive(str(output.with_suffix("")), "zip", bundle.parent, bundle.name))


def dmg(bundle: Path, output: Path) -> Path:
    """Kvasir.app in a compressed disk image, with a link to /Applications to drag it onto."""
    staging = WORK / "dmg"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    subprocess.run(["ditto", str(bundle), str(staging / bundle.name)], check=True)
    (staging / "Applications").symlink_to("/Applications")
    output.unlink(missing_ok=True)
    subprocess.run(["hdiutil", "create", "-volname", "Kvasir", "-srcfolder", str(staging), "-ov",
                    "-format", "UDZO", str(output)], check=True)
    return output


def artefacts(bundle: Path, version: str, variant: str):
    """The downloadable files for this system, each yielded once built."""
    suffix = "" if variant == "cpu" else f"-{variant}"
    machine = {"amd64": "x86_64", "aarch64": "arm64"}.get(platform.machine().lower(), platform.machine().lower())
    DIST.mkdir(exist_ok=True)
    if sys.platform == "win32":
        yield zipped(bundle, DIST / f"kvasir-{version}-windows-{machine}{suffix}.zip")
        return
    if sys.platform == "darwin":
        yield dmg(bundle, DIST / f"kvasir-{version}-macos-{machine}{suffix}.dmg")
        return
    from debian import build_deb

    yield tarball(bundle, DIST / f"kvasir-{version}-linux-{machine}{suffix}.tar.gz")
    if shutil.which("dpkg-deb") and machine == "x86_64":
        package = "kvasir" if variant == "cpu" else f"kvasir-{variant}"
        yield build_deb(bundle, version, WORK / "deb", DIST / f"{package}_{version}_amd64.deb", package=package)


def size_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 1e6
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return total / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    import torch

    if (args.variant == "cuda") != bool(torch.version.cuda):
        print(f"packaging: --variant {args.variant} needs the {'CUDA' if args.variant == 'cuda' else 'CPU'} "
              f"torch in this environment; it has torch {torch.__version__}", file=sys.stderr)
        return 2
    version = read_version()
    started = [time.perf_counter()]
    kernels = prebuilt_kernels(args.variant)
    step("native kernels", started)
    bundle = pyinstaller(args.variant, kernels)
    step("PyInstaller", started)
    print(f"[package] {bundle.relative_to(ROOT)}: {size_mb(bundle):.0f} MB unpacked")
    for artefact in artefacts(bundle, version, args.variant):
        step(artefact.name, started)
        print(f"[package] {artefact.relative_to(ROOT)}: {size_mb(artefact):.0f} MB")
    print(f"[package] total: {time.perf_counter() - started[0]:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
