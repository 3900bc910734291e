"""Discover: search the Hub, list a repository's options with sizes and fit, download (progress, cancel,
resume), then load. Against a Hub on loopback (tests/helpers/fake_hub.py), so huggingface_hub's real client
code makes the requests."""

from __future__ import annotations

import hashlib
import socket
import threading

import pytest

from engine.errors import DownloadCancelled, HubError
from engine.models.hub_download import DownloadSettings, HubDownload, download_folder
from engine.models.hub_fit import COMFORTABLE_CONTEXT, fit_options
from engine.models.hub_search import gguf_quantization, repo_options, search_models
from engine.models.library import ModelLibrary
from tests.helpers.fake_hub import GGUF_REPO, HF_REPO, FakeHub, FakeRepo, tiny_ggufs, tiny_repos


@pytest.fixture(scope="session")
def ggufs(tiny_llama, tmp_path_factory):
    return tiny_ggufs(tiny_llama, tmp_path_factory.mktemp("hub-gguf"))


@pytest.fixture
def hub(ggufs, tiny_llama, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite runs offline otherwise
    with FakeHub(tiny_repos(ggufs, tiny_llama)) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.fixture
def library(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    return ModelLibrary()


def test_search_lists_chat_models_with_loadable_weights_most_downloaded_first(hub):
    found = search_models("tiny")
    assert [m.repo_id for m in found] == [HF_REPO, GGUF_REPO]  # onnx-only and non-chat repos left out
    assert found[0].formats == ("safetensors",) and found[1].formats == ("gguf",)
    assert (found[1].downloads, found[1].likes, found[1].conversational) == (500, 7, True)
    assert found[1].updated.year == 2025
    assert [m.repo_id for m in search_models("tiny", "gguf")] == [GGUF_REPO]
    assert search_models("no-such-model") == []
    asked = [e.path for e in hub.log]
    assert asked and set(asked) == {"/api/models"}


def test_a_repository_becomes_options_with_quantisation_and_size(hub, ggufs, tiny_llama):
    repo = repo_options(GGUF_REPO)
    assert repo.revision == hub.repos[GGUF_REPO].sha
    names = [o.name for o in repo.options]
    assert names == ["big/tiny-llama-Q4_K_M-00001-of-00002.gguf", "tiny-llama-Q4_1.gguf", "tiny-llama-Q8_0.gguf"]
    split, q4, q8 = repo.options
    assert (q4.quantization, q4.size, q4.problem) == ("Q4_1", len(ggufs["tiny-llama-Q4_1.gguf"]), None)
    assert q8.quantization == "Q8_0" and q8.files[0].sha256 == hashlib.sha256(
        ggufs["tiny-llama-Q8_0.gguf"]).hexdigest()
    assert split.quantization == "Q4_K_M" and split.size == 1500 and "split into 2 files" in split.problem
    hf = repo_options(HF_REPO)
    (option,) = hf.options
    on_disk = {f.name: f.stat().st_size for f in tiny_llama.iterdir() if f.is_file()}
    assert option.kind == "hf" and option.quantization == "F32" and option.size == sum(on_disk.values())
    assert {f.path for f in option.files} == set(on_disk)


def test_a_sharded_model_takes_its_shards_and_not_the_extra_copies(hub):
    files = {name: b"{}" for name in ("config.json", "model.safetensors.index.json", "tokenizer.json",
                                      "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                      "consolidated.safetensors", "original/params.json", "pytorch_model.bin")}
    hub.repos["tiny-org/sharded"] = FakeRepo("tiny-org/sharded", files, tags=["safetensors", "text-generation"])
    (option,) = repo_options("tiny-org/sharded").options
    assert sorted(f.path for f in option.files) == [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "tokenizer.json"]
    assert [f.path for f in option.weight_files] == ["model-00001-of-00002.safetensors",
                                                     "model-00002-of-00002.safetensors"]
    del files["config.json"]
    hub.repos["tiny-org/sharded"] = FakeRepo("tiny-org/sharded", files, tags=["safetensors"])
    assert "no config.json" in repo_options("tiny-org/sharded").options[0].problem


@pytest.mark.parametrize(("name", "quant"), [
    ("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", "Q4_K_M"), ("model.q8_0.gguf", "Q8_0"), ("ggml-model-f16.gguf", "F16"),
    ("Llama-3.2-1B-Instruct-IQ4_XS.gguf", "IQ4_XS"), ("phi-4-BF16.gguf", "BF16"), ("gemma-UD-Q4_K_XL.gguf", "Q4_K_XL"),
    ("Mistral-7B-Q6_K_L.gguf", "Q6_K_L"), ("model-f16-Q5_K_S.gguf", "Q5_K_S"), ("mystery.gguf", "unknown"),
])
def test_quantisation_is_read_from_the_file_name(name, quant):
    assert gguf_quantization(name) == quant


def test_fit_is_estimated_from_remote_headers_without_downloading(hub, ggufs, tmp_path):
    from engine import EngineConfig, estimate_fit

    repo = repo_options(GGUF_REPO)
    fits = fit_options(repo, quantization="auto", device="cpu")
    q4, q8 = fits["tiny-llama-Q4_1.gguf"], fits["tiny-llama-Q8_0.gguf"]
    assert q4.verdict == q8.verdict == "fits"
    assert q4.context_tokens == 2048 >= min(2048, COMFORTABLE_CONTEXT)  # the tiny model's whole context
    assert q4.label() == "fits: 2,048 tokens (estimate)"
    assert (q4.estimate.quantization, q8.estimate.quantization) == ("int4", "w8")  # auto on the CPU, by the quant
    local = {}
    for name in ("tiny-llama-Q4_1.gguf", "tiny-llama-Q8_0.gguf"):
        (tmp_path / name).write_bytes(ggufs[name])
        local[name] = estimate_fit(EngineConfig(model=str(tmp_path / name), device="cpu"))
    exact = local["tiny-llama-Q4_1.gguf"]  # the file whose header was read: the estimate of the file itself
    assert (q4.estimate.weight_bytes, q4.estimate.kv_bytes_per_token) == (exact.weight_bytes, exact.kv_bytes_per_token)
    by_name = local["tiny-llama-Q8_0.gguf"]  # known by its name only: never less than the truth, not far above
    assert by_name.weight_bytes <= q8.estimate.weight_bytes <= 1.25 * by_name.weight_bytes
    assert q8.estimate.kv_bytes_per_token == by_name.kv_bytes_per_token
    assert fits["big/tiny-llama-Q4_K_M-00001-of-00002.gguf"].verdict == "unknown"
    # only the smallest file's header was read, from its start; nothing was downloaded whole
    gets = [e for e in hub.log if e.method == "GET" and "/resolve/" in e.path]
    assert [e.path.rsplit("/", 1)[-1] for e in gets] == ["tiny-llama-Q4_1.gguf"]
    assert gets[0].range.startswith("bytes=0-") and hub.sent["tiny-llama-Q4_1.gguf"] < len(
        ggufs["tiny-llama-Q4_1.gguf"])


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_safetensors_fit_reads_config_and_headers_only(hub, tiny_llama, quantization):
    from engine import EngineConfig, estimate_fit

    fits = fit_options(repo_options(HF_REPO), quantization=quantization, device="cpu")
    fit = fits["safetensors"]
    local = estimate_fit(EngineConfig(model=str(tiny_llama), quantization=quantization, device="cpu"))
    assert fit.verdict == "fits" and fit.estimate.quantization == quantization
    assert (fit.estimate.weight_bytes, fit.estimate.kv_tokens) == (local.weight_bytes, local.kv_tokens)
    assert hub.sent["model.safetensors"] <= 100_001  # huggingface_hub's first header read, never the weights
    assert "Estimate before download" in fit.explanation()


def test_a_model_too_big_for_the_memory_says_so(hub, monkeypatch):
    import engine.models.fit as fit_module

    monkeypatch.setattr(fit_module, "available_memory", lambda device: 1024**2)  # 1 MiB free
    fits = fit_options(repo_options(GGUF_REPO), device="cpu")
    assert fits["tiny-llama-Q8_0.gguf"].verdict == "too big"
    assert fits["tiny-llama-Q8_0.gguf"].label() == "too big (estimate)"


def test_a_model_that_loads_with_a_shorter_context_is_tight(hub, monkeypatch):
    import engine.models.fit as fit_module

    repo = repo_options(GGUF_REPO)
    weights = fit_options(repo, device="cpu")["tiny-llama-Q8_0.gguf"].estimate.weight_bytes
    # 2 MiB beside the weights: the CPU's KV share (a quarter) holds 1,024 of the model's 2,048 tokens
    monkeypatch.setattr(fit_module, "available_memory", lambda device: weights + 2 * 1024**2)
    fit = fit_options(repo, device="cpu")["tiny-llama-Q8_0.gguf"]
    assert (fit.verdict, fit.context_tokens) == ("tight", 1024)
    assert fit.label() == "tight: 1,024 tokens (estimate)"


def test_download_reports_progress_and_adds_to_the_library(hub, library, ggufs):
    repo = repo_options(GGUF_REPO)
    seen = []
    download = HubDownload(repo, repo.option("tiny-llama-Q4_1.gguf"), library, progress=seen.append,
                           settings=DownloadSettings(progress_interval_s=0))
    entry = download.run()
    data = ggufs["tiny-llama-Q4_1.gguf"]
    assert seen[-1].done == seen[-1].total == len(data)
    assert [p.done for p in seen] == sorted(p.done for p in seen) and len(seen) > 2
    assert (download_folder(library, GGUF_REPO) / "tiny-llama-Q4_1.gguf").read_bytes() == data
    assert [e.spec for e in library.entries()][1] == entry.spec == str(download.target.resolve())
    assert not list(download.folder.glob("*.part"))


def test_a_safetensors_model_downloads_as_a_folder_that_loads_and_generates(hub, library, tiny_llama):
    from engine import Engine, EngineConfig, SamplingParams

    repo = repo_options(HF_REPO)
    entry = HubDownload(repo, repo.option("safetensors"), library).run()
    folder = download_folder(library, HF_REPO)
    assert entry.spec == str(folder.resolve()) and entry.info.architecture == "llama"
    assert (folder / "model.safetensors").read_bytes() == (tiny_llama / "model.safetensors").read_bytes()
    sampling = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    downloaded = Engine(EngineConfig(model=entry.spec, device="cpu", num_kv_blocks=16)).generate(["Hi"], sampling)
    original = Engine(EngineConfig(model=str(tiny_llama), device="cpu", num_kv_blocks=16)).generate(["Hi"], sampling)
    assert len(downloaded[0].token_ids) == 4 and downloaded[0].token_ids == original[0].token_ids


def _cancel_halfway(hub, library, name):
    repo = repo_options(GGUF_REPO)
    hub.throttle[name] = 4 * 1024**2  # bytes a second: the download takes about two seconds
    download = None

    def progress(p):
        if p.done > 1024**2:
            download.cancel()

    download = HubDownload(repo, repo.option(name), library, progress=progress,
                           settings=DownloadSettings(progress_interval_s=0))
    with pytest.raises(DownloadCancelled, match="cancelled at"):
        download.run()
    return repo, download


def test_cancel_keeps_nothing_in_the_library_and_resume_continues_with_a_range(hub, library, ggufs):
    name = "tiny-llama-Q8_0.gguf"
    repo, cancelled = _cancel_halfway(hub, library, name)
    kept = cancelled.partial_bytes()
    assert 1024**2 < kept < len(ggufs[name])
    assert len(library.entries()) == 1  # the bundled model only
    assert not (download_folder(library, GGUF_REPO) / name).exists()
    hub.throttle.clear()
    seen = []
    entry = HubDownload(repo, repo.option(name), library, progress=seen.append).run()
    assert hub.ranges(name) == [None, f"bytes={kept}-"]
    assert seen[0].resumed_from == kept and seen[-1].done == len(ggufs[name])
    assert (download_folder(library, GGUF_REPO) / name).read_bytes() == ggufs[name]
    assert library.entries()[1].spec == entry.spec


def test_a_server_that_ignores_ranges_gets_a_whole_new_copy(hub, library, ggufs):
    name = "tiny-llama-Q8_0.gguf"
    repo, cancelled = _cancel_halfway(hub, library, name)
    assert cancelled.partial_bytes() > 0
    hub.throttle.clear()
    hub.ignore_range = True
    seen = []
    HubDownload(repo, repo.option(name), library, progress=seen.append).run()
    assert hub.ranges(name)[-1].startswith("bytes=")  # asked to continue; answered with the whole file
    assert (download_folder(library, GGUF_REPO) / name).read_bytes() == ggufs[name]
    assert seen[-1].done == len(ggufs[name])
    assert fit_options(repo_options(GGUF_REPO), device="cpu")[name].verdict == "fits"  # header read capped


def test_a_damaged_download_is_refused_and_not_added(hub, library, ggufs):
    name = "tiny-llama-Q4_1.gguf"
    repo = repo_options(GGUF_REPO)
    data = bytearray(ggufs[name])
    data[-1] ^= 0xFF  # the server now sends other bytes than the listing's hash
    hub.repos[GGUF_REPO].files[name] = bytes(data)
    with pytest.raises(HubError, match="arrived damaged"):
        HubDownload(repo, repo.option(name), library).run()
    assert len(library.entries()) == 1 and not list(download_folder(library, GGUF_REPO).iterdir())


@pytest.fixture
def no_backoff_waits(monkeypatch):
    """huggingface_hub retries a failed API call five times, waiting 1 to 8 s between; the tests don't wait."""
    import huggingface_hub.utils._http as hf_http

    waits = []
    monkeypatch.setattr(hf_http.time, "sleep", waits.append)
    return waits


def test_missing_repository_and_server_errors_are_said_in_words(hub, no_backoff_waits):
    with pytest.raises(HubError, match="no such repository"):
        repo_options("tiny-org/nothing-here")
    hub.fail["/api/models"] = 500
    with pytest.raises(HubError, match="the search on the Hub failed: the Hub answered 500"):
        search_models("tiny")
    assert len(no_backoff_waits) == 5  # the client's own retries, then the error


def test_a_server_error_during_download_is_said_in_words(hub, library):
    repo = repo_options(GGUF_REPO)
    hub.fail[f"/{GGUF_REPO}/resolve/"] = 503
    with pytest.raises(HubError, match="the download of tiny-llama-Q4_1.gguf stopped at 0.0 MB: the Hub answered 503"):
        HubDownload(repo, repo.option("tiny-llama-Q4_1.gguf"), library,
                    settings=DownloadSettings(retry_wait_s=0)).run()
    assert len(library.entries()) == 1


def test_a_gated_repository_says_what_to_do(hub, library):
    hub.repos[GGUF_REPO].gated = True
    repo = repo_options(GGUF_REPO)
    assert repo.gated
    fit = fit_options(repo, device="cpu")["tiny-llama-Q4_1.gguf"]
    assert fit.verdict == "unknown" and fit.reason.startswith("Not estimated: ") and "gated" in fit.reason
    with pytest.raises(HubError, match="gated: accept its conditions on its Hub page, then log in"):
        HubDownload(repo, repo.option("tiny-llama-Q4_1.gguf"), library).run()
    assert len(library.entries()) == 1


def test_a_refused_connection_is_said_in_words(monkeypatch, no_backoff_waits):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(HubError, match=rf"127.0.0.1:{port} can't be reached .*check the network"):
        search_models("tiny")


def test_offline_mode_is_named(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match="offline mode is on"):
        search_models("tiny")


def test_cancel_from_another_thread_stops_a_stalled_transfer_soon(hub, library):
    name = "tiny-llama-Q8_0.gguf"
    repo = repo_options(GGUF_REPO)
    hub.throttle[name] = 64 * 1024  # a very slow line: the whole file would take minutes
    started = threading.Event()
    download = HubDownload(repo, repo.option(name), library, progress=lambda p: started.set(),
                           settings=DownloadSettings(progress_interval_s=0))
    errors = []
    worker = threading.Thread(target=lambda: _run_capturing(download, errors))
    worker.start()
    assert started.wait(10)
    download.cancel()
    worker.join(5)
    assert not worker.is_alive() and isinstance(errors[0], DownloadCancelled)


def _run_capturing(download, errors):
    try:
        download.run()
    except Exception as exc:
        errors.append(exc)


def test_the_command_line_searches_lists_and_downloads(hub, library, ggufs, capsys):
    from engine.tools.cli import main

    assert main(["models", "search", "tiny", "--format", "gguf"]) == 0
    assert capsys.readouterr().out.split()[0] == GGUF_REPO
    assert main(["models", "files", GGUF_REPO, "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["tiny-llama-Q4_1.gguf", "Q4_1"] and "fits: 2,048 tokens (estimate)" in lines[1]
    assert "split into 2 files" in lines[0]
    assert main(["models", "download", GGUF_REPO, "tiny-llama-Q4_1.gguf"]) == 0
    assert capsys.readouterr().out.strip().startswith("added tiny-llama-Q4_1")
    assert main(["models", "download", GGUF_REPO, "nothing.gguf"]) == 2
    assert "has no 'nothing.gguf'" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "safe"), [
    ("model.Q4_K_M.gguf", True), ("sub/folder/model.gguf", True),
    ("../model.gguf", False), ("a/../../model.gguf", False), ("/etc/model.gguf", False), ("a\\b.gguf", False),
    ("C:/Users/me/model.gguf", False), ("C:model.gguf", False), ("//server/share/model.gguf", False),
    ("model.gguf:hidden", False),
])
def test_a_file_name_that_would_land_outside_the_folder_on_any_system_is_dropped(name, safe):
    from pathlib import PureWindowsPath

    from engine.models.hub_search import _safe_path

    assert _safe_path(name) is safe
    if name.startswith("C:"):  # why: Windows joins a drive's path as a path of its own
        assert not str(PureWindowsPath("D:/models/repo") / name).startswith("D:")


def test_a_download_never_writes_outside_its_folder_even_past_the_listing(hub, library, ggufs):
    from engine.models.hub_search import RemoteFile

    repo = repo_options(GGUF_REPO)
    download = HubDownload(repo, repo.option("tiny-llama-Q4_1.gguf"), library)
    with pytest.raises(HubError, match="would land outside the model's folder"):
        download._final(RemoteFile("../../outside.gguf", 1, None))
