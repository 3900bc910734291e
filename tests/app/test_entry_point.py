"""The ``kvasir`` entry point."""

import pytest

from app.__main__ import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == "kvasir 0.1.0"
