"""benchmarks/bench_serve.py: its command line and its tables (printed and for
docs/performance.md), from made-up measurements; no server is started."""

from __future__ import annotations

import datetime
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_serve.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(SCRIPT.parent))  # (it imports perf_docs beside it)
    spec = importlib.util.spec_from_file_location("bench_serve", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_serve"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_slot_and_client_counts_are_lists_with_the_issues_grid_by_default(
    bench: ModuleType,
) -> None:
    args = bench.parse_args([])
    assert (args.np, args.clients) == ([1, 4, 8, 16], [1, 4, 16, 64])
    args = bench.parse_args(["--np", "8,4,8", "--clients", "2", "--ctx", "4096"])
    assert (args.np, args.clients) == ([8, 4], [2])  # each once, in the order given


def test_servers_take_turns_at_each_client_count_the_order_reversed_every_round(
    bench: ModuleType,
) -> None:
    order = bench.turns(["ours", "theirs"], [1, 16], 3)
    assert order == [
        (1, "ours"), (1, "theirs"), (1, "theirs"), (1, "ours"), (1, "ours"), (1, "theirs"),
        (16, "ours"), (16, "theirs"), (16, "theirs"), (16, "ours"), (16, "ours"), (16, "theirs"),
    ]  # fmt: skip
    assert bench.turns(["alone"], [4], 2) == [(4, "alone"), (4, "alone")]


def test_a_sequential_run_says_so_in_the_docs_rows(
    bench: ModuleType, results: dict[int, dict[str, list[object]]]
) -> None:
    argv = ["--sequential", "--rounds", "1", "--requests", "4", "--min-requests", "0",
            "--threads", "2"]  # fmt: skip
    run = bench.docs_rows(results, "SmolLM2.gguf", bench.parse_args(argv))[0][1]
    assert run == ("-c 2048, -t 2, 1 round of 4 requests a client, 64 tokens each, "
                   "one server, then the other")  # fmt: skip


def test_a_round_of_few_clients_sends_at_least_min_requests(bench: ModuleType) -> None:
    assert [bench.per_client(c, 2, 16) for c in (1, 3, 4, 8, 16, 64)] == [16, 6, 4, 2, 2, 2]
    assert [bench.per_client(c, 2, 0) for c in (1, 64)] == [2, 2]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--np", "0"], "--np: '0': give slot counts as whole numbers from 1 to 64"),
        (["--np", "4,x"], "--np: '4,x': give slot counts"),
        (["--np", "65"], "from 1 to 64"),
        (["--clients", "1,,4"], "--clients: '1,,4': give client counts"),
        (["--np", "32"], "--ctx 2048 gives each of llama-server's 32 slots 64 cells"),
        (["--np", "32"], "use --ctx 4096 or more"),
        (["--requests", "0"], "--requests, --rounds and --max-tokens must be at least 1"),
        (["--rounds", "0"], "--requests, --rounds and --max-tokens must be at least 1"),
        (["--min-requests", "-1"], "--min-requests must be 0 or more"),
        (["--tiny", "--write-docs"], "--write-docs takes a real model's figures"),
    ],
)
def test_bad_arguments_are_refused_naming_the_fix(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def _level(bench: ModuleType, clients: int, tps: float, ttft: float, itl: float) -> object:
    """A level of ``tps`` tokens/s whose TTFTs are ``ttft`` (p50) and 2 × ``ttft``
    (p99) seconds, its gaps ``itl`` and 3 × ``itl``."""
    lv = bench.Level(clients, wall_s=1.0, tokens=round(tps))
    lv.ttft = [ttft] * 98 + [2 * ttft] * 2
    lv.itl = [itl] * 98 + [3 * itl] * 2
    return lv


@pytest.fixture
def results(bench: ModuleType) -> dict[int, dict[str, list[object]]]:
    return {
        4: {
            "tensorplug": [_level(bench, 1, 96, 0.045, 0.010), _level(bench, 16, 222, 3.5, 0.02)],
            "llama-server": [_level(bench, 1, 74, 0.054, 0.020), _level(bench, 16, 121, 7, 0.04)],
        },
        8: {"tensorplug": [_level(bench, 8, 237, 0.25, 0.04)]},  # llama-server not run
    }


def test_each_row_gives_both_servers_and_the_ratio(
    bench: ModuleType, results: dict[int, dict[str, list[object]]]
) -> None:
    lines = bench.table(results).splitlines()
    assert lines[0] == "each figure: tensorplug / llama-server (ratio)"
    assert lines[1].split() == [
        "-np",
        "clients",
        "gen",
        "tok/s",
        "TTFT",
        "p50",
        "ms",
        "TTFT",
        "p99",
        "ms",
        "ITL",
        "p50",
        "ms",
        "ITL",
        "p99",
        "ms",
        "errors",
    ]
    row = lines[3].split("  ")
    cells = [c.strip() for c in row if c.strip()]
    assert cells == [
        "4",
        "1",
        "96.0 / 74.0 (1.30)",
        "45 / 54 (0.83)",
        "90 / 108 (0.83)",
        "10.0 / 20.0 (0.50)",
        "30.0 / 60.0 (0.50)",
        "0 / 0",
    ]
    assert "3500 / 7000 (0.50)" in lines[4]
    alone = [c.strip() for c in lines[5].split("  ") if c.strip()]
    assert alone == ["8", "8", "237.0", "250", "500", "40.0", "120.0", "0"]


def test_docs_rows_go_into_performance_md_between_the_markers(
    bench: ModuleType, results: dict[int, dict[str, list[object]]], tmp_path: Path
) -> None:
    args = bench.parse_args(["--np", "4,8", "--threads", "2"])
    rows = bench.docs_rows(results, "SmolLM2.gguf", args)
    run = ("-c 2048, -t 2, 2 rounds of 2 requests a client, at least 16 in all, 64 tokens each, "
           "in turns")  # fmt: skip
    assert rows[0] == [
        "SmolLM2.gguf",
        run,
        "4",
        "1",
        "96.0 / 74.0 (1.30)",
        "45 / 54 (0.83)",
        "90 / 108 (0.83)",
        "10.0 / 20.0 (0.50)",
        "30.0 / 60.0 (0.50)",
        "0 / 0",
    ]
    assert [r[2:4] for r in rows] == [["4", "1"], ["4", "16"], ["8", "8"]]
    page = tmp_path / "performance.md"
    page.write_text((ROOT / "docs" / "performance.md").read_text(encoding="utf-8"))

    def table() -> list[str]:
        text = page.read_text(encoding="utf-8")
        start, end = (
            text.index("<!-- perf:bench_serve -->"),
            text.index("<!-- /perf:bench_serve -->"),
        )
        return text[start:end].splitlines()[1:]

    before = table()  # header, rule, and the rows of the machines measured so far
    bench.perf_docs.write_rows(bench.DOCS_TABLE, rows, page, "Some CPU", datetime.date(2025, 1, 2))
    lines = table()
    ours = [line for line in lines if "| Some CPU |" in line]
    assert len(lines) == len(before) + 3 and lines[: len(before)] == before  # others kept
    assert len(ours) == 3  # a row per -np and client count
    assert ours[0] == (
        f"| SmolLM2.gguf | {run} | 4 | 1 | 96.0 / 74.0 (1.30) | 45 / 54 (0.83) | "
        "90 / 108 (0.83) | 10.0 / 20.0 (0.50) | 30.0 / 60.0 (0.50) | 0 / 0 | Some CPU | "
        "2025-01-02 |"
    )
