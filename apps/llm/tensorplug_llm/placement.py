"""Which device holds each part of a model, and the scheduler's backend order.

A :class:`Placement` names a device for the input layer (token embeddings), for each
block and for the output layer; a block's KV cache lives with the block. The
scheduler then runs every op where its weights are and copies activations between
devices at the boundaries, as llama.cpp does with ``--n-gpu-layers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tensorplug import registry, settings
from tensorplug.device import Device, DeviceType, is_host_cpu
from tensorplug.discovery import explain_missing
from tensorplug.errors import BackendNotFoundError
from tensorplug.priority import by_priority, host_cpu

__all__ = [
    "Placement",
    "accelerators",
    "best_accelerator",
    "by_priority",
    "host_cpu",
    "is_host_cpu",
    "selected_devices",
]


def best_accelerator() -> Device | None:
    """The best registered GPU or integrated GPU, or None.

    As in llama.cpp, only GPUs are offload targets. An ACCEL device (a backend that
    helps the CPU from the host: BLAS, JAX on the CPU) and a CPU-type device with its
    own buffers (OpenCL on PoCL) run on the same cores as the CPU backend, so they are
    never chosen by default — as ``init_best`` never chooses them — only when named."""
    gpus = (DeviceType.GPU, DeviceType.IGPU)
    return next((d for d in by_priority(registry.devices()) if d.type in gpus), None)


def accelerators() -> list[Device]:
    """Every registered GPU and integrated GPU, best first (:func:`best_accelerator`'s
    candidates): llama.cpp's GPU indices ``main_gpu`` and ``tensor_split`` count them."""
    gpus = (DeviceType.GPU, DeviceType.IGPU)
    return [d for d in by_priority(registry.devices()) if d.type in gpus]


def selected_devices() -> list[Device]:
    """The devices of the backends ``TENSORPLUG_BACKENDS`` lists, in its order (none
    when it is unset). The first is where ``run`` places a model; the host CPU backend,
    loaded as the fallback whether listed or not, is among them only when listed."""
    devices = registry.devices()
    return [
        d
        for name in settings.BACKENDS.get()
        for d in devices
        if d.reg is not None and d.reg.name.casefold() == name.casefold()
    ]


def device_named(name: str) -> Device:
    """The registered device called ``name``; when there is none, the error says why as
    ``tensorplug check --backend`` does: the plugin that would provide it is not
    installed, cannot run here (no driver), is disabled or failed to load."""
    dev = registry.dev_by_name(name)
    if dev is None:
        names = ", ".join(d.name for d in registry.devices()) or "none"
        why, _ = explain_missing(registry.plugin_records(), name, f"no device named {name!r}:")
        raise BackendNotFoundError(f"{why} Registered devices: {names} (`tensorplug devices`)")
    return dev


@dataclass(frozen=True)
class Placement:
    input: Device
    layers: tuple[Device, ...]
    output: Device

    @classmethod
    def on(cls, device: Device, n_layer: int) -> Placement:
        """Everything on ``device``."""
        return cls(device, (device,) * n_layer, device)

    @classmethod
    def offload(
        cls, n_layer: int, n_gpu_layers: int, gpu: Device | None = None, cpu: Device | None = None
    ) -> Placement:
        """llama.cpp's ``--n-gpu-layers N``: the last ``N`` blocks on ``gpu`` (default
        :func:`best_accelerator`), the output layer too when ``N > n_layer``, the rest and
        the token embeddings on the CPU. Without a GPU everything stays on the CPU."""
        cpu = cpu or host_cpu()
        gpu = gpu or best_accelerator() or cpu
        n = max(0, min(n_gpu_layers, n_layer + 1))
        first_gpu = n_layer - min(n, n_layer)
        layers = tuple(gpu if i >= first_gpu else cpu for i in range(n_layer))
        return cls(cpu, layers, gpu if n > n_layer else cpu)

    @classmethod
    def offload_split(
        cls, n_layer: int, n_gpu_layers: int, gpus: Sequence[Device], shares: Sequence[float]
    ) -> Placement:
        """llama.cpp's layer split (``split_mode`` layer with ``tensor_split``): the last
        ``n_gpu_layers`` blocks over ``gpus`` in consecutive runs sized by ``shares``
        (the first accelerator takes the first of them), the output layer on the one the
        split gives position ``n_layer`` when ``n_gpu_layers > n_layer``; the rest and the
        token embeddings on the CPU."""
        cpu = host_cpu()
        n = max(0, min(n_gpu_layers, n_layer + 1))  # offloaded: blocks, the output last
        first = n_layer - min(n, n_layer)
        total = sum(shares)
        bounds, run = [], 0.0
        for share in shares:
            run += share / total
            bounds.append(run)

        def device(i: int) -> Device:  # llama.cpp: upper_bound over the cumulative shares
            at = (i - first) / max(n, 1)
            k = next((j for j, b in enumerate(bounds) if b > at), len(bounds) - 1)
            return gpus[k]

        layers = tuple(device(i) if i >= first else cpu for i in range(n_layer))
        return cls(cpu, layers, device(n_layer) if n > n_layer else cpu)

    @classmethod
    def spread(cls, devices: Sequence[Device], n_layer: int) -> Placement:
        """Blocks in equal consecutive shares over ``devices``: the host CPU's share first,
        the best device's last, with the output layer; embeddings on the host CPU (or
        the last device of the list when it has no host CPU)."""
        order = list(reversed(by_priority(devices)))
        if not order:
            raise BackendNotFoundError(
                "no device to place the model on: no backend plugin is loaded (see "
                "`tensorplug doctor`; install one, e.g. pip install -e plugins/cpu, or check "
                "TENSORPLUG_DISABLE and TENSORPLUG_BACKENDS)"
            )
        k = len(order)
        layers = tuple(order[min(i * k // max(n_layer, 1), k - 1)] for i in range(n_layer))
        first = order[0] if is_host_cpu(order[0]) else order[-1]
        return cls(first, layers, order[-1])

    def devices(self) -> list[Device]:
        """The distinct devices used, best first."""
        return by_priority([self.input, *self.layers, self.output])

    def describe(self) -> str:
        parts = [f"token_embd: {self.input.name}"]
        start = 0
        for i in range(1, len(self.layers) + 1):
            if i == len(self.layers) or self.layers[i] is not self.layers[start]:
                span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
                parts.append(f"blocks {span}: {self.layers[start].name}")
                start = i
        parts.append(f"output: {self.output.name}")
        return ", ".join(parts)
