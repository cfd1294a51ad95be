"""The table of two runs of llama.cpp's server suite (``scripts/llama-server-suite.sh
table REFERENCE CANDIDATE``), from the JSON lines ``llama_suite_plugin`` wrote.

Per test file: tests run, skipped, passed on each server, and how many passed on the
reference but not on the candidate (what remains to do); then those gaps, and every
failure of the candidate, grouped by first cause (digits and quoted values folded away, so
one missing route or flag is one line); then the skip reasons.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

__all__ = ["Run", "cause_group", "read", "refused_flags", "render"]

Run = dict[str, dict[str, str]]  # node id → its record


def read(path: Path) -> Run:
    """A run's records by test, the last one of a test winning (a rerun of a file)."""
    run: Run = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            run[record["test"]] = record
        except (ValueError, KeyError, TypeError):
            raise SystemExit(f"{path}:{number}: not a record of llama_suite_plugin") from None
    return run


def cause_group(cause: str) -> str:
    """``cause`` with what differs between tests of one cause folded away: the values of
    refused flags, the numbers an assertion compared, quoted text in a server's message."""
    cause = re.sub(r" \(Server process died with return code \d+\)", "", cause)
    cause = re.sub(r"unrecognized arguments: .*", lambda m: _flags(m.group(0)), cause)
    if cause.startswith("assertion:"):  # the values compared differ from test to test
        cause = re.sub(r"\b0x[0-9a-f]+\b|\d+(\.\d+)?", "N", cause)
    else:  # a server's message naming what the request held, a test's own server's port
        cause = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", cause)
        cause = re.sub(r"(127\.0\.0\.1|localhost):\d+", r"\1:PORT", cause)
    return cause.strip()[:140]


def _flags(text: str) -> str:
    return "unrecognized arguments: " + " ".join(refused_flags(text))


def refused_flags(cause: str) -> list[str]:
    """The flags an argparse refusal in ``cause`` names, without their values."""
    _, found, rest = cause.partition("unrecognized arguments: ")
    return [w for w in rest.split() if found and re.fullmatch(r"--?[A-Za-z][\w-]*", w)]


def render(reference: Run, candidate: Run, names: tuple[str, str]) -> str:
    """The markdown tables comparing ``candidate`` with ``reference``."""
    files = sorted({test.split("::")[0] for test in (*reference, *candidate)})
    ref, cand = names
    lines = [
        f"| file | tests | skipped | passed on {ref} | passed on {cand} | {ref} only |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    totals = [0] * 5
    gaps: Counter[str] = Counter()
    for file in files:
        tests = [t for t in {*reference, *candidate} if t.split("::")[0] == file]
        both = [_outcome(reference, t) + _outcome(candidate, t) for t in tests]
        skipped = [o for o in both if o == "skippedskipped"]
        ref_pass = {t for t in tests if _outcome(reference, t) == "passed"}
        cand_pass = {t for t in tests if _outcome(candidate, t) == "passed"}
        only = ref_pass - cand_pass
        gaps.update(cause_group(candidate.get(t, {}).get("cause", "not run")) for t in only)
        row = [len(tests), len(skipped), len(ref_pass), len(cand_pass), len(only)]
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        lines.append(f"| {file.removeprefix('unit/')} | " + " | ".join(map(str, row)) + " |")
    lines.append("| **all** | " + " | ".join(f"**{n}**" for n in totals) + " |")
    lines += ["", f"First causes of the tests passing on {ref} and not on {cand}:", ""]
    lines += ["| tests | first cause |", "|---:|---|"]
    lines += [f"| {n} | {_cell(cause)} |" for cause, n in gaps.most_common()]
    failures = Counter(
        cause_group(record.get("cause", "")) for record in candidate.values()
        if record["outcome"] == "failed"
    )  # fmt: skip
    lines += ["", f"First causes of every failure on {cand}:", ""]
    lines += ["| tests | first cause |", "|---:|---|"]
    lines += [f"| {n} | {_cell(cause)} |" for cause, n in failures.most_common()]
    refused = Counter(
        flag for record in candidate.values() if record["outcome"] == "failed"
        for flag in refused_flags(record.get("cause", ""))
    )  # fmt: skip
    if refused:
        lines += ["", f"Flags {cand} refused, by the tests whose server they stopped:", ""]
        lines += ["| tests | flag |", "|---:|---|"]
        lines += [f"| {n} | `{flag}` |" for flag, n in refused.most_common()]
    reasons = Counter(
        record.get("reason", "")
        for record in candidate.values()
        if record["outcome"] == "skipped" and _outcome(reference, record["test"]) == "skipped"
    )
    lines += ["", "Skipped on both:", "", "| tests | reason |", "|---:|---|"]
    lines += [f"| {n} | {_cell(reason)} |" for reason, n in reasons.most_common()]
    return "\n".join(lines) + "\n"


def _outcome(run: Run, test: str) -> str:
    return run.get(test, {}).get("outcome", "not run")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: llama_suite_table.py REFERENCE.jsonl CANDIDATE.jsonl", file=sys.stderr)
        return 2
    paths = [Path(a) for a in argv]
    for path in paths:
        if not path.is_file():
            print(f"llama_suite_table: no results at {path}: run the suite first "
                  "(scripts/llama-server-suite.sh run ...)", file=sys.stderr)  # fmt: skip
            return 1
    names = (paths[0].stem, paths[1].stem)
    print(render(read(paths[0]), read(paths[1]), names), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
