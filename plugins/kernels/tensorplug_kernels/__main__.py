"""``python -m tensorplug_kernels check [--dialect opencl|cuda|msl]``: the kernel gates.

Prints one line per kernel and dialect and exits 1 when any kernel fails (2 for a
usage error); a gate that cannot run on this machine prints its kernels as ``skip``
with the reason, and ``--require`` turns a skip into a failure (CI uses it).
"""

from __future__ import annotations

import argparse
import sys
import time

from .check import GATES
from .source import DIALECTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorplug_kernels",
        description="Check every kernel of the GPU kernel library in every dialect.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="compile or type-check every kernel")
    check.add_argument("--dialect", choices=sorted(DIALECTS), action="append",
                       help="only this dialect (repeatable; default: all)")  # fmt: skip
    check.add_argument("--require", action="store_true",
                       help="a gate that cannot run here is a failure, not a skip")  # fmt: skip
    args = parser.parse_args(argv)
    failed = skipped = 0
    for dialect in args.dialect or list(DIALECTS):
        t0 = time.perf_counter()
        print(f"== {dialect}", flush=True)
        results = GATES[dialect]()
        for r in results:
            print(f"{dialect:6} {r.status:4} {r.kernel:22} {r.detail}")
            for d in r.messages[:5]:
                print(f"{'':12}{d.kind}: {d.where}: {d.text}")
        bad = sum(r.status == "FAIL" for r in results)
        skip = sum(r.status == "skip" for r in results)
        failed += bad
        skipped += skip
        print(f"== {dialect}: {len(results) - bad - skip} ok, {bad} failed, {skip} skipped "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
    if failed or (args.require and skipped):
        print(f"kernel check FAILED: {failed} failed, {skipped} skipped", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
