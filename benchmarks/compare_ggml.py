"""Op by op against the real ggml: tensorplug's CPU backend vs ggml's CPU backend.

Each case builds the same op on the same inputs in both libraries — ggml through the
``ggml-python`` ctypes bindings (a test helper, not a dependency: ``pip install
ggml-python`` builds ggml from source in a few minutes) — and reports one verdict:

* ``bit-exact``: the same bits (NaN where NaN);
* ``agree``: relative difference at most 1e-6 of the largest value;
* ``rounding``: NMSE at most 1e-5 — ggml rounds activations to F16 (gelu's table, the
  F16 path of some kernels) or Q8 (quantized mul_mat) where tensorplug stays in f32;
* ``explained``: a known difference where ggml is the odd one out (listed in
  :data:`EXPLAINED` with the reason);
* ``differs``: anything else, with the largest difference.

Run: ``python benchmarks/compare_ggml.py [--only OP]``; it exits 1 when a case differs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import tensorplug as tp
from tensorplug import ops
from tensorplug.quants import quantize

try:
    import ggml
    import ggml.utils as gu
except ImportError:
    sys.exit("compare_ggml needs ggml-python: pip install ggml-python (builds ggml, ~5 min)")

RNG = np.random.default_rng(15)

#: Differences kept on purpose, by case name, with the reason.
EXPLAINED = {
    "gelu_quick(special)": "ggml looks gelu_quick up in an F16 table, so |x| > 65504 becomes "
    "±inf first and -1e30 gives NaN; tensorplug computes the float32 formula (-0)",
}
SPECIAL = np.array([-np.inf, np.inf, np.nan, -1e30, 1e30, -100, 100, -88.8, 88.8, -10, 10,
                    -9.99, -1, -0.0, 0.0, 0.5, 3.0, 1e-30], np.float32)  # fmt: skip


@dataclass
class Case:
    name: str
    inputs: list[np.ndarray]  # float32 or int32 values; quantized weights given as f32
    ggml_build: Callable[[Any, list[Any]], Any]
    tp_build: Callable[[list[tp.Tensor]], tp.Tensor]
    types: tuple[str, ...] = ()  # tensorplug types of the inputs (default from dtype)
    #: NMSE still counted as rounding: ggml quantizes the activations of a quantized
    #: mul_mat to Q8 blocks (its vec_dot), which costs about 1e-5 to 1e-4
    rounding: float = 1e-5


def run_ggml(case: Case) -> np.ndarray:
    params = ggml.ggml_init_params(mem_size=256 * 1024 * 1024, mem_buffer=None)
    ctx = ggml.ggml_init(params)
    try:
        ins = []
        for x, t in zip(case.inputs, case.types or [""] * len(case.inputs), strict=True):
            if t in ("q8_0", "q4_0", "f16"):
                gt = {"q8_0": ggml.GGML_TYPE_Q8_0, "q4_0": ggml.GGML_TYPE_Q4_0,
                      "f16": ggml.GGML_TYPE_F16}[t]  # fmt: skip
                ne = list(reversed(x.shape))
                tensor = ggml.ggml_new_tensor(ctx, gt, len(ne), (ctypes_long * len(ne))(*ne))
                raw = quantize(x, tp.Type.parse(t)) if t != "f16" else x.astype(np.float16)
                buf = np.ascontiguousarray(raw).view(np.uint8)
                ctypes_memmove(ggml.ggml_get_data(tensor), buf.ctypes.data, buf.nbytes)
                ins.append(tensor)
            else:
                ins.append(gu.from_numpy(np.ascontiguousarray(x), ctx))
        out = case.ggml_build(ctx, ins)
        gf = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(gf, out)
        ggml.ggml_graph_compute_with_ctx(ctx, gf, 1)
        return np.array(gu.to_numpy(out), copy=True)
    finally:
        ggml.ggml_free(ctx)


def run_tp(case: Case, backend: tp.Backend) -> np.ndarray:
    tensors = []
    for x, t in zip(case.inputs, case.types or [""] * len(case.inputs), strict=True):
        ty = t or ("i32" if x.dtype == np.int32 else "f32")
        tensors.append(tp.new_tensor(ty, x.shape))
    out = case.tp_build(tensors)
    g = tp.Graph(out)
    tp.GraphAllocator(backend.buffer_type()).alloc_graph(g)
    for tensor, x, t in zip(tensors, case.inputs, case.types or [""] * len(tensors), strict=True):
        if t in ("q8_0", "q4_0"):
            tp.set_array(tensor, quantize(x, tp.Type.parse(t)))
        elif t == "f16":
            tp.set_array(tensor, x.astype(np.float16))
        else:
            tp.set_array(tensor, x)
    backend.graph_compute(g)
    return np.array(tp.get_array(out), copy=True)


def verdict(a: np.ndarray, b: np.ndarray, rounding: float = 1e-5) -> tuple[str, str]:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size == b.size:
        a = a.reshape(b.shape)  # ggml-python drops extents of 1
    if a.shape != b.shape:
        return "differs", f"shape {b.shape} vs ggml {a.shape}"
    if np.array_equal(a, b, equal_nan=True):
        return "bit-exact", ""
    nan = np.isnan(a) != np.isnan(b)
    inf = (np.isinf(a) | np.isinf(b)) & ~np.isclose(a, b, equal_nan=True)
    if nan.any() or inf.any():
        i = int(np.flatnonzero((nan | inf).ravel())[0])
        return "differs", f"at {i}: ggml {a.ravel()[i]}, tensorplug {b.ravel()[i]}"
    fin = np.isfinite(a) & np.isfinite(b)
    d = np.abs(a[fin] - b[fin]).max(initial=0.0)
    scale = max(np.abs(a[fin]).max(initial=0.0), 1e-30)
    if d <= 1e-6 * scale:
        return "agree", f"max diff {d / scale:.1e} of the largest value"
    nmse = float(((a[fin] - b[fin]) ** 2).sum() / max((a[fin] ** 2).sum(), 1e-30))
    if nmse <= rounding:
        return "rounding", f"NMSE {nmse:.1e}"
    return "differs", f"NMSE {nmse:.1e}, max diff {d:.3g}"


import ctypes  # noqa: E402  (after the optional ggml import, which sets up ctypes too)

ctypes_long = ctypes.c_int64
ctypes_memmove = ctypes.memmove


def _f(*shape: int, lo: float = -3, hi: float = 3) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def cases() -> list[Case]:
    out: list[Case] = []
    unary = {
        "abs": ggml.ggml_abs, "neg": ggml.ggml_neg, "relu": ggml.ggml_relu,
        "gelu": ggml.ggml_gelu, "gelu_quick": ggml.ggml_gelu_quick, "gelu_erf": ggml.ggml_gelu_erf,
        "silu": ggml.ggml_silu, "exp": ggml.ggml_exp, "tanh": ggml.ggml_tanh,
        "sigmoid": ggml.ggml_sigmoid,
    }  # fmt: skip
    for name, fn in unary.items():
        for label, x in (("random", _f(4, 37, lo=-6, hi=6)), ("special", SPECIAL.reshape(1, -1))):
            ggml_unary = lambda c, i, fn=fn: fn(c, i[0])  # noqa: E731
            tp_unary = lambda t, name=name: ops.unary(t[0], name)  # noqa: E731
            out.append(Case(f"{name}({label})", [x], ggml_unary, tp_unary))
    binary = {"add": (ggml.ggml_add, ops.add), "sub": (ggml.ggml_sub, ops.sub),
              "mul": (ggml.ggml_mul, ops.mul), "div": (ggml.ggml_div, ops.div)}  # fmt: skip
    for name, (g, t) in binary.items():
        gb = lambda c, i, g=g: g(c, i[0], i[1])  # noqa: E731
        tb = lambda ts, t=t: t(ts[0], ts[1])  # noqa: E731
        for bshape in ((5, 33), (1, 33), (5, 1)):
            b = _f(*bshape, lo=0.5, hi=2)
            out.append(Case(f"{name}(b={bshape})", [_f(5, 33), b], gb, tb))
        b = _f(2, 6, lo=0.5, hi=2)
        out.append(Case(f"{name}(b tiled (2,6) onto (4,6))", [_f(4, 6), b], gb, tb))
    out.append(Case("scale", [_f(3, 17)], lambda c, i: ggml.ggml_scale(c, i[0], 0.37),
                    lambda t: ops.scale(t[0], 0.37)))  # fmt: skip
    out.append(Case("rms_norm", [_f(4, 64)], lambda c, i: ggml.ggml_rms_norm(c, i[0], 1e-5),
                    lambda t: ops.rms_norm(t[0], 1e-5)))  # fmt: skip
    out.append(Case("norm", [_f(4, 64)], lambda c, i: ggml.ggml_norm(c, i[0], 1e-5),
                    lambda t: ops.norm(t[0], 1e-5)))  # fmt: skip
    out.append(Case("soft_max", [_f(4, 50)], lambda c, i: ggml.ggml_soft_max(c, i[0]),
                    lambda t: ops.soft_max(t[0])))  # fmt: skip
    out.append(Case("sum_rows", [_f(4, 50)], lambda c, i: ggml.ggml_sum_rows(c, i[0]),
                    lambda t: ops.sum_rows(t[0])))  # fmt: skip
    ties = RNG.integers(0, 3, (6, 40)).astype(np.float32)
    for label, x in (("random", _f(6, 40)), ("ties", ties), ("special", SPECIAL.reshape(2, 9))):
        out.append(Case(f"argmax({label})", [x], lambda c, i: ggml.ggml_argmax(c, i[0]),
                        lambda t: ops.argmax(t[0])))  # fmt: skip
    out.append(Case("argsort(asc, distinct)", [_f(3, 30)],
                    lambda c, i: ggml.ggml_argsort(c, i[0], ggml.GGML_SORT_ORDER_ASC),
                    lambda t: ops.argsort(t[0])))  # fmt: skip
    for name in ("swiglu", "geglu", "reglu", "geglu_erf", "geglu_quick"):
        g = getattr(ggml, f"ggml_{name}")
        ggml_glu = lambda c, i, g=g: g(c, i[0])  # noqa: E731
        tp_glu = lambda t, name=name: getattr(ops, name)(t[0])  # noqa: E731
        out.append(Case(f"{name}(split)", [_f(3, 64, lo=-6, hi=6)], ggml_glu, tp_glu))
    for wt in ("f32", "f16", "q8_0", "q4_0"):
        for n_tok in (1, 7):
            out.append(Case(f"mul_mat({wt}, tokens={n_tok})", [_f(32, 128), _f(n_tok, 128)],
                            lambda c, i: ggml.ggml_mul_mat(c, i[0], i[1]),
                            lambda t: ops.mul_mat(t[0], t[1]), (wt, "f32"),
                            1e-4 if wt.startswith("q") else 1e-5))  # fmt: skip
    rows = RNG.integers(0, 9, 5).astype(np.int32)
    out.append(Case("get_rows(f32)", [_f(9, 16), rows],
                    lambda c, i: ggml.ggml_get_rows(c, i[0], i[1]),
                    lambda t: ops.get_rows(t[0], t[1])))  # fmt: skip
    out.append(Case("clamp", [np.concatenate([SPECIAL, _f(14)]).reshape(4, 8)],
                    lambda c, i: ggml.ggml_clamp(c, i[0], -2.0, 2.0),
                    lambda t: ops.clamp(t[0], -2.0, 2.0)))  # fmt: skip
    out.append(Case("concat", [_f(3, 5), _f(3, 7)], lambda c, i: ggml.ggml_concat(c, i[0], i[1], 0),
                    lambda t: ops.concat(t[0], t[1], 1)))  # fmt: skip
    ids = np.array([[0, 2], [3, 3], [1, 0]], np.int32)
    out.append(Case("mul_mat_id(f32, 4 experts, 2 used)", [_f(4, 6, 32), _f(3, 1, 32), ids],
                    lambda c, i: ggml.ggml_mul_mat_id(c, i[0], i[1], i[2]),
                    lambda t: ops.mul_mat_id(t[0], t[1], t[2])))  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only cases whose name starts with this")
    args = parser.parse_args()
    backend = tp.init_by_name("CPU")
    counts: dict[str, int] = {}
    for case in cases():
        if not case.name.startswith(args.only):
            continue
        try:
            want, got = run_ggml(case), run_tp(case, backend)
            v, detail = verdict(want, got, case.rounding)
            if v == "differs" and case.name in EXPLAINED:
                v, detail = "explained", f"{detail} — {EXPLAINED[case.name]}"
        except Exception as e:  # a case neither side can build is reported, not fatal
            v, detail = "error", f"{type(e).__name__}: {e}"
        counts[v] = counts.get(v, 0) + 1
        print(f"{v:9}  {case.name:40}  {detail}")
    print("summary:", ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    return 1 if counts.get("differs") or counts.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
