"""What the bundle leaves out (packaging/packaging_rules.py); the build itself runs in make package-test."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packaging"))

from packaging_rules import EXCLUDED_MODULES, drop_dangling_symlinks, keep_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_no_qt_module_the_app_imports_is_left_out():
    imported = {f"PySide6.{name}" for path in (ROOT / "app").rglob("*.py")
                for name in re.findall(r"\bPySide6\.(Qt\w+)", path.read_text(encoding="utf-8"))}
    assert {"PySide6.QtWidgets", "PySide6.QtCharts"} <= imported  # the scan finds what the app uses
    assert sorted(imported & set(EXCLUDED_MODULES)) == []


def test_torch_tests_headers_and_test_binaries_are_left_out():
    for dropped in ("torch/include/ATen/ATen.h", "torch/test/test_api", "torch/lib/libtorchbind_test.so",
                    "torch/lib/libjitbackend_test.so", "torch/lib/libaoti_custom_ops.so", "torch/bin/test_jit",
                    "torch/bin/protoc", "torch/share/cmake/Torch/TorchConfig.cmake", "torch/_C/__init__.pyi"):
        assert not keep_file(dropped, None), dropped
    for kept in ("torch/lib/libtorch_cpu.so", "torch/lib/libc10.so", "torch/bin/torch_shm_manager",
                 "torch/nn/modules/linear.py", "transformers/models/llama/modeling_llama.py"):
        assert keep_file(kept, None), kept


def test_bitsandbytes_keeps_the_cpu_library_and_the_bundled_torchs_cuda_version_only():
    names = [f"bitsandbytes/libbitsandbytes_{flavour}.so"
             for flavour in ("cpu", "cuda121", "cuda128", "cuda130", "rocm64", "xpu2025")]
    assert [n for n in names if keep_file(n, None)] == ["bitsandbytes/libbitsandbytes_cpu.so"]
    assert [n for n in names if keep_file(n, "12.8")] == ["bitsandbytes/libbitsandbytes_cpu.so",
                                                           "bitsandbytes/libbitsandbytes_cuda128.so"]


def test_qt_plugins_a_desktop_window_needs_stay_and_kiosk_ones_go():
    plugins = "PySide6/Qt/plugins/"
    for kept in ("platforms/libqxcb.so", "platforms/libqwayland.so", "platforms/libqoffscreen.so",
                 "xcbglintegrations/libqxcb-glx-integration.so", "imageformats/libqsvg.so",
                 "platformthemes/libqxdgdesktopportal.so",
                 "platforminputcontexts/libibusplatforminputcontextplugin.so"):
        assert keep_file(plugins + kept, None), kept
    for dropped in ("platforms/libqeglfs.so", "platforms/libqvnc.so", "platforms/libqlinuxfb.so",
                    "platformthemes/libqgtk3.so", "platforminputcontexts/libqtvirtualkeyboardplugin.so",
                    "imageformats/libqpdf.so", "tls/libqopensslbackend.so", "generic/libqevdevmouseplugin.so"):
        assert not keep_file(plugins + dropped, None), dropped


def test_fontconfig_comes_from_the_system():
    assert not keep_file("libfontconfig.so.1", None)
    assert not keep_file("libfreetype.so.6", None)
    assert keep_file("PySide6/Qt/lib/libQt6Gui.so.6", None)


def test_symlinks_to_removed_files_go_too():
    binaries = [("PySide6/Qt/lib/libQt6Gui.so.6", "/venv/libQt6Gui.so.6", "BINARY"),
                ("libQt6Gui.so.6", "PySide6/Qt/lib/libQt6Gui.so.6", "SYMLINK"),
                ("libQt6Qml.so.6", "PySide6/Qt/lib/libQt6Qml.so.6", "SYMLINK"),
                ("libcudart.so", "libcudart.so.13", "SYMLINK")]
    kept, datas = drop_dangling_symlinks(binaries, [])
    assert [entry[0] for entry in kept] == ["PySide6/Qt/lib/libQt6Gui.so.6", "libQt6Gui.so.6"]
