"""The one door to the Hugging Face Hub: the client for an endpoint, and its failures in words.

The endpoint is ``HF_ENDPOINT`` read when a client is made (huggingface_hub reads it once, at import), so a
mirror or a local test server can be chosen at any time; huggingface_hub's own HTTP session does the requests.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator

from ..errors import HubError

API_TIMEOUT_S = 20.0  # for one metadata request; downloads use huggingface_hub's own download timeout


def endpoint() -> str:
    """The Hub's address: ``HF_ENDPOINT`` now, else huggingface_hub's default."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_api(address: str | None = None):
    """A ``huggingface_hub.HfApi`` for ``address`` (default :func:`endpoint`); the user's token if logged in."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=address or endpoint(), library_name="kvasir")


def http_module():
    """The HTTP library under huggingface_hub's session (httpx, or httpx2 in newer releases)."""
    from huggingface_hub.utils import get_session

    return importlib.import_module(type(get_session()).__module__.split(".")[0])


@contextlib.contextmanager
def in_words(what: str, address: str | None = None) -> Iterator[None]:
    """Turn whatever huggingface_hub or the network raises while doing ``what`` into a :class:`HubError`."""
    try:
        yield
    except HubError:
        raise
    except Exception as exc:
        raise HubError(f"{what}: {_reason(exc, address or endpoint())}") from exc


def _reason(exc: Exception, address: str) -> str:
    from huggingface_hub import errors

    http = http_module()
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return "Hugging Face offline mode is on (HF_HUB_OFFLINE); turn it off to use the Hub"
    if isinstance(exc, errors.GatedRepoError):
        return ("the repository is gated: accept its conditions on its Hub page, then log in "
                "(hf auth login, or set HF_TOKEN)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return "no such repository on the Hub (or it is private)"
    if isinstance(exc, errors.RevisionNotFoundError):
        return "the repository has no such revision"
    if isinstance(exc, errors.EntryNotFoundError):
        return "the file is not in the repository (it may have been removed; search again)"
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else 0
        detail = (exc.server_message or "").strip().splitlines()
        text = f"the Hub answered {status or 'an error'}" + (f" ({detail[0]})" if detail else "")
        return text + ("; try again later" if status >= 500 or status in (408, 429) else "")
    if isinstance(exc, http.TimeoutException):
        return f"{address} did not answer in time; check the network and try again"
    if isinstance(exc, http.TransportError):
        return f"{address} can't be reached ({exc or type(exc).__name__}); check the network and try again"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def fetch_bytes(repo_id: str, path: str, revision: str, address: str | None = None,
                byte_range: tuple[int, int] | None = None) -> bytes:
    """A small file of a repository (or bytes ``[start, end)`` of a large one), through huggingface_hub's session.

    Reading stops at the range's end even when a server ignores the Range header and sends the whole file.
    """
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    address = address or endpoint()
    url = hf_hub_url(repo_id, path, revision=revision, endpoint=address)
    headers = build_hf_headers(library_name="kvasir")
    if byte_range is not None:
        headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1] - 1}"
    with in_words(f"{path} of {repo_id} could not be read", address):
        with get_session().stream("GET", url, headers=headers, timeout=API_TIMEOUT_S) as response:
            hf_raise_for_status(response)
            if byte_range is None:
                return response.read()
            wanted = byte_range[1] - byte_range[0]
            if response.status_code != 206 and byte_range[0]:
                raise HubError(f"{address} does not answer requests for part of a file (HTTP Range)")
            return _first_bytes(response, wanted)


def _first_bytes(response, wanted: int) -> bytes:
    chunks, have = [], 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        have += len(chunk)
        if have >= wanted:
            break
    return b"".join(chunks)[:wanted]
