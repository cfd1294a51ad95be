"""benchmarks/perf_docs.py: the rows a benchmark writes into docs/performance.md carry
the machine and the date, replace only their own machine's row of the same key, and a
page or row that cannot be written is refused with what to change. Also the two
benchmarks' ``--write-docs`` rows, and the page's own tables being there to write."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DAY = datetime.date(2026, 11, 29)
PAGE = "# figures\n\nintro\n\n<!-- perf:t -->\n<!-- /perf:t -->\n\nafter\n"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pd() -> ModuleType:
    return _load("perf_docs")


@pytest.fixture
def table(pd: ModuleType) -> object:
    return pd.Table("t", ("model", "threads", "tok/s"), key_columns=2)


LSCPU = """Architecture:                            x86_64
Vendor ID:                               GenuineIntel
Model name:                              INTEL(R) XEON(R)   PLATINUM 8581C CPU @ 2.10GHz
CPU family:                              6
"""


def test_the_machine_is_lscpus_model_name(pd: ModuleType) -> None:
    assert pd.cpu_model(LSCPU) == "INTEL(R) XEON(R) PLATINUM 8581C CPU @ 2.10GHz"


def _vm_lscpu(model: int, flags: str) -> str:
    return (f"Vendor ID:   AuthenticAMD\nModel name:  AMD EPYC\nCPU family:  25\n"
            f"Model:       {model}\nFlags:       fpu sse2 {flags} fma\n")  # fmt: skip


def test_two_vms_named_alike_are_two_machines(pd: ModuleType) -> None:
    """A VM's CPU is often named "AMD EPYC" whatever its core: the family and model
    numbers and the widest vector instructions tell a Zen 3 guest from a Zen 4 one, so
    one's rows do not replace the other's."""
    zen3 = pd.cpu_model(_vm_lscpu(1, "avx avx2"))
    zen4 = pd.cpu_model(_vm_lscpu(17, "avx avx2 avx512f avx512_vnni"))
    assert zen3 == "AMD EPYC (family 25 model 1, AVX2)"
    assert zen4 == "AMD EPYC (family 25 model 17, AVX-512)"
    page = PAGE
    for machine, speed in ((zen3, "100.0"), (zen4, "200.0")):
        page = pd.merge_rows(page, pd.Table("t", ("model", "tok/s"), key_columns=1),
                             [["SmolLM2", speed]], machine, DAY)  # fmt: skip
    assert "| SmolLM2 | 100.0 | AMD EPYC (family 25 model 1, AVX2) |" in page
    assert "| SmolLM2 | 200.0 | AMD EPYC (family 25 model 17, AVX-512) |" in page


def test_rows_carry_machine_and_date(pd: ModuleType, table: object) -> None:
    text = pd.merge_rows(PAGE, table, [["100M:q4_0", "2", "412.5"]], "AMD EPYC", DAY)
    assert text.startswith("# figures\n\nintro\n\n<!-- perf:t -->\n")
    assert text.endswith("<!-- /perf:t -->\n\nafter\n")
    block = text.split("<!-- perf:t -->\n")[1].split("<!-- /perf:t -->")[0]
    assert block.splitlines() == [
        "| model | threads | tok/s | machine | date |",
        "| --- | --- | --- | --- | --- |",
        "| 100M:q4_0 | 2 | 412.5 | AMD EPYC | 2026-11-29 |",
    ]


def test_a_row_replaces_its_own_machines_row_only(pd: ModuleType, table: object) -> None:
    text = pd.merge_rows(PAGE, table, [["a", "1", "10"], ["a", "2", "20"]], "Zen 4", DAY)
    text = pd.merge_rows(text, table, [["a", "1", "11"]], "Xeon", DAY)
    later = DAY + datetime.timedelta(days=1)
    text = pd.merge_rows(text, table, [["a", "1", "12"], ["b", "1", "5"]], "Zen 4", later)
    rows = [line for line in text.splitlines() if line.startswith("| ")][2:]
    assert rows == [
        "| a | 1 | 12 | Zen 4 | 2026-11-30 |",  # measured again: in its place
        "| a | 2 | 20 | Zen 4 | 2026-11-29 |",
        "| a | 1 | 11 | Xeon | 2026-11-29 |",  # another machine's row stays
        "| b | 1 | 5 | Zen 4 | 2026-11-30 |",  # a new key goes last
    ]


def test_pipes_and_newlines_stay_inside_a_cell(pd: ModuleType, table: object) -> None:
    text = pd.merge_rows(PAGE, table, [["a|b", "1", "x\ny"]], "M", DAY)
    assert "| a\\|b | 1 | x y | M | 2026-11-29 |" in text
    again = pd.merge_rows(text, table, [["a|b", "1", "z"]], "M", DAY)
    assert "| a\\|b | 1 | z | M | 2026-11-29 |" in again and "x y" not in again


def test_refusals_name_the_fix(pd: ModuleType, table: object, tmp_path: Path) -> None:
    with pytest.raises(pd.PerfDocsError, match=r"add the lines '<!-- perf:t -->'"):
        pd.merge_rows("# no table\n", table, [], "M", DAY)
    with pytest.raises(pd.PerfDocsError, match=r"3 columns \(model, threads, tok/s\)"):
        pd.merge_rows(PAGE, table, [["a", "1"]], "M", DAY)
    broken = PAGE.replace("<!-- /perf:t -->", "| a | b |\n<!-- /perf:t -->")
    with pytest.raises(pd.PerfDocsError, match="mend or delete the row"):
        pd.merge_rows(broken, table, [], "M", DAY)
    with pytest.raises(pd.PerfDocsError, match="key_columns must be between 1 and 1"):
        pd.Table("u", ("a",), key_columns=2)
    with pytest.raises(SystemExit, match="--write-docs: cannot read"):
        pd.checked_writer(table, str(tmp_path / "missing.md"))


def test_the_writer_checks_first_then_writes(
    pd: ModuleType, table: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pd, "cpu_model", lambda: "Test CPU")
    page = tmp_path / "performance.md"
    page.write_text(PAGE, encoding="utf-8")
    assert pd.checked_writer(table, None) is None
    write = pd.checked_writer(table, str(page))
    assert write([["a", "1", "10"]]) == f"1 rows of table 't' written to {page} (Test CPU)"
    today = datetime.date.today().isoformat()
    assert f"| a | 1 | 10 | Test CPU | {today} |" in page.read_text(encoding="utf-8")
    parser = argparse.ArgumentParser()
    pd.add_argument(parser)
    assert parser.parse_args([]).write_docs is None
    assert parser.parse_args(["--write-docs"]).write_docs == str(pd.PERFORMANCE_MD)
    assert parser.parse_args(["--write-docs", "x.md"]).write_docs == "x.md"


def test_the_benchmarks_rows_fit_the_pages_tables(pd: ModuleType) -> None:
    """Both benchmarks' rows have their table's columns, and docs/performance.md holds
    both tables, so --write-docs run there writes them."""
    vs = _load("bench_vs_llamacpp")
    serve = _load("bench_serve")
    a = argparse.Namespace(prompt=128, gen=32, batch=128, rounds=3, load=0, as_avx2=True)
    ours = [{"prompt": 400.0, "gen": 200.0, "launch": 0.5, "peak_rss_mb": 160.0}] * 3
    theirs = [{"prompt": 500.0, "gen": 250.0, "launch": 0.4, "peak_rss_mb": 150.0}] * 3
    row = vs.docs_row("100M:q4_0", 2, a, ours, theirs, [{"launch": 9.6}])
    assert row == ["100M:q4_0", "2", "prompt 128, gen 32, batch 128, 3 rounds, --as-avx2",
                   "400.0 / 500.0 (0.80)", "200.0 / 250.0 (0.80)", "0.50 / 0.40 (1.25)",
                   "160 / 150 (1.07)", "9.6"]  # fmt: skip
    level = serve.Level(4, wall_s=2.0, tokens=512, ttft=[0.05, 0.06], itl=[0.01, 0.02])
    args = serve.parse_args(["--threads", "2"])  # the defaults, as a run has them
    rows = serve.docs_rows({4: {"tensorplug": [level]}}, "SmolLM2.gguf", args)
    run = ("-c 2048, -t 2, 2 rounds of 2 requests a client, at least 16 in all, 64 tokens each, "
           "in turns")  # fmt: skip
    assert rows == [["SmolLM2.gguf", run, "4", "4", "256.0", "50", "60", "10.0", "20.0",
                     "0"]]  # fmt: skip
    text = pd.PERFORMANCE_MD.read_text(encoding="utf-8")
    vs_table = pd.Table(vs.DOCS_TABLE_NAME, vs.DOCS_COLUMNS, key_columns=3)
    for tab, new in ((vs_table, [row]), (serve.DOCS_TABLE, rows)):
        assert "| M | 2026-11-29 |" in pd.merge_rows(text, tab, new, "M", DAY)


def test_without_lscpu_the_machine_is_proc_cpuinfos_first_processor(
    pd: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
        "model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu avx2 avx512f\n\n"
        "processor\t: 1\nmodel name\t: another\n"
    )
    monkeypatch.setattr(pd, "Path", lambda _: cpuinfo)
    assert pd.cpu_model("") == "Intel(R) Xeon(R) Processor (family 6 model 207, AVX-512)"
