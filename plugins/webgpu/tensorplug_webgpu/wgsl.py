"""WGSL kernel sources, put together from the kernel library's calling convention.

The shared kernel library declares each kernel's arguments struct once, in its
``.tpk`` sources, and :func:`tensorplug_kernels.abi.kernel_abis` parses those
declarations into the exact C layout the host packs. The WGSL kernels here do not
declare their structs: :func:`kernel_source` generates each WGSL struct from that same
parsed layout (and refuses one whose WGSL layout would differ), so the host, the
OpenCL/CUDA/Metal kernels and the WGSL kernels read one declaration. The encoder
(:func:`tensorplug_kernels.encode.encode`) is shared too: a WGSL kernel has the name,
the arguments and the work layout of its ``.tpk`` counterpart.

A kernel's text is: the constants and helpers of ``kernels/common.wgsl``; the generated
arguments struct and bindings (binding 0 the struct, then one ``array<u32>`` per buffer
parameter, in the ABI's order); per binding, the accessors of ``kernels/access.wgsl``
(words, bytes, halves, typed scalars, dequantization) with the binding's name; then
the kernel's section of its ``kernels/<group>.wgsl`` file, whose ``ENTRY`` is the
compute entry point. A binding the kernel ``//@writes`` is declared atomic in the
variant compiled for outputs narrower than a word, so that neighbouring work-items
writing the two halves of one word do not lose each other's bits.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

import numpy as np

from tensorplug_kernels.abi import TENSOR_DTYPE, KernelABI, kernel_abis

__all__ = [
    "GROUPS",
    "SECTION_MARK",
    "WgslKernel",
    "args_types",
    "field_name",
    "kernel_source",
    "wgsl_kernels",
]

#: The kernel files, in the order their sections are read.
GROUPS = ("elementwise", "rows", "matmul", "attention")

#: WGSL's words a struct field may not be called (the C names get a trailing "_").
_RESERVED = frozenset({"fn", "type", "let", "var", "loop", "const", "struct", "override"})

_SCALAR_WGSL = {"<i4": ("i32", 4, 4), "<u4": ("u32", 4, 4), "<f4": ("f32", 4, 4),
                "<i8": ("vec2<u32>", 8, 8), "<u8": ("vec2<u32>", 8, 8)}  # fmt: skip
_TENSOR_WGSL = ("TpTensor", 64, 8)  # common.wgsl's TpTensor: size 64, align 8, as in C

# one line, so that the kernel files' line numbers carry over to the generated text
_ENTRY = (
    "@compute @workgroup_size(WG, 1, 1) "
    "fn main(@builtin(local_invocation_id) lid: vec3<u32>, "
    "@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>)"
)
_SECTION = re.compile(r"^//@kernel (\w+)\n", re.MULTILINE)
_WRITES = re.compile(r"^//@writes (\w+)$", re.MULTILINE)
_ABI = re.compile(r"^//@abi (\w+)$", re.MULTILINE)
_INCLUDE = re.compile(r"^//@include (\w+)$", re.MULTILINE)
#: The line the generated text starts a kernel's own section with.
SECTION_MARK = re.compile(r"^// ---- kernel (\w+) ----$", re.MULTILINE)


@dataclass(frozen=True)
class WgslKernel:
    """One kernel's WGSL section: which file and line it starts at (for compiler
    messages), its text, the bindings it stores into, and the library kernel whose
    calling convention it has (its own name, or ``//@abi <kernel>`` for a WGSL-only
    variant such as the decode matrix-vector product)."""

    name: str
    group: str
    line: int
    body: str
    writes: frozenset[str]
    abi: str


def _text(name: str) -> str:
    return resources.files("tensorplug_webgpu").joinpath(f"kernels/{name}.wgsl").read_text()


@functools.cache
def wgsl_kernels() -> dict[str, WgslKernel]:
    """Every kernel written in WGSL, by name."""
    found: dict[str, WgslKernel] = {}
    for group in GROUPS:
        text = _text(group)
        marks = list(_SECTION.finditer(text))
        for m, nxt in zip(marks, [*marks[1:], None], strict=True):
            body = text[m.end() : nxt.start() if nxt else len(text)]
            line = text.count("\n", 0, m.end()) + 1
            writes = frozenset(_WRITES.findall(body))
            abi = _ABI.search(body)
            name = m.group(1)
            found[name] = WgslKernel(name, group, line, body, writes, abi.group(1) if abi else name)
    return found


def field_name(name: str) -> str:
    """The WGSL name of an arguments struct field."""
    return f"{name}_" if name in _RESERVED else name


def _struct(abi: KernelABI) -> str:
    """The WGSL declaration of ``abi``'s arguments struct, checked field by field against
    the C layout the host packs (WGSL's storage layout rules place them identically for
    the types the library uses; a future field that breaks this is refused here)."""
    lines, pos, align = [], 0, 4
    dtype = abi.dtype
    for name in dtype.names or ():
        sub, offset = dtype.fields[name][:2]  # type: ignore[index]
        wtype, size, al = _TENSOR_WGSL if sub == TENSOR_DTYPE else _SCALAR_WGSL[sub.str]
        pos = (pos + al - 1) // al * al
        if pos != offset:
            raise ValueError(
                f"{abi.struct_name}.{name}: WGSL places it at byte {pos}, the C struct at "
                f"{offset}; reorder the struct's fields in the kernel library"
            )
        lines.append(f"    {field_name(name)}: {wtype},")
        pos, align = pos + size, max(align, al)
    if (pos + align - 1) // align * align != dtype.itemsize:
        raise ValueError(f"{abi.struct_name}: WGSL and C sizes differ")
    return f"struct {abi.struct_name} {{\n" + "\n".join(lines) + "\n}\n"


def _accessors(name: str, atomic: bool) -> str:
    arr = f"buf_{name}"
    if atomic:
        read, write = f"atomicLoad(&{arr}[b >> 2u])", f"atomicStore(&{arr}[b >> 2u], v)"
        bits = (
            f"fn {name}_and(b: u32, m: u32) {{ atomicAnd(&{arr}[b >> 2u], m); }}\n"
            f"fn {name}_or(b: u32, m: u32) {{ atomicOr(&{arr}[b >> 2u], m); }}\n"
        )
    else:
        read, write = f"{arr}[b >> 2u]", f"{arr}[b >> 2u] = v"
        bits = (
            f"fn {name}_and(b: u32, m: u32) {{ {arr}[b >> 2u] &= m; }}\n"
            f"fn {name}_or(b: u32, m: u32) {{ {arr}[b >> 2u] |= m; }}\n"
        )
    text = _text("access").replace("$R", read).replace("$W", write).replace("$X", name)
    return bits + text


def _copy_from(src: str) -> str:
    """``copy_from_<src>``: one unit of ``ts`` bytes (an element or a quantized block)
    from binding ``src`` to binding ``d``, by words where both ends allow it."""
    return f"""
fn copy_from_{src}(db: u32, sb: u32, ts: u32) {{
    if (ts == 1u) {{ d_st8(db, {src}_u8(sb)); return; }}
    if (ts % 4u == 0u && (db & 3u) == 0u && (sb & 3u) == 0u) {{
        for (var k = 0u; k < ts; k += 4u) {{ d_st32(db + k, {src}_w(sb + k)); }}
        return;
    }}
    for (var k = 0u; k < ts; k += 2u) {{ d_st16(db + k, {src}_u16(sb + k)); }}
}}
"""


_REPORT = """
// A bad index goes into the error word (the host reads it at synchronize).
fn report_bad_index(idx: i32) {
    if (err_w(0u) == 0u) {
        err_st32(0u, 1u);
        err_st32(4u, bitcast<u32>(idx));
    }
}
"""


def kernel_source(name: str, wg: int, atomic_writes: bool) -> str:
    """The WGSL text of kernel ``name`` for work-groups of ``wg`` items (its written
    bindings atomic when ``atomic_writes``). Its own section starts after the line
    :data:`SECTION_MARK` matches (compiler messages before it are about the prelude)."""
    kernel = wgsl_kernels()[name]
    abi = kernel_abis()[kernel.abi]
    parts = [_text("common"), f"const WG: u32 = {wg}u;\n", _struct(abi)]
    parts.append(f"@group(0) @binding(0) var<storage, read> args: {abi.struct_name};\n")
    for i, buf in enumerate(abi.buffers, start=1):
        atomic = atomic_writes and buf in kernel.writes
        elem = "atomic<u32>" if atomic else "u32"
        parts.append(
            f"@group(0) @binding({i}) var<storage, read_write> buf_{buf}: array<{elem}>;\n"
        )
        parts.append(_accessors(buf, atomic))
    if "d" in abi.buffers:
        parts += [_copy_from(b) for b in abi.buffers if b not in ("d", "err")]
    if "err" in abi.buffers:
        parts.append(_REPORT)
    parts += [_text(name) for name in _INCLUDE.findall(kernel.body)]
    parts.append(f"// ---- kernel {name} ----\n" + kernel.body.replace("ENTRY", _ENTRY))
    return "\n".join(parts)


def args_types(abi: KernelABI, data: bytes, buffers: tuple[str, ...]) -> list[int]:
    """The element type ids of the tensor arguments named ``buffers`` in packed ``data``."""
    rec = np.frombuffer(data, abi.dtype, count=1)[0]
    return [int(rec[b]["type"]) for b in buffers]
