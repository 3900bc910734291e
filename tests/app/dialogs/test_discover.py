"""The Discover page of the model manager, driven offscreen against a Hub on loopback (tests/helpers/fake_hub.py)."""

from __future__ import annotations

import socket
import time

import pytest
from PySide6.QtCore import Qt

from app.dialogs.discover import DiscoverPage, HubFilesModel, HubResultsModel
from app.dialogs.model_manager import ModelDialog
from engine import ModelLibrary, fit_hub_options, hub_repo_options, search_hub
from tests.helpers.fake_hub import GGUF_REPO, HF_REPO, FakeHub, tiny_ggufs, tiny_repos

Q4 = "tiny-llama-Q4_1.gguf"
Q8 = "tiny-llama-Q8_0.gguf"


@pytest.fixture(scope="session")
def ggufs(tiny_llama, tmp_path_factory):
    return tiny_ggufs(tiny_llama, tmp_path_factory.mktemp("hub-gguf"))


@pytest.fixture
def hub(ggufs, tiny_llama, monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite runs offline otherwise
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    with FakeHub(tiny_repos(ggufs, tiny_llama)) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.fixture
def page(qtbot, hub):
    widget = DiscoverPage(ModelLibrary(), device="cpu")
    qtbot.addWidget(widget)
    widget.resize(1000, 520)
    widget.show()
    return widget


def _search(qtbot, page: DiscoverPage, text: str) -> None:
    page.query.clear()
    page.query.setFocus()
    qtbot.keyClicks(page.query, text)
    with qtbot.wait_signal(page.answer_shown, check_params_cb=lambda what: what == "search"):
        qtbot.keyClick(page.query, Qt.Key_Return)
    assert "models." in page.status.text() or "No chat model" in page.status.text()


def _open_repo(qtbot, page: DiscoverPage, repo_id: str) -> None:
    row = [m.repo_id for m in page.results_model.models].index(repo_id)
    with qtbot.wait_signal(page.answer_shown, check_params_cb=lambda what: what == "fit", timeout=15_000):
        page.results.selectRow(row)
    assert page.files_model.fits


def _pick(page: DiscoverPage, name: str) -> None:
    page.files.selectRow([o.name for o in page.files_model.options].index(name))


def test_the_item_models_pass_the_model_tester(qtmodeltester, hub):
    results = HubResultsModel()
    results.set_models(search_hub("tiny"))
    qtmodeltester.check(results)
    files = HubFilesModel()
    repo = hub_repo_options(GGUF_REPO)
    files.set_repo(repo)
    files.set_fits(fit_hub_options(repo, device="cpu"))
    qtmodeltester.check(files)
    assert results.index(0, 0).data() == HF_REPO and results.index(1, 1).data() == "500"
    assert results.index(1, 3).data() == "2025-01-02" and results.index(1, 4).data() == "gguf"


def test_search_select_see_fit_download_and_load(qtbot, page, hub, ggufs):
    _search(qtbot, page, "tiny")
    assert page.status.text() == "2 models. Pick one to see its files."
    assert [m.repo_id for m in page.results_model.models] == [HF_REPO, GGUF_REPO]
    _open_repo(qtbot, page, GGUF_REPO)
    rows = {page.files_model.index(r, 0).data(): [page.files_model.index(r, c).data() for c in range(1, 4)]
            for r in range(page.files_model.rowCount())}
    assert rows[Q4] == ["Q4_1", f"{len(ggufs[Q4]) / 1024**2:.1f} MiB", "fits: 2,048 tokens (estimate)"]
    assert rows["big/tiny-llama-Q4_K_M-00001-of-00002.gguf"][2] == "can't be used"
    _pick(page, Q4)
    assert "Estimate before download" in page.details.text() and "Licence: apache-2.0" in page.details.text()
    assert page.download_button.isEnabled() and not page.load_button.isEnabled()
    with qtbot.waitSignal(page.model_added, timeout=15_000) as added:
        page.download_button.click()
    spec = added.args[0]
    assert spec.endswith(Q4) and spec in [e.spec for e in page.library.entries()]
    qtbot.waitUntil(page.load_button.isEnabled)
    assert not page.download_button.isEnabled() and "is in the library" in page.status.text()
    with qtbot.waitSignal(page.load_requested) as load:
        page.load_button.click()
    assert load.args == [spec]


def test_cancel_then_resume_from_the_page(qtbot, page, hub, ggufs):
    hub.throttle[Q8] = 2 * 1024**2  # about three seconds for the whole file
    _search(qtbot, page, "gguf")
    _open_repo(qtbot, page, GGUF_REPO)
    _pick(page, Q8)
    page.download_button.click()
    assert page.cancel_button.isEnabled() and page.progress.isVisible()
    qtbot.waitUntil(lambda: page.progress.value() > 150)
    with qtbot.wait_signal(page.answer_shown, check_params_cb=lambda what: what == "download", timeout=10_000):
        page.cancel_button.click()
    assert page.status.text().startswith("Cancelled.")
    assert len(page.library.entries()) == 1 and not page.progress.isVisible()
    assert page.download_button.text() == "Resume" and f"{Q8} " not in page.details.text()
    assert "already here; Download continues from there" in page.details.text()
    hub.throttle.clear()
    with qtbot.waitSignal(page.model_added, timeout=15_000):
        page.download_button.click()
    (first, resumed) = hub.ranges(Q8)
    assert first is None and resumed.startswith("bytes=") and int(resumed[6:-1]) > 0.15 * len(ggufs[Q8])


def test_the_manager_has_a_discover_tab_whose_downloads_join_the_library(qtbot, hub, monkeypatch):
    dialog = ModelDialog(ModelLibrary(), "none")
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.tabs.setCurrentWidget(dialog.discover)
    page = dialog.discover
    loads = []
    dialog.load_requested.connect(lambda *args: loads.append(args))
    _search(qtbot, page, "tiny")
    assert dialog.isVisible() and loads == []  # Return searched; it did not press the dialog's Load
    _open_repo(qtbot, page, HF_REPO)
    assert page.files_model.index(0, 3).data().startswith("fits: ")
    assert "(none, float32)" in page.details.text()  # estimated for the manager's quantisation
    with qtbot.wait_signal(page.answer_shown, check_params_cb=lambda what: what == "fit"):
        dialog.quant.setCurrentText("int8")
    assert "(int8, float32)" in page.details.text()
    with qtbot.waitSignal(page.model_added, timeout=15_000):
        page.download_button.click()
    assert dialog.model.rowCount() == 2 and dialog.selected().info.architecture == "llama"
    with qtbot.waitSignal(dialog.load_requested) as load:
        page.load_button.click()
    assert load.args == [dialog.selected().spec, "int8"]


def test_an_answer_for_a_repository_no_longer_selected_is_dropped(qtbot, page, hub):
    _search(qtbot, page, "tiny")
    answers = []
    page._answers.answered.connect(lambda what, ticket, result: answers.append((what, result)))
    hub.delay[f"/api/models/{GGUF_REPO}"] = 0.5  # the first choice answers late
    ids = [m.repo_id for m in page.results_model.models]
    page.results.selectRow(ids.index(GGUF_REPO))
    page.results.selectRow(ids.index(HF_REPO))
    qtbot.waitUntil(lambda: [w for w, _ in answers].count("repo") == 2, timeout=10_000)
    qtbot.waitUntil(lambda: bool(page.files_model.fits), timeout=10_000)
    late = [r for w, r in answers if w == "repo" and r.repo_id == GGUF_REPO]
    assert late and page.repo.repo_id == HF_REPO  # the late answer arrived and was not shown
    assert [o.name for o in page.files_model.options] == ["safetensors"]


def test_closing_the_manager_stops_a_download_and_keeps_what_arrived(qtbot, hub):
    dialog = ModelDialog(ModelLibrary(), "auto")
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.tabs.setCurrentWidget(dialog.discover)
    page = dialog.discover
    hub.throttle[Q8] = 1024**2
    _search(qtbot, page, "gguf")
    _open_repo(qtbot, page, GGUF_REPO)
    _pick(page, Q8)
    page.download_button.click()
    qtbot.waitUntil(lambda: page.progress.value() > 50)
    with qtbot.wait_signal(page.answer_shown, check_params_cb=lambda what: what == "download", timeout=10_000):
        dialog.reject()
    assert page.status.text().startswith("Cancelled.")
    assert len(page.library.entries()) == 1 and page.download_button.text() == "Resume"


def test_hub_errors_are_shown_on_the_page(qtbot, page, hub):
    _search(qtbot, page, "nothing-like-this")
    assert page.status.text() == "No chat model with GGUF or safetensors weights matches this search."
    hub.fail["/api/models/"] = 503
    _search(qtbot, page, "tiny")
    with qtbot.wait_signal(page.answer_shown, check_params_cb=lambda what: what == "repo"):
        page.results.selectRow(0)
    assert "could not be listed" in page.status.text()
    assert "the Hub answered 503 (scripted failure 503); try again later" in page.status.text()
    assert page.files_model.rowCount() == 0 and not page.download_button.isEnabled()


def test_a_silent_network_never_holds_the_window(qtbot, monkeypatch, tmp_path):
    """A server that accepts the connection and never answers: the search waits on its thread; the page says so."""
    import huggingface_hub.constants
    import huggingface_hub.utils._http as hf_http

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_http.time, "sleep", lambda s: None)  # its retries end at once once the socket closes
    monkeypatch.setattr("app.dialogs.discover.PATIENCE_S", 0.3)
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    page = DiscoverPage(ModelLibrary())
    qtbot.addWidget(page)
    started = time.monotonic()
    page.query.setText("tiny")
    page.search()
    assert time.monotonic() - started < 0.5  # the request runs on a worker thread
    qtbot.waitUntil(lambda: "has not answered" in page.status.text())
    assert page.search_button.isEnabled() and page.query.isEnabled()
    silent.close()


def test_every_control_has_an_accessible_name_and_tab_reaches_them(qtbot, page):
    from PySide6.QtWidgets import QComboBox, QLineEdit, QProgressBar, QPushButton, QTableView

    controls = [c for kind in (QLineEdit, QComboBox, QPushButton, QTableView, QProgressBar)
                for c in page.findChildren(kind) if c.parent() is not None and not c.isWindow()]
    assert len(controls) >= 9 and [c for c in controls if not c.accessibleName()] == []
    order, widget = [], page.query
    for _ in range(6):
        order.append(widget)
        widget = widget.nextInFocusChain()
        while not widget.focusPolicy() & Qt.TabFocus:
            widget = widget.nextInFocusChain()
    assert order[:5] == [page.query, page.format, page.search_button, page.results, page.files]
