"""The Ray plugin's graph description, without Ray: what crosses, and what an actor refuses.

A description is decoded against plain host buffers here, exactly as an actor does
against the buffers it owns, so every refusal is checked without starting a cluster.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import ops
from tensorplug.host import host_buffer_type
from tensorplug.opcodes import Op

pytest.importorskip(
    "tensorplug_ray", reason="tensorplug-ray is not installed (pip install -e plugins/ray)"
)
from tensorplug_ray import settings, wire


def _graph() -> tuple[tp.Graph, dict[int, Any], tp.Tensor, dict[str, np.ndarray]]:
    """rms_norm → mul_mat → rope-free attention-ish chain on one host buffer (handle 7)."""
    rng = np.random.default_rng(0)
    w = tp.new_tensor("f32", (6, 8), "w")
    x = tp.new_tensor("f32", (3, 8), "x")
    y = ops.silu(ops.mul_mat(w, ops.rms_norm(x, 1e-5)))
    out = ops.scale(ops.transpose(y), 0.5)
    g = tp.Graph(ops.cont(out))
    buf = tp.alloc_tensors(g.leafs + [t for t in g.nodes if not t.is_view], host_buffer_type())
    for t in g.nodes:
        if t.is_view:
            tp.view_init(t)
    data = {"w": rng.standard_normal((6, 8)).astype(np.float32),
            "x": rng.standard_normal((3, 8)).astype(np.float32)}  # fmt: skip
    tp.set_array(w, data["w"])
    tp.set_array(x, data["x"])
    return g, {7: buf}, g.nodes[-1], data


def _encode(g: tp.Graph) -> dict[str, Any]:
    return wire.encode_graph(g, lambda t: 7)


def test_a_description_is_plain_data_and_rebuilds_the_same_graph() -> None:
    g, buffers, result, data = _graph()
    desc = _encode(g)
    # nothing but builtins: it would survive JSON, so no pickled object can hide in it
    import json

    assert json.loads(json.dumps(desc)) == desc
    nodes = wire.decode_graph(copy.deepcopy(desc), buffers)
    assert [n.op for n in nodes] == [n.op for n in g.nodes]
    assert [(n.shape, n.strides, n.offset) for n in nodes] == [
        (n.shape, n.strides, n.offset) for n in g.nodes
    ]
    tp.init_by_name("CPU").graph_compute(tp.Graph(nodes[-1]))
    x = data["x"] / np.sqrt(np.mean(data["x"] ** 2, axis=-1, keepdims=True) + 1e-5)
    h = x @ data["w"].T
    expected = (h / (1 + np.exp(-h))).T * 0.5
    np.testing.assert_allclose(tp.get_array(result), expected, rtol=1e-5, atol=1e-6)


def test_digest_names_content_not_identity() -> None:
    g1, _, _, _ = _graph()
    g2, _, _, _ = _graph()
    assert wire.digest(_encode(g1)) == wire.digest(_encode(g2))
    g3 = tp.Graph(ops.scale(g1.nodes[-1], 2.0))
    assert wire.digest(_encode(g1)) != wire.digest(wire.encode_graph(g3, lambda t: 7))


def _corrupt(mutate: Any) -> tuple[dict[str, Any], dict[int, Any]]:
    g, buffers, _, _ = _graph()
    desc = copy.deepcopy(_encode(g))
    mutate(desc)
    return desc, buffers


def _node(desc: dict[str, Any], op: str) -> dict[str, Any]:
    return next(e for e in desc["tensors"] if e.get("op") == op)


def _placed(desc: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in desc["tensors"] if e["kind"] == "placed")


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.update(v=99), "v=1"),
        (lambda d: d.update(tensors="nope"), "'tensors' must be a list"),
        (lambda d: _node(d, "mul_mat").update(op="custom_fn_pointer"), "unknown op"),
        (lambda d: _placed(d).update(off=1 << 40), "spans bytes"),
        (lambda d: _placed(d).update(off=-8), "whole number"),
        (lambda d: _placed(d).update(buf=8), "not allocated on this device"),
        (lambda d: _node(d, "mul_mat").update(src=[5, 0]), "earlier entries"),
        (lambda d: _node(d, "mul_mat").update(shape=[3, 7]), "builds F32"),
        (lambda d: _node(d, "mul_mat").update(type="Q4_0"), "builds F32"),
        (lambda d: _node(d, "rms_norm").update(params=[["eps", "f", "1e-5"]]), "unknown kind"),
        (lambda d: _node(d, "rms_norm").update(params=[]), "missing its param"),
        (
            lambda d: _node(d, "scale").update(
                params=[["scale", "pickle", pickle.dumps(print)], ["bias", "f", 0.0]]
            ),
            "unknown kind",
        ),
        (lambda d: _node(d, "unary").update(params=[["fn", "e", "Op", "add"]]), "unknown kind"),
        (
            lambda d: _node(d, "unary").update(params=[["fn", "e", "UnaryOp", "rm -rf"]]),
            "no UnaryOp",
        ),
        (lambda d: _placed(d).update(shape=[True, 8]), "whole number"),
        (lambda d: _placed(d).update(strides=[32]), "list of 2 to 2"),
        (lambda d: _node(d, "transpose").update(strides=[4, 4]), "builds F32"),
        (lambda d: _node(d, "mul_mat").update(name="x" * 1000), "at most 256"),
    ],
)
def test_actor_refuses_a_malformed_description(mutate: Any, match: str) -> None:
    desc, buffers = _corrupt(mutate)
    with pytest.raises(wire.DescriptionError, match=match):
        wire.decode_graph(desc, buffers)


def test_a_view_past_its_base_is_refused_before_anything_runs() -> None:
    g, buffers, _, _ = _graph()
    desc = _encode(g)
    view = _node(desc, "transpose")
    # a transpose whose strides reach outside the tensor: the builder recomputes them
    view["strides"] = [4, 1 << 20]
    with pytest.raises(wire.DescriptionError, match="builds"):
        wire.decode_graph(desc, buffers)


def test_ops_without_a_builder_are_unsupported_not_trusted() -> None:
    assert Op.NONE not in wire.BUILDERS
    g, buffers, _, _ = _graph()
    desc = _encode(g)
    saved = wire.BUILDERS.pop(Op.SCALE)
    try:
        with pytest.raises(tp.UnsupportedError, match="scale cannot run on a remote device"):
            wire.decode_graph(desc, buffers)
    finally:
        wire.BUILDERS[Op.SCALE] = saved


def test_params_that_cannot_cross_are_refused_on_the_client() -> None:
    with pytest.raises(tp.UnsupportedError, match="cannot cross"):
        wire.encode_params({"fn": print})
    assert wire.encode_params({"axes": (1, 0), "b": True, "i": 3, "f": 0.5}) == [
        ["axes", "ti", [1, 0]], ["b", "b", True], ["f", "f", 0.5], ["i", "i", 3],
    ]  # fmt: skip


def test_a_tensor_elsewhere_is_named_in_the_error() -> None:
    g, _, _, _ = _graph()

    def handle_of(t: tp.Tensor) -> int:
        raise tp.OutOfBoundsError(f"{t.describe()} lives elsewhere")

    with pytest.raises(tp.OutOfBoundsError, match="lives elsewhere"):
        wire.encode_graph(g, handle_of)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CPU:2", ((("CPU", 2)),)),
        ("CPU:2, CUDA:4", (("CPU", 2), ("CUDA", 4))),
        ("OpenCL", (("OpenCL", 1),)),
    ],
)
def test_device_requests_parse(text: str, expected: tuple[tuple[str, int], ...]) -> None:
    got = settings.parse_devices(text)
    assert [(r.backend, r.count) for r in got] == [tuple(e) for e in expected]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("CPU:x", "whole number"),
        ("CPU:0", "between 1 and 64"),
        (",,", "no device"),
        ("2:CPU", "backend name"),
    ],
)
def test_bad_device_requests_say_what_is_wrong(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        settings.parse_devices(text)


def test_the_plugin_is_off_until_a_cluster_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorplug_ray import score

    monkeypatch.delenv(settings.ADDRESS.env, raising=False)
    value, reason = score()
    assert value == 0
    assert settings.ADDRESS.env in reason and "local" in reason
    monkeypatch.setenv(settings.ADDRESS.env, "local")
    monkeypatch.setenv(settings.DEVICES.env, "CPU:3")
    value, reason = score()
    assert value > 0 and "CPU:3" in reason and "local cluster" in reason
