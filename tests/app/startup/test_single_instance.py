"""A second Kvasir on the same data folder says clearly that one is already running."""

import subprocess
import sys
from pathlib import Path

import pytest

from app.__main__ import main
from app.startup.single_instance import LOCK_NAME, DataFolderError, acquire_instance_lock

HOLD_LOCK = """
import sys, time
from pathlib import Path
from app.startup.single_instance import acquire_instance_lock
lock = acquire_instance_lock(Path(sys.argv[1]))
print("locked" if lock else "refused", flush=True)
sys.stdin.readline()
"""


def test_a_second_instance_is_refused_while_the_first_runs(tmp_path):
    first = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "locked"
        assert acquire_instance_lock(tmp_path) is None
    finally:
        first.communicate("\n", timeout=30)
    lock = acquire_instance_lock(tmp_path)  # the first one has quit
    assert lock is not None
    lock.unlock()


def test_a_lock_left_by_a_crashed_instance_is_taken_over(tmp_path):
    crashed = subprocess.run([sys.executable, "-c", HOLD_LOCK.replace("sys.stdin.readline()", "import os; os._exit(9)"),
                              str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert crashed.stdout.strip() == "locked" and (tmp_path / LOCK_NAME).exists()
    lock = acquire_instance_lock(tmp_path)
    assert lock is not None
    lock.unlock()


def test_starting_again_says_kvasir_is_already_running(qapp, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    shown = []
    monkeypatch.setattr("PySide6.QtWidgets.QMessageBox.information",
                        lambda parent, title, text: shown.append((title, text)))
    lock = acquire_instance_lock(tmp_path)
    try:
        assert main(["--data-dir", str(tmp_path)]) == 1
        assert shown[0][0] == "Kvasir is already running" and str(tmp_path) in shown[0][1]
        assert main(["--self-test", "--data-dir", str(tmp_path)]) == 1
        assert "already running" in capsys.readouterr().err
    finally:
        lock.unlock()
    assert not (tmp_path / "kvasir.db").exists()  # the second start never touched the database


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs a read-only folder: Linux's /proc")
def test_a_read_only_data_folder_is_named_not_taken_for_a_running_kvasir(qapp, monkeypatch, capsys):
    read_only = Path("/proc/self")  # read-only even for root, where chmod would not stop a write
    monkeypatch.setenv("KVASIR_DATA_DIR", str(read_only))  # main() sets it; put back after the test
    with pytest.raises(DataFolderError, match="can't write in its data folder /proc/self"):
        acquire_instance_lock(read_only)
    shown = []
    monkeypatch.setattr("PySide6.QtWidgets.QMessageBox.warning", lambda parent, title, text: shown.append(title))
    monkeypatch.setattr("PySide6.QtWidgets.QMessageBox.information", lambda parent, title, text: shown.append(title))
    assert main(["--data-dir", str(read_only)]) == 1
    assert shown == ["Kvasir can't use its data folder"]
    assert main(["--self-test", "--data-dir", str(read_only)]) == 1
    err = capsys.readouterr().err
    assert "can't write in its data folder" in err and "already running" not in err


def test_a_data_folder_that_cannot_be_made_says_why(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(DataFolderError, match="can't make its data folder .*Not a directory"):
        acquire_instance_lock(tmp_path / "a-file" / "data")
