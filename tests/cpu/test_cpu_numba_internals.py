"""The CPU plugin's fast launch (:mod:`tensorplug_cpu.kernels.numba_internals`): private
numba and llvmlite names used in one module of it, only for the versions it lists, and
the public path whenever anything there is unexpected."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

pytest.importorskip("numba")

from tensorplug_cpu.kernels import numba_internals

PLUGIN = Path(__file__).parents[2] / "plugins" / "cpu" / "tensorplug_cpu"
INTERNALS = PLUGIN / "kernels" / "numba_internals"
#: the one module that may name them
PRIVATE_MODULE = INTERNALS / "numba_private.py"

#: numba's public module the kernels may use: its types (the IR the intrinsics emit is
#: llvmlite's, not numba's ``cgutils`` helpers; its compile events, documented for
#: developers, are asked of the one module like the rest)
_PUBLIC_CORE = ("types",)
#: what only code that reaches into numba or llvmlite names
PRIVATE = [
    re.compile(rf"numba\.core\.(?!(?:{'|'.join(_PUBLIC_CORE)})\b)\w+"),
    re.compile(rf"from numba\.core import (?!(?:{'|'.join(_PUBLIC_CORE)})\b)"),
    re.compile(r"numba\.np\.ufunc|numba\._\w+|from numba import _"),
    re.compile(
        r"\._(?:cache|index_key|load_overload|launch_threads|rebuild_env|wrapper_address"
        r"|wrapper_name|library|pyfunc|sig|targetdescr|cache_file|impl|insert|is_initialized"
        r"|threading_layer|load_threading_functions|set_compiled_object|engine)\b"
    ),
    re.compile(r"_ZN08NumbaEnv|compile_nrt_functions|unserialize_library|\brtsys\b|nrtdynmod"),
    re.compile(r"__class__\s*="),
    re.compile(r"\b(?:make_function|c_helpers|launch_threads|fndesc|typeof_pyval\(.*\)\._code)\b"),
    re.compile(r"\b(?:Environment|CFunc|FunctionCache|JITCodeLibrary)\b"),
]


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path`` that are code (docstrings and comments may name numba's
    internals to explain why the public path is taken)."""
    lines, in_string = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        quotes = stripped.count('"""')
        if in_string or stripped.startswith(('"""', "#")):
            if quotes % 2:
                in_string = not in_string
            continue
        lines.append((number, line.split("  #")[0]))
    return lines


def test_no_private_numba_name_outside_the_one_module() -> None:
    found = []
    for path in sorted(PLUGIN.rglob("*.py")):
        if path == PRIVATE_MODULE:
            continue
        for number, line in _code_lines(path):
            if any(p.search(line) for p in PRIVATE):
                found.append(f"{path.relative_to(PLUGIN)}:{number}: {line.strip()}")
    assert not found, "private numba names outside numba_private:\n" + "\n".join(found)


def test_the_grep_sees_the_private_names_it_looks_for() -> None:
    """The patterns find what the fast launch uses (else the test above proves nothing)."""
    hits = sum(1 for _, line in _code_lines(PRIVATE_MODULE) if any(p.search(line) for p in PRIVATE))
    assert hits >= 40


def test_the_installed_numba_is_listed_or_the_fast_launch_is_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A numba or llvmlite the fast launch was not tested with must take the public path,
    saying so: a new release decides nothing about whether a fresh install works."""
    versions = numba_internals.installed_versions()
    with caplog.at_level(logging.WARNING, "tensorplug_cpu"):
        on = numba_internals.enabled()
    if versions in numba_internals.ALLOWED_VERSIONS:
        assert on or numba_internals.why_off() is not None
    else:
        assert not on
        assert f"numba {versions[0]}" in str(numba_internals.why_off())


def test_an_unlisted_numba_takes_the_public_path_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(numba_internals, "installed_versions", lambda: ("0.99.0", "0.60.0"))
    monkeypatch.setattr(numba_internals, "_warned", set())
    with caplog.at_level(logging.WARNING, "tensorplug_cpu"):
        assert not numba_internals.enabled()
        assert not numba_internals.enabled()
        assert numba_internals.attempt("anything", lambda: 1) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert "numba 0.99.0 with llvmlite 0.60.0" in said[0] and "public API" in said[0]


def test_the_allow_list_names_exact_versions() -> None:
    for numba, llvmlite in numba_internals.ALLOWED_VERSIONS:
        assert re.fullmatch(r"\d+\.\d+\.\d+", numba) and re.fullmatch(r"\d+\.\d+\.\d+", llvmlite)


def test_the_dependency_bounds_stop_at_the_newest_listed_minor() -> None:
    text = (PLUGIN.parent / "pyproject.toml").read_text()
    newest = max(tuple(int(p) for p in n.split(".")) for n, _ in numba_internals.ALLOWED_VERSIONS)
    llvm = max(tuple(int(p) for p in v.split(".")) for _, v in numba_internals.ALLOWED_VERSIONS)
    assert f"numba>=0.59,<0.{newest[1] + 1}" in text
    assert f"llvmlite<0.{llvm[1] + 1}" in text


def test_an_error_inside_shuts_the_fast_launch_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(numba_internals, "_given_up", [])
    monkeypatch.setattr(numba_internals, "_warned", set())
    monkeypatch.setattr(numba_internals, "installed_versions",
                        lambda: next(iter(numba_internals.ALLOWED_VERSIONS)))  # fmt: skip
    monkeypatch.delenv("TENSORPLUG_CPU_NUMBA_INTERNALS", raising=False)
    monkeypatch.delenv("NUMBA_DISABLE_JIT", raising=False)
    if not numba_internals.enabled():
        pytest.skip(f"fast launch off here: {numba_internals.why_off()}")

    def broken() -> int:
        raise AttributeError("module 'numba.core.caching' has no attribute '_CacheImpl'")

    with caplog.at_level(logging.WARNING, "tensorplug_cpu"):
        assert numba_internals.attempt("loading kept code", broken) is None
        assert not numba_internals.enabled()
        assert numba_internals.attempt("loading kept code", lambda: 1) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "loading kept code failed (AttributeError" in said[0]
    assert "public API" in said[0]


def test_the_setting_turns_the_fast_launch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORPLUG_CPU_NUMBA_INTERNALS", "0")
    assert not numba_internals.enabled()
    assert numba_internals.why_off() == "TENSORPLUG_CPU_NUMBA_INTERNALS=0"
    monkeypatch.setenv("TENSORPLUG_CPU_NUMBA_INTERNALS", "1")
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    assert numba_internals.why_off() == "NUMBA_DISABLE_JIT is set"
