"""scripts/llama-server-suite.sh's Python parts, without llama.cpp or a network: how
llama-server's command line becomes ``tensorplug serve``'s (scripts/llama_server_argv.py),
which hub models the shipped file stands in for (scripts/llama_suite_plugin.py), and how
the table groups causes (scripts/llama_suite_table.py)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def argv() -> ModuleType:
    return _load("llama_server_argv")


# what llama.cpp's suite runs for its tinyllama2 preset, the model already local
SUITE_LINE = [
    "--port", "8080", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1", "--offline",
    "--model", "/m/SmolLM2.gguf", "--batch-size", "32", "--no-slots", "--alias", "tinyllama-2",
    "--ctx-size", "512", "--parallel", "2", "--n-predict", "64", "--no-jinja",
]  # fmt: skip


def test_the_model_flag_becomes_the_argument_and_the_rest_passes_in_order(
    argv: ModuleType,
) -> None:
    rest = [a for a in SUITE_LINE if a not in ("--model", "/m/SmolLM2.gguf")]
    assert argv.serve_argv(SUITE_LINE) == ["/m/SmolLM2.gguf", *rest]
    assert argv.serve_argv(["-m", "a.gguf", "--port", "1"]) == ["a.gguf", "--port", "1"]
    assert argv.serve_argv(["--model=a.gguf", "--jinja"]) == ["a.gguf", "--jinja"]
    assert argv.serve_argv(["--metrics"]) == ["--metrics"]  # no model: serve picks one


def test_drop_leaves_out_refused_flags_with_their_values(argv: ModuleType) -> None:
    taken = {"--port", "--seed", "--host", "--batch-size", "--alias", "--ctx-size", "--parallel"}
    out = argv.serve_argv([*SUITE_LINE, "--temp=0.5", "--bogus", "x"], taken.__contains__)
    assert out == [
        "/m/SmolLM2.gguf", "--port", "8080", "--seed", "42", "--host", "127.0.0.1",
        "--batch-size", "32", "--alias", "tinyllama-2", "--ctx-size", "512", "--parallel", "2",
        "--bogus", "x",  # a flag of unknown arity is never dropped: the server refuses it
    ]  # fmt: skip


def test_a_flag_without_its_value_is_refused_by_name(argv: ModuleType) -> None:
    with pytest.raises(ValueError, match="--ctx-size needs a value"):
        argv.serve_argv(["--port", "1", "--ctx-size"])


def test_known_to_asks_the_parser(argv: ModuleType) -> None:
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("model", nargs="?")
    parser.add_argument("--port", type=int)
    parser.add_argument("--embeddings", action="store_true")
    known = argv.known_to(parser)
    assert known("--port")  # taken even though its value is missing here
    assert known("--embeddings")
    assert not known("--temp")
    assert not known("--no-slots")


def test_the_serve_parser_takes_its_own_flags(argv: ModuleType) -> None:
    known = argv.known_to(argv._serve_parser())
    assert known("--port") and known("--alias") and known("-np")
    assert not known("--no-such-flag")


def test_the_tools_flags_pass_through_with_their_values(argv: ModuleType) -> None:
    """``--tools``, ``--tools-runtime`` and the MCP flags are serve's own, spelled as
    llama-server's: passed as they came, values and all."""
    line = ["--tools", "all", "--tools-runtime", "docker:busybox", "--mcp-servers-json",
            '{"mcpServers": {}}', "--mcp-servers-config", "m.json", "--no-ui"]  # fmt: skip
    assert argv.serve_argv(line) == line
    known = argv.known_to(argv._serve_parser())
    assert all(known(f) for f in line if f.startswith("--"))


def test_main_refuses_an_unknown_mode(
    argv: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TENSORPLUG_SUITE_UNKNOWN_FLAGS", "ignore")
    assert argv.main(["--port", "1"]) == 2
    assert "use 'pass' (the default) or 'drop'" in capsys.readouterr().err


def test_presets_run_the_local_file_and_other_models_are_skipped_with_a_reason() -> None:
    plugin = _load("llama_suite_plugin")
    assert plugin.model_for("ggml-org/test-model-stories260K", None) is None
    assert plugin.model_for("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf") is None
    assert plugin.model_for("ggml-org/tinygemma3-GGUF:Q8_0", None).startswith("vision:")
    reason = plugin.model_for("ggml-org/models", "jina-reranker-v1-tiny-en/ggml-model-f16.gguf")
    assert reason.startswith("reranking:")
    assert plugin.model_for("bartowski/Phi-3.5-mini-instruct-GGUF:Q4_K_M", None) == (
        "needs the hub model bartowski/Phi-3.5-mini-instruct-GGUF:Q4_K_M"
    )


def test_the_table_compares_by_file_and_groups_first_causes(tmp_path: Path) -> None:
    table = _load("llama_suite_table")
    refused = "server did not start (Server process died with return code 2): tensorplug: "
    records = {
        "llama": [("a::t1", "passed", ""), ("a::t2", "passed", ""), ("b::t3", "skipped", "")],
        "ours": [
            ("a::t1", "failed", refused + "error: unrecognized arguments: --temp 0.8 --no-jinja"),
            ("a::t2", "failed", refused + "error: unrecognized arguments: --temp -1 --no-jinja"),
            ("b::t3", "skipped", ""),
        ],
    }
    runs = {}
    for name, rows in records.items():
        path = tmp_path / f"{name}.jsonl"
        lines = [json.dumps({"test": t, "outcome": o, "cause": c, "reason": "vision"})
                 for t, o, c in rows]  # fmt: skip
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        runs[name] = table.read(path)
    text = table.render(runs["llama"], runs["ours"], ("llama", "ours"))
    assert "| a | 2 | 0 | 2 | 0 | 2 |" in text
    assert "| b | 1 | 1 | 0 | 0 | 0 |" in text
    cause = "server did not start: tensorplug: error: unrecognized arguments: --temp --no-jinja"
    assert f"| 2 | {cause} |" in text
    assert "| 2 | `--temp` |\n| 2 | `--no-jinja` |" in text
    assert "| 1 | vision |" in text


def test_the_first_answer_outside_2xx_is_the_cause() -> None:
    httpx = pytest.importorskip("httpx")
    plugin = _load("llama_suite_plugin")
    answers = iter([httpx.Response(200, json={}), httpx.Response(404, json={"error": {
        "message": "no  such\nroute", "type": "not_found"}}), httpx.Response(500, text="x")]
    )  # fmt: skip
    send = plugin._send(httpx.Client.send)
    with httpx.Client(transport=httpx.MockTransport(lambda request: next(answers))) as client:
        for path in ("/v1/models", "/completion?x=1", "/tokenize"):
            send(client, client.build_request("POST", f"http://h{path}"))
    assert plugin._cause == {"cause": "POST /completion?x=1 → 404 no such route"}


def test_the_health_polls_of_a_start_are_not_a_cause(tmp_path: Path) -> None:
    plugin = _load("llama_suite_plugin")

    class Server:  # what the wrapper reads of the suite's ServerProcess
        model_hf_repo = model_url = mmproj_url = None
        log_path = str(tmp_path / "server.log")

        def start(self) -> None:
            plugin._note("GET /health → 503 Loading model")  # polled until the model loads

    plugin._cause.clear()
    plugin._start(Server.start)(Server())
    assert plugin._cause == {}
