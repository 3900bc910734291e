"""The app's shipped files are package data: found through importlib.resources, and inside a built wheel."""

import shutil
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest

from app.data.settings import load_presets
from app.resources import ICON_SIZES, asset, icon_file

ROOT = Path(__file__).resolve().parents[2]


def test_assets_are_found_through_the_package_not_the_working_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # nothing may be read relative to where kvasir was started
    assert Path(str(files("app.assets"))) == ROOT / "app" / "assets"
    presets = load_presets()
    assert presets[0].name == "Helpful assistant"
    assert all(p.name and p.system_prompt is not None for p in presets)


def test_every_hicolor_icon_is_a_png_of_its_size(qapp):
    from PySide6.QtGui import QImage

    for size in ICON_SIZES:
        image = QImage(str(icon_file(size)))
        assert (image.width(), image.height()) == (size, size), size
        assert image.hasAlphaChannel()
    assert asset("icons/kvasir.svg").read_text().lstrip().startswith("<svg")


def test_a_missing_asset_names_itself():
    with pytest.raises(FileNotFoundError, match="nothere.json"):
        asset("nothere.json")


def test_the_app_icon_has_every_size(qapp):
    from app.resources import app_icon

    sizes = {(s.width(), s.height()) for s in app_icon().availableSizes()}
    assert sizes == {(n, n) for n in ICON_SIZES}


def test_a_built_wheel_carries_the_assets(tmp_path):
    """The crash this prevents: a wheel without presets.json fails in load_presets() at start. Built from a
    copy of the sources, so the build leaves nothing in the checkout."""
    source = tmp_path / "source"
    for name in ("app", "engine"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "prebuilt"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "wheel"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("kvasir-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "app/assets/presets.json" in names
    assert "app/assets/icons/kvasir.svg" in names
    assert {f"app/assets/icons/hicolor/{n}x{n}/apps/kvasir.png" for n in ICON_SIZES} <= names
    assert "engine/step/kernels/block_quant.cpp" in names
