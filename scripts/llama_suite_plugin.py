"""A pytest plugin for llama.cpp's server test suite (``-p llama_suite_plugin``): every
model comes from one local GGUF file, and each failure says what went wrong first.

The suite's presets (``utils.py``'s ``ServerPreset``) download small models from the
Hugging Face hub; a run that compares two servers needs both on the same file and no
network, so a preset's hub model becomes ``--model $TENSORPLUG_SUITE_MODEL`` (the shipped
SmolLM2). A test that needs a model of a family that file cannot stand in for (vision with
its projector, a reranker, a draft or LoRA file, a named hub model) is skipped with the
reason. ``ServerPreset.load_all`` (the session's download of every preset) does nothing.

For the comparison table, each test's outcome is appended as a JSON line to the file
``$TENSORPLUG_SUITE_RESULTS`` (when set): passed, failed or skipped, the skip's reason, and
a failure's first cause: the first HTTP answer outside 2xx the test got, through the
suite's helpers or an ``openai`` client (method, path, status, error message), the
server's last output line when it died while starting, else the assertion that failed.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["HUB_PRESETS", "SKIPPED_REPOS", "model_for"]

#: hub models of the presets that the local file stands in for (text generation,
#: infill, embeddings: what SmolLM2, a llama, does).
HUB_PRESETS = frozenset(
    {
        ("ggml-org/test-model-stories260K", None),
        ("ggml-org/test-model-stories260K-infill", None),
        ("ggml-org/models", "tinyllamas/stories260K.gguf"),
        ("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf"),
        ("ggml-org/stories15M_MOE", "stories15M_MOE-F16.gguf"),
    }
)

#: hub models no local file stands in for, with why.
SKIPPED_REPOS = {
    ("ggml-org/tinygemma3-GGUF:Q8_0", None): "vision: a Gemma 3 model with its image "
    "projector (mmproj), a model family tensorplug does not run",
    ("ggml-org/models", "jina-reranker-v1-tiny-en/ggml-model-f16.gguf"): "reranking: a "
    "jina-bert reranker with a classification head, no such file is shipped",
}

_cause: dict[str, str] = {}  # the running test's first cause, by key "cause"
_records: dict[str, dict[str, str]] = {}  # outcome of each running test, by node id


def model_for(repo: str, file: str | None) -> str | None:
    """Why a test asking for the hub model ``repo``/``file`` is skipped, or None when the
    local file stands in for it."""
    if (repo, file) in HUB_PRESETS:
        return None
    return SKIPPED_REPOS.get((repo, file), f"needs the hub model {repo} {file or ''}".strip())


def _note(cause: str) -> None:
    _cause.setdefault("cause", cause)


def _start(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def start(self: Any, *args: Any, **kwargs: Any) -> None:
        if self.model_hf_repo is not None:
            reason = model_for(self.model_hf_repo, self.model_hf_file)
            if reason is not None:
                pytest.skip(reason)
            self.model_file = os.environ["TENSORPLUG_SUITE_MODEL"]
            self.model_hf_repo = self.model_hf_file = None
        if self.model_url or self.mmproj_url:
            pytest.skip(f"downloads {self.model_url or self.mmproj_url}")
        if self.log_path is None:  # kept to say why a server died while starting
            fd, self.log_path = tempfile.mkstemp(prefix="llama-suite-server-", suffix=".log")
            os.close(fd)
        before = _cause.get("cause")
        try:
            original(self, *args, **kwargs)
        except (RuntimeError, TimeoutError) as e:
            lines = Path(self.log_path).read_text(errors="replace").strip().splitlines()
            if before is None:
                _cause.pop("cause", None)
            _note(f"server did not start ({e}): {lines[-1] if lines else 'no output'}")
            raise
        if before is None:  # /health's 503 while the model loads is how starting looks
            _cause.pop("cause", None)

    return start


def _request(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def make_request(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        response = original(self, method, path, *args, **kwargs)
        if not 200 <= response.status_code < 300:
            _note(f"{method} {path} → {response.status_code} {_message(response.body)}")
        return response

    return make_request


def _stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def make_stream_request(self: Any, method: str, path: str, *args: Any, **kw: Any) -> Any:
        try:
            yield from original(self, method, path, *args, **kw)
        except Exception as e:
            body = getattr(e, "body", None)
            code = getattr(e, "code", type(e).__name__)
            _note(f"{method} {path} (stream) → {code} {_message(body) if body else e}")
            raise

    return make_stream_request


def _send(original: Callable[..., Any]) -> Callable[..., Any]:
    """httpx's ``Client.send``, noting answers outside 2xx: the suite's ``openai`` clients."""

    @functools.wraps(original)
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        response = original(self, request, *args, **kwargs)
        if not 200 <= response.status_code < 300:
            response.read()  # an error's body, read once and kept for its caller
            try:
                body = response.json()
            except ValueError:
                body = response.text
            path = request.url.raw_path.decode("ascii", "replace")
            _note(f"{request.method} {path} → {response.status_code} {_message(body)}")
        return response

    return send


def _message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body))
        text = error.get("message", error) if isinstance(error, dict) else error
    else:
        text = body
    return " ".join(str(text).split())[:160]


def _no_download(url: str, output_file_path: str | None = None) -> str:
    pytest.skip(f"downloads {url}")


def pytest_configure(config: pytest.Config) -> None:
    if "TENSORPLUG_SUITE_MODEL" not in os.environ:
        raise pytest.UsageError(
            "llama_suite_plugin: set TENSORPLUG_SUITE_MODEL to the GGUF file every preset "
            "runs (scripts/llama-server-suite.sh sets it to the shipped SmolLM2)"
        )
    import utils  # the suite's own module, importable from its folder

    utils.ServerPreset.load_all = staticmethod(lambda: None)
    utils.ServerProcess.start = _start(utils.ServerProcess.start)
    utils.ServerProcess.make_request = _request(utils.ServerProcess.make_request)
    utils.ServerProcess.make_stream_request = _stream(utils.ServerProcess.make_stream_request)
    utils.download_file = _no_download
    try:
        import httpx
    except ImportError:  # the suite's requirements bring it with openai
        return
    httpx.Client.send = _send(httpx.Client.send)  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    if call.when == "setup":
        _cause.clear()
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    record = _records.setdefault(item.nodeid, {"test": item.nodeid, "outcome": "passed"})
    if report.skipped and record["outcome"] == "passed":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        record.update(outcome="skipped", reason=str(reason).removeprefix("Skipped: "))
    elif report.failed and record["outcome"] != "failed":
        crash = getattr(report.longrepr, "reprcrash", None)
        message = " ".join(str(crash.message if crash else report.longrepr).split())[:200]
        record.update(outcome="failed", cause=_cause.get("cause", f"assertion: {message}"))
        report.user_properties.append(("first_cause", record["cause"]))
    if call.when == "teardown":
        _write(_records.pop(item.nodeid))


def _write(record: dict[str, str]) -> None:
    path = os.environ.get("TENSORPLUG_SUITE_RESULTS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
