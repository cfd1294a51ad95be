"""benchmarks/bench_vs_llamacpp.py: which models it measures and where their files come
from (written models, or a downloaded GGUF given by path), and its refusals. The
figures themselves come from running it (llama.cpp through llama-cpp-python)."""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vs_llamacpp.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_vs_llamacpp", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_vs_llamacpp"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_sizes_and_files_are_both_models(bench: ModuleType, tmp_path: Path) -> None:
    real = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    real.write_bytes(b"GGUF")
    specs = bench.parse_models(f"100M:Q4_0, {real}")
    assert [s.name for s in specs] == ["100M:q4_0", "SmolLM2-135M"]
    assert bench.model_path(specs[1], tmp_path / "cache") == real  # used as it is
    assert not (tmp_path / "cache").exists()  # nothing written for a given file


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("900M:q4_0", "write SIZE:TYPE"),
        ("100M", "write SIZE:TYPE"),
        ("missing.gguf", "does not exist"),
        (" , ", "--models is empty"),
    ],
)
def test_bad_models_are_refused_with_the_fix(bench: ModuleType, text: str, message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        bench.parse_models(text)


def test_thread_counts_take_auto_for_each_engines_own_choice(bench: ModuleType) -> None:
    assert bench.parse_counts("1, 2,auto", "--threads") == [1, 2, bench.AUTO]
    for bad in ("0", "two", "", "-1", "1,0"):
        with pytest.raises(SystemExit, match="integers >= 1 or 'auto'"):
            bench.parse_counts(bad, "--threads")


def test_the_ratio_is_the_median_of_each_rounds_own(bench: ModuleType) -> None:
    # round ratios 1.0, 2.0, 0.8: their median is 1.0, where the ratio of the medians
    # (80 / 100) would pair round 3's tensorplug with round 1's llama.cpp
    assert bench.paired_ratio([100.0, 50.0, 80.0], [100.0, 25.0, 100.0]) == 1.0
    assert bench.paired_ratio([3.0], [4.0]) == 0.75


def test_a_tensorplug_worker_reports_first_prompt_repeats_and_generation(
    bench: ModuleType, tmp_path: Path
) -> None:
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", "q8_0", n_embd=64, n_ff=128, n_layer=2,
                            n_head=4, n_head_kv=2, n_vocab=320)  # fmt: skip
    before = time.time()
    got = bench.worker_tensorplug(str(path), 1, n_prompt=12, n_gen=3, batch=8, repeats=2)
    assert set(got) == {"prompt", "again", "gen", "first_token_at", "peak_rss_mb"}
    assert all(v > 0 for v in got.values())
    assert before < got["first_token_at"] < time.time()  # when, not how long: the driver
    # subtracts its own start of the process
    assert got["peak_rss_mb"] > 20  # at least the interpreter and numpy


def test_a_tensorplug_worker_feeds_back_its_own_greedy_tokens(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as llama.cpp's worker does: each generated step reads the token the last one chose
    # (eval returns the last token's logits, shape (n_vocab,); indexing them once more
    # took a scalar's argmax, 0, and fed token 0 to every step)
    import numpy as np

    from tensorplug_llm.runner import ModelRunner
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", "q8_0", n_embd=64, n_ff=128, n_layer=2,
                            n_head=4, n_head_kv=2, n_vocab=320)  # fmt: skip
    steps: list[tuple[list[int], int]] = []
    real_eval = ModelRunner.eval

    def eval_noting(
        self: ModelRunner, tokens: list[int], *args: object, **kw: object
    ) -> np.ndarray:
        out = real_eval(self, tokens, *args, **kw)  # type: ignore[arg-type]
        steps.append((list(tokens), int(out.argmax())))
        return out

    monkeypatch.setattr(ModelRunner, "eval", eval_noting)
    bench.worker_tensorplug(str(path), 1, n_prompt=12, n_gen=4, batch=8, repeats=1)
    prompt_at = next(i for i, (toks, _) in enumerate(steps) if len(toks) == 12)
    chain = steps[prompt_at : prompt_at + 5]  # the prompt, then the 4 generated steps
    for (_, chose), (fed, _) in itertools.pairwise(chain):
        assert fed == [chose]
    assert {chose for _, chose in chain} != {0}


def test_the_start_table_gives_medians_ratios_and_the_first_run(bench: ModuleType) -> None:
    ours = [{"launch": 2.0, "peak_rss_mb": 300.0}, {"launch": 3.0, "peak_rss_mb": 310.0},
            {"launch": 2.5, "peak_rss_mb": 305.0}]  # fmt: skip
    theirs = [{"launch": 0.5, "peak_rss_mb": 100.0}, {"launch": 1.0, "peak_rss_mb": 100.0},
              {"launch": 0.5, "peak_rss_mb": 100.0}]  # fmt: skip
    row = bench.start_row(ours, theirs, [{"launch": 14.25}])
    launch, rss = (cell.split() for cell in row.split(" | "))
    # medians (min-max) in hundredths of a second, then the median of the rounds' ratios
    # 4.0, 3.0, 5.0, then the first run's
    assert launch == ["2.50", "(2.00-3.00)", "0.50", "(0.50-1.00)", "4.00", "14.25"]
    assert rss == ["305.0", "(300.0-310.0)", "100.0", "(100.0-100.0)", "3.05"]
    assert bench.start_row(ours, theirs, []).split(" | ")[0].split()[-1] == "-"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux's VmHWM")
def test_a_worker_reports_its_own_peak_not_the_parents(bench: ModuleType) -> None:
    """The driver forks each worker while it holds the models it wrote; Linux's
    ``ru_maxrss`` carries the parent's resident size across ``exec``, so every worker
    read at least the driver's (342 MB for either engine). Here a parent holding 300 MB
    starts a child that only imports the script: the child's peak is its own."""
    import numpy as np

    ballast = np.ones(300 * 2**20 // 8)  # touched: resident in this process
    code = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location("
        f"'b', {str(SCRIPT)!r}); m = importlib.util.module_from_spec(spec); "
        "sys.modules['b'] = m; spec.loader.exec_module(m); print(m._peak_rss_mb())"
    )
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout)  # fmt: skip
    assert ballast.sum() > 0 and bench._peak_rss_mb() > 300
    assert 5 < child < 150  # the interpreter and numpy


def test_as_avx2_gives_tensorplugs_workers_an_avx2_hosts_kernels(bench: ModuleType) -> None:
    from tensorplug_cpu.system import AVX2_FEATURES

    on, off = (bench.argparse.Namespace(as_avx2=v) for v in (True, False))
    assert bench.worker_env("tensorplug", on)["NUMBA_CPU_FEATURES"] == AVX2_FEATURES
    assert bench.worker_env("tensorplug", on)["OPENBLAS_CORETYPE"] == "Haswell"
    for engine, a in [("llamacpp", on), ("tensorplug", off)]:
        env = bench.worker_env(engine, a)
        assert env.get("NUMBA_CPU_FEATURES") == bench.os.environ.get("NUMBA_CPU_FEATURES")


def test_as_avx2_refuses_a_llama_cpp_built_with_avx512(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stand-in interpreter whose llama_cpp reports AVX-512: refused, with the build."""
    (tmp_path / "llama_cpp.py").write_text(
        "def llama_print_system_info():\n"
        "    return b'CPU : AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 |'\n"
    )
    exe = tmp_path / "python"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path} exec {sys.executable} "$@"\n')
    exe.chmod(0o755)
    assert "AVX512 = 1" in bench.llama_system_info(str(exe))
    code = bench.main(["--as-avx2", "--llama-python", str(exe), "--models", "100M:q4_0"])
    assert code == 2
    err = capsys.readouterr().err
    assert "-DGGML_AVX512=OFF" in err and "AVX512 = 1" in err


def _namespace(bench: ModuleType, **given: object) -> object:
    options = {"prompt": 128, "gen": 64, "batch": 128, "repeats": 2, "as_avx2": False,
               "time_limit": 2.0} | given  # fmt: skip
    return bench.argparse.Namespace(**options)


def test_a_worker_ended_at_the_limit_gives_what_it_finished_and_a_bound(
    bench: ModuleType, tmp_path: Path
) -> None:
    """A stand-in worker that prints its first prompt's part and that it began generating,
    then hangs: the driver ends it at ``--time-limit`` and keeps the prompt, bounds the
    generation by its tokens over the time it had, and knows nothing of the rest."""
    exe = tmp_path / "hanging"
    exe.write_text(
        "#!/bin/sh\n"
        "now=$(date +%s.%N)\n"
        f"echo $now > '{tmp_path / 'now'}'\n"
        'echo "{\\"prompt_from\\": $now}"\n'
        'echo "{\\"prompt\\": 500.0, \\"first_token_at\\": $now, \\"gen_from\\": $now, '
        '\\"peak_rss_mb\\": 99.0}"\n'
        "exec sleep 300\n"
    )
    exe.chmod(0o755)
    before = time.time()  # the driver's clock starts after this, before the worker's now
    got = bench.measure(str(exe), "llamacpp", tmp_path / "m.gguf", 2, _namespace(bench))
    assert time.time() - before < 240  # ended at the 2 s limit, not after the 300 s sleep
    now = float((tmp_path / "now").read_text())
    assert got["prompt"] == 500.0 and "prompt" not in got["bounds"]
    # 64 tokens not generated in the time it had, from its now to the 2 s limit: fewer
    # than 64 / that a second, which is at least 32 (a busy machine starts it late)
    assert 32 <= got["gen"] <= 64 / max(before + 2 - now, 1e-9)
    assert got["bounds"]["gen"] == "<"
    assert got["again"] is None
    assert 0 <= got["launch"] <= now - before and "launch" not in got["bounds"]
    assert got["peak_rss_mb"] == 99.0 and got["bounds"]["peak_rss_mb"] == ">"


def test_a_worker_ended_while_loading_launched_later_than_the_limit(bench: ModuleType) -> None:
    got = bench.bounded_result('{"prompt_fr', started=100.0, a=_namespace(bench, time_limit=60.0))
    assert got["launch"] == 60.0 and got["bounds"]["launch"] == ">"
    assert got["prompt"] is got["gen"] is got["again"] is got["peak_rss_mb"] is None


def test_bounds_mark_the_cells_and_turn_the_ratio_the_way_they_bound_it(
    bench: ModuleType,
) -> None:
    done = [{"gen": 100.0, "bounds": {}}, {"gen": 120.0, "bounds": {}}]
    ended = [{"gen": 2.0, "bounds": {"gen": "<"}}, {"gen": 50.0, "bounds": {}}]
    # llama.cpp's 2.0 is an upper bound: the rounds' ratios 50 and 2.4 are lower bounds
    assert bench.compared(done, ended, "gen").split() == [
        "110.0", "(100.0-120.0)", "<26.0", "(2.0-50.0)", ">26.20"]  # fmt: skip
    assert bench.compared(ended, done, "gen").split()[-1] == "<0.22"
    assert bench.compared(ended, ended, "gen").split()[-1] == "?1.00"  # bounded alike: no way
    unknown: list[dict] = [{"gen": None, "bounds": {}}, {"gen": None, "bounds": {}}]
    assert bench.compared(done, unknown, "gen").split()[-2:] == ["-", "-"]


def test_bytecode_is_written_before_launches_are_timed(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package whose bytecode the environment forbids writing would compile from
    source at every timed launch; the driver writes it first, as installing does."""
    package = tmp_path / "launched_pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n")
    (package / "inner" / "__init__.py").write_text("Y = 2\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    tag = sys.implementation.cache_tag
    subprocess.run([sys.executable, "-c", "import launched_pkg.inner"], check=True)
    assert not list(package.rglob("*.pyc"))  # the environment's own imports write none
    bench.compile_bytecode(sys.executable, ["launched_pkg", "no_such_package"])
    assert (package / "__pycache__" / f"__init__.{tag}.pyc").is_file()
    assert (package / "inner" / "__pycache__" / f"__init__.{tag}.pyc").is_file()
    assert {"tensorplug", "tensorplug_llm", "tensorplug_cpu"} <= set(bench.own_packages())


def test_the_cache_is_filled_at_every_thread_count_before_any_round(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A run at one thread count may take kernels another does not: a 100M Q5_K round
    on two threads compiled for 21 s after a fill on one. Each count gets its untimed
    fill (not ended at --time-limit) before the model's first timed round, and the
    bytecode of both engines is written before anything runs."""
    calls: list[tuple[str, int, bool]] = []
    result = {"prompt": 1.0, "again": 1.0, "gen": 1.0, "launch": 1.0, "peak_rss_mb": 1.0,
              "bounds": {}}  # fmt: skip

    def measure(exe: str, engine: str, path: Path, threads: int, a: object,
                numba_cache: str | None = None, limited: bool = True) -> dict:  # fmt: skip
        calls.append((engine, threads, limited))
        return dict(result)

    compiled: list[str] = []
    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "find_llama_python", lambda given: sys.executable)
    monkeypatch.setattr(bench, "llama_system_info", lambda exe: "CPU : AVX2 = 1 |")
    monkeypatch.setattr(bench, "model_path", lambda spec, cache: tmp_path / "m.gguf")
    monkeypatch.setattr(bench, "compile_bytecode", lambda exe, names: compiled.append(exe))
    code = bench.main(["--models", "100M:q4_0,100M:q4_k", "--threads", "1,2", "--rounds", "2",
                       "--cold", "0", "--time-limit", "5"])  # fmt: skip
    assert code == 0 and len(compiled) == 2 and "100M:q4_k" in capsys.readouterr().out
    fills = [("tensorplug", 1, False), ("tensorplug", 2, False)]
    rounds = [(engine, threads, True) for threads in (1, 2) for _ in range(2)
              for engine in ("tensorplug", "llamacpp")]  # fmt: skip
    assert calls == (fills + rounds) * 2  # per model: its fills, then its rounds
