"""Before Qt aborts for want of X11 libraries, kvasir names them and the apt command that installs them."""

import ctypes
import io
import sys
from pathlib import Path

import pytest

import app.__main__ as entry
from app.startup import xcb_check
from app.startup.xcb_check import EXIT_MISSING_LIBRARIES, check_before_qt, missing_libraries, package_name, uses_xcb

PLUGIN = Path("/opt/qt/plugins/platforms/libqxcb.so")
LDD_MISSING = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007f4f)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxkbcommon-x11.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f4f)
"""
LDD_COMPLETE = "\tlibxcb-icccm.so.4 => /lib/x86_64-linux-gnu/libxcb-icccm.so.4 (0x1)\n"


def test_debian_package_names_follow_the_soname_rule():
    assert package_name("libxcb-cursor.so.0") == "libxcb-cursor0"
    assert package_name("libxcb-icccm.so.4") == "libxcb-icccm4"
    assert package_name("libX11.so.6") == "libx11-6"
    assert package_name("libX11-xcb.so.1") == "libx11-xcb1"
    assert package_name("libxkbcommon-x11.so.0") == "libxkbcommon-x11-0"
    assert package_name("libglib-2.0.so.0") == "libglib2.0-0"


def test_missing_libraries_are_named_once_with_their_packages():
    missing = missing_libraries(PLUGIN, ldd=lambda path: LDD_MISSING)
    assert missing.sonames == ("libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxkbcommon-x11.so.0")
    assert missing.packages == ("libxcb-icccm4", "libxcb-keysyms1", "libxkbcommon-x11-0")
    text = missing.message(has_apt=True)
    assert "sudo apt install libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0\n" in text
    assert "libxcb-keysyms.so.1" in text
    assert "apt" not in missing.message(has_apt=False).replace("(on Debian", "")


def test_nothing_missing_or_no_ldd_lets_qt_start():
    assert missing_libraries(PLUGIN, ldd=lambda path: LDD_COMPLETE) is None
    assert missing_libraries(PLUGIN, ldd=lambda path: None) is None


def test_which_sessions_use_xcb():
    assert uses_xcb({"DISPLAY": ":0"}, "linux")
    assert not uses_xcb({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"}, "linux")
    assert uses_xcb({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0", "QT_QPA_PLATFORM": "xcb"}, "linux")
    assert not uses_xcb({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}, "linux")
    assert not uses_xcb({}, "linux")
    assert not uses_xcb({"DISPLAY": ":0"}, "darwin")


def test_the_check_prints_the_command_and_returns_non_zero():
    stderr = io.StringIO()
    status = check_before_qt({"DISPLAY": ":1"}, stderr, plugin=lambda: PLUGIN, ldd=lambda path: LDD_MISSING)
    assert status == EXIT_MISSING_LIBRARIES != 0
    assert "libxcb-icccm4 libxcb-keysyms1" in stderr.getvalue()


def test_offscreen_never_runs_ldd():
    def fail(path):
        raise AssertionError("ldd ran for an offscreen start")

    assert check_before_qt({"DISPLAY": ":1", "QT_QPA_PLATFORM": "offscreen"}, io.StringIO(),
                           plugin=lambda: PLUGIN, ldd=fail) is None


def test_kvasir_exits_before_qt_starts(monkeypatch, capsys):
    def no_qt(args):
        raise AssertionError("Qt was started although the xcb libraries are missing")

    monkeypatch.setattr(entry, "run", no_qt)
    monkeypatch.setenv("DISPLAY", ":1")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setattr(xcb_check, "run_ldd", lambda path: LDD_MISSING)
    assert entry.main([]) == EXIT_MISSING_LIBRARIES
    assert "libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the xcb plugin is Linux's")
def test_on_this_machine_what_is_reported_missing_really_does_not_load():
    plugin = xcb_check.xcb_plugin()
    assert plugin is not None and plugin.name == "libqxcb.so"
    missing = missing_libraries(plugin)
    for soname in missing.sonames if missing else ():
        with pytest.raises(OSError):
            ctypes.CDLL(soname)
