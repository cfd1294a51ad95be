"""Run catalogue cases against a backend and collect pass / fail / unsupported verdicts.

A backend is judged against a reference: the CPU backend, or — when the backend under
test *is* the CPU backend — :class:`~.refbackend.ReferenceBackend`, the independent
float64 formulas. Backends come from the registry by name; core never imports a plugin.

One case never takes the run down: an exception raised while computing a case is that
case's failure (with the exception named), so a report always covers every case.
"""

from __future__ import annotations

import enum
import math
import re
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backend import Backend
from ..contract import problems, version_label
from ..extras import available
from ..tensor import Tensor
from ..types import Type
from .cases import Case
from .compare import (
    ComputeFailedError,
    NodeUnsupportedError,
    OutOfBoundsWriteError,
    compare_arrays,
    compare_graph_backend,
    max_nmse_for,
    node_label,
    tensor_values,
)
from .refbackend import (
    GGUF_PURPOSE,
    REFERENCE_NAME,
    ReferenceBackend,
    needs_gguf,
    reference_backend,
)

__all__ = [
    "CaseResult",
    "CheckReport",
    "Outcome",
    "check_backend",
    "default_reference",
    "resolve_backend",
    "run_case",
    "run_cases",
]


class Outcome(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class CaseResult:
    """The verdict on one case; ``error`` is the worst NMSE seen (None when not compared)."""

    case: str
    op: str
    outcome: Outcome
    error: float | None = None
    message: str = ""
    seconds: float = 0.0
    #: for a case that raised: the exception's traceback (and its cause's), so that a
    #: backend author sees where their code failed, not just ``KeyError: 'boom'``
    traceback: str = ""
    #: for a case unsupported because a node needs an op-contract feature newer than the
    #: backend's plugin declares: that feature's version (what declaring it would take)
    contract: tuple[int, int] | None = None

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASS

    def to_dict(self) -> dict[str, Any]:
        error: float | str | None = self.error
        if self.error is not None and not math.isfinite(self.error):
            error = str(error)  # JSON has no NaN or infinity
        return {
            "case": self.case,
            "op": self.op,
            "outcome": self.outcome.value,
            "error": error,
            "message": self.message,
            "seconds": round(self.seconds, 6),
            "traceback": self.traceback or None,
            "contract_needed": version_label(self.contract) if self.contract else None,
        }

    @property
    def where(self) -> str:
        """The innermost frame of the traceback (``file:line in function``), or ""."""
        frames = [
            ln.strip() for ln in self.traceback.splitlines() if ln.strip().startswith("File ")
        ]
        if not frames:
            return ""
        m = re.match(r'File "(.+)", line (\d+), in (.+)', frames[-1])
        return f"{m.group(1)}:{m.group(2)} in {m.group(3)}" if m else frames[-1]


@dataclass
class CheckReport:
    """All verdicts of one run of the catalogue against one backend."""

    backend: str
    reference: str
    results: list[CaseResult] = field(default_factory=list)

    def count(self, outcome: Outcome) -> int:
        return sum(r.outcome is outcome for r in self.results)

    @property
    def ok(self) -> bool:
        """True when no case failed (unsupported cases do not count against a backend)."""
        return self.count(Outcome.FAIL) == 0

    @property
    def contract_unsupported(self) -> list[CaseResult]:
        """The unsupported cases that need a newer op contract than the backend declares:
        what declaring (and implementing) the newest contract would put to the test."""
        return [r for r in self.results if r.contract is not None]

    def summary(self) -> str:
        n = len(self.results)
        p, f, u = (self.count(o) for o in Outcome)
        verdict = "OK" if self.ok else "FAILED"
        newer = self.contract_unsupported
        if newer:
            lowest = version_label(min(r.contract for r in newer if r.contract))
            u_text = f"{u} unsupported ({len(newer)} need op contract {lowest} or newer)"
        else:
            u_text = f"{u} unsupported"
        passed = f"{p}/{n} passed, {f} failed"
        return f"{self.backend} vs {self.reference}: {passed}, {u_text} — {verdict}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "reference": self.reference,
            "summary": {o.value: self.count(o) for o in Outcome} | {"total": len(self.results)},
            "ok": self.ok,
            "cases": [r.to_dict() for r in self.results],
        }


def _worse(a: float, b: float) -> float:
    return b if math.isnan(b) or b > a else a


def run_case(case: Case, backend: Backend, reference: Backend) -> CaseResult:
    """Compare ``backend`` with ``reference`` on every node of ``case``'s graph."""
    start = time.perf_counter()
    graph, inputs = case.instantiate()
    worst = 0.0
    failure = ""
    names = (reference.name, backend.name)

    def judge(index: int, expected: Tensor, actual: Tensor) -> bool:
        nonlocal worst, failure
        limit = max_nmse_for(expected)
        if case.max_nmse is not None and expected.op == case.op:
            limit = case.max_nmse
        err, mismatch = compare_arrays(
            tensor_values(expected), tensor_values(actual), limit, names,
            nan_ok="special_values" in case.tags,
        )  # fmt: skip
        worst = _worse(worst, err)
        if mismatch is not None:
            failure = f"node {index} {node_label(expected)}: {mismatch.message}"
            return False  # later nodes read this one: their errors would only echo it
        return True

    def result(
        outcome: Outcome,
        message: str = "",
        error: float | None = None,
        exc: BaseException | None = None,
        contract: tuple[int, int] | None = None,
    ) -> CaseResult:
        elapsed = time.perf_counter() - start
        tb = "".join(traceback.format_exception(exc)) if exc is not None else ""
        return CaseResult(case.name, case.op.value, outcome, error, message, elapsed, tb, contract)

    if why := _missing_codecs(case, backend, reference):
        return result(Outcome.UNSUPPORTED, why)
    for node in graph.nodes:  # a case whose builder drifted from the contract is wrong
        if broken := problems(node):
            return result(Outcome.FAIL, f"op contract: {'; '.join(broken)}")
    try:
        compare_graph_backend(reference, backend, graph, judge, inputs=inputs)
    except NodeUnsupportedError as e:
        side = " (the reference)" if e.backend is reference and reference is not backend else ""
        # a node beyond the contract the plugin declares: judged by what it declares
        newer = e.feature.version if e.feature is not None and e.backend is backend else None
        return result(Outcome.UNSUPPORTED, f"{e}{side}", contract=newer)
    except (OutOfBoundsWriteError, ComputeFailedError) as e:
        return result(Outcome.FAIL, str(e), exc=e)
    except Exception as e:  # a crashing kernel is this case's failure, not the run's
        return result(Outcome.FAIL, f"{type(e).__name__}: {e}", exc=e)
    if failure:
        return result(Outcome.FAIL, failure, worst)
    return result(Outcome.PASS, "", worst)


def _missing_codecs(case: Case, *backends: Backend) -> str:
    """Why the float64 reference cannot take part in ``case`` here, or "": its quantized
    and BF16 codecs are the optional ``gguf`` package's. Unsupported, like any case a
    side cannot compute, rather than a failure of the backend under test."""
    if available("gguf") or not any(isinstance(b, ReferenceBackend) for b in backends):
        return ""
    if not any(needs_gguf(t) for t in case.types):
        return ""
    return f"{GGUF_PURPOSE} needs the gguf package: pip install 'tensorplug[gguf]'"


def run_cases(
    cases: Iterable[Case],
    backend: Backend,
    reference: Backend,
    progress: Callable[[CaseResult], None] | None = None,
) -> CheckReport:
    report = CheckReport(backend.name, reference.name)
    for case in cases:
        r = run_case(case, backend, reference)
        report.results.append(r)
        if progress is not None:
            progress(r)
    return report


# -- backends by name ---------------------------------------------------------------------------


def resolve_backend(name: str | Backend) -> Backend:
    """A backend from the registry by device or backend name; ``"reference"`` is the oracle."""
    if isinstance(name, Backend):
        return name
    if name.casefold() == REFERENCE_NAME:
        return reference_backend()
    from .. import registry

    return registry.init_by_name(name)


def default_reference(backend: Backend) -> str:
    """The CPU backend is judged by the float64 formulas; every other backend by the CPU."""
    return REFERENCE_NAME if backend.name.casefold() == "cpu" else "CPU"


def check_backend(
    backend: str | Backend = "CPU",
    *,
    reference: str | Backend | None = None,
    full: bool = False,
    ops: Sequence[str] = (),
    types: Sequence[Type | str] = (),
    progress: Callable[[CaseResult], None] | None = None,
) -> CheckReport:
    """Run the catalogue (quick, or ``full``) on ``backend``; filters as in :func:`catalogue`.

    ``reference`` defaults to the CPU backend, or to the float64 reference formulas when
    the backend under test is the CPU backend.
    """
    from .families import catalogue

    test = resolve_backend(backend)
    ref = resolve_backend(reference if reference is not None else default_reference(test))
    try:
        return run_cases(catalogue(full, ops, types), test, ref, progress)
    finally:
        for b, given in ((test, backend), (ref, reference)):
            if b is not given:
                b.free()
