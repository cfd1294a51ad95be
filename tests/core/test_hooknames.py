"""One hook convention (plugin API 1.3): plugins implement underscore hooks, applications call
public methods; API 1.0's names keep working for one release, with a warning."""

from __future__ import annotations

import warnings

import pytest

import tensorplug as tp
from tensorplug import ops
from tensorplug.backend import GraphPlan
from tensorplug.errors import PluginError, UnsupportedError
from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice


def _old_style() -> tuple[type[ReferenceDevice], list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        class OldDevice(ReferenceDevice):  # written against API 1.0
            def supports_op(self, op: tp.Tensor) -> bool:
                return op.op is not tp.Op.SUM_ROWS and super()._supports_op(op)

            def event_new(self) -> tp.Event:
                return tp.Event(self, "made by the old hook")

    return OldDevice, caught


def test_an_old_hook_name_warns_once_per_class_with_the_fix() -> None:
    _, caught = _old_style()
    assert len(caught) == 1 and caught[0].category is DeprecationWarning
    text = str(caught[0].message)
    assert "OldDevice implements plugin hooks under their API 1.0 names" in text
    assert "(supports_op, event_new)" in text
    assert "Fix: rename them to _supports_op, _event_new" in text
    assert caught[0].filename == __file__  # points at the class statement


def test_an_old_hook_keeps_working_behind_the_public_method() -> None:
    old_device, _ = _old_style()
    dev = old_device()
    x = tp.new_tensor("f32", (6, 4))
    assert dev.supports_op(ops.neg(x)) and not dev.supports_op(ops.sum_rows(x))
    assert dev._supports_op(ops.neg(x))  # the hook is the old method
    assert dev.event_new().context == "made by the old hook"
    # the contract still comes first: a 1.0-era device is never handed a tiled add
    tiled = ops.add(x, tp.new_tensor("f32", (6, 2)))
    assert dev.supports_op(tiled)
    dev_10 = type("Old10", (old_device,), {"api_version": property(lambda self: (1, 0))})()
    assert not dev_10.supports_op(tiled)


def test_old_style_subclasses_calling_super_do_not_recurse() -> None:
    old_device, _ = _old_style()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)

        class OlderStill(old_device):  # type: ignore[valid-type,misc]
            def supports_op(self, op: tp.Tensor) -> bool:
                return op.op is not tp.Op.ARGMAX and super().supports_op(op)

    dev, x = OlderStill(), tp.new_tensor("f32", (3, 5))
    assert dev.supports_op(ops.neg(x))
    assert not dev.supports_op(ops.argmax(x)) and not dev.supports_op(ops.sum_rows(x))


def test_new_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class NewDevice(ReferenceDevice):
            def _supports_op(self, op: tp.Tensor) -> bool:
                return True

    assert NewDevice().supports_op(ops.neg(tp.new_tensor("f32", (2,))))


class _Plans(ReferenceBackend):
    def _graph_plan_create(self, graph: tp.Graph) -> GraphPlan:
        return GraphPlan(self, graph)

    def _graph_plan_compute(self, plan: GraphPlan) -> tp.Status:
        return tp.Status.SUCCESS


def test_graph_plans_and_events_go_through_public_methods() -> None:
    backend = _Plans(ReferenceDevice())
    graph = tp.Graph(ops.neg(tp.new_tensor("f32", (2,))))
    plan = backend.graph_plan_create(graph)
    assert backend.graph_plan_compute(plan) is tp.Status.SUCCESS
    backend.graph_plan_free(plan)
    with pytest.raises(UnsupportedError, match="does not support graph plans"):
        backend.graph_plan_update(plan, graph)
    device = backend.device
    with pytest.raises(UnsupportedError, match="does not support events"):
        device.event_new()
    event = tp.Event(device)
    for call in (lambda: backend.event_record(event), lambda: backend.event_wait(event),
                 lambda: device.event_synchronize(event)):  # fmt: skip
        with pytest.raises(UnsupportedError, match="does not support events"):
            call()
    device.event_free(event)  # nothing to free: no error


def test_an_old_style_backend_keeps_its_graph_plans() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)

        class OldPlans(ReferenceBackend):
            def graph_plan_create(self, graph: tp.Graph) -> GraphPlan:
                return GraphPlan(self, graph)

            def graph_plan_compute(self, plan: GraphPlan) -> tp.Status:
                return tp.Status.SUCCESS

    backend = OldPlans(ReferenceDevice())
    plan = backend.graph_plan_create(tp.Graph(ops.neg(tp.new_tensor("f32", (2,)))))
    assert backend.graph_plan_compute(plan) is tp.Status.SUCCESS
    assert backend._graph_plan_compute(plan) is tp.Status.SUCCESS  # moved to the hook


def test_a_backend_answering_supports_op_itself_still_sees_the_contract() -> None:
    class Eager(ReferenceBackend):
        def supports_op(self, op: tp.Tensor) -> bool:
            return True

    class Old(ReferenceDevice):
        api_version = property(lambda self: (1, 0))

    x = tp.new_tensor("f32", (6, 4))
    assert Eager(ReferenceDevice()).supports_op(ops.add(x, tp.new_tensor("f32", (6, 2))))
    assert not Eager(Old()).supports_op(ops.add(x, tp.new_tensor("f32", (6, 2))))


def test_a_device_without_supports_op_is_refused_at_registration() -> None:
    class Mute(ReferenceDevice):
        _supports_op = tp.Device._supports_op

    class MuteReg(tp.Reg):
        name = property(lambda self: "MUTE")

        def devices(self) -> list[tp.Device]:
            return [Mute()]

    with pytest.raises(NotImplementedError, match="does not implement _supports_op"):
        Mute().supports_op(ops.neg(tp.new_tensor("f32", (2,))))
    with pytest.raises(PluginError, match=r"does not implement _supports_op\(op\)"):
        tp.registry.register(MuteReg())
