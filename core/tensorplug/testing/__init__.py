"""The conformance kit: the op-by-op check every backend is judged by (ggml's test-backend-ops).

It ships inside the core so that a third-party backend author runs exactly the suite
the project's own backends pass:

* :func:`catalogue` — every op × type × shape family (non-contiguous views,
  broadcasting, odd sizes, in-place writes, the quantized ``mul_mat`` matrix);
* :func:`compare_graph_backend` — two backends node by node, with sentinel bytes
  around every tensor to catch out-of-bounds writes;
* :func:`check_backend` / ``tensorplug check`` — pass, fail or unsupported per case,
  against the CPU backend, or for the CPU backend against independent float64 numpy
  formulas (:mod:`~tensorplug.testing.reference`) and ``gguf``'s quantizers;
* a pytest plugin (fixtures ``tensorplug_case`` and ``tensorplug_check``, see
  :mod:`tensorplug_pytest`, loaded through pytest's ``pytest11`` entry point);
* :func:`run_bench` / ``tensorplug bench`` — µs/run, GFLOP/s or GB/s, next to a numpy
  baseline measured in the same run.

Example::

    from tensorplug.testing import check_backend
    report = check_backend("OpenCL0", ops=["mul_mat"])
    print(report.summary())

Attributes load on first use, so importing this package (as pytest does for the
plugin) costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorplug.lazy import lazy_exports

if TYPE_CHECKING:
    from .bench import BenchResult, bench_case, bench_cases, run_bench
    from .cases import Case, Inputs
    from .compare import (
        ComputeFailedError,
        NodeUnsupportedError,
        OutOfBoundsWriteError,
        compare_arrays,
        compare_graph_backend,
        max_nmse_for,
        nmse,
        tensor_values,
    )
    from .families import all_cases, catalogue
    from .placement import Placement
    from .refbackend import ReferenceBackend, reference_backend
    from .runner import CaseResult, CheckReport, Outcome, check_backend, run_case, run_cases

_EXPORTS: dict[str, str] = {
    "BenchResult": "bench", "bench_case": "bench", "bench_cases": "bench", "run_bench": "bench",
    "Case": "cases", "Inputs": "cases",
    "all_cases": "families", "catalogue": "families",
    "ComputeFailedError": "compare", "NodeUnsupportedError": "compare",
    "OutOfBoundsWriteError": "compare", "compare_arrays": "compare",
    "compare_graph_backend": "compare", "max_nmse_for": "compare", "nmse": "compare",
    "tensor_values": "compare",
    "Placement": "placement",
    "ReferenceBackend": "refbackend", "reference_backend": "refbackend",
    "CaseResult": "runner", "CheckReport": "runner", "Outcome": "runner",
    "check_backend": "runner", "run_case": "runner", "run_cases": "runner",
}  # fmt: skip

__all__ = [
    "BenchResult",
    "Case",
    "CaseResult",
    "CheckReport",
    "ComputeFailedError",
    "Inputs",
    "NodeUnsupportedError",
    "OutOfBoundsWriteError",
    "Outcome",
    "Placement",
    "ReferenceBackend",
    "all_cases",
    "bench_case",
    "bench_cases",
    "catalogue",
    "check_backend",
    "compare_arrays",
    "compare_graph_backend",
    "max_nmse_for",
    "nmse",
    "reference_backend",
    "run_bench",
    "run_case",
    "run_cases",
    "tensor_values",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
