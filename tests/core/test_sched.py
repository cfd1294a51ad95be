"""The scheduler over the CPU backend and TESTACCEL (tests/plugins_sched/tp-testaccel).

TESTACCEL keeps tensors in private memory, defers its work until synchronized, supports
events and async copies between its devices, and cannot run soft_max, rope or
quantized mul_mat: so splits, copies, fallbacks and weight placement all happen, and
every result is compared with the CPU backend alone and with numpy.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import Type, ops, quants
from tensorplug.alloc import alloc_tensors
from tensorplug.errors import AllocationError, UnsupportedError
from tensorplug.registry import init_by_name
from tensorplug.sched import Scheduler
from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice

sys.path.insert(0, str(Path(__file__).parents[1] / "plugins_sched"))
import schedkit
from plan_runs import kept_plans, record_runs
from tensorplug_testaccel.device import AccelBackend

WEIGHTS = tp.BufferUsage.WEIGHTS


@pytest.fixture(scope="module")
def cpu() -> tp.Backend:
    return init_by_name("CPU")


@pytest.fixture
def reg() -> schedkit.TestAccelReg:
    return schedkit.TestAccelReg(n_devices=2)


@pytest.fixture
def acc(reg: schedkit.TestAccelReg) -> AccelBackend:
    return reg.devices()[0].init_backend("min_batch=4")


def load_weights(model: schedkit.Llama, values: dict[str, np.ndarray], place) -> list[tp.Buffer]:
    """Put each weight in the buffer type ``place(name)`` returns (WEIGHTS usage)."""
    groups: dict[tp.BufferType, list[tp.Tensor]] = {}
    for name, t in model.weights.items():
        groups.setdefault(place(name), []).append(t)
    bufs = [alloc_tensors(ts, bt, usage=WEIGHTS) for bt, ts in groups.items()]
    for name, t in model.weights.items():
        if t.type.is_quantized:
            tp.set_array(t, quants.quantize(values[name], t.type))
        else:
            tp.set_array(t, values[name])
    return [b for b in bufs if b is not None]


def cpu_only_logits(cpu: tp.Backend, cfg: dict[str, int], wtype: Type = Type.F32) -> np.ndarray:
    """The reference run: the same model on the CPU backend alone."""
    m = schedkit.build_llama(wtype=wtype, **cfg)
    load_weights(m, m.weight_values(), lambda _: cpu.buffer_type())
    sched = Scheduler([cpu])
    sched.alloc_graph(m.graph)
    m.set_inputs(m.input_values())
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    assert sched.n_splits == 1 and sched.n_split_inputs == 0
    return tp.get_array(m.logits)


def backend_of(sched: Scheduler, t: tp.Tensor) -> tp.Backend:
    """``sched.get_tensor_backend(t)``, for a node the test knows was assigned one."""
    be = sched.get_tensor_backend(t)
    assert be is not None, t.describe()
    return be


def where(sched: Scheduler, model: schedkit.Llama) -> dict[str, list[str]]:
    """op name -> backend names of the graph's non-view nodes, in order."""
    out: dict[str, list[str]] = {}
    for n in model.graph.nodes:
        if n.view_src is None or n.op in (tp.Op.CPY, tp.Op.SET_ROWS):
            be = sched.get_tensor_backend(n)
            out.setdefault(n.op.value, []).append(be.name if be else "-")
    return out


CFG = {"n_layer": 2, "n_tokens": 8, "n_embd": 32, "n_head": 4, "n_head_kv": 2, "n_ff": 64}


def test_weights_on_the_accelerator_pull_ops_there_and_results_match(
    cpu: tp.Backend, acc: AccelBackend
) -> None:
    m = schedkit.build_llama(**CFG)
    wv, iv = m.weight_values(), m.input_values()
    load_weights(m, wv, lambda _: acc.buffer_type())
    sched = Scheduler([acc, cpu])
    sched.reserve(m.graph)
    assert sched.buffer_size(acc) > 0 and sched.buffer_size(cpu) > 0
    sched.alloc_graph(m.graph)
    m.set_inputs(iv)
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    placed = where(sched, m)
    assert set(placed["rope"]) == {cpu.name} and set(placed["soft_max"]) == {cpu.name}
    assert set(placed["mul_mat"]) == {acc.name} and set(placed["rms_norm"]) == {acc.name}
    # every node runs on a backend that supports it
    for n in m.graph.nodes:
        assert backend_of(sched, n).supports_op(n), n.describe()
    # a split per backend change: embd..k | rope k | ... ; all inputs are copied once
    splits = sched.splits
    assert len(splits) == sched.n_splits >= 1 + 2 * 3 * CFG["n_layer"]
    assert all(a.backend_id != b.backend_id for a, b in itertools.pairwise(splits))
    assert sched.n_split_inputs == sum(len(s.inputs) for s in splits) > 0
    logits = tp.get_array(m.logits)
    np.testing.assert_allclose(logits, cpu_only_logits(cpu, CFG), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits, schedkit.llama_reference(m, wv, iv), rtol=1e-4, atol=1e-4)
    # the inputs and weights are intact: computing again gives the same logits
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    np.testing.assert_array_equal(tp.get_array(m.logits), logits)


def test_a_capable_accelerator_runs_everything_and_only_inputs_are_copied(
    cpu: tp.Backend,
) -> None:
    acc = schedkit.TestAccelReg(n_devices=1, partial=False).devices()[0].init_backend()
    m = schedkit.build_llama(**CFG)
    wv, iv = m.weight_values(), m.input_values()
    load_weights(m, wv, lambda _: acc.buffer_type())
    sched = Scheduler([acc, cpu])
    sched.alloc_graph(m.graph)
    m.set_inputs(iv)
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    assert sched.n_splits == 1 and sched.splits[0].backend_id == 0
    assert {t.name for t in sched.splits[0].inputs} == {"tokens", "pos", "mask"}
    assert sched.buffer_size(cpu) == 64 + 64 + 256  # only the inputs: tokens, pos, mask
    np.testing.assert_allclose(
        tp.get_array(m.logits), schedkit.llama_reference(m, wv, iv), rtol=1e-4, atol=1e-4
    )


def test_compute_buffers_in_chunks_under_max_size(cpu: tp.Backend) -> None:
    reg = schedkit.TestAccelReg(n_devices=1, max_size=16384)
    acc = reg.devices()[0].init_backend()
    cfg = {**CFG, "n_tokens": 32}
    m = schedkit.build_llama(**cfg)
    load_weights(m, m.weight_values(), lambda _: acc.buffer_type())  # 16 KiB buffers
    sched = Scheduler([acc, cpu])
    sched.alloc_graph(m.graph)
    assert sched.plan is not None
    chunks = sched.plan.chunk_sizes[0]
    assert len(chunks) > 1 and max(chunks) <= 16384 and sched.buffer_size(acc) == sum(chunks)
    m.set_inputs(m.input_values())
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    np.testing.assert_allclose(
        tp.get_array(m.logits), cpu_only_logits(cpu, cfg), rtol=1e-4, atol=1e-4
    )


def test_partial_offload_pins_every_node_backend_and_copy(cpu: tp.Backend) -> None:
    """Layer 0 on the CPU, layer 1 and the output on the accelerator (``-ngl 1`` of 2).

    As in ggml, assignments spread *down* from the accelerator's weights but never from
    the CPU's: layer 0's last residual add and layer 1's first rms_norm follow the
    accelerator weights that come next, not the CPU weights before them.
    """
    acc = schedkit.TestAccelReg(n_devices=1).devices()[0].init_backend("min_batch=64")
    m = schedkit.build_llama(**CFG)
    wv, iv = m.weight_values(), m.input_values()

    def place(name: str) -> tp.BufferType:
        on_acc = name.endswith(".1") or name in ("output", "output_norm")
        return acc.buffer_type() if on_acc else cpu.buffer_type()

    load_weights(m, wv, place)
    sched = Scheduler([acc, cpu])
    sched.alloc_graph(m.graph)
    got = [(n.op.value, backend_of(sched, n).name[0]) for n in m.graph.nodes if n.view_src is None]
    C, T = "C", "T"
    attn = ["rms_norm", "mul", "mul_mat", "cont", "mul_mat", "rope", "cont", "mul_mat", "rope",
            "mul_mat", "soft_max", "mul_mat", "cont", "mul_mat", "add"]  # fmt: skip
    ffn = ["rms_norm", "mul", "mul_mat", "mul_mat", "glu", "mul_mat", "add"]
    layer0 = [(op, C) for op in ["get_rows", *attn, *ffn[:-1]]] + [("add", T)]
    layer1 = [(op, C if op in ("rope", "soft_max") else T) for op in [*attn, *ffn]]
    assert got == [*layer0, *layer1, ("rms_norm", T), ("mul", T), ("mul_mat", T)]
    assert [sched.backends[s.backend_id].name[0] for s in sched.splits] == [C, T, C, T, C, T, C, T]
    assert sched.n_split_inputs == 8
    m.set_inputs(iv)
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    np.testing.assert_allclose(
        tp.get_array(m.logits), schedkit.llama_reference(m, wv, iv), rtol=1e-4, atol=1e-4
    )


def test_host_weights_stay_on_the_cpu_unless_the_accelerator_offloads(
    cpu: tp.Backend, reg: schedkit.TestAccelReg
) -> None:
    m = schedkit.build_llama(**CFG)  # 8 tokens
    load_weights(m, m.weight_values(), lambda _: cpu.buffer_type())
    weights = set(m.weights.values())
    expected = cpu_only_logits(cpu, CFG)
    for min_batch, offload, where_mm in ((32, True, cpu.name), (4, True, "TestAccel0"),
                                         (4, False, cpu.name)):  # fmt: skip
        acc = reg.devices()[0].init_backend(f"min_batch={min_batch}")
        sched = Scheduler([acc, cpu], op_offload=offload)
        weight_mm = [n for n in m.graph.nodes if n.op is tp.Op.MUL_MAT and n.src[0] in weights]
        sched.alloc_graph(m.graph)
        m.set_inputs(m.input_values())
        assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
        assert len(weight_mm) == 7 * CFG["n_layer"] + 1
        assert {backend_of(sched, n).name for n in weight_mm} == {where_mm}
        np.testing.assert_allclose(tp.get_array(m.logits), expected, rtol=1e-4, atol=1e-4)
        sched.reset()


def test_quantized_weights_on_the_accelerator_are_copied_to_the_cpu(
    cpu: tp.Backend, acc: AccelBackend
) -> None:
    cfg = {**CFG, "n_layer": 1}
    m = schedkit.build_llama(wtype=Type.Q8_0, **cfg)
    load_weights(m, m.weight_values(), lambda _: acc.buffer_type())
    sched = Scheduler([acc, cpu])
    sched.alloc_graph(m.graph)
    m.set_inputs(m.input_values())
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    weights = set(m.weights.values())
    for n in m.graph.nodes:
        if n.op is tp.Op.MUL_MAT and n.src[0].type is Type.Q8_0:
            assert sched.get_tensor_backend(n) is cpu  # TESTACCEL has no quantized mul_mat
    copied = [t for s in sched.splits for t in s.inputs if t in weights]
    assert len(copied) == 7 * cfg["n_layer"] + 1  # every matrix weight goes to the CPU
    # a copied weight opens a split of its own, so the copies' memory can be reused
    assert all(sum(t in weights for t in s.inputs) <= 1 for s in sched.splits)
    expected = cpu_only_logits(cpu, cfg, wtype=Type.Q8_0)
    np.testing.assert_allclose(tp.get_array(m.logits), expected, rtol=1e-4, atol=1e-4)


class NoSoftMaxDevice(ReferenceDevice):
    def _supports_op(self, op: tp.Tensor) -> bool:
        return op.op is not tp.Op.SOFT_MAX and super()._supports_op(op)


def test_an_op_no_backend_runs_raises_naming_op_and_backends(acc: AccelBackend) -> None:
    m = schedkit.build_llama(**CFG)
    load_weights(m, m.weight_values(), lambda _: acc.buffer_type())
    sched = Scheduler([acc, ReferenceBackend(NoSoftMaxDevice())])
    original = [n.src for n in m.graph.nodes]
    with pytest.raises(UnsupportedError, match=r"soft_max.*TestAccel0.*reference"):
        sched.alloc_graph(m.graph)
    assert [n.src for n in m.graph.nodes] == original  # nothing left rewritten
    assert sched.n_splits == 0


def test_a_weight_in_a_buffer_no_backend_can_use_raises(
    cpu: tp.Backend, reg: schedkit.TestAccelReg
) -> None:
    acc0, acc1 = (d.init_backend() for d in reg.devices())
    m = schedkit.build_llama(**CFG)
    load_weights(m, m.weight_values(), lambda _: acc1.buffer_type())
    with pytest.raises(UnsupportedError, match="TestAccel1_VRAM"):
        Scheduler([acc0, cpu]).alloc_graph(m.graph)


def test_construction_is_validated(cpu: tp.Backend, acc: AccelBackend) -> None:
    with pytest.raises(ValueError, match="last backend must be a CPU"):
        Scheduler([cpu, acc])
    with pytest.raises(ValueError, match="cannot use buffer type"):
        Scheduler([acc, cpu], buffer_types=[cpu.buffer_type(), cpu.buffer_type()])
    with pytest.raises(ValueError, match="twice"):
        Scheduler([cpu, cpu])
    sched = Scheduler([acc, cpu], parallel=True, n_copies=3)
    assert sched.n_copies == 3 and sched.n_backends == 2 and sched.backend(1) is cpu
    with pytest.raises(ValueError, match="parallel=True"):
        Scheduler([acc, cpu], n_copies=3)


def test_pinned_nodes_run_where_asked_and_bad_pins_are_refused(
    cpu: tp.Backend, acc: AccelBackend
) -> None:
    m = schedkit.build_llama(**CFG)
    load_weights(m, m.weight_values(), lambda _: acc.buffer_type())
    gate = next(n for n in m.graph.nodes if n.op is tp.Op.GLU)
    sched = Scheduler([acc, cpu])
    sched.set_tensor_backend(gate, cpu)
    assert sched.get_tensor_backend(gate) is cpu
    sched.alloc_graph(m.graph)
    m.set_inputs(m.input_values())
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    assert sched.get_tensor_backend(gate) is cpu
    np.testing.assert_allclose(
        tp.get_array(m.logits), cpu_only_logits(cpu, CFG), rtol=1e-4, atol=1e-4
    )
    sched.reset()
    assert sched.get_tensor_backend(gate) is None  # reset forgets pins
    soft_max = next(n for n in m.graph.nodes if n.op is tp.Op.SOFT_MAX)
    sched.set_tensor_backend(soft_max, acc)
    with pytest.raises(UnsupportedError, match="does not support"):
        sched.alloc_graph(m.graph)


def test_split_inputs_are_rewritten_then_restored(cpu: tp.Backend, acc: AccelBackend) -> None:
    m = schedkit.build_llama(**CFG)
    load_weights(m, m.weight_values(), lambda _: acc.buffer_type())
    original = {id(n): n.src for n in m.graph.nodes}
    sched = Scheduler([acc, cpu])
    sched.alloc_graph(m.graph)
    rope = next(n for n in m.graph.nodes if n.op is tp.Op.ROPE)
    assert rope.src[0] is not original[id(rope)][0]  # reads the CPU copy of its input
    assert rope.src[0].buffer.buft is cpu.buffer_type() and rope.src[0].name.startswith(
        f"{cpu.name}#"
    )
    sched.reset()
    assert all(n.src is original[id(n)] for n in m.graph.nodes)
    assert m.logits.buffer is None  # its memory was handed back


def test_more_inputs_in_one_split_than_ggml_allows(cpu: tp.Backend, acc: AccelBackend) -> None:
    x = tp.new_tensor(Type.F32, (4, 16), "x").set_input()
    parts = [ops.soft_max(ops.scale(x, 0.1 * (i + 1))).set_name(f"p{i}") for i in range(14)]
    total = parts[0]
    adds = []
    for p in parts[1:]:
        total = total + p
        adds.append(total)
    g = tp.Graph(parts)  # every soft_max first (on the CPU), then the sums
    g.expand(total.set_output())
    sched = Scheduler([acc, cpu])
    for a in adds:
        sched.set_tensor_backend(a, acc)
    sched.alloc_graph(g)
    xv = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    tp.set_array(x, xv)
    assert sched.graph_compute(g) is tp.Status.SUCCESS
    # the sums form one TESTACCEL split reading all 14 soft_max results (ggml: at most 10)
    assert max(len(s.inputs) for s in sched.splits) == 14
    logits = [xv * 0.1 * (i + 1) for i in range(14)]
    expected = sum(np.exp(e) / np.exp(e).sum(-1, keepdims=True) for e in logits)
    np.testing.assert_allclose(tp.get_array(total), expected, rtol=1e-5)


def test_eval_callback_batches_unobserved_nodes_and_can_cancel_everything(
    cpu: tp.Backend, acc: AccelBackend
) -> None:
    m = schedkit.build_llama(**CFG)
    load_weights(m, m.weight_values(), lambda _: acc.buffer_type())
    expected = cpu_only_logits(cpu, CFG)
    sched = Scheduler([acc, cpu])
    seen: list[tuple[str, float]] = []

    def watch(t: tp.Tensor, ask: bool) -> bool:
        if ask:
            return t.name.startswith("l_out.")
        seen.append((t.name, float(np.abs(tp.get_array(t)).sum())))
        return True

    sched.set_eval_callback(watch)
    sched.alloc_graph(m.graph)
    m.set_inputs(m.input_values())
    acc.log.clear()
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    assert [name for name, _ in seen] == ["l_out.0", "l_out.1"]
    assert all(v > 0 for _, v in seen)
    np.testing.assert_allclose(tp.get_array(m.logits), expected, rtol=1e-4, atol=1e-4)
    # one compute call per TESTACCEL split, plus one more where an observed node splits it
    acc_splits = sum(s.backend_id == 0 for s in sched.splits)
    assert sum(e.startswith("compute") for e in acc.log) == acc_splits + 2

    asked: list[str] = []

    def cancel(t: tp.Tensor, ask: bool) -> bool:
        if ask:
            asked.append(t.name)
            return t.name == "l_out.0"
        return False  # seen l_out.0: stop everything

    sched.set_eval_callback(cancel)
    acc.log.clear()
    assert sched.graph_compute(m.graph) is tp.Status.ABORTED
    # nothing after l_out.0 was computed or even asked about, on either backend
    order = [n.name for n in m.graph.nodes]
    assert asked[-1] == "l_out.0" and len(asked) == order.index("l_out.0") + 1
    started = sum(s.backend_id == 0 and s.start <= order.index("l_out.0") for s in sched.splits)
    assert sum(e.startswith("compute") for e in acc.log) == started


def test_pipeline_parallel_copies_alternate_and_overlap_with_events(
    cpu: tp.Backend, acc: AccelBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORPLUG_SCHED_COPIES", "3")
    sched = Scheduler([acc, cpu], parallel=True)
    assert sched.n_copies == 3
    models = [schedkit.build_llama(**CFG) for _ in range(4)]
    expected = cpu_only_logits(cpu, CFG)
    slots: list[tuple[str, int]] = []
    for m in models:
        load_weights(m, m.weight_values(), lambda _: acc.buffer_type())
    sched.reserve(models[0].graph)
    for m in models:
        sched.reset()
        sched.alloc_graph(m.graph)
        m.set_inputs(m.input_values())
        rope = next(n for n in m.graph.nodes if n.op is tp.Op.ROPE)
        slots.append((rope.src[0].name, rope.src[0].offset))
        assert sched.graph_compute_async(m.graph) is tp.Status.SUCCESS
        # the last split is TESTACCEL's: its work is still queued when we go on
        assert acc.queue
    sched.synchronize()
    # consecutive graphs read their inputs from different copy slots, cycling every 3
    assert [name[-1] for name, _ in slots] == ["0", "1", "2", "0"]
    assert len({off for _, off in slots[:3]}) == 3
    np.testing.assert_allclose(tp.get_array(models[-1].logits), expected, rtol=1e-4, atol=1e-4)
    assert "record" in acc.log  # splits with inputs mark their copy slot with an event


def test_pipeline_copies_reserve_a_slot_per_copy_for_graph_inputs_too(cpu: tp.Backend) -> None:
    """Each extra copy adds, in the CPU's compute buffer, one slot for every split input
    copied to the CPU and one for every graph input (tokens, pos, mask), as in ggml."""
    align = cpu.buffer_type().alignment

    def aligned(t: tp.Tensor) -> int:
        return -(-t.nbytes // align) * align

    sizes, per_copy = [], set()
    for n_copies in (2, 3, 4):
        acc = schedkit.TestAccelReg(n_devices=1).devices()[0].init_backend("min_batch=4")
        m = schedkit.build_llama(**CFG)
        load_weights(m, m.weight_values(), lambda _, acc=acc: acc.buffer_type())
        sched = Scheduler([acc, cpu], parallel=True, n_copies=n_copies)
        sched.alloc_graph(m.graph)
        sizes.append(sched.buffer_size(cpu))
        on_cpu = [sp for sp in sched.splits if sched.backends[sp.backend_id] is cpu]
        to_cpu = [i for sp in on_cpu for i in sp.inputs]
        inputs = [t for t in m.graph.leafs if t.flags & tp.TensorFlag.INPUT]
        assert {t.name for t in inputs} == {"tokens", "pos", "mask"}
        per_copy.add(sum(map(aligned, to_cpu)) + sum(map(aligned, inputs)))
    assert len(per_copy) == 1 and per_copy.pop() == sizes[1] - sizes[0] == sizes[2] - sizes[1]


def test_async_copies_between_two_accelerators(cpu: tp.Backend, reg: schedkit.TestAccelReg) -> None:
    acc0, acc1 = (d.init_backend() for d in reg.devices())
    m = schedkit.build_llama(**CFG)
    load_weights(
        m, m.weight_values(),
        lambda n: (acc1 if n.endswith(".1") or n.startswith("output") else acc0).buffer_type(),
    )  # fmt: skip
    sched = Scheduler([acc0, acc1, cpu])
    sched.alloc_graph(m.graph)
    m.set_inputs(m.input_values())
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    names = {b.name for b in (sched.get_tensor_backend(n) for n in m.graph.nodes) if b}
    assert names == {"TestAccel0", "TestAccel1", cpu.name}
    assert "copy" in acc0.log and "wait" in acc1.log  # queued on the source stream
    np.testing.assert_allclose(
        tp.get_array(m.logits), cpu_only_logits(cpu, CFG), rtol=1e-4, atol=1e-4
    )


def test_tensor_copy_async_queues_on_the_source_stream_and_checks_layouts(
    reg: schedkit.TestAccelReg,
) -> None:
    acc0, acc1 = (d.init_backend() for d in reg.devices())
    src, dst = tp.new_tensor(Type.F32, (6,), "src"), tp.new_tensor(Type.F32, (6,), "dst")
    alloc_tensors([src], acc0.buffer_type())
    alloc_tensors([dst], acc1.buffer_type())
    vals = np.arange(6, dtype=np.float32) - 2.5
    tp.tensor_set_async(acc0, src, vals)
    tp.tensor_copy_async(acc0, acc1, src, dst)
    # the device-to-device path: queued after the write on the source stream, the
    # destination waits for it; nothing has run yet (no synchronous fallback)
    assert acc0.log == [] and len(acc0.queue) == 3 and len(acc1.queue) == 1
    acc1.synchronize()
    assert acc0.log == ["set", "copy", "record"] and acc1.log == ["wait"]
    np.testing.assert_array_equal(tp.get_array(dst), vals)
    with pytest.raises(tp.LayoutMismatchError, match="tensor_copy_async: .* differ in layout"):
        tp.tensor_copy_async(acc0, acc1, src, tp.ops.reshape(dst, (2, 3)))


def test_allocation_failure_is_an_exception_and_recoverable(cpu: tp.Backend) -> None:
    reg = schedkit.TestAccelReg(n_devices=1)
    dev = reg.devices()[0]
    acc = dev.init_backend("min_batch=16")  # host weights: mul_mats offloaded from 16 tokens
    small = schedkit.build_llama(**{**CFG, "n_tokens": 16})
    big = schedkit.build_llama(**{**CFG, "n_tokens": 64})
    for m in (small, big):
        load_weights(m, m.weight_values(), lambda _: cpu.buffer_type())
    probe = Scheduler([acc, cpu])
    probe.reserve(small.graph)
    need = probe.buffer_size(acc)
    probe.free()
    dev.capacity = dev.used + need + 1024  # room for the small graph only
    sched = Scheduler([acc, cpu])
    with pytest.raises(AllocationError, match="TestAccel0_VRAM"):
        sched.reserve(big.graph)
    sched.alloc_graph(small.graph)
    small.set_inputs(small.input_values())
    assert sched.graph_compute(small.graph) is tp.Status.SUCCESS
    assert sched.buffer_size(acc) == need
    np.testing.assert_allclose(
        tp.get_array(small.logits), cpu_only_logits(cpu, {**CFG, "n_tokens": 16}),
        rtol=1e-4, atol=1e-4,
    )  # fmt: skip


def test_debug_prints_the_assignment(
    cpu: tp.Backend, acc: AccelBackend, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    m = schedkit.build_llama(**{**CFG, "n_layer": 1})
    load_weights(m, m.weight_values(), lambda _: acc.buffer_type())
    sched = Scheduler([acc, cpu])
    monkeypatch.setenv("TENSORPLUG_SCHED_DEBUG", "1")
    sched.alloc_graph(m.graph)
    lines = capsys.readouterr().err.splitlines()
    acc_in = "## SPLIT #{}: TestAccel0 # 1 inputs: [{}]"
    cpu_in = "## SPLIT #{}: CPU # 1 inputs: [{}]"
    assert [x for x in lines if x.startswith("##")] == [
        acc_in.format(0, "tokens (0K)"),
        cpu_in.format(1, "reshape (0K)"),  # k before rope
        acc_in.format(2, "permute (0K)"),
        cpu_in.format(3, "reshape (1K)"),  # q before rope
        acc_in.format(4, "permute (1K)"),
        cpu_in.format(5, "mul_mat (1K)"),  # kq before soft_max
        acc_in.format(6, "kq_soft_max.0 (1K)"),
    ]
    nodes = [x for x in lines if x.startswith("node #")]
    assert len(nodes) == len([n for n in m.graph.nodes if n.view_src is None])
    assert nodes[0] == (
        "node #  0 (  get_rows):                 embd (1K) [TestAccel0]: "
        "tok_embd (12K) [TestAccel0] TestAccel0#tokens#0 (0K) [TestAccel0]"
    )  # its input, copied to the accelerator, is named after the copy
    assert (
        "node #  9 (      rope):                  k.0 (0K) [CPU]: "
        "CPU#reshape#0 (0K) [CPU] pos (0K) [CPU]"
    ) in nodes
    monkeypatch.setenv("TENSORPLUG_SCHED_DEBUG", "0")
    sched.alloc_graph(m.graph)
    assert capsys.readouterr().err == ""


def test_the_test_plugin_loads_through_the_registry() -> None:
    from tensorplug import registry

    reg = registry.load(schedkit.PLUGIN_ROOT)  # a folder holding the package
    try:
        assert reg.name == "TESTACCEL" and [d.name for d in reg.devices()] == [
            "TestAccel0", "TestAccel1",
        ]  # fmt: skip
        assert registry.dev_by_name("TestAccel1") is reg.devices()[1]
    finally:
        registry.unload(reg)
    assert registry.dev_by_name("TestAccel1") is None


def test_prepare_readies_every_split_on_its_backend_and_computes_nothing(
    cpu: tp.Backend, acc: AccelBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Scheduler.prepare`` allocates the graph and hands each split's graph to its
    backend's ``graph_prepare`` (TESTACCEL keeps the default: nothing), computing none;
    the compute after it runs those very graphs, and the CPU backend binds no plan for
    them again."""
    m = schedkit.build_llama(**CFG)
    wv, iv = m.weight_values(), m.input_values()
    load_weights(m, wv, lambda _: acc.buffer_type())
    sched = Scheduler([acc, cpu])
    prepared: list[tuple[str, tp.Graph]] = []
    computed: list[tuple[str, tp.Graph]] = []
    for be in (acc, cpu):
        for hook, seen in (("_graph_prepare", prepared), ("_graph_compute", computed)):
            original = getattr(be, hook)

            def record(graph, original=original, seen=seen, name=be.name):  # type: ignore[no-untyped-def]
                seen.append((name, graph))
                return original(graph)

            monkeypatch.setattr(be, hook, record)
    sched.prepare(m.graph)
    assert computed == []
    assert [(name, id(g)) for name, g in prepared] == [
        (sched.backends[s.backend_id].name, id(s.graph)) for s in sched.splits
    ]
    assert {name for name, _ in prepared} == {acc.name, cpu.name}
    bound = kept_plans(cpu)
    monkeypatch.setattr(cpu, "_run", cpu._run)  # type: ignore[attr-defined]  # put back after
    ran = record_runs(cpu)
    m.set_inputs(iv)
    assert sched.graph_compute(m.graph) is tp.Status.SUCCESS
    assert [(name, id(g)) for name, g in computed] == [(n, id(g)) for n, g in prepared]
    assert ran and set(ran) <= bound  # the plans prepare bound, none bound again
    np.testing.assert_allclose(
        tp.get_array(m.logits), schedkit.llama_reference(m, wv, iv), rtol=1e-4, atol=1e-4
    )
