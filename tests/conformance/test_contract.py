"""The op contract: complete, true of every builder, read by the kit and the backends, and
published as docs/ops.md."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import tensorplug as tp
from tensorplug import ops
from tensorplug.contract import CONTRACT, conforms, problems, render_markdown
from tensorplug.opcodes import Op
from tensorplug.tensor import Tensor
from tensorplug.testing.families import catalogue
from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice, reference_backend
from tensorplug.testing.runner import Outcome, run_case

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ops.md"


def test_every_op_has_a_contract() -> None:
    assert set(CONTRACT) == set(Op) - {Op.NONE}


def test_every_node_of_every_catalogue_case_conforms() -> None:
    for case in catalogue(True, [], []):
        graph, _ = case.instantiate()
        for node in graph.nodes:
            assert problems(node) == [], case.name


def test_optional_operands_are_present_only_when_given() -> None:
    a = tp.new_tensor("f32", (4, 2, 8))  # (n_tokens, n_head, head_dim)
    pos = tp.new_tensor("i32", (4,))
    plain = ops.rope(a, pos, 8)
    with_ff = ops.rope(a, pos, 8, freq_factors=tp.new_tensor("f32", (4,)))
    assert len(plain.src) == 2 and len(with_ff.src) == 3
    assert CONTRACT[Op.ROPE].operands[2].name == "freq_factors"
    assert conforms(plain) and conforms(with_ff)


def _hand_made(op: Op, src: tuple[Tensor, ...], params: dict[str, object]) -> Tensor:
    return Tensor("f32", (4,), op=op, src=src, op_params=params)


def test_a_node_that_departs_from_the_contract_is_described() -> None:
    x = tp.new_tensor("f32", (4,))
    assert problems(_hand_made(Op.SCALE, (x,), {"scale": 2.0})) == [
        "scale: op_params lack ['bias']"
    ]
    assert problems(_hand_made(Op.SCALE, (x,), {"scale": 2.0, "bias": 0.0, "zoom": 1})) == [
        "scale: op_params ['zoom'] are not in the contract"
    ]
    assert problems(_hand_made(Op.NORM, (x,), {"eps": "small"})) == [
        "norm: op_params['eps'] is str, not float"
    ]
    assert problems(_hand_made(Op.ADD, (x,), {})) == ["add takes 2 operands, the node has 1"]
    assert "takes 1 to 2 operands" in problems(_hand_made(Op.SOFT_MAX, (x, x, x), _sm()))[0]


def test_conforms_says_exactly_whether_there_are_problems() -> None:
    """``conforms`` decides without writing messages; it must agree with ``problems``
    on every catalogue node and on nodes broken each way ``problems`` describes."""
    x = tp.new_tensor("f32", (4,))
    broken = [
        _hand_made(Op.SCALE, (x,), {"scale": 2.0}),  # a parameter missing
        _hand_made(Op.SCALE, (x,), {"scale": 2.0, "bias": 0.0, "zoom": 1}),  # one extra
        _hand_made(Op.SCALE, (x,), {"scale": 2.0, "zoom": 1}),  # one swapped for another
        _hand_made(Op.NORM, (x,), {"eps": "small"}),  # a parameter of the wrong type
        _hand_made(Op.NORM, (x,), {"eps": True}),  # a bool is not a float here
        _hand_made(Op.ADD, (x,), {}),  # too few operands
        _hand_made(Op.SOFT_MAX, (x, x, x), _sm()),  # too many
        _hand_made(Op.SCALE, (x,), {"scale": 2.0, "bias": 0}),  # an int is a float here
    ]
    not_a_tensor = _hand_made(Op.ADD, (x, x), {})
    not_a_tensor.src = (x, 3)  # type: ignore[assignment]  # what a careless rewrite leaves
    broken.append(not_a_tensor)
    nodes = broken + [n for c in catalogue(True, [], []) for n in c.instantiate()[0].nodes]
    for node in nodes:
        assert conforms(node) == (not problems(node)), (node.op, dict(node.op_params))
    assert sum(not conforms(n) for n in broken) == len(broken) - 1  # the int-as-float one


def _sm() -> dict[str, object]:
    return {"scale": 1.0, "max_bias": 0.0}


@pytest.mark.parametrize("name", ["CPU", "OpenCL0"])
def test_backends_refuse_nodes_that_do_not_conform(name: str) -> None:
    dev = tp.dev_by_name(name)
    if dev is None:
        pytest.skip(f"no {name} device")
    x = tp.new_tensor("f32", (4,))
    good = ops.scale(x, 2.0)
    assert dev.supports_op(good)
    assert not dev.supports_op(_hand_made(Op.SCALE, (x,), {"scale": 2.0}))


def test_the_kit_fails_a_case_whose_nodes_do_not_conform() -> None:
    case = next(c for c in catalogue(True, ["scale"], []))

    def drifted() -> tuple[tp.Graph, dict]:  # type: ignore[type-arg]
        graph, inputs = case.instantiate()
        graph.nodes[-1].op_params = {"scale": 1.0}  # a builder that forgot "bias"
        return graph, inputs

    fake = SimpleNamespace(name=case.name, op=case.op, max_nmse=case.max_nmse,
                           instantiate=drifted)  # fmt: skip
    result = run_case(fake, ReferenceBackend(ReferenceDevice()), reference_backend())  # type: ignore[arg-type]
    assert result.outcome is Outcome.FAIL and "op contract: scale: op_params lack" in result.message


def test_the_reference_page_is_up_to_date() -> None:
    assert DOCS.read_text(encoding="utf-8") == render_markdown(), (
        "docs/ops.md is stale: python -m tensorplug.contract > docs/ops.md"
    )
