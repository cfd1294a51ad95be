"""The CPU's mul_mat dispatch table: its choices for the cases that matter, its agreement
with the kernels that exist, and the README's copy of it."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cpu_helpers import throwaway_cache_env

import tensorplug as tp
from tensorplug.quants import SUPPORTED_TYPES
from tensorplug_cpu.kernels import dispatch as d
from tensorplug_cpu.system import AVX2_FEATURES, LEVELS, KernelFeatures, kernel_features

T = tp.Type
QUANT = [t for t in SUPPORTED_TYPES if t.is_quantized]
README = Path(__file__).resolve().parents[2] / "plugins" / "cpu" / "README.md"


def _path(t: T, rows: int, layout: str = d.PLAIN, numba: bool = True, **facts: bool) -> str:
    return d.select(t, layout, rows, numba=numba, **facts).name


# (weight type, layout, rows, numba, facts) -> the path, as the kernels chose before the
# table: the limits on both sides of each boundary, every fallback
PINNED = [
    (T.Q4_0, d.PLAIN, 1, True, {}, d.INT8),
    (T.Q4_0, d.PLAIN, 16, True, {}, d.INT8),
    (T.Q4_0, d.PLAIN, 17, True, {}, d.DECODE_VECTOR),
    (T.Q4_K, d.PLAIN, 16, True, {}, d.INT8),
    (T.Q4_K, d.PLAIN, 17, True, {}, d.DECODE_VECTOR),
    (T.Q4_1, d.PLAIN, 12, True, {}, d.INT8),
    (T.Q8_0, d.PLAIN, 12, True, {}, d.INT8),
    (T.Q6_K, d.PLAIN, 12, True, {}, d.INT8),
    (T.Q6_K, d.PLAIN, 13, True, {}, d.DECODE_VECTOR),
    (T.Q5_0, d.PLAIN, 8, True, {}, d.INT8),
    (T.Q5_0, d.PLAIN, 9, True, {}, d.DECODE_VECTOR),
    (T.Q5_1, d.PLAIN, 8, True, {}, d.INT8),
    (T.Q5_K, d.PLAIN, 8, True, {}, d.FLOAT_FUSED),
    (T.Q5_K, d.PLAIN, 9, True, {}, d.DECODE_VECTOR),
    (T.Q2_K, d.PLAIN, 8, True, {}, d.FLOAT_FUSED),
    (T.Q2_K, d.PLAIN, 9, True, {}, d.DECODE_SCALAR),
    (T.Q3_K, d.PLAIN, 200, True, {}, d.DECODE_SCALAR),
    (T.Q4_0, d.PLAIN, 1, True, {"blocks_contiguous": False}, d.FLOAT_FUSED),
    (T.Q4_0, d.PLAIN, 100, True, {"blocks_contiguous": False}, d.DECODE_SCALAR),
    (T.Q4_0, d.PLAIN, 1, False, {}, d.DECODE_NUMPY),
    (T.Q6_K, d.PLAIN, 128, False, {}, d.DECODE_NUMPY),
    (T.Q4_0, d.REPACKED, 1, True, {}, d.REPACKED_INT8),
    (T.Q6_K, d.REPACKED, 512, True, {}, d.REPACKED_INT8),
    (T.Q8_0, d.REPACKED, 3, False, {}, d.REPACKED_DECODE),
    (T.F32, d.PLAIN, 8, True, {}, d.FLOAT_MATVEC),
    (T.F32, d.PLAIN, 9, True, {}, d.BLAS),
    (T.F32, d.PLAIN, 1, True, {"unit_stride": False}, d.BLAS),
    (T.F32, d.PLAIN, 1, False, {}, d.BLAS),
    (T.F16, d.PLAIN, 8, True, {}, d.FLOAT_MATVEC),
    (T.F16, d.PLAIN, 9, True, {}, d.F16_WIDEN),
    (T.F16, d.PLAIN, 1, True, {"matrix": False}, d.F16_NUMPY),
    (T.F16, d.PLAIN, 1, False, {}, d.F16_NUMPY),
    (T.BF16, d.PLAIN, 8, True, {}, d.FLOAT_MATVEC),
    (T.BF16, d.PLAIN, 9, True, {}, d.BF16_SHIFT),
]


@pytest.mark.parametrize(("t", "layout", "rows", "numba", "facts", "want"), PINNED,
                         ids=lambda v: getattr(v, "name", str(v)))  # fmt: skip
def test_the_table_chooses_as_the_kernels_did(
    t: T, layout: str, rows: int, numba: bool, facts: dict[str, bool], want: str
) -> None:
    assert _path(t, rows, layout, numba, **facts) == want


def test_every_product_the_cpu_supports_has_exactly_one_first_path() -> None:
    """Over the grid of every weight type, layout, row count, numba and fact, select finds
    a path (none falls through), and the paths' names are distinct."""
    assert len({p.name for p in d.TABLE}) == len(d.TABLE)
    flags = list(itertools.product([True, False], repeat=4))
    for t, rows, (numba, contiguous, matrix, unit) in itertools.product(
        [*QUANT, T.F32, T.F16, T.BF16], [0, 1, 7, 8, 9, 12, 13, 16, 17, 64, d.MANY], flags
    ):
        layouts = [d.PLAIN, d.REPACKED] if t in d.path(d.REPACKED_INT8).types else [d.PLAIN]
        for layout in layouts:
            choice = d.select(t, layout, rows, numba=numba, blocks_contiguous=contiguous,
                              matrix=matrix, unit_stride=unit)  # fmt: skip
            assert t in choice.path.types and choice.path.layout == layout
            assert numba or d.NUMBA not in choice.path.needs


def test_a_product_no_path_takes_is_named() -> None:
    with pytest.raises(LookupError, match=r"no CPU kernel multiplies I32 weights \(plain\)"):
        d.select(T.I32, d.PLAIN, 1, numba=True)
    with pytest.raises(LookupError, match="Q3_K weights"):
        d.select(T.Q3_K, d.REPACKED, 1, numba=True)  # no repacked layout


def test_the_limits() -> None:
    assert d.matvec_max_tokens(T.Q4_0) == d.matvec_max_tokens(T.Q4_K) == 16
    assert d.matvec_max_tokens(T.Q8_0) == d.matvec_max_tokens(T.Q6_K) == 12
    assert d.matvec_max_tokens(T.Q5_0) == d.matvec_max_tokens(T.Q2_K) == 8
    assert d.MATVEC_MOST_TOKENS == 16 and d.FLOAT_MATVEC_MAX_TOKENS == 8
    assert d.fused_path(T.Q4_0) == d.INT8
    assert d.fused_path(T.Q4_0, blocks_contiguous=False) == d.FLOAT_FUSED
    assert d.fused_path(T.Q3_K) == d.FLOAT_FUSED


def test_the_features_pick_the_instructions_not_the_path() -> None:
    forms = {}
    for level, feats in zip(LEVELS, [KernelFeatures(avx2=True, f16c=True, vnni=True),
                                     KernelFeatures(avx2=True, f16c=True),
                                     KernelFeatures()], strict=True):  # fmt: skip
        assert feats.level == level
        choice = d.select(T.Q4_0, d.REPACKED, 4, numba=True, features=feats)
        assert choice.name == d.REPACKED_INT8
        forms[level] = choice.form
        assert d.select(T.Q4_0, d.PLAIN, 4, numba=True, features=feats).name == d.INT8
    assert "vpdpbusd" in forms["vnni"] and "vpmaddubsw" in forms["avx2"]
    assert "portable" not in forms["portable"] and "widening" in forms["portable"]
    host = d.select(T.Q4_0, d.REPACKED, 1, numba=True)
    assert host.level == kernel_features().level
    assert d.select(T.F32, d.PLAIN, 100, numba=False).form == "numpy and BLAS"


def test_the_readme_prints_the_table_as_generated() -> None:
    text = README.read_text(encoding="utf-8")
    assert d.readme_block(text) == d.markdown(), (
        "plugins/cpu/README.md's dispatch table is stale: run "
        "`python -m tensorplug_cpu.kernels --write`"
    )


def test_the_table_is_written_between_the_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{d.BEGIN}\nold\n{d.END}\n\nafter\n", encoding="utf-8")
    assert d.main(["--write", str(readme)]) == 0
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# title\n\n") and text.endswith("\n\nafter\n")
    assert d.readme_block(text) == d.markdown()
    assert not d.write_readme(readme)  # already up to date
    (tmp_path / "plain.md").write_text("no markers\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no dispatch table markers"):
        d.write_readme(tmp_path / "plain.md")
    assert d.readme_block("no markers") == ""


def test_the_command_prints_the_table() -> None:
    done = subprocess.run([sys.executable, "-m", "tensorplug_cpu.kernels", "--markdown"],
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    assert done.stdout.strip() == d.markdown()
    assert "RuntimeWarning" not in done.stderr


# -- the table and the kernels that exist -----------------------------------------------------


def test_the_table_names_the_kernels_that_exist() -> None:
    """Each type the table gives a numba path has that kernel, and no kernel is left out."""
    pytest.importorskip("numba")
    from tensorplug_cpu.kernels import _numba_introw as rows
    from tensorplug_cpu.kernels.jit import load_jit
    from tensorplug_cpu.repack import LAYOUTS

    jit = load_jit()
    assert jit is not None
    assert set(jit._kernels) == set(d.path(d.FLOAT_FUSED).types)
    assert set(jit._row_decoders) == set(d.path(d.DECODE_VECTOR).types)
    assert set(d.path(d.REPACKED_INT8).types) == set(LAYOUTS)
    assert {t.name.lower(): n for t, n in d.INT8_ROWS.items()} == rows.GROUP
    for t, n in d.INT8_ROWS.items():
        assert hasattr(rows, f"rows{n}_dot_{t.name.lower()}")


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The numba kernels a JitKernels call would run, recorded instead of run."""
    from tensorplug_cpu.kernels.jit import JitKernels

    calls: list[str] = []

    def record(self: JitKernels, what: str, kernel: object, *args: object) -> int:
        calls.append(what)
        return -1

    monkeypatch.setattr(JitKernels, "call", record)
    return calls


def test_the_kernels_ask_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bind_matvec`` and ``bind_dequantize`` take the table's path for the blocks they
    are given: the integer kernel or the vector decoder for contiguous blocks, the float
    kernels for strided ones; joint products only for the integer kernels."""
    pytest.importorskip("numba")
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    assert jit is not None
    calls = _recorded(monkeypatch)
    monkeypatch.setattr(jit, "n_threads", 2)
    blocks = np.zeros((8, 4, T.Q4_0.type_size), np.uint8)
    strided = np.zeros((8, 8, T.Q4_0.type_size), np.uint8)[:, ::2]
    x, out = np.zeros((2, 128), np.float32), np.zeros((2, 8), np.float32)
    jit.bind_matvec(T.Q4_0, blocks, x, out)()
    jit.bind_matvec(T.Q4_0, strided, x, out)()
    jit.bind_matvec(T.Q3_K, np.zeros((8, 1, T.Q3_K.type_size), np.uint8),
                    np.zeros((2, 256), np.float32), out)()  # fmt: skip
    jit.dequantize(T.Q4_0, blocks, np.zeros((8, 128), np.float32))
    jit.dequantize(T.Q4_0, strided, np.zeros((8, 128), np.float32))
    assert calls == [
        "integer matrix-vector kernel for Q4_0",
        "matrix-vector kernel for Q4_0",
        "matrix-vector kernel for Q3_K",
        "row decoding kernel for Q4_0",
        "decoding kernel for Q4_0",
    ]
    outs = [np.zeros((2, 8), np.float32) for _ in range(2)]
    assert jit.bind_matvec_siblings(x, [(T.Q4_0, blocks, outs[0]), (T.Q4_0, blocks, outs[1])])
    assert jit.bind_matvec_siblings(x, [(T.Q4_0, blocks, outs[0]), (T.Q4_0, strided, outs[1])]) \
        is None  # fmt: skip
    k = np.zeros((8, 1, T.Q5_K.type_size), np.uint8)
    x256 = np.zeros((2, 256), np.float32)
    assert jit.bind_matvec_siblings(x256, [(T.Q5_K, k, outs[0]), (T.Q5_K, k, outs[1])]) is None


# -- the one feature probe ----------------------------------------------------------------------


def test_the_ir_kernels_compile_for_what_the_one_probe_found() -> None:
    pytest.importorskip("numba")
    from llvmlite import binding

    from tensorplug_cpu.kernels import _numba_ir as ir

    host = kernel_features()
    assert (host.avx2, host.f16c, host.vnni) == (ir.HAS_AVX2, ir.HAS_F16C, ir.HAS_VNNI)
    flat = binding.get_host_cpu_features().flatten()
    assert host.avx2 == ("+avx2" in flat) and host.f16c == ("+f16c" in flat)


def test_without_llvm_the_probe_finds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An LLVM that cannot tell, or no llvmlite: the kernels' portable form."""
    from tensorplug_cpu import system

    binding = pytest.importorskip("llvmlite.binding")

    def unknown() -> None:
        raise RuntimeError("no host features")

    monkeypatch.setattr(binding, "get_host_cpu_features", unknown)
    assert system.llvm_features() == frozenset()
    monkeypatch.setitem(sys.modules, "llvmlite", None)  # import llvmlite fails
    assert system.llvm_features() == frozenset()
    assert KernelFeatures().level == "portable"


def test_the_probe_follows_numbas_compile_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba compiles for ``NUMBA_CPU_FEATURES`` where it is set, and for no features with
    ``NUMBA_CPU_NAME=generic`` alone (numba's advice for a portable cache): the kernels may
    use only what it compiles for, else LLVM cannot select their instructions."""
    from tensorplug_cpu import system

    binding = pytest.importorskip("llvmlite.binding")
    probe = system.kernel_features.__wrapped__  # the cached probe, asked afresh
    monkeypatch.delenv("NUMBA_CPU_NAME", raising=False)
    assert system.llvm_cpu_name() == binding.get_host_cpu_name()
    monkeypatch.setenv("NUMBA_CPU_FEATURES", AVX2_FEATURES)
    monkeypatch.setenv("NUMBA_CPU_NAME", "emeraldrapids")  # an Intel core
    assert system.llvm_features() == {"avx", "avx2", "fma", "f16c", "bmi2"}
    assert probe() == KernelFeatures(avx2=True, f16c=True) and probe().level == "avx2"
    monkeypatch.setenv("NUMBA_CPU_NAME", "znver4")  # a Zen core: its own tile heights
    assert probe() == KernelFeatures(avx2=True, f16c=True, zen=True)
    monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    assert probe().level == "avx2"  # the features given win over the name
    monkeypatch.delenv("NUMBA_CPU_FEATURES")
    assert system.llvm_features() == frozenset() and probe() == KernelFeatures()
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "")
    assert probe() == KernelFeatures()
    monkeypatch.delenv("NUMBA_CPU_FEATURES")
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")  # a name alone: the host's features
    flat = binding.get_host_cpu_features().flatten()
    assert system.llvm_features() == {f[1:] for f in flat.split(",") if f.startswith("+")}


_GENERIC_TARGET = """
import numpy as np
from numba import njit
from tensorplug_cpu.kernels import _numba_ir as ir
from tensorplug_cpu.kernels._numba_kint8 import _dot_q4

@njit
def dot(w, x):
    return _dot_q4(w, 0, x, 0)

rng = np.random.default_rng(5)
w = rng.integers(0, 256, 16, dtype=np.uint8)
x = rng.integers(-128, 128, 32, dtype=np.int8)
nibbles = np.concatenate([w & 15, w >> 4]).astype(np.int64)
print(ir.HAS_AVX2, ir.HAS_F16C, ir.HAS_VNNI, ir.HAS_32_REGS, dot(w, x) == nibbles @ x)
"""


def test_a_generic_target_compiles_the_portable_form(tmp_path: Path) -> None:
    """``NUMBA_CPU_NAME=generic`` once aborted the process (LLVM could not select the
    host's VNNI dot for a CPU without it); now its kernels take the portable form."""
    pytest.importorskip("numba")
    env = throwaway_cache_env(tmp_path, NUMBA_CPU_NAME="generic")
    env.pop("NUMBA_CPU_FEATURES", None)
    done = subprocess.run([sys.executable, "-c", _GENERIC_TARGET], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "False", "False", "False", "True"]
