"""The inner loops of the exact attention kernel (:mod:`._numba_attention`), as LLVM IR.

They read cache rows where they lie (F16 as raw ``uint16`` widened in registers, sixteen
values per ``vcvtph2ps``, or float32), so no widened copy of K or V is made: at a long
context those copies would be a large share of a generated token's attention, written
to and read back from L3. They keep ggml's arithmetic to the bit:

- :func:`scores16` takes sixteen cells' scores at once. A score is
  ``ggml_vec_dot_f32``'s (and ``ggml_vec_dot_f16``'s, whose halves are widened to
  float32 first): 64 lanes that fused multiply-adds accumulate over runs of 64, halved
  down to one. The first two halvings are whole-register adds per cell; the last four
  (within one register: latency-bound shuffles for one cell) are made across the
  sixteen cells, pairing cells' halves so that every addition is the one the halving
  tree makes, sixteen at a time. :func:`scores16_narrow` is tinyBLAS's order, which
  ggml's F16 K·Q product of two query rows or more takes: 16 lanes over runs of 16,
  then the same last four halvings (``_mm512_reduce_add_ps``).
- :func:`weighted_lanes` is the weights·V product's lane ``i`` (cells ``i``,
  ``i + lanes``, …) for up to four query heads that share a KV head: each V row is
  loaded and widened once for all of them, and their accumulators stay in registers
  for the lane's whole chain (in memory, one load and store each per cell, they cost
  three times as much).
- :func:`online_values` is ggml's flash attention's output for an F16 V, a row at a
  time: each value rounded to f16 after every cell, for up to four query heads that
  share a KV head, their accumulators in registers across the cells.
- :func:`touch_cells` reads K and V through once, in the order they lie, before the
  passes that read them in the arithmetic's order.

A row is addressed from the array's strides (its last must be the element size: the
caller checks), so no row view (and no reference count) is made per cell.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import _numba_ir as _ir

#: Lanes of one score (``ggml_vec_dot_f32`` on AVX-512: four registers of 16 floats).
SCORE_LANES = 64
#: Lanes of one score in tinyBLAS's order (one ``__m512``): ggml's F16 K·Q product of
#: two query rows or more (llamafile ``sgemm`` on the F16 query it rounds to)
NARROW_SCORE_LANES = 16
#: Cells whose scores :func:`scores16` takes at once (one register of their sums).
CELLS = 16
#: Query heads one :func:`weighted_lanes` chain serves at most (their accumulators,
#: four registers of 16 each, stay in registers beside the V row's).
MAX_HEADS = 4

_F32, I32, I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)


def value_dims() -> int:
    """Values of a V row one :func:`weighted_lanes` chain carries per head: 64 where the
    CPU has 32 vector registers (four heads' accumulators, 16 of them, and the row's
    4), else 32 (16 AVX2 registers hold four heads' 16 and the row's 4 at 8 lanes
    each: 20, and LLVM spills the fewest there)."""
    return 64 if _ir.HAS_32_REGS else 32


def _row(context: Any, builder: ir.IRBuilder, aryty: Any, ary: Any, head: Any,
         cell: Any) -> tuple[Any, Any]:  # fmt: skip
    """A pointer to ``ary[head, cell, 0]`` (3-d float32, or ``uint16`` holding f16) typed
    as its elements (half or float), and that element type."""
    arr = context.make_array(aryty)(context, builder, ary)
    strides = [builder.extract_value(arr.strides, axis) for axis in (0, 1)]
    at = builder.add(builder.mul(builder.sext(head, I64), strides[0]),
                     builder.mul(builder.sext(cell, I64), strides[1]))  # fmt: skip
    elem = ir.HalfType() if aryty.dtype == types.uint16 else _F32
    base = builder.gep(builder.bitcast(arr.data, ir.IntType(8).as_pointer()), [at])
    return builder.bitcast(base, elem.as_pointer()), elem


def _floats(builder: ir.IRBuilder, ptr: Any, elem: Any, at: Any, n: int) -> Any:
    """``n`` elements from ``ptr + at`` as ``<n x float>`` (halves widened)."""
    vec_ty = ir.VectorType(elem, n)
    align = 2 if isinstance(elem, ir.HalfType) else 4
    vec = builder.load(builder.bitcast(builder.gep(ptr, [at]), vec_ty.as_pointer()), align=align)
    return builder.fpext(vec, ir.VectorType(_F32, n)) if isinstance(elem, ir.HalfType) else vec


def _fma(builder: ir.IRBuilder, n: int) -> Any:
    """``llvm.fma`` on ``<n x float>``: each lane rounded once, whatever the register width."""
    vec = ir.VectorType(_F32, n)
    return _ir.llvm_fn(builder, f"llvm.fma.v{n}f32", vec, vec, vec, vec)


def _halves(builder: ir.IRBuilder, vec: Any, n: int) -> tuple[Any, Any]:
    """The low and high halves of an ``n``-lane vector."""
    lo, hi = (ir.Constant(ir.VectorType(I32, n // 2), list(range(a, a + n // 2)))
              for a in (0, n // 2))  # fmt: skip
    return builder.shuffle_vector(vec, vec, lo), builder.shuffle_vector(vec, vec, hi)


def _lanes(context: Any, builder: ir.IRBuilder, k: tuple[Any, Any], head: Any, cell: Any,
           q: tuple[Any, Any], g: Any, runs: Any, width: int) -> Any:  # fmt: skip
    """One score's ``width`` lanes (64 or 16) over ``runs`` runs of ``width`` values,
    halved down to ``<16 x float>``, for cache row ``k[head, cell]`` and query row
    ``q[g]`` (each an (array type, value) pair)."""
    row, elem = _row(context, builder, *k, head, cell)
    qa = context.make_array(q[0])(context, builder, q[1])
    q_at = builder.mul(builder.sext(g, I64), builder.extract_value(qa.strides, 0))
    qp = builder.bitcast(builder.gep(builder.bitcast(qa.data, ir.IntType(8).as_pointer()),
                                     [q_at]), _F32.as_pointer())  # fmt: skip
    fma = _fma(builder, width)
    vec = ir.VectorType(_F32, width)

    def run(at: Any, acc: list[Any]) -> list[Any]:
        k = _floats(builder, row, elem, at, width)
        x = builder.load(builder.bitcast(builder.gep(qp, [at]), vec.as_pointer()), align=4)
        return [builder.call(fma, [k, x, acc[0]])]

    zero = ir.Constant(vec, [0.0] * width)
    if isinstance(runs, ir.Constant):  # straight-line code LLVM schedules across the cells
        acc = zero
        for at in range(0, runs.constant * width, width):
            [acc] = run(ir.Constant(I64, at), [acc])
    else:
        end = builder.mul(builder.sext(runs, I64), ir.Constant(I64, width))
        [acc] = _ir.carried_loop(builder, "score", ir.Constant(I64, 0), end, width, [zero],
                                 run)  # fmt: skip
    n = width
    while n > CELLS:
        acc = builder.fadd(*_halves(builder, acc, n))
        n //= 2
    return acc


def _scores16_ir(width: int, context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
    """The code of :func:`scores16` for lanes of ``width`` (64 or 16)."""
    colp = context.make_array(sig.args[2])(context, builder, args[2]).data
    c0 = builder.sext(args[3], I64)
    keys, query = (sig.args[0], args[0]), (sig.args[4], args[4])
    sums = []
    for t in range(CELLS):
        cell = builder.load(builder.gep(colp, [builder.add(c0, ir.Constant(I64, t))]))
        sums.append(_lanes(context, builder, keys, args[1], cell, query, args[5], args[6], width))
    size = CELLS  # each vector holds CELLS // size cells' lanes, `size` each
    while size > 1:
        half = size // 2
        paired = []
        for a, b in zip(sums[0::2], sums[1::2], strict=True):
            groups = CELLS // size  # cells per vector before this step
            lo = [s * size + i for s in range(groups) for i in range(half)]
            hi = [s * size + half + i for s in range(groups) for i in range(half)]
            lo += [CELLS + i for i in lo]  # b's lanes follow a's in the shuffle
            hi += [CELLS + i for i in hi]
            pick = [ir.Constant(ir.VectorType(I32, CELLS), sel) for sel in (lo, hi)]
            paired.append(builder.fadd(builder.shuffle_vector(a, b, pick[0]),
                                       builder.shuffle_vector(a, b, pick[1])))  # fmt: skip
        sums, size = paired, half
    out = context.make_array(sig.args[7])(context, builder, args[7])
    at = builder.add(builder.mul(builder.sext(args[5], I64),
                                 builder.extract_value(out.strides, 0)),
                     builder.mul(c0, ir.Constant(I64, 4)))  # fmt: skip
    dst = builder.gep(builder.bitcast(out.data, ir.IntType(8).as_pointer()), [at])
    builder.store(sums[0], builder.bitcast(dst, ir.VectorType(_F32, CELLS).as_pointer()),
                  align=4)  # fmt: skip
    return context.get_dummy_value()


@intrinsic
def scores16(typingctx: Any, k: Any, hk: Any, cols: Any, c0: Any, q: Any, g: Any, runs: Any,
             w: Any) -> Any:  # fmt: skip
    """``w[g, c0 + t] = Σ k[hk, cols[c0 + t], :64·runs]·q[g, :64·runs]`` for ``t < 16``,
    each sum in ``ggml_vec_dot_f32``'s order (the module's docstring); ``k`` 3-d (KV
    head, cell, D) float32 or raw f16 with unit-stride rows, ``cols`` int64, ``q``
    (heads, D) and ``w`` (heads, ≥ c0 + 16) float32 with unit-stride rows."""
    sig = types.void(k, hk, cols, c0, q, g, runs, w)
    return sig, functools.partial(_scores16_ir, SCORE_LANES)


@intrinsic
def scores16_narrow(typingctx: Any, k: Any, hk: Any, cols: Any, c0: Any, q: Any, g: Any,
                    runs: Any, w: Any) -> Any:  # fmt: skip
    """:func:`scores16` in tinyBLAS's order: ``Σ k[hk, cols[c0 + t], :16·runs]·q[g,
    :16·runs]``, 16 fused lanes over runs of 16, then halved down to one."""
    sig = types.void(k, hk, cols, c0, q, g, runs, w)
    return sig, functools.partial(_scores16_ir, NARROW_SCORE_LANES)


def _score_row_ir(width: int, context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
    """The code of :func:`score_row` for lanes of ``width`` (64 or 16)."""
    acc = _lanes(context, builder, (sig.args[0], args[0]), args[1], args[2],
                 (sig.args[3], args[3]), args[4], args[5], width)  # fmt: skip
    n = CELLS
    while n > 1:
        acc = builder.fadd(*_halves(builder, acc, n))
        n //= 2
    return builder.extract_element(acc, ir.Constant(I32, 0))


@intrinsic
def score_row(typingctx: Any, k: Any, hk: Any, cell: Any, q: Any, g: Any, runs: Any) -> Any:
    """One cell's :func:`scores16` sum, returned: ``Σ k[hk, cell, :64·runs]·q[g, :64·runs]``."""
    return types.float32(k, hk, cell, q, g, runs), functools.partial(_score_row_ir, SCORE_LANES)


@intrinsic
def score_row_narrow(typingctx: Any, k: Any, hk: Any, cell: Any, q: Any, g: Any,
                     runs: Any) -> Any:  # fmt: skip
    """One cell's :func:`scores16_narrow` sum, returned."""
    sig = types.float32(k, hk, cell, q, g, runs)
    return sig, functools.partial(_score_row_ir, NARROW_SCORE_LANES)


@functools.cache
def weighted_lanes(heads: int) -> Callable[..., None]:
    """The intrinsic for ``heads`` query heads (1 to :data:`MAX_HEADS`):
    ``(v, hk, cols, w, g0, i, n, step, d0, acc)`` sets ``acc[g0 + h, i, d0:d0 + W]`` (W =
    :func:`value_dims`) for ``h < heads`` to the fused chain over cells
    ``c = i + t·step``, ``t < n`` (n ≥ 1) of ``v[hk, cols[c], d0:d0 + W]·w[g0 + h, c]``: the
    first term fused onto +0, and a term whose weight is 0 skipped (a zero weight
    leaves the lane as ggml's zero product would for any finite value, and -0 stays
    -0), as ggml's ``vec_dot`` lane ``i mod step`` sums them. ``v`` 3-d (KV head, cell,
    value) float32 or raw f16 with unit-stride rows, ``cols`` int64, ``w`` 2-d and
    ``acc`` 3-d float32 with unit-stride last axes."""
    if not 1 <= heads <= MAX_HEADS:
        raise ValueError(f"weighted_lanes serves 1 to {MAX_HEADS} heads, not {heads}")

    def typer(typingctx: Any, v: Any, hk: Any, cols: Any, w: Any, g0: Any, i: Any, n: Any,
              step: Any, d0: Any, acc: Any) -> Any:  # fmt: skip
        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
            width = value_dims()
            vec = ir.VectorType(_F32, width)
            fma = _fma(builder, width)
            i8p = ir.IntType(8).as_pointer()
            v, hk, cols, w, g0, i, n, step, d0, acc = args
            colp = context.make_array(sig.args[2])(context, builder, cols).data
            wa = context.make_array(sig.args[3])(context, builder, w)
            w_rows = []
            for h in range(heads):
                head = builder.add(builder.sext(g0, I64), ir.Constant(I64, h))
                at = builder.mul(head, builder.extract_value(wa.strides, 0))
                w_rows.append(builder.bitcast(builder.gep(builder.bitcast(wa.data, i8p), [at]),
                                              _F32.as_pointer()))  # fmt: skip
            d0 = builder.sext(d0, I64)
            zero, no_weight = ir.Constant(vec, [0.0] * width), ir.Constant(_F32, 0.0)

            def term(c: Any, accs: list[Any]) -> list[Any]:
                row, elem = _row(context, builder, sig.args[0], v, hk,
                                 builder.load(builder.gep(colp, [c])))  # fmt: skip
                values = _floats(builder, row, elem, d0, width)
                weights = [builder.load(builder.gep(wp, [c])) for wp in w_rows]
                fused = [builder.call(fma, [values, _ir.splat_scalar(builder, p, width), a])
                         for p, a in zip(weights, accs, strict=True)]  # fmt: skip
                # a zero weight is rare (an exponential that underflowed): one branch, seldom
                # taken, keeps the lanes it would touch, where a select per head and term
                # cost as much as the fused product
                zero = builder.fcmp_ordered("==", weights[0], no_weight)
                for p in weights[1:]:
                    zero = builder.or_(zero, builder.fcmp_ordered("==", p, no_weight))
                before = builder.block
                with builder.if_then(zero, likely=False):
                    kept = [builder.select(builder.fcmp_ordered("!=", p, no_weight), f, a)
                            for p, f, a in zip(weights, fused, accs, strict=True)]  # fmt: skip
                    inside = builder.block
                out = []
                for f, k in zip(fused, kept, strict=True):
                    phi = builder.phi(f.type)
                    phi.add_incoming(f, before)
                    phi.add_incoming(k, inside)
                    out.append(phi)
                return out

            first = builder.sext(i, I64)
            stride = builder.sext(step, I64)
            accs = term(first, [zero] * heads)

            def later(t: Any, accs: list[Any]) -> list[Any]:
                return term(builder.add(first, builder.mul(t, stride)), accs)

            accs = _ir.carried_loop(builder, "lane", ir.Constant(I64, 1),
                                    builder.sext(n, I64), 1, accs, later)  # fmt: skip
            out = context.make_array(sig.args[9])(context, builder, acc)
            s0, s1 = (builder.extract_value(out.strides, a) for a in (0, 1))
            lane_at = builder.add(builder.mul(first, s1), builder.mul(d0, ir.Constant(I64, 4)))
            for h, a in enumerate(accs):
                head = builder.add(builder.sext(g0, I64), ir.Constant(I64, h))
                at = builder.add(builder.mul(head, s0), lane_at)
                dst = builder.gep(builder.bitcast(out.data, i8p), [at])
                builder.store(a, builder.bitcast(dst, vec.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(v, hk, cols, w, g0, i, n, step, d0, acc), codegen

    typer.__name__ = typer.__qualname__ = f"weighted_lanes_{heads}"
    return intrinsic(typer)  # type: ignore[no-any-return]  # numba's decorator is untyped


#: Values of a V row one :func:`online_values` walk carries per head (a SmolLM2 head's).
ONLINE_DIMS = 64
#: Query heads one :func:`online_values` walk serves: four where the CPU has 32 vector
#: registers (their 16 accumulators beside the row's values), else one (its 8 beside
#: them: two heads' 16 leave LLVM no register for a value, and it spills; one head a
#: walk, each cell's values read again per head from L1, measured fastest on AVX2)
ONLINE_HEADS = MAX_HEADS if _ir.HAS_32_REGS else 1


def _head_rows(context: Any, builder: ir.IRBuilder, aryty: Any, ary: Any, g0: Any,
               heads: int) -> list[Any]:  # fmt: skip
    """``float*`` pointers to rows ``g0 … g0 + heads - 1`` of a 2-d float32 array."""
    arr = context.make_array(aryty)(context, builder, ary)
    i8p = ir.IntType(8).as_pointer()
    rows = []
    for h in range(heads):
        at = builder.mul(builder.add(builder.sext(g0, I64), ir.Constant(I64, h)),
                         builder.extract_value(arr.strides, 0))  # fmt: skip
        rows.append(builder.bitcast(builder.gep(builder.bitcast(arr.data, i8p), [at]),
                                    _F32.as_pointer()))  # fmt: skip
    return rows


@functools.cache
def online_values(heads: int) -> Callable[..., None]:
    """The intrinsic for ``heads`` query heads (1 to :data:`MAX_HEADS`):
    ``(v, hk, cols, m, weights, rescales, g0, d0, acc)`` sets ``acc[g0 + h, d0:d0 + W]``
    (W = :data:`ONLINE_DIMS`) for ``h < heads`` to ggml's ``one_chunk`` output in f16:
    from +0, for each cell ``c < m`` in turn, the output scaled by ``rescales[g0 + h,
    c]`` and rounded to f16 where some head's is not 1 (a new maximum), then
    ``f16(fma(v[hk, cols[c], d0:d0 + W], weights[g0 + h, c], ·))``. Every value is
    rounded to f16 after each step, so scaling by 1 changes none: one branch per cell
    serves all the heads. The accumulators stay in registers for the whole walk, where
    in memory each cell would load and store them. ``v`` 3-d (KV head, cell, value) raw
    f16 with unit-stride rows, ``cols`` int64, ``weights``, ``rescales`` and ``acc``
    2-d float32 with unit-stride rows; only where the CPU has F16C (the rounding is one
    ``vcvtps2ph``/``vcvtph2ps`` pair)."""
    if not 1 <= heads <= MAX_HEADS:
        raise ValueError(f"online_values serves 1 to {MAX_HEADS} heads, not {heads}")

    def typer(typingctx: Any, v: Any, hk: Any, cols: Any, m: Any, weights: Any,
              rescales: Any, g0: Any, d0: Any, acc: Any) -> Any:  # fmt: skip
        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
            width = ONLINE_DIMS
            vec, halves = ir.VectorType(_F32, width), ir.VectorType(ir.HalfType(), width)
            fma = _fma(builder, width)
            v, hk, cols, m, weights, rescales, g0, d0, acc = args
            colp = context.make_array(sig.args[2])(context, builder, cols).data
            w_rows = _head_rows(context, builder, sig.args[4], weights, g0, heads)
            r_rows = _head_rows(context, builder, sig.args[5], rescales, g0, heads)
            d0 = builder.sext(d0, I64)
            one = ir.Constant(_F32, 1.0)

            def f16(x: Any) -> Any:
                return builder.fpext(builder.fptrunc(x, halves), vec)

            def cell(c: Any, accs: list[Any]) -> list[Any]:
                row, elem = _row(context, builder, sig.args[0], v, hk,
                                 builder.load(builder.gep(colp, [c])))  # fmt: skip
                values = _floats(builder, row, elem, d0, width)
                scales = [builder.load(builder.gep(rp, [c])) for rp in r_rows]
                new_max = builder.fcmp_unordered("!=", scales[0], one)
                for s in scales[1:]:
                    new_max = builder.or_(new_max, builder.fcmp_unordered("!=", s, one))
                before = builder.block
                with builder.if_then(new_max, likely=False):
                    scaled = [f16(builder.fmul(a, _ir.splat_scalar(builder, s, width)))
                              for s, a in zip(scales, accs, strict=True)]  # fmt: skip
                    inside = builder.block
                kept = []
                for a, sa in zip(accs, scaled, strict=True):
                    phi = builder.phi(vec)
                    phi.add_incoming(a, before)
                    phi.add_incoming(sa, inside)
                    kept.append(phi)
                weights = [_ir.splat_scalar(builder, builder.load(builder.gep(wp, [c])), width)
                           for wp in w_rows]  # fmt: skip
                return [f16(builder.call(fma, [values, p, a]))
                        for p, a in zip(weights, kept, strict=True)]  # fmt: skip

            zero = ir.Constant(vec, [0.0] * width)
            accs = _ir.carried_loop(builder, "cell", ir.Constant(I64, 0), builder.sext(m, I64),
                                    1, [zero] * heads, cell)  # fmt: skip
            out = context.make_array(sig.args[8])(context, builder, acc)
            i8p = ir.IntType(8).as_pointer()
            lane_at = builder.mul(d0, ir.Constant(I64, 4))
            for h, a in enumerate(accs):
                head = builder.add(builder.sext(g0, I64), ir.Constant(I64, h))
                at = builder.add(builder.mul(head, builder.extract_value(out.strides, 0)), lane_at)
                dst = builder.gep(builder.bitcast(out.data, i8p), [at])
                builder.store(a, builder.bitcast(dst, vec.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(v, hk, cols, m, weights, rescales, g0, d0, acc), codegen

    typer.__name__ = typer.__qualname__ = f"online_values_{heads}"
    return intrinsic(typer)  # type: ignore[no-any-return]  # numba's decorator is untyped


@intrinsic
def value_width(typingctx: Any) -> Any:
    """:func:`value_dims` as a compile-time constant of compiled code."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return ir.Constant(I64, value_dims())

    return types.int64(), codegen


@intrinsic
def touch_cells(typingctx: Any, a: Any, h0: Any, h1: Any, n: Any) -> Any:
    """Read one byte of every 64-byte line of cells ``[0, n)`` of KV heads ``[h0, h1)``
    of a 3-d cache ``a`` (KV head, cell, value; unit-stride values), cell by cell, and
    nothing else: a stream the hardware prefetcher follows at the memory's speed."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        i8 = ir.IntType(8)
        head_stride, cell_stride = (builder.extract_value(arr.strides, axis) for axis in (0, 1))
        base = builder.bitcast(arr.data, i8.as_pointer())
        size = builder.mul(builder.extract_value(arr.shape, 2),
                           ir.Constant(I64, sig.args[0].dtype.bitwidth // 8))  # fmt: skip

        def cell(c: Any, _: list[Any]) -> list[Any]:
            row0 = builder.gep(base, [builder.mul(c, cell_stride)])

            def head(h: Any, _: list[Any]) -> list[Any]:
                row = builder.gep(row0, [builder.mul(h, head_stride)])

                def line(at: Any, _: list[Any]) -> list[Any]:
                    byte = builder.load(builder.gep(row, [at]), align=1)
                    # an empty asm that takes the byte keeps the load (nothing reads it)
                    builder.asm(ir.FunctionType(ir.VoidType(), [i8]), "", "r", [byte],
                                side_effect=True)  # fmt: skip
                    return []

                _ir.carried_loop(builder, "line", ir.Constant(I64, 0), size, 64, [], line)
                return []

            _ir.carried_loop(builder, "head", builder.sext(args[1], I64),
                             builder.sext(args[2], I64), 1, [], head)  # fmt: skip
            return []

        _ir.carried_loop(builder, "cell", ir.Constant(I64, 0), builder.sext(args[3], I64), 1,
                         [], cell)  # fmt: skip
        return context.get_dummy_value()

    return types.void(a, h0, h1, n), codegen
