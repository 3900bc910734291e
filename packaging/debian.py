"""The .deb: the bundle under /opt/kvasir, a ``kvasir`` command, the menu entry, icons and AppStream metadata,
and ``Depends:`` worked out from the system libraries the bundle's ELF files need but do not carry."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from app.resources import APP_ID
from app.startup.xcb_check import package_name

ROOT = Path(__file__).resolve().parent.parent
GLIBC_SONAMES = re.compile(r"^(libc|libm|libdl|libpthread|librt|libutil|libresolv|libanl|ld-linux-x86-64)\.so")
NEEDED = re.compile(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]")
GLIBC_VERSION = re.compile(r"\bGLIBC_(\d+)\.(\d+)(?:\.\d+)?\b")


def elf_files(folder: Path) -> list[Path]:
    """Every ELF file (executables, libraries, Python extensions) under ``folder``."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as f:
                if f.read(4) == b"\x7fELF":
                    found.append(path)
    return found


def _readelf(args: list[str], path: Path) -> str:
    return subprocess.run(["readelf", *args, str(path)], capture_output=True, text=True, check=False).stdout


def system_libraries(bundle: Path) -> tuple[set[str], tuple[int, int]]:
    """(sonames the bundle needs from the system, the newest glibc symbol version any of its files uses)."""
    files = elf_files(bundle)
    carried = {path.name for path in files} | {path.name for path in bundle.rglob("*.so*") if path.is_symlink()}
    needed, glibc = set(), (2, 17)
    for path in files:
        needed |= set(NEEDED.findall(_readelf(["-d", "--wide"], path)))
        for major, minor in GLIBC_VERSION.findall(_readelf(["-V", "--wide"], path)):
            glibc = max(glibc, (int(major), int(minor)))
    return {name for name in needed if name not in carried}, glibc


def _ldconfig_paths() -> dict[str, str]:
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    paths = {}
    for line in listing.splitlines():
        match = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if match and "x86-64" in match.group(2):
            paths.setdefault(match.group(1), match.group(3))
    return paths


def _owner(path: str) -> str | None:
    """The installed Debian package owning ``path`` (tried with and without the merged /usr prefix)."""
    resolved = str(Path(path).resolve())
    for candidate in dict.fromkeys([path, resolved, *(p.removeprefix("/usr") for p in (path, resolved))]):
        done = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return done.stdout.split(":", 1)[0].strip()
    return None


def _exists_in_apt(package: str) -> bool:
    done = subprocess.run(["apt-cache", "show", "--no-all-versions", package], capture_output=True, check=False)
    return done.returncode == 0


def depends(bundle: Path) -> list[str]:
    """The Depends: entries: glibc with its minimum version, then one package per library the bundle needs."""
    sonames, glibc = system_libraries(bundle)
    paths = _ldconfig_paths()
    packages, unknown = {f"libc6 (>= {glibc[0]}.{glibc[1]})"}, []
    for soname in sorted(sonames):
        if GLIBC_SONAMES.match(soname):
            continue
        package = _owner(paths[soname]) if soname in paths else None
        if package is None:  # not installed on this machine: Debian's naming rule, checked against apt
            package = package_name(soname)
            if not _exists_in_apt(package):
                unknown.append(f"{soname} (guessed {package})")
                continue
        packages.add(package.split(":")[0])
    if unknown:
        raise SystemExit("no Debian package found for: " + ", ".join(unknown))
    return sorted(packages)


def _installed_kib(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink()) // 1024


def _fill(template: Path, version: str) -> str:
    return template.read_text(encoding="utf-8").replace("@VERSION@", version).replace(
        "@DATE@", time.strftime("%Y-%m-%d"))


def build_deb(bundle: Path, version: str, staging: Path, output: Path, package: str = "kvasir") -> Path:
    """Stage the package tree from ``bundle`` (PyInstaller's folder) and build ``output`` with dpkg-deb."""
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(bundle, staging / "opt" / "kvasir", symlinks=True)
    command = staging / "usr" / "bin" / "kvasir"
    command.parent.mkdir(parents=True)
    command.write_text('#!/bin/sh\nexec /opt/kvasir/kvasir "$@"\n')
    command.chmod(0o755)
    share = staging / "usr" / "share"
    (share / "applications").mkdir(parents=True)
    shutil.copyfile(ROOT / "assets" / f"{APP_ID}.desktop", share / "applications" / f"{APP_ID}.desktop")
    (share / "metainfo").mkdir()
    (share / "metainfo" / f"{APP_ID}.metainfo.xml").write_text(
        _fill(ROOT / "assets" / f"{APP_ID}.metainfo.xml", version), encoding="utf-8")
    icons = ROOT / "app" / "assets" / "icons"
    shutil.copytree(icons / "hicolor", share / "icons" / "hicolor")
    (share / "icons" / "hicolor" / "scalable" / "apps").mkdir(parents=True)
    shutil.copyfile(icons / "kvasir.svg", share / "icons" / "hicolor" / "scalable" / "apps" / "kvasir.svg")
    control = staging / "DEBIAN" / "control"
    control.parent.mkdir()
    control.write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: amd64\nSection: utils\nPriority: optional\n"
        "Maintainer: Kvasir developers <kvasir@users.noreply.github.com>\n"
        f"Installed-Size: {_installed_kib(staging)}\nDepends: {', '.join(depends(bundle))}\n"
        + ("" if package == "kvasir" else "Provides: kvasir\nConflicts: kvasir\nReplaces: kvasir\n") +
        "Description: chat with language models that run on this computer\n"
        " Kvasir is a desktop chat app for local language models, with its inference engine\n"
        " in the app (paged KV cache, prefix caching, continuous batching). A small model,\n"
        " SmolLM2-135M-Instruct, is bundled, so the first chat needs no download.\n")
    output.parent.mkdir(parents=True, exist_ok=True)
    # zstd: a fraction of xz's time on a 1 GB tree for a few percent more; dpkg reads it since 1.21.18
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zzstd", "-z9", "--build", str(staging), str(output)],
                   check=True)
    return output
