"""``tensorplug serve``'s command line as llama-server's: its flags mean the same, the
ones tensorplug lacks are refused by name, and a mistake (a busy port, a missing file)
is one line at once, before a model loads."""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tensorplug.cli import main
from tensorplug.errors import RunError
from tensorplug.types import Type
from tensorplug_llm import run_cli
from tensorplug_llm.rope import RopeOverrides
from tensorplug_llm.run_cli import cache_types
from tensorplug_llm.serve_cli import _resolve, add_arguments, bind
from tensorplug_llm.serve_flags import (
    api_keys,
    chat_template,
    prompt_cache_cells,
    request_defaults,
)
from tensorplug_llm.tiny import write_tiny_llama


def _no_loading(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the model was loaded")


def test_a_port_in_use_is_one_line_before_the_model_loads(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_cli, "load_model", _no_loading)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--tiny", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"tensorplug serve: error: cannot listen on 127.0.0.1:{port}" in err
    assert "pick another --port" in err


def test_a_missing_model_file_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_cli, "load_model", _no_loading)
    assert main(["serve", "nosuch.gguf"]) == 1
    err = capsys.readouterr().err
    assert err == "tensorplug serve: error: nosuch.gguf: no such model file (a .gguf path)\n"


def test_max_connections_reaches_the_listener(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorplug_llm import serve_cli
    from tensorplug_llm.http.transport import ConnectionCap

    caps: list[int] = []

    class Recorded(serve_cli._Listening):
        def __enter__(self) -> serve_cli._Listening:
            app = self.server.config.app
            assert isinstance(app, ConnectionCap)  # the cap wraps the whole app
            caps.append(app.connections.limit)
            raise RunError("stopped before the model loads")

    monkeypatch.setattr(serve_cli, "_Listening", Recorded)
    monkeypatch.setattr(run_cli, "load_model", _no_loading)
    assert main(["serve", "--tiny", "--port", "0", "--max-connections", "5"]) == 1
    assert main(["serve", "--tiny", "--port", "0"]) == 1
    assert caps == [5, 256]  # given, then the default
    with pytest.raises(SystemExit):
        main(["serve", "--tiny", "--max-connections", "0"])
    assert "--max-connections" in capsys.readouterr().err


def test_health_is_503_loading_until_the_model_is_ready(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server listens from the start and says it is loading (llama-server's
    ``/health`` states); a load that fails then stops it, in one line."""
    loading = threading.Event()

    def slow_load(*args: Any, **kwargs: Any) -> Any:
        loading.wait(60)
        raise RunError("the file is not a model")

    monkeypatch.setattr(run_cli, "load_model", slow_load)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    done: list[int] = []
    thread = threading.Thread(
        target=lambda: done.append(main(["serve", "--tiny", "--port", str(port)]))
    )
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the server did not answer while loading"
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(f"http://127.0.0.1:{port}/health")
                break
            time.sleep(0.05)
        assert r.status_code == 503
        assert r.json()["error"] == {"message": "Loading model", "type": "unavailable_error",
                                     "param": None, "code": None}  # fmt: skip
    finally:
        loading.set()
        thread.join(60)
    assert done == [1]
    assert capsys.readouterr().err.endswith("tensorplug serve: error: the file is not a model\n")
    with socket.socket() as again:  # the port is free again
        again.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    ("flag", "why"),
    [(["-mu", "https://x/m.gguf"], "from a URL"),
     (["-ctk", "q4_k"], "not a KV cache type"),
     (["--cache-reuse", "-1"], "not a number of tokens"),
     (["--rope-freq-base", "-1"], "not a base frequency"), (["--rope-scale", "0"], "> 0"),
     (["--rope-scaling", "ntk"], "invalid choice"), (["--yarn-beta-fast", "nan"], "finite")],
)  # fmt: skip
def test_a_llama_server_flag_tensorplug_lacks_is_refused_by_name(
    flag: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--tiny", *flag])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"tensorplug serve: error: argument {flag[0]}") or flag[0] in err
    assert why in err


def test_the_flags_every_llama_server_preset_passes_are_accepted() -> None:
    """llama.cpp's server tests start every server with --offline and most with
    --no-jinja: --offline changes nothing here (nothing is downloaded); --no-jinja turns
    Jinja off as llama-server's does, the last of the two flags winning."""
    args = _parse(["--offline", "--no-jinja", "--jinja"])
    assert args.offline and args.jinja
    assert not _parse(["--jinja", "--no-jinja"]).jinja and _parse([]).jinja


def test_llama_servers_rope_flags_override_the_files(tmp_path: Path) -> None:
    """--rope-scaling, --rope-scale (1/N as --rope-freq-scale), --rope-freq-base and the
    --yarn-* flags reach the model as llama.cpp's context parameters; left out, the
    file's rope applies."""
    model = write_tiny_llama(tmp_path / "m.gguf", "f32", 3)
    args = _parse(["-m", str(model), "-c", "64", "--rope-scaling", "yarn", "--rope-scale", "4",
                   "--rope-freq-base", "500", "--yarn-orig-ctx", "16", "--yarn-beta-fast",
                   "16"])  # fmt: skip
    assert args.rope == RopeOverrides(scaling_type=2, freq_base=500.0, freq_scale=0.25,
                                      orig_ctx=16, beta_fast=16.0)  # fmt: skip
    m = run_cli.load_model(args)
    try:
        c = m.config
        assert (c.rope_base, c.rope_scale, c.rope_ext_factor) == (500.0, 0.25, 1.0)
        assert (c.rope_n_ctx_orig, c.rope_beta_fast, c.rope_beta_slow) == (16, 16.0, 1.0)
    finally:
        m.close()
    assert _parse(["-m", str(model), "--rope-scale", "2", "--rope-freq-scale", "0.25"]).rope == (
        RopeOverrides(freq_scale=0.25)  # the last of the two scale flags, as llama-server
    )
    assert _parse(["-m", str(model)]).rope is None


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(argv)
    _resolve(args)
    return args


def test_aliases_and_tags_are_sorted_sets_whose_first_alias_names_the_model() -> None:
    args = _parse(["--tiny", "-a", "tinyllama-2,fim,code,fim", "--tags", "small, chat"])
    assert (args.aliases, args.alias, args.tags) == (["code", "fim", "tinyllama-2"], "code",
                                                     ["chat", "small"])  # fmt: skip
    bare = _parse(["--tiny"])
    assert (bare.aliases, bare.alias, bare.tags, bare.ui) == ([], None, [], True)


def test_the_prompt_cache_and_the_idle_sleep_flags_are_llama_servers() -> None:
    args = _parse(["--tiny"])
    assert (args.cache_ram, args.cache_idle_slots, args.sleep_idle_seconds) == (8192, True, -1)
    args = _parse(["--tiny", "--cache-ram", "100", "--no-cache-idle-slots",
                   "--sleep-idle-seconds", "1.5"])  # fmt: skip
    assert (args.cache_ram, args.cache_idle_slots, args.sleep_idle_seconds) == (100, False, 1.5)
    # MiB as KV cells: 1 MiB of 4 KiB cells is 256 of them; -1 no bound, 0 no cache
    assert prompt_cache_cells(1, 4096) == 256
    assert prompt_cache_cells(-1, 4096) is None and prompt_cache_cells(0, 4096) == 0
    with pytest.raises(RunError, match="--cache-ram -2"):
        prompt_cache_cells(-2, 4096)


def test_lora_flags_name_adapters_and_their_scales(tmp_path: Path) -> None:
    one, two = tmp_path / "a.gguf", tmp_path / "b.gguf"
    one.write_bytes(b"x")
    two.write_bytes(b"x")
    args = _parse(["--tiny", "--lora", str(one), "--lora-scaled", str(two), "0.25"])
    assert run_cli.lora_adapters(args) == [(str(one), 1.0), (str(two), 0.25)]
    with pytest.raises(RunError, match="no such LoRA adapter file"):
        run_cli.lora_adapters(_parse(["--lora", str(tmp_path / "absent.gguf")]))
    with pytest.raises(RunError, match="finite number"):
        run_cli.lora_adapters(_parse(["--lora-scaled", str(one), "lots"]))


def test_override_kv_reads_llama_cpps_form() -> None:
    assert run_cli.kv_overrides(
        ["tokenizer.ggml.add_bos_token=bool:false", "llama.context_length=int:1024",
         "llama.rope.freq_base=float:5e4", "general.name=str:a=b:c"]
    ) == {"tokenizer.ggml.add_bos_token": False, "llama.context_length": 1024,
          "llama.rope.freq_base": 50000.0, "general.name": "a=b:c"}  # fmt: skip
    for bad in ("novalue", "k=int", "k=int:x", "k=list:1", "k=bool:yes", "=int:1"):
        with pytest.raises(RunError, match="KEY=TYPE:VALUE"):
            run_cli.kv_overrides([bad])


def test_no_ui_and_kv_unified_are_taken() -> None:
    args = _parse(["--tiny", "--no-ui", "--kv-unified"])
    assert (args.ui, args.kv_unified) == (False, True)


def test_llama_servers_common_flags_mean_the_same(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    args = _parse(["-m", str(model), "-c", "512", "-np", "3", "-b", "64", "-ub", "32", "-t", "2",
                   "-ngl", "0", "--host", "0.0.0.0", "--port", "9000", "-a", "gpt", "--jinja",
                   "-fa", "on", "-ctk", "f32", "-ctv", "f32", "--embeddings", "--pooling",
                   "cls", "--metrics", "--no-slots", "-n", "16", "--temp", "0.5", "--seed",
                   "7", "--timeout", "30", "--cache-reuse", "256"])  # fmt: skip
    assert args.model == str(model)
    assert (args.ctx_size, args.parallel, args.batch_size, args.threads) == (512, 3, 32, 2)
    assert (args.n_gpu_layers, args.host, args.port, args.alias) == (0, "0.0.0.0", 9000, "gpt")
    assert cache_types(args) == (Type.F32, Type.F32)
    assert (args.pooling, args.metrics, args.slots) == ("cls", True, False)
    assert args.timeout == 30 and args.cache_reuse == 256
    assert request_defaults(args) == {"n_predict": 16, "temperature": 0.5, "seed": 7}
    plain = _parse([str(model)])
    assert request_defaults(plain) == {} and plain.seed == 0 and plain.slots
    # K and V each their own type, as llama-server's
    assert cache_types(_parse([str(model), "-ctk", "q8_0", "-ctv", "q4_0"])) == (
        Type.Q8_0,
        Type.Q4_0,
    )
    assert cache_types(_parse([str(model), "-ctv", "Q5_1"])) == (Type.F16, Type.Q5_1)


def test_flash_attention_is_on_unless_turned_off_as_llama_servers_auto(tmp_path: Path) -> None:
    """llama-server's ``-fa`` defaults to auto, which llama.cpp resolves to on for a CPU:
    serve's model rounds attention as ggml's flash kernel unless ``-fa off``."""
    model = write_tiny_llama(tmp_path / "t.gguf", "q8_0", 0)
    for argv, on in (([], True), (["-fa"], True), (["-fa", "auto"], True), (["-fa", "off"], False)):
        args = _parse([str(model), "-c", "64", "-t", "1", *argv])
        loaded = run_cli.load_model(args, batch_invariant=True)
        try:
            assert loaded.config.flash_attn is on, argv
        finally:
            loaded.close()


def test_max_prefill_tokens_is_a_count_and_defaults_to_what_the_batch_leaves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert _parse([str(model), "--max-prefill-tokens", "16"]).max_prefill_tokens == 16
    assert _parse([str(model)]).max_prefill_tokens is None
    with pytest.raises(SystemExit):
        _parse([str(model), "--max-prefill-tokens", "0"])
    assert "--max-prefill-tokens" in capsys.readouterr().err


def test_keys_come_from_the_flag_and_the_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k3\n\n  k4  \n")
    args = argparse.Namespace(api_key="k1,k2", api_key_file=str(keys))
    assert api_keys(args) == ["k1", "k2", "k3", "k4"]
    keys.write_text("\n")
    with pytest.raises(Exception, match="holds no key"):
        api_keys(args)


def test_a_chat_template_is_jinja_text_or_a_file(tmp_path: Path) -> None:
    text = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    file = tmp_path / "t.jinja"
    file.write_text(text)
    for value, path in ((text, None), (str(file), None), (None, str(file))):
        assert chat_template(argparse.Namespace(chat_template=value,
                                                chat_template_file=path)) == text  # fmt: skip
    with pytest.raises(Exception, match="neither a built-in template's name"):
        chat_template(argparse.Namespace(chat_template="no-such", chat_template_file=None))


def test_a_chat_template_may_be_named_as_llama_cpps_built_in_ones() -> None:
    """llama-server's ``--chat-template llama3``: the Jinja of that name renders the text
    llama.cpp's C++ writes; a name llama.cpp has and tensorplug lacks is refused by name."""
    from tensorplug_llm.template import render

    def named(name: str) -> str | None:
        return chat_template(argparse.Namespace(chat_template=name, chat_template_file=None))

    messages = [{"role": "system", "content": "You are a test."},
                {"role": "user", "content": "Hi there"}]  # fmt: skip
    command_r = named("command-r")
    assert command_r is not None
    assert render(command_r, messages) == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    )  # llama.cpp's test_apply_chat_template
    llama3 = named("llama3")
    assert llama3 is not None
    assert render(llama3, messages) == (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a test.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    chatml = named("chatml")
    assert chatml is not None and render(chatml, messages).endswith("<|im_start|>assistant\n")
    with pytest.raises(RunError, match="'deepseek3' is not one tensorplug has"):
        named("deepseek3")


def test_several_hosts_are_all_bound() -> None:
    sockets = bind("127.0.0.1,127.0.0.1", 0)
    try:
        assert len(sockets) == 2
        assert len({s.getsockname()[1] for s in sockets}) == 2
    finally:
        for s in sockets:
            s.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    keys = tmp_path / "keys"
    keys.write_text("sekrit\n")
    child = subprocess.Popen(
        [sys.executable, "-m", "tensorplug", "serve", "--tiny", "-c", "128", "--port",
         str(port), "--api-key-file", str(keys), "--metrics", "-n", "3", "-a", "tiny",
         "--max-prefill-tokens", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            assert child.poll() is None, child.communicate()[1]
            assert time.monotonic() < deadline, "the server did not answer"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            time.sleep(0.2)
        yield port
    finally:
        child.terminate()
        child.communicate(timeout=60)


def test_serve_wires_the_flags_to_the_server(served: int) -> None:
    url = f"http://127.0.0.1:{served}"
    assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["tiny"]
    assert httpx.get(url + "/metrics").status_code == 401
    key = {"x-api-key": "sekrit"}
    assert "llamacpp:prompt_tokens_total" in httpx.get(url + "/metrics", headers=key).text
    got = httpx.post(url + "/completion", json={"prompt": "the of"}, headers=key).json()
    assert got["tokens_predicted"] == 3  # -n 3
