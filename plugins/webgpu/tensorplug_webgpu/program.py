"""WGSL kernels compiled kernel by kernel into compute pipelines, over the runtime base.

WebGPU compiles one shader module per kernel (naga, inside wgpu-native), so the program
builds a kernel the first time a launch asks for it. A kernel comes in two variants:
plain, and with the bindings it writes declared atomic (``<name>+atomic``), used when
an output is narrower than a word (f16, bf16, 8- and 16-bit integers, quantized blocks)
so that two work-items writing halves of one word keep each other's bits.

naga's messages point at lines of the generated text; the log handed to
:class:`~tensorplug_kernels.runtime.KernelBuildError` says which kernel was compiled
and maps each line back to ``kernels/<group>.wgsl:<line>`` or to the prelude.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from tensorplug_kernels.abi import kernel_abis
from tensorplug_kernels.runtime import BuildFailed, KernelBuildError
from tensorplug_kernels.runtime import KernelProgram as BaseProgram

from .wgsl import SECTION_MARK, kernel_source, wgsl_kernels

__all__ = ["ATOMIC", "Pipeline", "WgslProgram", "located_log"]

#: Suffix of a kernel's variant whose written bindings are atomic.
ATOMIC = "+atomic"

_LOCATION = re.compile(r"wgsl:(\d+):(\d+)")


@dataclass(frozen=True)
class Pipeline:
    """A compiled kernel: its compute pipeline and the layout its bind groups follow."""

    name: str
    pipeline: Any
    layout: Any
    nbuffers: int


class WgslProgram(BaseProgram):
    """The WGSL kernels of one WebGPU device (``device``: the ``wgpu.GPUDevice``)."""

    runtime = "WebGPU"
    compiler = "naga (wgpu-native)"
    located = True

    def __init__(self, label: str, device: Any, wg: int) -> None:
        self.device = device
        self.wg = wg
        super().__init__(label)

    @property
    def kernel_names(self) -> Collection[str]:
        names = wgsl_kernels()
        return {*names, *(n + ATOMIC for n in names)}

    def _compile(self, text: str, name: str | None) -> Any:
        import wgpu

        try:
            return self.device.create_shader_module(code=text, label=name or "")
        except wgpu.GPUError as e:
            raise BuildFailed(located_log(str(e), text)) from e

    def _kernel(self, name: str) -> Pipeline:
        import wgpu

        base = name.removesuffix(ATOMIC)
        module = self.compile(kernel_source(base, self.wg, name.endswith(ATOMIC)), base)
        abi = kernel_abis()[wgsl_kernels()[base].abi]
        storage = wgpu.BufferBindingType.storage
        entries = [
            {"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE,
             "buffer": {"type": wgpu.BufferBindingType.read_only_storage}},
            *({"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": storage}}
              for i in range(1, len(abi.buffers) + 1)),
        ]  # fmt: skip
        try:
            layout = self.device.create_bind_group_layout(entries=entries)
            pipeline = self.device.create_compute_pipeline(
                layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": "main"},
                label=name,
            )
        except wgpu.GPUError as e:  # the shader compiled but the device refuses it
            raise KernelBuildError(
                f"{self.label}: {self.compiler} could not make a pipeline of {base}: {e}",
                kernel=base,
                log=str(e),
            ) from e
        return Pipeline(name, pipeline, layout, len(abi.buffers))


def located_log(log: str, text: str) -> str:
    """naga's ``log`` with the lines of the generated ``text`` named as the kernel
    files' (``kernels/<group>.wgsl:<line>``) or as the prelude."""
    m = SECTION_MARK.search(text)
    if m is None:
        return log
    src = wgsl_kernels()[m.group(1)]
    start = text.count("\n", 0, m.start()) + 2  # the section's first line

    def where(loc: re.Match[str]) -> str:
        line = int(loc.group(1))
        if line < start:
            return f"<prelude of {src.name}>:{line}:{loc.group(2)}"
        return f"kernels/{src.group}.wgsl:{src.line + line - start}:{loc.group(2)}"

    return f"while compiling {src.name}:\n" + _LOCATION.sub(where, log)
