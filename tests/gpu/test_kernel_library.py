"""The shared GPU kernel library: one text per kernel, three dialects, and its gates.

The gates themselves run here (they are part of CI): every kernel builds on PoCL,
compiles with NVRTC for every CUDA architecture we target, and type-checks as Metal.
Each gate is also shown to fail on a deliberately broken kernel, so a green gate means
something.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from tensorplug_kernels import DIALECTS, kernel_abis, render
from tensorplug_kernels.abi import TENSOR_DTYPE, TensorArg, parse
from tensorplug_kernels.check import check_cuda, check_msl, check_opencl
from tensorplug_kernels.source import Source, body_sources, prelude

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _common() -> tuple[Source, ...]:
    return body_sources()[:1]  # common.tpk: the definitions every kernel uses


def _kernel(name: str, body: str) -> Source:
    """A one-tensor kernel called ``name`` whose body is ``body``."""
    return Source(
        f"src/{name}.tpk",
        f"typedef struct {{\n    tp_tensor x;\n}} {name}_args;\n"
        f"TP_KERNEL {name}(TP_ARGS({name}_args), TP_BUFFER(x, 1) TP_IDS) {{\n"
        f"    TP_UNPACK(x);\n{body}\n}}\n",
    )


def _status(results: list, kernel: str) -> str:
    return next(r.status for r in results if r.kernel == kernel)


# -- one text, three dialects -------------------------------------------------------------------


def test_the_three_rendered_texts_differ_only_in_their_prelude() -> None:
    rendered = {d: render(d) for d in DIALECTS}
    bodies = {r.body for r in rendered.values()}
    assert len(bodies) == 1
    for d, r in rendered.items():
        assert r.text == prelude(d) + r.body
    assert len({r.prelude for r in rendered.values()}) == 3


#: Words of one dialect that a portable body must not use (the preludes map them).
_DIALECT_WORDS = re.compile(
    r"\b(get_(?:local|global|group)_id|get_global_size|barrier|__syncthreads|threadIdx|"
    r"blockIdx|__global__|__shared__|__device__|threadgroup|threadgroup_barrier|simd_sum|"
    r"kernel\s+void|global|local|constant|device|as_float|as_uint|vload\w*|convert_\w+|"
    r"float[248]|uint[248]|int[248]|ulong|long|INFINITY)\b"
)


@pytest.mark.parametrize("src", body_sources(), ids=lambda s: s.name)
def test_kernel_bodies_use_only_the_dialects_words(src: Source) -> None:
    code = re.sub(r"//[^\n]*", "", src.text)
    found = sorted(set(_DIALECT_WORDS.findall(code)))
    assert not found, f"{src.name} uses dialect-specific words {found}; use the TP_ words"


def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown kernel dialect 'vulkan'"):
        render("vulkan")  # type: ignore[arg-type]


# -- the calling convention ------------------------------------------------------------------


def test_packed_arguments_match_the_c_layout_numpy_computes() -> None:
    abi = kernel_abis()["k_soft_max"]
    t = TensorArg(None, 24, 1, (3, 4, 5, 6), (2, 6, 24, 0))
    args = {"a": t, "m": t, "d": t, "scale": 0.5, "max_bias": 8.0, "m0": 0.25, "m1": 0.125,
            "n_head_log2": 4, "has_mask": 1}  # fmt: skip
    data, buffers = abi.pack(args)
    ref = np.zeros((), abi.dtype)
    for name in ("a", "m", "d"):
        ref[name] = (24, 1, 0, (3, 4, 5, 6), (2, 6, 24, 0))
    for name in ("scale", "max_bias", "m0", "m1", "n_head_log2", "has_mask"):
        ref[name] = args[name]
    assert data == ref.tobytes() and len(data) == abi.dtype.itemsize
    assert buffers == (t, t, t)
    assert abi.dtype.fields is not None
    assert abi.dtype.fields["a"][0] == TENSOR_DTYPE and TENSOR_DTYPE.itemsize == 64


def test_extra_buffers_follow_the_tensors() -> None:
    abi = kernel_abis()["k_set_rows"]
    assert abi.buffers == ("b", "r", "d", "err")
    t = TensorArg(None, 0, 0, (1, 1, 1, 1), (0, 0, 0, 0))
    assert abi.pack({"b": t, "r": t, "d": t})[1] == (t, t, t, "err")


def test_packing_names_a_missing_or_unknown_argument() -> None:
    abi = kernel_abis()["k_unary"]
    t = TensorArg(None, 0, 0, (1, 1, 1, 1), (0, 0, 0, 0))
    with pytest.raises(KeyError, match="no value for argument 'p1'"):
        abi.pack({"a": t, "d": t, "fn": 1, "p0": 0.0})
    with pytest.raises(KeyError, match=r"has no field\(s\) \['bogus'\]"):
        abi.pack({"a": t, "d": t, "fn": 1, "p0": 0.0, "p1": 0.0, "bogus": 1})
    with pytest.raises(ValueError, match="do not fit k_unary_args"):
        abi.pack({"a": t, "d": t, "fn": 2**40, "p0": 0.0, "p1": 0.0})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("TP_BUFFER(d, 1), TP_BUFFER(a, 2)", r"takes buffers \['d', 'a'\].*tensors \['a', 'd'\]"),
        ("TP_BUFFER(a, 1), TP_BUFFER(d, 3)", r"numbers its buffers \['1', '3'\]"),
        ("TP_BUFFER(a, 1), TP_BUFFER(d, 2), TP_BUFFER(log, 3)", r"then only \['err', 'scratch'\]"),
    ],
)
def test_a_kernel_whose_buffers_do_not_match_its_struct_is_refused(
    params: str, message: str
) -> None:
    src = Source(
        "src/bad.tpk",
        "typedef struct {\n    tp_tensor a;\n    tp_tensor d;\n} k_bad_args;\n"
        f"TP_KERNEL k_bad(TP_ARGS(k_bad_args), {params} TP_IDS) {{}}\n",
    )
    with pytest.raises(ValueError, match=message):
        parse((src,))


def test_a_struct_field_of_an_unknown_type_is_refused() -> None:
    src = Source("src/bad.tpk", "typedef struct {\n    double x;\n} k_bad_args;\n")
    with pytest.raises(ValueError, match="field 'x' has type 'double'"):
        parse((src,))


def test_every_packaged_kernel_has_a_parsed_abi() -> None:
    # a template's text is in body_sources() once per instance, like its kernels
    text = "".join(s.text for s in body_sources())
    assert len(kernel_abis()) == len(re.findall(r"^TP_KERNEL\b", text, re.MULTILINE))
    assert {"k_binary", "k_get_rows", "k_set_rows_check", "k_mm_q4_0_4", "k_mv_f16"} <= set(
        kernel_abis()
    )


# -- the gates, on the real kernels (CI runs them) ----------------------------------------------


def _require_or_skip(results: list, gate: str) -> None:
    skipped = [r for r in results if r.status == "skip"]
    if skipped and not IN_CI:
        pytest.skip(f"the {gate} gate cannot run here: {skipped[0].detail}")
    assert not skipped, f"CI=true but the {gate} gate cannot run: {skipped[0].detail}"


def test_every_kernel_builds_on_opencl_as_shipped_and_portable() -> None:
    results = check_opencl()
    _require_or_skip(results, "OpenCL")
    assert [r.kernel for r in results if r.status != "ok"] == []
    assert len(results) == len(kernel_abis())


@pytest.mark.slow
def test_every_kernel_compiles_with_nvrtc_for_every_architecture_without_warnings() -> None:
    results = check_cuda()
    _require_or_skip(results, "CUDA (NVRTC)")
    assert [(r.kernel, r.detail) for r in results if r.status != "ok"] == []
    assert all("sm_90" in r.detail for r in results)


def test_every_kernel_type_checks_as_metal() -> None:
    results = check_msl()
    _require_or_skip(results, "Metal (C++ syntax)")
    assert [(r.kernel, r.messages) for r in results if r.status != "ok"] == []


# -- each gate fails on a broken kernel -----------------------------------------------------------


def test_the_opencl_gate_fails_on_a_broken_kernel() -> None:
    broken = _kernel("k_broken", "    *(TP_GLOBAL float *)x_p = no_such_value;")
    good = _kernel("k_good", "    *(TP_GLOBAL float *)x_p = 1.0f;")
    results = check_opencl((*_common(), good, broken))
    _require_or_skip(results, "OpenCL")
    assert _status(results, "k_broken") == "FAIL" and _status(results, "k_good") == "ok"
    failed = next(r for r in results if r.kernel == "k_broken")
    assert any("no_such_value" in d.text for d in failed.messages)


def test_the_cuda_gate_fails_on_opencl_only_code_and_on_a_warning() -> None:
    # valid OpenCL C, which a body must not be: NVRTC has no get_local_id
    opencl_only = _kernel("k_opencl_only", "    ((TP_GLOBAL float *)x_p)[get_local_id(0)] = 1.0f;")
    warns = _kernel("k_warns", "    int unused = 3;\n    *(TP_GLOBAL float *)x_p = 1.0f;")
    good = _kernel("k_good", "    *(TP_GLOBAL float *)x_p = 1.0f;")
    results = check_cuda((*_common(), good, opencl_only), archs=("sm_80",))
    _require_or_skip(results, "CUDA (NVRTC)")
    assert _status(results, "k_opencl_only") == "FAIL" and _status(results, "k_good") == "ok"
    results = check_cuda((*_common(), good, warns), archs=("sm_80",))
    assert _status(results, "k_warns") == "FAIL" and _status(results, "k_good") == "ok"
    assert any(d.kind == "warning" for r in results for d in r.messages)


def test_the_cuda_gate_names_the_architectures_this_nvrtc_dropped() -> None:
    # CUDA 13's NVRTC refuses sm_70 outright; sm_10 stands for such an architecture here
    good = _kernel("k_good", "    *(TP_GLOBAL float *)x_p = 1.0f;")
    results = check_cuda((*_common(), good), archs=("sm_10", "sm_80"))
    _require_or_skip(results, "CUDA (NVRTC)")
    assert _status(results, "k_good") == "ok"
    detail = next(r.detail for r in results if r.kernel == "k_good")
    assert detail.startswith("sm_80 + portable (this NVRTC dropped sm_10);"), detail
    results = check_cuda((*_common(), good), archs=("sm_10",))
    assert _status(results, "k_good") == "FAIL"
    assert "compiles none of sm_10" in next(r.detail for r in results if r.kernel == "k_good")


def test_the_metal_gate_fails_on_cuda_only_code() -> None:
    cuda_only = _kernel("k_cuda_only", "    __syncthreads();\n    *(TP_GLOBAL float *)x_p = 1.0f;")
    good = _kernel("k_good", "    *(TP_GLOBAL float *)x_p = 1.0f;")
    results = check_msl((*_common(), good, cuda_only))
    _require_or_skip(results, "Metal (C++ syntax)")
    assert _status(results, "k_cuda_only") == "FAIL" and _status(results, "k_good") == "ok"


def test_the_command_prints_a_line_per_kernel_and_fails_on_a_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorplug_kernels import __main__ as cli
    from tensorplug_kernels import check as gates

    broken = _kernel("k_broken", "    __syncthreads();")
    good = _kernel("k_good", "    *(TP_GLOBAL float *)x_p = 1.0f;")
    monkeypatch.setitem(gates.GATES, "msl", lambda: check_msl((*_common(), good, broken)))
    monkeypatch.setattr(cli, "GATES", gates.GATES)
    code = cli.main(["check", "--dialect", "msl"])
    out = capsys.readouterr().out
    if " skip " in out and not IN_CI:
        pytest.skip("no C++ compiler for the Metal gate")
    assert code == 1
    lines = [ln for ln in out.splitlines() if ln.startswith("msl ")]
    assert [ln.split()[1:3] for ln in lines] == [["ok", "k_good"], ["FAIL", "k_broken"]]
    assert "__syncthreads" in out


# -- the portable fallbacks, checked numerically on PoCL ------------------------------------------

_PRIMITIVES = Source(
    "src/primitives_test.tpk",
    """typedef struct {
    tp_tensor x;
    tp_tensor d;
} k_primitives_args;

// One work-group of WG work-items: d[0] = group sum of x, d[1] = group max of x,
// d[2] = dot4 of the bytes of x[0] and x[1] plus 7, d[3..10] = the eight halves in
// x[2..5] through the scalar f16 -> f32, d[11..18] the same through the 8-lane one.
TP_KERNEL k_primitives(TP_ARGS(k_primitives_args), TP_BUFFER(x, 1), TP_BUFFER(d, 2) TP_IDS) {
    TP_SHARED float red[WG];
    TP_SHARED float lanes[8];
    TP_UNPACK(x);
    TP_UNPACK(d);
    const int l = TP_LOCAL_ID(0);
    const TP_GLOBAL float *xf = (const TP_GLOBAL float *)x_p;
    TP_GLOBAL float *df = (TP_GLOBAL float *)d_p;
    const float s = tp_group_sum(xf[l], red, l);
    const float m = tp_group_max(xf[l], red, l);
    if (l == 0) {
        const TP_GLOBAL int *xi = (const TP_GLOBAL int *)x_p;
        df[0] = s;
        df[1] = m;
        df[2] = (float)tp_dot4_i8(xi[0], xi[1], 7);
        tp_store_local_f32x8(lanes, tp_load_f16x8(x_p + 8));
        for (int i = 0; i < 8; i++) {
            df[3 + i] = tp_h2f(((const TP_GLOBAL ushort *)(x_p + 8))[i]);
            df[11 + i] = lanes[i];
        }
    }
}
""",
)


@pytest.mark.parametrize("portable", [False, True], ids=["native", "portable"])
def test_the_primitives_compute_what_numpy_does_on_pocl(portable: bool) -> None:
    cl = pytest.importorskip("pyopencl", reason="pyopencl is not installed")
    devices = [d for p in cl.get_platforms() for d in p.get_devices()] if cl else []
    if not devices:
        pytest.skip("no OpenCL device")
    wg = 64
    ctx = cl.Context(devices[:1])
    queue = cl.CommandQueue(ctx)
    text = render("opencl", (*_common(), _PRIMITIVES)).text
    opts = [f"-DWG={wg}", *(["-DTP_PORTABLE"] if portable else [])]
    prg = cl.Program(ctx, text).build(options=opts)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(wg).astype(np.float32)
    raw = x.view(np.uint8).copy()
    raw[:8] = rng.integers(0, 256, 8, dtype=np.uint8)  # two words of packed int8
    halves = np.array([1.5, -2.0, 6.1e-5, 3.0e-7, 65504.0, -0.0, np.inf, np.nan], np.float16)
    raw[8:24] = halves.view(np.uint8)
    x = raw.view(np.float32)
    out = np.zeros(19, np.float32)
    mf = cl.mem_flags
    bx = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    bd = cl.Buffer(ctx, mf.READ_WRITE, out.nbytes)
    abi = parse((*_common(), _PRIMITIVES))["k_primitives"]
    t = TensorArg(None, 0, 0, (wg, 1, 1, 1), (4, 0, 0, 0))
    data, _ = abi.pack({"x": t, "d": t})
    prg.k_primitives(queue, (wg,), (wg,), data, bx, bd)
    cl.enqueue_copy(queue, out, bd)
    queue.finish()
    finite = x[np.isfinite(x)]
    assert finite.size == x.size  # the group reductions see plain floats
    np.testing.assert_allclose(out[0], x.astype(np.float64).sum(), rtol=1e-5)
    assert out[1] == x.max()
    a, b = raw[:4].view(np.int8).astype(int), raw[4:8].view(np.int8).astype(int)
    assert out[2] == float((a * b).sum() + 7)
    want = halves.astype(np.float32).view(np.uint32)
    assert (out[3:11].view(np.uint32) == want).all()  # bit for bit, NaN included
    assert (out[11:19].view(np.uint32) == want).all()
