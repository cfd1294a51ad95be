"""Remote devices on a local Ray cluster: two actors with CPU backends, as on two nodes.

One private cluster (``ray.init(num_cpus=2)``, a few seconds) serves the module. The
same checks run against a real cluster by pointing TENSORPLUG_RAY_ADDRESS at it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import ops

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e plugins/ray)")
from test_cpu_helpers import ggml_gelu  # noqa: E402

from tensorplug_ray import device as ray_device  # noqa: E402
from tensorplug_ray.settings import DeviceRequest  # noqa: E402

#: starting the private cluster is most of the module's time
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reg() -> Iterator[ray_device.RayReg]:
    started_here = not ray.is_initialized()
    if started_here:
        # logical CPUs: each remote CPU device's actor reserves one, and the tests start
        # three such actors on this (2-core) machine
        ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)  # fmt: skip
    reg = ray_device.RayReg(ray_device.start_devices([DeviceRequest("CPU", 2)], 120), "local")
    yield reg
    for dev in reg.devices():
        ray.kill(dev.actor)  # type: ignore[attr-defined]
    if started_here:
        ray.shutdown()


@pytest.fixture(scope="module")
def backends(reg: ray_device.RayReg) -> list[tp.Backend]:
    return [d.init_backend() for d in reg.devices()]


def _on(backend: tp.Backend, values: np.ndarray, name: str = "") -> tp.Tensor:
    t = tp.new_tensor("f32", values.shape, name)
    tp.alloc_tensors([t], backend.buffer_type())
    tp.set_array(t, values)
    return t


def test_devices_describe_the_remote_device_and_its_node(reg: ray_device.RayReg) -> None:
    devs = list(reg.devices())
    assert [d.name for d in devs] == ["Ray0", "Ray1"]
    for d in devs:
        assert d.type is tp.DeviceType.CPU
        assert "through CPU on node" in d.description
        free, total = d.memory()
        assert 0 < free <= total
        assert d.caps.asynchronous and d.caps.events
    assert reg.features()["nodes"]


def test_conformance_on_a_remote_device(
    tensorplug_case: Any, tensorplug_check: Callable[..., Any], backends: list[tp.Backend]
) -> None:
    tensorplug_check(tensorplug_case, backend=backends[0])


def test_graph_results_match_and_repeats_send_only_a_digest(
    backends: list[tp.Backend], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(1)
    be = backends[0]
    a_np, b_np = (
        rng.standard_normal((4, 16), dtype=np.float32),
        rng.standard_normal(16, dtype=np.float32),
    )
    a, b = _on(be, a_np), _on(be, b_np)
    y = ops.gelu(ops.add(a, b))
    g = tp.Graph(y)
    tp.alloc_tensors([n for n in g.nodes], be.buffer_type())
    sent: list[Any] = []
    real_call = ray_device.RayDevice.call

    def spy(self: ray_device.RayDevice, method: str, *args: Any) -> Any:
        if method == "compute":
            sent.append(args[1])
        return real_call(self, method, *args)

    monkeypatch.setattr(ray_device.RayDevice, "call", spy)
    for _ in range(3):
        be.graph_compute(g)
    assert sent[0] is not None and sent[1:] == [None, None]
    # the actors compute on the CPU backend, whose GELU is ggml's f16 table lookup
    expected = ggml_gelu(a_np + b_np)
    np.testing.assert_allclose(tp.get_array(y), expected, rtol=1e-6, atol=1e-7)


def test_copy_between_remote_devices_goes_actor_to_actor(
    backends: list[tp.Backend], monkeypatch: pytest.MonkeyPatch
) -> None:
    values = np.arange(3 << 18, dtype=np.float32).reshape(3, -1)  # 3 MiB: through ray.put
    src = _on(backends[0], values)
    dst = tp.new_tensor("f32", values.shape)
    tp.alloc_tensors([dst], backends[1].buffer_type())
    asked: list[str] = []
    real_ask = ray_device.RayDevice.ask

    def spy(self: ray_device.RayDevice, method: str, *args: Any) -> Any:
        asked.append(method)
        return real_ask(self, method, *args)

    monkeypatch.setattr(ray_device.RayDevice, "ask", spy)
    tp.tensor_copy_async(backends[0], backends[1], src, dst)
    backends[1].synchronize()
    assert "read" not in asked  # no byte came through this process
    monkeypatch.undo()
    np.testing.assert_array_equal(tp.get_array(dst), values)


def test_async_reads_fill_at_synchronize(backends: list[tp.Backend]) -> None:
    values = np.linspace(-1, 1, 64, dtype=np.float32)
    t = _on(backends[1], values)
    out = np.zeros_like(values)
    tp.tensor_get_async(backends[1], t, out)
    backends[1].synchronize()
    np.testing.assert_array_equal(out, values)


def test_remote_errors_name_the_device_and_node(backends: list[tp.Backend]) -> None:
    t = _on(backends[0], np.zeros(8, np.float32))
    dev = backends[0].device
    with pytest.raises(tp.OutOfBoundsError, match=r"remote device Ray0 \(node .*\), read"):
        dev.ask("read", t.buffer.handle, 0, 1 << 30)  # type: ignore[attr-defined,union-attr]
    # the device keeps working after a refused call
    np.testing.assert_array_equal(tp.get_array(t), np.zeros(8, np.float32))


def test_a_malformed_description_is_refused_by_the_actor(backends: list[tp.Backend]) -> None:
    dev = backends[0].device
    node = {"kind": "node", "op": "rm -rf", "type": "F32", "shape": [1], "strides": [4],
            "src": [], "params": []}  # fmt: skip
    bad = {"v": 1, "tensors": [node], "nodes": [0]}
    with pytest.raises(tp.TensorplugError, match="unknown op 'rm -rf'"):
        dev.ask("compute", "deadbeef", bad)  # type: ignore[attr-defined]
    with pytest.raises(ray_device.RemoteDeviceError, match="not cached"):
        dev.ask("compute", "never-sent", None)  # type: ignore[attr-defined]


def _wait_until_dead(actor: Any, seconds: float = 60.0) -> None:
    """Block until calls to ``actor`` fail, on a handle call of the test's own (the
    device under test keeps no record of it)."""
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.memory.remote(), timeout=1.0)
        except RayActorError:
            return
        except GetTimeoutError:
            continue
        time.sleep(0.05)
    raise AssertionError(f"the killed actor still answered after {seconds} s")


def test_a_killed_actor_is_a_clear_error_and_the_others_keep_working(
    backends: list[tp.Backend],
) -> None:
    lone = ray_device.RayReg(ray_device.start_devices([DeviceRequest("CPU", 1)], 120), "local")
    dev = lone.devices()[0]
    assert isinstance(dev, ray_device.RayDevice)
    be = dev.init_backend()
    t = _on(be, np.ones(4, np.float32))
    ray.kill(dev.actor)
    _wait_until_dead(dev.actor)  # ray.kill returns first: a read could still get through
    with pytest.raises(ray_device.RemoteDeviceLostError, match=r"Ray0 \(CPU on node .*\) is gone"):
        tp.get_array(t)
    with pytest.raises(ray_device.RemoteDeviceLostError, match="is gone"):  # no waiting
        tp.set_array(t, np.zeros(4, np.float32))
    survivor = _on(backends[1], np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(tp.get_array(survivor), np.full(4, 2.0, np.float32))


def test_a_cluster_without_room_is_an_error_not_a_hang(reg: ray_device.RayReg) -> None:
    with pytest.raises(tp.PluginError, match=r"did not start 8 remote device\(s\) within 1 s"):
        ray_device.start_devices([DeviceRequest("CPU", 8)], 1.0)


def test_tiny_llama_over_two_remote_devices_matches_a_local_run(
    backends: list[tp.Backend], tmp_path: Any
) -> None:
    from tensorplug_llm.placement import Placement, host_cpu
    from tensorplug_llm.runner import ModelRunner
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", "f32", 3)
    tokens = [1, 259, 288, 300, 270, 265, 280, 290]
    logits = []
    for placement in (Placement.on(host_cpu(), 2),
                      Placement.spread([b.device for b in backends], 2)):  # fmt: skip
        m = ModelRunner(path, placement=placement, cache_type="f32")
        try:
            logits.append(m.eval(tokens, all_logits=True))
            logits.append(m.eval([300]))  # one decode step through the cache
        finally:
            m.close()
    for local, remote in zip(logits[:2], logits[2:], strict=True):
        assert np.abs(remote - local).max() <= 1e-5 * np.abs(local).max()


def test_check_cli_runs_against_a_remote_device(reg: ray_device.RayReg) -> None:
    env = dict(os.environ, TENSORPLUG_RAY_ADDRESS=ray.get_runtime_context().gcs_address,
               TENSORPLUG_RAY_DEVICES="CPU:1")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "tensorplug", "check", "--backend", "Ray0", "--op", "mul_mat",
         "--output", "json"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    report = json.loads(done.stdout)
    assert report["backend"] == "Ray0" and report["ok"]
    assert (
        report["summary"]["total"] >= 10 and report["summary"]["pass"] == report["summary"]["total"]
    )
