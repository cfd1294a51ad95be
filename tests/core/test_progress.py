"""Progress and figures for people reading piped output (CI logs, ``| tee``)."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

import pytest

from tensorplug import progress as progress_mod
from tensorplug.cli import count_argument, format_bytes, format_bytes_of
from tensorplug.progress import Progress


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(progress_mod.time, "perf_counter", c)
    return c


def test_piped_progress_prints_a_line_after_a_second_then_every_few_seconds(clock: _Clock) -> None:
    out = io.StringIO()
    with Progress("checking X", total=10, stream=out, unit="cases") as p:
        p.advance()  # at once: nothing yet
        clock.now += 1.5
        p.advance()  # the first line
        clock.now += 1.0
        p.advance()  # too soon for another
        clock.now += 5.0
        p.advance(3)
    assert out.getvalue().splitlines() == [
        "checking X: 2/10 cases (20%), 2 s",
        "checking X: 6/10 cases (60%), 8 s",
        "checking X: done, 6/10 cases (60%) in 7.5 s",
    ]


def test_a_job_shorter_than_a_second_prints_nothing(clock: _Clock) -> None:
    out = io.StringIO()
    with Progress("quick", total=3, stream=out) as p:
        for _ in range(3):
            clock.now += 0.2
            p.advance()
    assert out.getvalue() == ""


def test_stages_change_the_label_and_total(clock: _Clock) -> None:
    out = io.StringIO()
    with Progress("loading m", total=0, stream=out) as p:
        clock.now += 2
        p.update(5, 10, "loading m: weights")
        clock.now += 6
        p.update(1, 2, "loading m: warming up")
    assert out.getvalue().splitlines()[:2] == [
        "loading m: weights: 5/10 (50%), 2 s",
        "loading m: warming up: 1/2 (50%), 8 s",
    ]


def test_a_closed_reader_does_not_break_the_job(clock: _Clock) -> None:
    class Gone(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError

    with Progress("x", total=2, stream=Gone()) as p:
        clock.now += 2
        p.advance()


def test_figures_side_by_side_share_one_unit() -> None:
    assert format_bytes(512 * 2**20) == "512.0 MiB"
    assert format_bytes_of(512 * 2**20, 5.6 * 2**30) == "0.5 / 5.6 GiB"
    assert format_bytes_of(100, 1000) == "100 / 1000 B"
    assert format_bytes(3 * 2**30, unit=2) == "3072.0 MiB"


def test_a_count_argument_takes_whole_numbers_from_one() -> None:
    threads = count_argument("a thread count")
    assert threads("3") == 3 and threads(" 12 ") == 12
    for bad in ("0", "-2", "x", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^{bad!r} is not a thread count"):
            threads(bad)


def _tensorplug(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorplug", *args], capture_output=True, text=True, check=False
    )


def test_check_prints_a_row_per_op_and_lines_a_person_can_read() -> None:
    r = _tensorplug("check", "--op", "add,rms_norm,flash_attn_ext")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["op", "cases", "pass", "fail", "unsupported", "worst", "NMSE"]
    assert [ln.split()[0] for ln in lines[1:4]] == ["add", "rms_norm", "flash_attn_ext"]
    assert max(len(ln) for ln in lines) <= 100
    every = _tensorplug("check", "--op", "add", "--cases").stdout.splitlines()
    assert every[0].split()[:2] == ["result", "case"] and len(every) > 10


def test_loading_a_model_reports_each_weight_and_the_warm_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tensorplug_llm.runner import ModelRunner
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "m.gguf")
    seen: list[tuple[str, int, int]] = []
    ModelRunner(path, use_mmap=False, on_progress=lambda *a: seen.append(a))
    weights = [s for s in seen if s[0] == "loading weights"]
    assert weights[-1][1] == weights[-1][2] > 3  # every weight tensor, counted once
    assert [d for _, d, _ in weights] == list(range(1, len(weights) + 1))
    assert [s for s in seen if s[0] == "warming up"] == [
        ("warming up", 0, 2), ("warming up", 1, 2), ("warming up", 2, 2),
    ]  # fmt: skip
