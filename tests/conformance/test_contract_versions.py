"""The versioned op contract (issue 40): a plugin declares the contract it implements, is
never handed a node needing more, and is judged by the kit on what it declares.

JAXLIKE (tests/plugins/tp-jaxlike) stands in for the outside author's JAX backend: written
from the 1.0 docs, declaring ``api_version=(1, 0)``, numpy broadcasting for binary ops and
soft_max masks, IEEE relu/gelu/argmax, and a ``supports_op`` (the 1.0 hook name) saying
yes to those ops whatever the shapes.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from plugin_dists import PluginEnv

import tensorplug as tp
from tensorplug import contract, ops
from tensorplug.contract import (
    CONTRACT,
    FEATURES,
    LATEST_VERSION,
    VERSIONS,
    features_after,
    missing_feature,
    needed_features,
    required_version,
)
from tensorplug.errors import ApiVersionError
from tensorplug.opcodes import Op, UnaryOp
from tensorplug.registration import check_api_version
from tensorplug.testing.families import catalogue
from tensorplug.testing.refbackend import ReferenceDevice
from tensorplug.testing.runner import CheckReport, Outcome, run_cases

JAXLIKE = Path(__file__).resolve().parents[1] / "plugins" / "tp-jaxlike"


@pytest.fixture(scope="module")
def jaxlike() -> Iterator[object]:
    """The JAXLIKE plugin's backend module, imported from its source folder."""
    sys.path.insert(0, str(JAXLIKE))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # it uses the 1.0 hook name
        import tp_jaxlike.backend as module
    yield module
    sys.path.remove(str(JAXLIKE))


def _backend(module: object, version: tuple[int, int]) -> tp.Backend:
    reg = module.create_reg()  # type: ignore[attr-defined]
    reg.api_version = version  # what the registry sets from the plugin's Registration
    return reg.devices()[0].init_backend()


@pytest.fixture(scope="module")
def reports(jaxlike: object) -> dict[tuple[int, int], CheckReport]:
    """`tensorplug check` over the whole catalogue, against the CPU backend, with JAXLIKE
    declaring 1.0 (as written) and declaring the newest contract."""
    cpu = tp.init_by_name("CPU")
    cases = catalogue(full=True)
    return {v: run_cases(cases, _backend(jaxlike, v), cpu) for v in ((1, 0), LATEST_VERSION)}


# -- the feature records --------------------------------------------------------------------


def test_versions_are_cumulative_and_the_core_provides_the_newest() -> None:
    assert VERSIONS[0] == (1, 0) and list(VERSIONS) == sorted(set(VERSIONS))
    assert LATEST_VERSION == tp.API_VERSION
    assert len({f.name for f in FEATURES}) == len(FEATURES)
    assert all(op in CONTRACT for f in FEATURES for op in f.ops)
    assert [f.version for f in FEATURES] == sorted(f.version for f in FEATURES)
    assert features_after(LATEST_VERSION) == [] and features_after((1, 0)) == list(FEATURES)
    assert {f.name for f in features_after((1, 1))} >= {"special_values", "top_k"}


def test_what_each_node_needs() -> None:
    a, b_row, b_tiled = (tp.new_tensor("f32", s) for s in ((6, 4), (1, 4), (6, 2)))
    assert required_version(ops.add(a, b_row)) == (1, 0)  # numpy broadcasting: 1.0
    assert [f.name for f in needed_features(ops.mul(a, b_tiled))] == ["tiled_broadcast"]
    scores = tp.new_tensor("f32", (2, 4, 7, 33))
    mask = tp.new_tensor("f32", (1, 2, 7, 33))
    assert required_version(ops.soft_max(scores, mask)) == (1, 1)
    assert required_version(ops.soft_max(scores, tp.new_tensor("f16", (1, 1, 8, 33)))) == (1, 0)
    assert required_version(ops.soft_max(scores)) == (1, 0)
    x = tp.new_tensor("f32", (3, 5))
    assert required_version(ops.unary(x, UnaryOp.RELU)) == (1, 2)
    assert required_version(ops.argmax(x)) == (1, 2)
    assert required_version(ops.unary(x, UnaryOp.NEG)) == (1, 0)
    assert required_version(ops.unary(x, UnaryOp.GELU_QUICK)) == (1, 3)
    assert required_version(ops.top_k(x, 2)) == (1, 3)
    assert required_version(ops.glu(x, x, tp.GluOp.GEGLU)) == (1, 3)
    assert required_version(ops.glu(x, x)) == (1, 0)  # swiglu
    assert missing_feature(ops.mul(a, b_tiled), (1, 1)) is None
    assert missing_feature(ops.mul(a, b_tiled), (1, 0)).name == "tiled_broadcast"  # type: ignore[union-attr]


def test_every_feature_except_new_ops_has_catalogue_cases() -> None:
    needed = {f.name for c in catalogue(full=True) for n in c.instantiate()[0].nodes
              for f in needed_features(n)}  # fmt: skip
    assert needed == {f.name for f in FEATURES}


def test_the_reference_page_has_each_ops_changelog() -> None:
    page = contract.render_markdown()
    assert "## Contract versions" in page and "| `tiled_broadcast` | 1.1 |" in page
    add = page.split("## `add`")[1].split("## ")[0]
    assert "- 1.1 `tiled_broadcast`" in add
    assert "in the contract since 1.3, unchanged since" in page.split("## `top_k`")[1]


def test_a_newer_minor_than_the_core_knows_is_refused_with_the_remedy() -> None:
    newer = (LATEST_VERSION[0], LATEST_VERSION[1] + 1)
    with pytest.raises(ApiVersionError, match=r"upgrade tensorplug \(pip install -U tensorplug\)"):
        check_api_version(newer, plugin="tp-future 1.0", package="tp-future")
    check_api_version((1, 0), plugin="tp-old", package="tp-old")  # older: accepted, filtered


# -- the filter in front of supports_op -------------------------------------------------------


class _Asked(ReferenceDevice):
    """A reference device that records which nodes its plugin hook is asked about."""

    def __init__(self, version: tuple[int, int]) -> None:
        super().__init__()
        self.version = version
        self.asked: list[Op] = []

    @property
    def api_version(self) -> tuple[int, int]:
        return self.version

    def _supports_op(self, op: tp.Tensor) -> bool:
        self.asked.append(op.op)
        return super()._supports_op(op)


def test_a_node_beyond_the_declared_contract_is_refused_before_the_plugin_is_asked() -> None:
    a, b = tp.new_tensor("f32", (6, 4)), tp.new_tensor("f32", (6, 2))
    old, new = _Asked((1, 0)), _Asked(LATEST_VERSION)
    tiled = ops.add(a, b)
    assert not old.supports_op(tiled) and old.asked == []
    assert not old.init_backend().supports_op(tiled)  # the backend's answer is the device's
    assert new.supports_op(tiled) and new.asked == [Op.ADD]
    assert old.supports_op(ops.add(a, a)) and old.asked == [Op.ADD]


def test_a_registration_declares_the_contract_of_its_devices(tmp_path: Path) -> None:
    plugin = tmp_path / "tp_declares.py"
    plugin.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(JAXLIKE)!r})\n"
        "from tensorplug.registration import Registration\n"
        "registration = Registration(name='JAXLIKE', api_version=(1, 1),\n"
        "                            init='tp_jaxlike.backend:create_reg')\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        reg = tp.registry.load(plugin)
    try:
        # the Reg class sets no api_version (it would be the core's): the Registration's counts
        dev = reg.devices()[0]
        assert reg.api_version == (1, 1) and dev.api_version == (1, 1)
        a, b = tp.new_tensor("f32", (6, 4)), tp.new_tensor("f32", (6, 2))
        assert dev.supports_op(ops.add(a, b))  # 1.1: tiled broadcast is declared...
        assert not dev.supports_op(ops.argmax(a))  # ...special values (1.2) are not
    finally:
        tp.registry.unload(reg)


# -- the JAX-like plugin, as written and upgraded ---------------------------------------------

#: The 20 tiled binary cases, the soft_max with 2 mask heads for 4, and the special-value
#: and tie cases of relu, gelu and argmax: what its 1.0 implementation gets wrong.
BROKEN_AT_1_0 = 25
#: Cases of relu, gelu and argmax on ordinary values: right, but a value rule cannot be
#: seen on a node, so contract 1.2 withholds every relu, gelu and argmax node.
WITHHELD_BUT_RIGHT = 10


def test_as_written_it_passes_with_the_newer_cases_needing_a_newer_contract(
    reports: dict[tuple[int, int], CheckReport],
) -> None:
    old = reports[(1, 0)]
    assert old.ok and old.count(Outcome.FAIL) == 0, old.summary()
    needing = {r.case: r.contract for r in old.contract_unsupported}
    assert len(needing) == BROKEN_AT_1_0 + WITHHELD_BUT_RIGHT
    assert all(r.outcome is Outcome.UNSUPPORTED for r in old.contract_unsupported)
    tiled = {c for c, v in needing.items() if v == (1, 1)}
    assert len(tiled) == 21 and all(c.startswith(("ADD", "SUB", "MUL", "DIV", "SOFT_MAX"))
                                    for c in tiled)  # fmt: skip
    assert {c.split("(")[0] for c, v in needing.items() if v == (1, 2)} == {
        "RELU", "GELU", "ARGMAX"}  # fmt: skip
    sample = next(r for r in old.contract_unsupported if r.case.startswith("ADD"))
    assert "contract 1.1 needed (tiled_broadcast; JAXLIKE0 declares 1.0)" in sample.message
    assert "(35 need op contract 1.1 or newer)" in old.summary()


def test_declaring_the_newest_contract_it_fails_exactly_those_cases(
    reports: dict[tuple[int, int], CheckReport],
) -> None:
    old, new = reports[(1, 0)], reports[LATEST_VERSION]
    failed = {r.case for r in new.results if r.outcome is Outcome.FAIL}
    needing = {r.case for r in old.contract_unsupported}
    assert len(failed) == BROKEN_AT_1_0 and failed <= needing
    newly_passing = {r.case for r in new.results if r.passed} - {r.case for r in old.results
                                                                  if r.passed}  # fmt: skip
    assert newly_passing == needing - failed and len(newly_passing) == WITHHELD_BUT_RIGHT
    assert not any("special" in c or "ties" in c for c in newly_passing)
    assert new.contract_unsupported == []  # the newest contract is judged on everything
    # what it got wrong: tiled operands raise in numpy; NaN and ties give numpy's answers
    messages = {r.case.split("(")[0]: r.message for r in new.results if r.case in failed}
    assert "could not be broadcast" in messages["ADD"] and "NaN" in messages["RELU"]


def test_the_scheduler_runs_a_tiled_add_on_the_cpu_for_a_1_0_plugin(jaxlike: object) -> None:
    def run(version: tuple[int, int]) -> tuple[np.ndarray, str, str]:
        a, b = tp.new_tensor("f32", (6, 4), "a"), tp.new_tensor("f32", (6, 2), "b")
        total = ops.add(a, b)  # tiled: b twice along each row
        out = ops.scale(total, 2.0)  # an op the plugin computes at any version
        sched = tp.Scheduler([_backend(jaxlike, version), tp.init_by_name("CPU")])
        graph = tp.Graph(out)
        sched.alloc_graph(graph)
        tp.set_array(a, np.arange(24, dtype=np.float32).reshape(6, 4))
        tp.set_array(b, np.arange(12, dtype=np.float32).reshape(6, 2))
        sched.graph_compute(graph)
        total_on, out_on = sched.get_tensor_backend(total), sched.get_tensor_backend(out)
        assert total_on is not None and out_on is not None
        return tp.get_array(out), total_on.name, out_on.name

    got, add_on, scale_on = run((1, 0))
    want = 2 * (np.arange(24).reshape(6, 4) + np.tile(np.arange(12).reshape(6, 2), (1, 2)))
    np.testing.assert_array_equal(got, want)
    assert (add_on, scale_on) == ("CPU", "JAXLIKE0")
    with pytest.raises(ValueError, match="could not be broadcast"):  # what 1.0 protects from
        run(LATEST_VERSION)


# -- installed, as users get it ---------------------------------------------------------------


@pytest.fixture(scope="module")
def jaxlike_env(tmp_path_factory: pytest.TempPathFactory) -> PluginEnv:
    return PluginEnv.create(tmp_path_factory.mktemp("jaxlike-env"), [JAXLIKE])


def test_installed_as_written_tensorplug_check_passes(jaxlike_env: PluginEnv) -> None:
    args = ["-m", "tensorplug", "check", "--backend", "JAXLIKE0", "--reference", "reference"]
    proc = jaxlike_env.run([*args, "--plain"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " 0 failed" in summary and "need op contract 1.1 or newer) — OK" in summary
    assert "contract 1.1 needed (tiled_broadcast; JAXLIKE0 declares 1.0)" in proc.stdout
    assert "note: 35 cases need a later op contract than JAXLIKE0" in proc.stdout


def test_doctor_names_what_the_plugin_does_not_declare(jaxlike_env: PluginEnv) -> None:
    proc = jaxlike_env.run(["-m", "tensorplug", "doctor", "--plain"])
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("Op contract (newest 1.4)")[1].split("Devices (")[0]
    assert "JAXLIKE (tp-jaxlike 0.1.0) declares op contract 1.0" in section
    assert "- 1.1 tiled_broadcast (add, sub, mul, div): b is repeated onto a" in section
    assert "- 1.2 special_values (unary, argmax)" in section
    assert "Fix: its authors implement them and declare api_version=(1, 4)" in section
    assert "users: pip install -U tp-jaxlike once they have" in section


#: what each in-tree plugin leaves to others: the features after the contract it declares
#: (the GPU plugins have no Hadamard rotation yet: a quantized KV cache runs on the CPU)
_LEFT_TO_OTHERS = {"cpu": set(), "opencl": {"hadamard"}, "cuda": {"hadamard"},
                   "metal": {"hadamard"}, "ray": {"hadamard"}}  # fmt: skip


@pytest.mark.parametrize("package", sorted(_LEFT_TO_OTHERS))
def test_in_tree_plugins_declare_what_they_implement(package: str) -> None:
    module = pytest.importorskip(f"tensorplug_{package}")
    declared = module.registration.api_version
    left = {f.name for f in features_after(declared)}
    assert left == _LEFT_TO_OTHERS[package]
