"""``tensorplug run``'s options at their edges: llama.cpp's special values mean what they
mean there, and every other bad value is refused in one line, before anything loads.

Usage errors exit with status 2 (argparse's convention). A model path that does not
exist shows that a refusal came before loading: loading would have failed on it first.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tensorplug import registry
from tensorplug.cli import main
from tensorplug_llm.tiny import write_tiny_llama

MISSING = "/nonexistent/model.gguf"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("opts") / "tiny.gguf", "f32", 3, n_ctx=64)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["run", *argv])
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    said = capsys.readouterr()
    assert "Traceback" not in said.err
    return code, said.out, said.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "-5"], "argument --seed: -5 is not a seed"),
        (["--temp", "nan"], "argument --temp: 'nan' is not a finite number"),
        (["--temp", "inf"], "argument --temp: 'inf' is not a finite number"),
        (["--top-p", "nan"], "argument --top-p: 'nan' is not a finite number"),
        (["-ngl", "-2"], "argument -ngl/--n-gpu-layers: -2 is not a layer count"),
        (["-n", "-3"], "argument -n/--n-predict: -3 is not a token count"),
        (["-sm", "row", "-ts", "nan,1"], "argument -ts/--tensor-split: 'nan,1'"),
        (["-sm", "row", "-ts", "inf,1"], "argument -ts/--tensor-split: 'inf,1'"),
        (["-sm", "row", "-ts", "1e308,1e308"], "argument -ts/--tensor-split: '1e308,1e308'"),
        (["-p", ""], "-p/--prompt is empty"),
        (["--logits-out", "/"], "--logits-out /: is a directory"),
        (["--logits-out", "/nonexistent/dir/l.npy"], "no folder /nonexistent/dir"),
    ],
)
def test_bad_values_are_refused_before_loading(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = _run(capsys, MISSING, *args)
    assert code == 2, err
    assert message in err, err
    assert "model.gguf" not in err  # refused before the missing model was looked at
    assert not Path("/.npy").exists()


def test_seed_minus_one_is_random_and_says_which(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(model), "--device", "CPU", "-n", "8", "--temp", "1.5", "--top-k", "0"]
    code, out, err = _run(capsys, *argv, "--seed", "-1", "--ignore-eos")
    assert code == 0, err
    seed = re.search(r"seed: (\d+) \(random", err)
    assert seed, err
    again = _run(capsys, *argv, "--seed", seed.group(1), "--ignore-eos")
    assert again[1] == out  # the seed printed reproduces the run


def test_n_predict_zero_evaluates_the_prompt_only(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, str(model), "--device", "CPU", "--tokens", "1", "-n", "0")
    assert code == 0, err
    assert "prompt:         1 tokens" in err
    assert "generation:     0 tokens" in err, err


def test_n_predict_minus_one_runs_until_the_context_is_full(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(model), "--device", "CPU", "--tokens", "1,300", "-n", "-1", "-c", "16"]
    code, _, err = _run(capsys, *argv, "--ignore-eos")
    assert code == 0, err
    assert "exceed the context" not in err
    assert "generation:    14 tokens" in err, err  # the 16 - 2 slots after the prompt


def test_ngl_minus_one_puts_every_layer_on_the_gpu(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if registry.dev_by_name("OpenCL0") is None:
        pytest.skip("no OpenCL device (pip install -e plugins/opencl pocl-binary-distribution)")
    code, _, err = _run(capsys, str(model), "--device", "OpenCL0", "-ngl", "-1", "-n", "1")
    assert code == 0, err
    assert "placement: token_embd: CPU, blocks 0-1: OpenCL0, output: OpenCL0" in err


def test_logits_out_writes_the_name_given(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "logits"  # np.save would have written logits.npy
    code, _, err = _run(capsys, str(model), "--device", "CPU", "-n", "1", "--logits-out",
                        str(target))  # fmt: skip
    assert code == 0, err
    assert np.load(target).shape[1] == 320


def test_a_device_of_a_plugin_that_cannot_run_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "--tiny", "--device", "cuda0", "-n", "1")
    assert code == 1
    assert "no device named 'cuda0'" in err
    # as `check --backend cuda0` says: the CUDA plugin's state, whatever it is here
    assert "backend 'CUDA'" in err or "no installed plugin provides a backend" in err, err
