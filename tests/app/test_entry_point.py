"""The ``kvasir`` entry point."""

from app.__main__ import main


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "kvasir 0.1.0"
