"""Before Qt starts on X11: do the system libraries of PySide6's xcb platform plugin load?

Without them Qt aborts with "Could not load the Qt platform plugin "xcb"" and no word on what to install. This
check asks the dynamic linker (``ldd`` on the plugin) which libraries are missing and names the Debian/Ubuntu
packages that provide them, so ``kvasir`` can say what to install and exit instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)
# Libraries whose Debian package name does not follow the soname rule (policy 8.1).
PACKAGE_EXCEPTIONS = {"libglib-2.0.so.0": "libglib2.0-0", "libgthread-2.0.so.0": "libglib2.0-0",
                      "libgobject-2.0.so.0": "libglib2.0-0"}
EXIT_MISSING_LIBRARIES = 3


@dataclass(frozen=True, slots=True)
class MissingLibraries:
    """The xcb plugin's libraries that do not load, and the packages that provide them."""

    plugin: Path
    sonames: tuple[str, ...]
    packages: tuple[str, ...]

    def message(self, has_apt: bool) -> str:
        """What the user reads: what is missing and the exact command that installs it."""
        lines = [f"kvasir: Qt can't open a window: its X11 (xcb) platform plugin needs system libraries that are "
                 f"missing: {', '.join(self.sonames)}."]
        if has_apt:
            lines += ["Install them with:", f"    sudo apt install {' '.join(self.packages)}"]
        else:
            lines.append(f"Install the packages that provide them (on Debian and Ubuntu: {' '.join(self.packages)}).")
        lines.append("Then start kvasir again. (In a Wayland session, QT_QPA_PLATFORM=wayland avoids X11.)")
        return "\n".join(lines)


def package_name(soname: str) -> str:
    """The Debian package of a library, by Debian's naming rule: libfoo.so.1 -> libfoo1, libx11.so.6 ->
    libx11-6 (a hyphen when the name ends in a digit)."""
    if soname in PACKAGE_EXCEPTIONS:
        return PACKAGE_EXCEPTIONS[soname]
    match = re.match(r"^(.+?)\.so\.(\d+)", soname)
    if not match:
        return soname
    name, major = match.group(1).lower(), match.group(2)
    return f"{name}-{major}" if name[-1].isdigit() else f"{name}{major}"


def uses_xcb(environ=None, platform: str | None = None) -> bool:
    """Whether Qt will pick its xcb plugin: Linux, X11 asked for, or a display without a Wayland session."""
    environ = os.environ if environ is None else environ
    if not (platform or sys.platform).startswith("linux"):
        return False
    chosen = environ.get("QT_QPA_PLATFORM", "").split(":")[0].strip()
    if chosen:
        return chosen == "xcb"
    return bool(environ.get("DISPLAY")) and not environ.get("WAYLAND_DISPLAY")


def xcb_plugin() -> Path | None:
    """PySide6's xcb platform plugin, where Qt itself will look for it (a checkout, a wheel or the bundle)."""
    from PySide6.QtCore import QLibraryInfo

    plugin = Path(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath)) / "platforms" / "libqxcb.so"
    return plugin if plugin.is_file() else None


def run_ldd(library: Path) -> str | None:
    """``ldd``'s report on ``library`` (every library it needs, and which are not found); None without ldd."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    try:
        return subprocess.run([ldd, str(library)], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def missing_libraries(plugin: Path, ldd: Callable[[Path], str | None] | None = None) -> MissingLibraries | None:
    """The plugin's libraries the dynamic linker can't find, or None when all load (or ldd is unavailable)."""
    report = (ldd or run_ldd)(plugin)
    if not report:
        return None
    sonames = tuple(dict.fromkeys(NOT_FOUND.findall(report)))
    if not sonames:
        return None
    return MissingLibraries(plugin, sonames, tuple(dict.fromkeys(package_name(s) for s in sonames)))


def check_before_qt(environ=None, stderr=None, plugin: Callable[[], Path | None] | None = None,
                    ldd: Callable[[Path], str | None] | None = None) -> int | None:
    """None when Qt can start; else print what to install and return the exit status for ``kvasir``."""
    if not uses_xcb(environ):
        return None
    found = (plugin or xcb_plugin)()
    missing = missing_libraries(found, ldd) if found is not None else None
    if missing is None:
        return None
    print(missing.message(has_apt=shutil.which("apt") is not None), file=stderr or sys.stderr)
    return EXIT_MISSING_LIBRARIES
