"""The meta device: split states, their rules, the conformance catalogue and a row-split llama.

Members are the CPU backend and OpenCL0 (PoCL), a meta device of two different backends;
OpenCL0 + OpenCL1 (two PoCL devices, ``POCL_DEVICES="pthread pthread"``) run in a
subprocess, since PoCL reads that variable once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from pending_opencl import PENDING

import tensorplug as tp
from tensorplug import ops
from tensorplug.meta import MetaDevice, SplitState, even_sizes
from tensorplug.meta.split import check_state, host_assemble, host_slice, np_axis
from tensorplug.testing.runner import check_backend
from tensorplug.types import Type


def _device(name: str) -> tp.Device:
    dev = tp.dev_by_name(name)
    if dev is None:
        pytest.skip(
            f"no {name} device (install an OpenCL driver: pip install pocl-binary-distribution)"
        )
    return dev


def _meta(split_state: Callable[[tp.Tensor], SplitState | None] | None = None) -> MetaDevice:
    return tp.meta_device([_device("CPU"), _device("OpenCL0")], split_state)


# -- split arithmetic ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "weights", "gran", "expected"),
    [
        (64, [1, 1], 1, (32, 32)),
        (64, [3, 1], 1, (48, 16)),
        (96, [1, 1, 1], 32, (32, 32, 32)),
        (128, [3, 1], 32, (96, 32)),
        (8, [1, 2, 1], 1, (2, 4, 2)),
    ],
)
def test_even_sizes_follow_the_proportions(
    n: int, weights: list[float], gran: int, expected: tuple[int, ...]
) -> None:
    got = even_sizes(n, weights, gran)
    assert got == expected and sum(got) == n and all(g % gran == 0 for g in got)


@pytest.mark.parametrize(
    ("type_", "shape", "state"),
    [
        ("f32", (6, 10), SplitState.split(0, [3, 7])),
        ("f32", (6, 10), SplitState.split(1, [4, 2])),
        ("f16", (2, 3, 8), SplitState.split(2, [1, 1])),
        ("q8_0", (4, 96), SplitState.split(0, [64, 32])),
        ("f32", (3, 12), SplitState.split(0, [[2, 2], [1, 3], [4, 0]])),  # Q, K, V segments
    ],
)
def test_host_slices_put_back_together(
    type_: str, shape: tuple[int, ...], state: SplitState
) -> None:
    t = tp.new_tensor(type_, shape)
    rng = np.random.default_rng(0)
    full = rng.integers(0, 256, t.nbytes, dtype=np.uint8)
    parts = [host_slice(t, state, m, full) for m in range(state.n_members)]
    assert np.array_equal(host_assemble(t, state, parts), full)
    if type_ == "f32":  # and a part holds exactly the member's index ranges, by value
        values = full.view(np.float32).reshape(shape)
        ax = np_axis(int(state.axis), len(shape))
        want = np.concatenate([values.take(range(a, b), axis=ax) for a, b in state.ranges(0)], ax)
        assert np.array_equal(parts[0].view(np.float32).reshape(want.shape), want)


@pytest.mark.parametrize(
    ("shape", "state", "match"),
    [
        ((6, 10), SplitState.split(0, [3, 6]), "adds up to 9, not its extent 10"),
        ((4, 64), SplitState.split(0, [16, 48]), "inside its Q8_0 blocks of 32"),
        ((6, 10), SplitState.split(1, [6, 0]), "leaves a member with nothing"),
        ((10,), SplitState.split(1, [5, 5]), "has no axis 1"),
        ((6, 10), SplitState.split(1, [2, 2, 2]), "names 3 members"),
    ],
)
def test_states_that_do_not_fit_are_refused(
    shape: tuple[int, ...], state: SplitState, match: str
) -> None:
    t = tp.new_tensor("q8_0" if "Q8_0" in match else "f32", shape, "w")
    with pytest.raises(tp.ShapeError, match=match):
        check_state(t, state, 2)


def test_a_meta_device_needs_two_distinct_members() -> None:
    cpu = _device("CPU")
    with pytest.raises(ValueError, match="at least two"):
        tp.meta_device([cpu])
    with pytest.raises(ValueError, match="only once"):
        tp.meta_device([cpu, cpu])


# -- rules ----------------------------------------------------------------------------------


def _matmul_state(w_state: SplitState | None, x_state: SplitState | None) -> tuple[bool, str]:
    W = tp.new_tensor("f32", (64, 32), "w")
    x = tp.new_tensor("f32", (6, 32), "x")
    meta = _meta(lambda t: {"w": w_state, "x": x_state}.get(t.name))
    y = ops.mul_mat(W, x)
    if not meta.supports_op(y):
        return False, meta.unsupported_reason(y) or ""
    plan = meta.plan_of(y)
    return True, "partial" if plan.all_reduce else meta.state_of(y).describe()


@pytest.mark.parametrize(
    ("w", "x", "expected"),
    [
        (None, None, (True, "mirrored")),
        (SplitState.split(1, [40, 24]), None, (True, "axis 0 [40/24]")),  # column parallel
        (None, SplitState.split(1, [4, 2]), (True, "axis 1 [4/2]")),  # tokens
        (SplitState.split(0, [16, 16]), SplitState.split(0, [16, 16]), (True, "partial")),
        (SplitState.split(0, [16, 16]), None, (True, "partial")),  # x cut on the fly
        (SplitState.split(0, [16, 16]), SplitState.split(0, [8, 24]), (False, "reduction")),
        (SplitState.split(1, [32, 32]), SplitState.split(1, [3, 3]), (False, "no split rule")),
    ],
)
def test_mul_mat_split_rules(
    w: SplitState | None, x: SplitState | None, expected: tuple[bool, str]
) -> None:
    ok, what = _matmul_state(w, x)
    assert ok is expected[0]
    assert expected[1] in what


def test_unsupported_combinations_say_why() -> None:
    meta = _meta(lambda t: SplitState.split(0, [16, 16]) if t.name == "a" else None)
    a = tp.new_tensor("f32", (4, 32), "a")
    n = ops.rms_norm(a, 1e-5)
    assert not meta.supports_op(n)
    assert "rms_norm works along axis 0, which is split" in (meta.unsupported_reason(n) or "")
    s = ops.soft_max(tp.new_tensor("f32", (2, 4, 32), "x"), tp.new_tensor("f32", (4, 32), "m"))
    assert meta.supports_op(s)  # everything mirrored


def test_split_weights_round_trip_and_partial_writes_are_refused() -> None:
    meta = _meta(lambda t: SplitState.split(1, [3, 5]) if t.name == "w" else None)
    w = tp.new_tensor("f32", (8, 16), "w")
    buf = tp.alloc_tensors([w], meta.buffer_type())
    assert buf is not None and buf.size < w.nbytes  # each member holds at most 5 of 8 rows
    values = np.arange(128, dtype=np.float32).reshape(8, 16)
    tp.set_array(w, values)
    assert np.array_equal(tp.get_array(w), values)
    parts = buf.parts(w)  # type: ignore[attr-defined]
    assert [p.shape for p in parts] == [(3, 16), (5, 16)]
    assert np.array_equal(tp.get_array(parts[1]), values[3:])
    with pytest.raises(tp.UnsupportedError, match="only whole contiguous tensors"):
        tp.tensor_set(w, b"\0" * 16, offset=64)


# -- conformance --------------------------------------------------------------------------------


def _split_inputs(axis: int) -> Callable[[tp.Tensor], SplitState | None]:
    """Split every float input along ``axis`` in two (where it has room), like weights."""

    def state(t: tp.Tensor) -> SplitState | None:
        if t.type in (Type.I8, Type.I32, Type.I64) or t.ndim <= axis:
            return None
        n = t.shape[np_axis(axis, t.ndim)]
        gran = t.type.block_size if axis == 0 else 1
        if n % gran or n // gran < 2:
            return None
        return SplitState.split(axis, even_sizes(n, [1, 1], gran))

    return state


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_conformance_with_inputs_split_along_each_axis(axis: int) -> None:
    meta = _meta(_split_inputs(axis))
    report = check_backend(meta.init_backend())
    # an OpenCL member still computes the cases pending there (see pending_opencl)
    pending = PENDING if "OpenCL" in meta.name else {}
    failed = [
        f"{r.case}: {r.message}"
        for r in report.results
        if r.outcome.value == "fail" and str(r.case) not in pending
    ]
    assert not failed, "\n".join(failed[:10])
    assert report.count(type(report.results[0].outcome)("pass")) > 100


# -- llama, row split -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_gqa(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tensorplug_llm.tiny import write_tiny_llama

    folder = tmp_path_factory.mktemp("meta")
    return write_tiny_llama(
        folder / "gqa.gguf", "q8_0", 3, n_embd=128, n_head=8, n_head_kv=4, n_ff=192
    )


TOKENS = [1, 259, 288, 300, 270, 265, 280, 290]


def _assert_agree(got: np.ndarray, want: np.ndarray) -> None:
    """Logits of the same model on other devices. The CPU multiplies quantized weights
    by Q8_0-rounded activations for a few tokens (as ggml does), OpenCL in float32, so
    they are judged as ggml judges mul_mat across backends: NMSE within 5e-4 (a wrong
    split gives ~1), and the same top token at every position."""
    assert float(np.sum((got - want) ** 2) / np.sum(want**2)) <= 5e-4
    assert (got.argmax(-1) == want.argmax(-1)).all()


def _logits(path: Path, placement: object) -> tuple[np.ndarray, np.ndarray]:
    from tensorplug_llm.runner import ModelRunner

    m = ModelRunner(path, placement=placement, cache_type="f32", warmup=False)  # type: ignore[arg-type]
    try:
        return m.eval(TOKENS, all_logits=True), m.eval([300])
    finally:
        m.close()


@pytest.mark.parametrize("shares", [None, [3.0, 1.0]])
def test_row_split_llama_matches_one_device(tiny_gqa: Path, shares: list[float] | None) -> None:
    from tensorplug.gguf import GGUFFile
    from tensorplug_llm.placement import Placement, host_cpu
    from tensorplug_llm.row_split import row_split_device

    want = _logits(tiny_gqa, Placement.on(host_cpu(), 2))
    meta = row_split_device(GGUFFile(tiny_gqa), [_device("CPU"), _device("OpenCL0")], shares)
    q_rows = meta.split_state(tp.new_tensor("f32", (128, 128), "blk.0.attn_q.weight"))  # type: ignore[misc]
    assert q_rows is not None and q_rows.sizes == ((96, 32),) if shares else ((64, 64),)
    got = _logits(tiny_gqa, Placement.on(meta, 2))
    for g, w in zip(got, want, strict=True):
        _assert_agree(g, w)


def test_memory_shared_by_members_is_counted_once() -> None:
    """The host CPU backend and an OpenCL CPU driver both report the host's RAM; two
    members with one device_id are one GPU: the row split's header said 36.2 GiB."""
    from tensorplug.testing.refbackend import ReferenceDevice

    gib = 1 << 30

    class Fake(ReferenceDevice):
        def __init__(self, kind: tp.DeviceType, free: int, total: int, did: str | None) -> None:
            super().__init__()
            self.kind, self.figures, self.did = kind, (free * gib, total * gib), did

        @property
        def type(self) -> tp.DeviceType:
            return self.kind

        @property
        def device_id(self) -> str | None:
            return self.did

        def memory(self) -> tuple[int, int]:
            return self.figures

    cpu, pocl = Fake(tp.DeviceType.CPU, 20, 24, None), Fake(tp.DeviceType.CPU, 5, 12, None)
    assert MetaDevice([cpu, pocl]).memory() == (20 * gib, 24 * gib)
    gpu = Fake(tp.DeviceType.GPU, 6, 16, "pci:0000:01:00.0")
    same_gpu = Fake(tp.DeviceType.GPU, 7, 16, "pci:0000:01:00.0")
    other_gpu = Fake(tp.DeviceType.GPU, 1, 8, None)
    meta = MetaDevice([cpu, gpu, same_gpu, other_gpu, pocl])
    assert meta.memory() == ((20 + 7 + 1) * gib, (24 + 16 + 8) * gib)


def test_row_split_is_refused_clearly_when_it_cannot_work(tiny_gqa: Path) -> None:
    from tensorplug.gguf import GGUFFile
    from tensorplug_llm.row_split import row_split_device

    devs = [_device("CPU"), _device("OpenCL0")]
    with pytest.raises(tp.TensorplugError, match="gives 3 proportions for 2 devices"):
        row_split_device(GGUFFile(tiny_gqa), devs, [1, 1, 1])
    with pytest.raises(tp.TensorplugError, match="gives a device no share"):
        row_split_device(GGUFFile(tiny_gqa), devs, [1, 0])


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorplug", "run", *args], capture_output=True, text=True,
        env=env, timeout=300,
    )  # fmt: skip


def test_run_split_mode_row_from_the_command_line(tiny_gqa: Path, tmp_path: Path) -> None:
    from tensorplug_llm.placement import Placement, host_cpu

    _device("OpenCL0")
    out = tmp_path / "logits.npy"
    done = _run_cli(str(tiny_gqa), "--tokens", ",".join(map(str, TOKENS)), "-n", "2",
                    "--device", "CPU,OpenCL0", "--split-mode", "row", "--tensor-split", "3,1",
                    "--cache-type", "f32", "--logits-out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Meta(CPU,OpenCL0)" in done.stderr
    want = _logits(tiny_gqa, Placement.on(host_cpu(), 2))[0]
    _assert_agree(np.load(out), want)
    for args, message in [
        (["--device", "CPU", "--split-mode", "row"], "name at least two"),
        (["--device", "CPU,OpenCL0", "--split-mode", "row", "-ts", "1,1,1"], "3 proportions"),
        (["--device", "CPU,OpenCL0", "--split-mode", "row", "-ts", "1,x"], "list of numbers"),
    ]:
        bad = _run_cli(str(tiny_gqa), *args)
        assert bad.returncode != 0 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
        assert message in bad.stderr


def test_two_pocl_devices_as_one(tmp_path: Path) -> None:
    _device("OpenCL0")
    script = textwrap.dedent(
        """
        import numpy as np, tensorplug as tp
        from tensorplug.meta import SplitState, even_sizes
        from tensorplug.testing.runner import check_backend
        devs = [tp.dev_by_name("OpenCL0"), tp.dev_by_name("OpenCL1")]
        assert all(devs), [d.name for d in tp.devices()]
        def split(t):
            if t.type.name not in ("F32", "F16") or t.shape[-1] % 2:
                return None
            return SplitState.split(0, even_sizes(t.shape[-1], [1, 1]))
        report = check_backend(tp.meta_device(devs, split).init_backend(), ops=["mul_mat", "add"])
        fails = [r.case for r in report.results if r.outcome.value == "fail"]
        print("passed", report.count(report.results[0].outcome), "failed", fails)
        assert not fails
        """
    )
    env = dict(os.environ, POCL_DEVICES="pthread pthread")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
