"""One version, pyproject's: ``kvasir --version`` and the app read it, from the checkout or the metadata."""

import importlib.metadata
import re
from pathlib import Path

import pytest

from app import version as version_module
from app.__main__ import main

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def pyproject_version() -> str:
    return re.search(r'(?m)^version = "([^"]+)"', PYPROJECT.read_text()).group(1)


def test_kvasir_version_prints_pyprojects_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvasir {pyproject_version()}"


def test_an_installed_copy_reads_the_package_metadata(monkeypatch, tmp_path):
    monkeypatch.setattr(version_module, "_PYPROJECT", tmp_path / "absent" / "pyproject.toml")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"kvasir": "7.8.9"}[name])
    assert version_module.read_version() == "7.8.9"


def test_without_metadata_the_version_says_unknown(monkeypatch, tmp_path):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version_module, "_PYPROJECT", tmp_path / "pyproject.toml")
    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert version_module.read_version() == "unknown"
