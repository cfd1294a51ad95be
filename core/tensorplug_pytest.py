"""pytest plugin: run tensorplug's conformance catalogue on your backend, from your tests.

Installed with tensorplug (entry point ``pytest11``), so there is nothing to configure.
pytest loads it in *every* session of *any* project where tensorplug is installed, so
it is inert until a test asks for one of its fixtures: it is a top-level module (not
inside the ``tensorplug`` package, whose ``__init__`` imports numpy and the core), and
importing it imports nothing from tensorplug; no plugin is discovered or loaded.

A backend author adds one test to their plugin's suite::

    # tests/conformance/test_conformance.py
    def test_conformance(tensorplug_case, tensorplug_check):
        tensorplug_check(tensorplug_case, backend="OpenCL0")

``tensorplug_case`` parametrizes the test over the catalogue (one test per case, named
like ``ADD(type=f32,shape=[2,3,5,10],b=[1,3,1,10])``); ``tensorplug_check`` runs a case
on the backend — a registry name or a :class:`~tensorplug.Backend` instance — against
the CPU backend (the CPU backend itself against the float64 reference formulas), node
by node, with sentinel checks. A case the backend does not support is *skipped* with
the reason — "contract 1.x needed" when a node needs a later op contract than the
plugin's ``api_version`` declares (it is judged by what it declares); a mismatch
*fails* with the node, the error and the first bad element.

Options::

    --tensorplug-backend NAME    the backend checked when the test passes none
                                 (also the ini option ``tensorplug_backend``)
    --tensorplug-reference NAME  compare against NAME instead (``reference`` = formulas)
    --tensorplug-full            the full catalogue instead of the quick subset
    --tensorplug-op NAME         only cases of these ops / functions (repeatable)
    --tensorplug-type T          only cases involving these types (repeatable)

The same catalogue runs from the command line: ``tensorplug check --backend OpenCL0``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tensorplug.backend import Backend
    from tensorplug.testing.cases import Case
    from tensorplug.testing.runner import CaseResult

__all__ = ["pytest_addoption", "pytest_generate_tests", "tensorplug_check"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tensorplug", "tensorplug backend conformance")
    group.addoption(
        "--tensorplug-backend",
        metavar="NAME",
        default=None,
        help="backend that tensorplug_check checks when the test names none",
    )
    group.addoption(
        "--tensorplug-reference",
        metavar="NAME",
        default=None,
        help="backend to compare against (default: CPU; 'reference' = float64 formulas)",
    )
    group.addoption(
        "--tensorplug-full",
        action="store_true",
        default=False,
        help="parametrize tensorplug_case over the full catalogue, not the quick subset",
    )
    group.addoption(
        "--tensorplug-op",
        action="append",
        default=[],
        metavar="NAME",
        help="only catalogue cases of this op or unary function (repeatable)",
    )
    group.addoption(
        "--tensorplug-type",
        action="append",
        default=[],
        metavar="T",
        help="only catalogue cases involving this type (repeatable)",
    )
    parser.addini("tensorplug_backend", "default backend for tensorplug_check", default="")


def _names(values: list[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tensorplug_case" not in metafunc.fixturenames:
        return
    from tensorplug.testing.families import catalogue

    opt = metafunc.config.getoption
    cases = catalogue(
        full=bool(opt("tensorplug_full")),
        ops=_names(opt("tensorplug_op")),
        types=_names(opt("tensorplug_type")),
    )
    metafunc.parametrize("tensorplug_case", cases, ids=[c.name for c in cases])


@pytest.fixture(scope="session")
def _tensorplug_backends() -> Iterator[dict[str, Backend]]:
    """Backends made by name, shared across the session and freed at its end."""
    made: dict[str, Backend] = {}
    yield made
    for backend in made.values():
        backend.free()


@pytest.fixture
def tensorplug_check(
    request: pytest.FixtureRequest, _tensorplug_backends: dict[str, Backend]
) -> Callable[..., CaseResult]:
    """``check(case, backend=None, reference=None)``: run one case; skip if unsupported,
    fail on a mismatch, return the :class:`~tensorplug.testing.CaseResult` on success."""
    from tensorplug.errors import BackendUnavailableError
    from tensorplug.testing.runner import Outcome, default_reference, resolve_backend, run_case

    config = request.config

    def get(name: str | Backend) -> Backend:
        if not isinstance(name, str):
            return name
        key = name.casefold()
        if key not in _tensorplug_backends:
            try:
                _tensorplug_backends[key] = resolve_backend(name)
            except BackendUnavailableError as e:  # installed, but cannot run on this machine
                pytest.skip(str(e))
        return _tensorplug_backends[key]

    def check(
        case: Case, backend: str | Backend | None = None, reference: str | Backend | None = None
    ) -> CaseResult:
        name = (
            backend or config.getoption("tensorplug_backend") or config.getini("tensorplug_backend")
        )
        if not name:
            raise pytest.UsageError(
                "tensorplug_check: no backend to check; pass backend='NAME' in the test or run "
                "pytest --tensorplug-backend NAME"
            )
        test = get(name)
        chosen: str | Backend | None = reference or config.getoption("tensorplug_reference")
        ref = get(chosen or default_reference(test))
        result = run_case(case, test, ref)
        if result.outcome is Outcome.UNSUPPORTED:  # the case id keeps skips apart in -rs
            pytest.skip(f"{case.name}: unsupported: {result.message}")
        if result.outcome is Outcome.FAIL:
            where = f"\n\n{result.traceback}" if result.traceback else ""
            pytest.fail(f"{case.name}: {result.message}{where}", pytrace=False)
        return result

    return check
