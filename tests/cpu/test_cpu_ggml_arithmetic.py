"""The CPU's attention, rope and SwiGLU compute ggml's float32 arithmetic bit for bit.

llama.cpp rounds activations to 8 bits before each quantized product, so one ulp
anywhere can tip a rounding and grow into a visible logit difference (SmolLM2 differed
by up to 0.8 from its fifth token on while these three ops were off by an ulp). Held
here: llama.cpp's own inputs and outputs of one SmolLM2 layer (recorded by
``tests/data/make_ggml_ops_fixture.py``), a float64 re-statement of ggml's order of
operations (:func:`_ggml_attention`) on shapes the model does not cover, and the
invariance batching needs: a query row's bits do not depend on the rows beside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_cpu_helpers import backend_for, compute

import tensorplug as tp
from tensorplug import ops

# the numpy fallback computes the same functions, not ggml's float32 order
pytest.importorskip("numba", reason="ggml's arithmetic is the numba kernels'")
OPS = np.load(Path(__file__).parents[1] / "data" / "ggml_ops_llamacpp.npz")
HEADS, KV_HEADS, DIM = 9, 3, 64


def _attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
    threads: int = 2, jit: bool = True, order: np.ndarray | None = None,
    batch_invariant: bool = False, cache: str = "f32",
) -> np.ndarray:  # fmt: skip
    """flash_attn_ext on the CPU backend: q (B, H, n_q, D), k/v (B, H_kv, n_kv, D) of
    type ``cache`` (rounded to it here), the cells summed in ``order`` when given;
    ``batch_invariant`` as the engine asks (every row in one token's order, whatever
    the step's rows)."""
    tq = tp.new_tensor("f32", q.shape, "q")
    tk = tp.new_tensor(cache, k.shape, "k")
    tv = tp.new_tensor(cache, v.shape, "v")
    tm = tp.new_tensor("f32", mask.shape, "mask")
    kv_type = tk.type.numpy_dtype
    inputs = {tq: q, tk: k.astype(kv_type), tv: v.astype(kv_type), tm: mask}
    to = None
    if order is not None:
        to = tp.new_tensor("i32", order.shape, "order")
        inputs[to] = order.astype(np.int32)
    out = ops.flash_attn_ext(tq, tk, tv, tm, scale=scale, order=to)
    backend = backend_for(jit=jit)
    tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
    tp.get_proc("CPU", "set_batch_invariant")(backend, batch_invariant)  # type: ignore[misc]
    compute(out, inputs, backend)
    return tp.get_array(out).copy()


def _heads_first(x: np.ndarray) -> np.ndarray:
    """(n, H, D) as the op's (1, H, n, D)."""
    return np.ascontiguousarray(x.transpose(1, 0, 2))[None]


# -- llama.cpp's own tensors -------------------------------------------------------------


@pytest.mark.parametrize("ggml_order", [False, True], ids=["invariant", "ggml-order"])
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_of_each_generated_token_is_llama_cpps(
    threads: int, ggml_order: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token by token, step ``s`` attends to cache rows 0…s, here in a cache padded to
    32 rows with -inf (as the runner pads it): llama.cpp's kqv_out, bit for bit, in
    either mode (one query row takes ``ggml_vec_dot_f32``'s 64 lanes in both)."""
    monkeypatch.setenv("TENSORPLUG_CPU_GGML_PRODUCT_ORDER", "1" if ggml_order else "0")
    q, k, v, want = OPS["step_q"], OPS["step_k"], OPS["step_v"], OPS["step_out"]
    n = q.shape[0]
    pad = np.zeros((32 - n, KV_HEADS, DIM), np.float32)
    kc, vc = _heads_first(np.concatenate([k, pad])), _heads_first(np.concatenate([v, pad]))
    for s in range(n):
        mask = np.zeros((1, 1, 1, 32), np.float32)
        mask[..., s + 1 :] = -np.inf
        got = _attention(_heads_first(q[s : s + 1]), kc, vc, mask, DIM**-0.5, threads)
        np.testing.assert_array_equal(got.reshape(-1), want[s], err_msg=f"step {s}")


@pytest.mark.parametrize("threads", [1, 2])
def test_batch_invariant_attention_of_a_prompt_is_llama_cpps_up_to_16_cells(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch-invariant: a 16-token prompt at once gives llama.cpp's rows bit for bit
    (they see cells 0…15 only, so a 26-token prompt's first 16 rows are theirs). From
    the 17th visible cell on, ggml multiplies weights by V in tinyBLAS's order (16 fused
    lanes) for two query rows or more, where one token takes ``ggml_vec_dot_f32``'s (64
    lanes); a batch-invariant backend keeps the latter for any number of rows (batching
    needs one order): a few ulp off."""
    monkeypatch.setenv("TENSORPLUG_CPU_GGML_PRODUCT_ORDER", "0")
    q, k, v, want = OPS["prompt_q"], OPS["prompt_k"], OPS["prompt_v"], OPS["prompt_out"]
    for n in (16, q.shape[0]):
        mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)[None, None]
        got = _attention(_heads_first(q[:n]), _heads_first(k[:n]), _heads_first(v[:n]), mask,
                         DIM**-0.5, threads)  # fmt: skip
        got = got.reshape(n, -1)
        if n == 16:
            np.testing.assert_array_equal(got, want[:16])
        else:
            assert 0 < np.abs(got - want).max() <= 2e-6  # measured 8.4e-7


@pytest.mark.parametrize("threads", [1, 2])
def test_attention_of_a_prompt_is_llama_cpps_in_every_row(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In ggml's orders (a backend's default) a step of two query rows or more sums
    weights·V in tinyBLAS's order (16 fused lanes over the cells, then its 8-4-2-1 tree),
    as ggml does: all 26 rows of the prompt are llama.cpp's, the ones past 16 cells too
    (batch-invariant, 64 lanes leave them ulp off, as the test above holds)."""
    monkeypatch.delenv("TENSORPLUG_CPU_GGML_PRODUCT_ORDER", raising=False)
    q, k, v, want = OPS["prompt_q"], OPS["prompt_k"], OPS["prompt_v"], OPS["prompt_out"]
    n = q.shape[0]
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)[None, None]
    got = _attention(_heads_first(q), _heads_first(k), _heads_first(v), mask, DIM**-0.5,
                     threads)  # fmt: skip
    np.testing.assert_array_equal(got.reshape(n, -1), want)


def test_rope_is_llama_cpps() -> None:
    """ggml's ``x0·cos − x1·sin`` and ``x0·sin + x1·cos`` with the first product fused (GCC
    contracts them): unfused, 15% of these values were an ulp off."""
    x = tp.new_tensor("f32", OPS["rope_in"].shape, "x")
    pos = tp.new_tensor("i32", (x.shape[0],), "pos")
    out = ops.rope(x, pos, DIM, tp.RopeMode.NORMAL, freq_base=100000.0)
    compute(out, {x: OPS["rope_in"], pos: np.arange(x.shape[0], dtype=np.int32)})
    np.testing.assert_array_equal(tp.get_array(out), OPS["rope_out"])


def test_swiglu_is_llama_cpps() -> None:
    """SiLU's ``e^−x`` is ggml's vector ``ggml_v_expf``, bit for bit."""
    a = tp.new_tensor("f32", OPS["gate"].shape, "a")
    b = tp.new_tensor("f32", OPS["up"].shape, "b")
    out = ops.swiglu(a, b)
    compute(out, {a: OPS["gate"], b: OPS["up"]})
    np.testing.assert_array_equal(tp.get_array(out), OPS["swiglu"])


# -- ggml's order of operations, restated in float64 ----------------------------------


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a·b + c`` rounded once: the product is exact in float64 (24 + 24 bits)
    and the sum rounded there, then to float32 (a double rounding that is wrong only
    where the float64 sum lands exactly halfway between two floats: not in these data)."""
    f64 = np.float64
    return (np.asarray(a, f64) * np.asarray(b, f64) + np.asarray(c, f64)).astype(np.float32)


def _halve(lanes: np.ndarray) -> np.float32:
    """Add the top half of the lanes onto the bottom until one is left (ggml's reduction of
    its four accumulators, then ``_mm512_reduce_add_ps``)."""
    lanes = lanes.astype(np.float32)
    while lanes.size > 1:
        h = lanes.size // 2
        lanes = (lanes[:h] + lanes[h:]).astype(np.float32)
    return lanes[0]


def _vec_dot(x: np.ndarray, y: np.ndarray, width: int = 64, half: bool = False) -> np.float32:
    """``ggml_vec_dot_f32`` on AVX-512: 64 fused lanes per run of 64, halved, then the
    leftover terms fused one by one; ``half``: ``ggml_vec_dot_f16``, whose leftover
    terms are float32 products added to a float64 sum. ``width`` 16: tinyBLAS's order
    (16 fused lanes per run of 16, then ``_mm512_reduce_add_ps``)."""
    n = x.size
    whole = n - n % width
    lanes = np.zeros(width, np.float32)
    for i0 in range(0, whole, width):
        lanes = _fma(x[i0 : i0 + width], y[i0 : i0 + width], lanes)
    s = np.array(_halve(lanes), np.float32)
    if half:
        return np.float32(float(s) + sum(float(np.float32(x[i] * y[i])) for i in range(whole, n)))
    for i in range(whole, n):
        s = _fma(x[i], y[i], s)
    return np.float32(s)


def _f16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to f16 (to nearest even), as float32."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _ggml_expf(x: np.ndarray) -> np.ndarray:
    """``ggml_v_expf`` (ggml-cpu/vec.h) in float64 steps rounded as its float32 ones."""
    f = np.float32
    x = np.asarray(x, f)
    hexes = ("0x1.8p23", "0x1.715476p+0", "0x1.62e4p-1", "0x1.7f7d1cp-20", "0x1.0e4020p-7",
             "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1")  # fmt: skip
    c = [f(float.fromhex(h)) for h in hexes]
    r, log2e, hi, lo, c0, c1, c2, c3, c4 = c
    z = _fma(x, log2e, r)
    n = (z - r).astype(f)
    b = _fma(-n, lo, _fma(-n, hi, x))
    u = (b * b).astype(f)
    j = _fma(_fma(_fma(c0, b, c1), u, _fma(c2, b, c3)), u, _fma(c4, b, f(1)))
    with np.errstate(over="ignore", invalid="ignore"):
        res = np.ldexp(j.astype(np.float64), np.clip(n, -192, 192).astype(np.int64)).astype(f)
    return np.where(np.abs(n) > 192, np.where(n > 0, f(np.inf), f(0)), res).astype(f)


def _ggml_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray,
                    scale: float, half: bool = False, rows: int = 1) -> np.ndarray:  # fmt: skip
    """One query row ``q`` (D,) over the visible rows of ``k`` (n, D) and ``v`` (n, Dv), as
    llama.cpp's ``mul_mat(k, q)``, ``soft_max_ext``, ``mul_mat(v, kq)`` in a step of
    ``rows`` query rows, the visible rows in cache order packed to the front (as one
    sequence's cells are). ``half``: an F16 cache (``k`` and ``v`` already rounded to
    it), whose products ggml takes on f16 operands (``vec_dot_type``): the query and the
    weights rounded to f16, ``ggml_vec_dot_f16`` for one row, tinyBLAS's 16 lanes for
    two rows or more (K·Q, and weights·V as with a float32 cache)."""
    ks, vs = k[visible], v[visible]
    m = ks.shape[0]
    if half:
        q = _f16(q)
    score_lanes = 16 if half and rows > 1 else 64
    s = [_vec_dot(kj, q, score_lanes, half) for kj in ks]
    s = np.array(s, np.float32) * np.float32(scale)
    e = _ggml_expf((s - s.max()).astype(np.float32))
    padded = np.concatenate([e, np.zeros(-m % 16, np.float32)])
    total = sum(float(_halve(blk)) for blk in padded.reshape(-1, 16))  # float64 sum
    p = (e * np.float32(1.0 / total)).astype(np.float32)
    if half:
        p = _f16(p)
    lanes = 16 if rows > 1 else 64
    p = np.concatenate([p, np.zeros(-m % lanes, np.float32)])
    vp = np.concatenate([vs, np.zeros((-m % lanes, vs.shape[1]), np.float32)])
    return np.array([_vec_dot(vp[:, d], p, lanes, half) for d in range(vs.shape[1])], np.float32)


@pytest.mark.parametrize(("dim", "n_kv"), [(64, 150), (80, 70), (40, 9)])
def test_attention_follows_ggmls_order(dim: int, n_kv: int) -> None:
    """Against the float64 re-statement: a head size with leftover terms (80, 40), more
    visible rows than one run of 64 lanes and than one 16-wide exp block, rows hidden
    in the middle (another sequence's cells), 2 query heads per KV head. Batch-invariant,
    as the restatement is one token's order (ggml's prompt order: the tests above)."""
    rng = np.random.default_rng(dim + n_kv)
    h, hk = 4, 2
    q = rng.standard_normal((1, h, 3, dim)).astype(np.float32)
    k = rng.standard_normal((1, hk, n_kv, dim)).astype(np.float32)
    v = rng.standard_normal((1, hk, n_kv, dim)).astype(np.float32)
    mask = np.zeros((1, 1, 3, n_kv), np.float32)
    mask[0, 0, :, 3::5] = -np.inf  # cells of other sequences
    mask[0, 0, 1, n_kv // 2 :] = -np.inf  # a row that sees fewer
    got = _attention(q, k, v, mask, 0.3, batch_invariant=True)
    for r in range(3):
        visible = np.flatnonzero(mask[0, 0, r] == 0)
        for head in range(h):
            want = _ggml_attention(q[0, head, r], k[0, head // 2], v[0, head // 2], visible, 0.3)
            np.testing.assert_array_equal(got[0, r, head], want, err_msg=f"row {r} head {head}")


@pytest.mark.parametrize("ggml_order", [False, True], ids=["invariant", "ggml-order"])
@pytest.mark.parametrize(("dim", "n_kv", "rows"), [(64, 150, 1), (64, 70, 3), (80, 40, 1)])
def test_attention_over_an_f16_cache_follows_ggmls_order(
    dim: int, n_kv: int, rows: int, ggml_order: bool
) -> None:
    """An F16 cache (both libraries' default) against the restatement: the query and the
    weights rounded to f16 as ggml's products round them, ``ggml_vec_dot_f16``'s float64
    leftover terms (head size 80), and in ggml's order a step of several rows in
    tinyBLAS's order for K·Q and weights·V (batch-invariant: one token's, for any step).
    Without the roundings a row was up to ~1e-3 off, and SmolLM2's logits differed from
    llama.cpp's by up to 1.4 at the defaults."""
    rng = np.random.default_rng(dim + n_kv + rows)
    h, hk = 4, 2
    q = rng.standard_normal((1, h, rows, dim)).astype(np.float32)
    k = _f16(rng.standard_normal((1, hk, n_kv, dim)))
    v = _f16(rng.standard_normal((1, hk, n_kv, dim)))
    mask = np.zeros((1, 1, rows, n_kv), np.float32)
    mask[0, 0, :, 3::5] = -np.inf  # cells of other sequences
    mask[0, 0, rows - 1, n_kv // 2 :] = -np.inf  # a row that sees fewer
    got = _attention(q, k, v, mask, 0.3, batch_invariant=not ggml_order, cache="f16")
    step = rows if ggml_order else 1
    for r in range(rows):
        visible = np.flatnonzero(mask[0, 0, r] == 0)
        for head in range(h):
            want = _ggml_attention(q[0, head, r], k[0, head // 2], v[0, head // 2], visible,
                                   0.3, half=True, rows=step)  # fmt: skip
            np.testing.assert_array_equal(got[0, r, head], want, err_msg=f"row {r} head {head}")


def test_ggml_expf_over_its_range() -> None:
    """SiLU through the op against ``x / (1 + ggml_v_expf(−x))`` restated: every float32
    in steps over [−105, 105] (both overflow sides and subnormal results), and ±inf."""
    x = np.concatenate([np.linspace(-105, 105, 20011, dtype=np.float32), [-np.inf, np.inf]])
    x = x.astype(np.float32)[None]
    a = tp.new_tensor("f32", x.shape, "a")
    b = tp.new_tensor("f32", x.shape, "b")
    out = ops.swiglu(a, b)
    compute(out, {a: x, b: np.ones_like(x)})
    with np.errstate(invalid="ignore", over="ignore"):
        want = (x / (np.float32(1) + _ggml_expf(-x))).astype(np.float32)
    np.testing.assert_array_equal(tp.get_array(out), want)


# -- batching changes nothing ------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_attention_is_the_same_alone_and_in_a_batch(threads: int) -> None:
    """One sequence's query row alone over its own 40 cells, then the same row among 6
    query rows of three sequences whose cells are interleaved with its own in one cache
    view (the engine's unified cache), the others' cells masked with -inf for it: the
    same bits, at one thread and two."""
    rng = np.random.default_rng(37)
    n_own, dim = 40, 64
    q_row = rng.standard_normal((1, 4, 1, dim)).astype(np.float32)
    k_own = rng.standard_normal((1, 2, n_own, dim)).astype(np.float32)
    v_own = rng.standard_normal((1, 2, n_own, dim)).astype(np.float32)
    alone = _attention(q_row, k_own, v_own, np.zeros((1, 1, 1, n_own), np.float32), 0.125,
                       threads, batch_invariant=True)  # fmt: skip
    n_kv = 3 * n_own
    owner = np.arange(n_kv) % 3  # cells of sequences 0, 1, 2 interleaved
    k = rng.standard_normal((1, 2, n_kv, dim)).astype(np.float32)
    v = rng.standard_normal((1, 2, n_kv, dim)).astype(np.float32)
    k[:, :, owner == 1], v[:, :, owner == 1] = k_own, v_own
    q = rng.standard_normal((1, 4, 6, dim)).astype(np.float32)
    q[:, :, 4] = q_row[:, :, 0]
    seq_of_row = np.array([0, 2, 0, 2, 1, 1])
    mask = np.where(owner[None, :] == seq_of_row[:, None], 0, -np.inf).astype(np.float32)
    batched = _attention(q, k, v, mask[None, None], 0.125, threads, batch_invariant=True)
    np.testing.assert_array_equal(batched[:, 4], alone[:, 0])


def test_a_rows_attention_is_the_same_at_every_step_size() -> None:
    """Steps of 1 to 40 query rows of one sequence (causal, 3 query heads per KV head,
    a cache padded with -inf): every row has the bits it has alone, at every step size.
    When steps of more than 16 rows took BLAS, rows of the larger steps rounded
    differently (the engine's batched steps carry up to 57 rows)."""
    rng = np.random.default_rng(40)
    n, n_kv, dim = 40, 64, 64
    q = rng.standard_normal((1, 6, n, dim)).astype(np.float32)
    k = rng.standard_normal((1, 2, n_kv, dim)).astype(np.float32)
    v = rng.standard_normal((1, 2, n_kv, dim)).astype(np.float32)
    causal = np.full((n, n_kv), -np.inf, np.float32)
    for r in range(n):
        causal[r, : r + 1] = 0
    alone = [_attention(q[:, :, r : r + 1], k, v, causal[None, None, r : r + 1], 0.125,
                        batch_invariant=True) for r in range(n)]  # fmt: skip
    for size in range(1, n + 1):
        got = _attention(q[:, :, :size], k, v, causal[None, None, :size], 0.125,
                         batch_invariant=True)  # fmt: skip
        for r in range(size):
            np.testing.assert_array_equal(got[:, r], alone[r][:, 0], err_msg=f"{size} rows")


def test_cells_are_summed_in_the_given_order_wherever_they_lie() -> None:
    """One sequence's 40 cells in cache order 0…39, then the same cells scattered over a
    96-cell cache in shuffled order among other sequences' cells, with the order that
    sorts them back by position: the same bits for each of its rows (a fragmented
    unified cache gives what a compact one does). Without the order the shuffled cells
    are summed in cache order, and the bits differ."""
    rng = np.random.default_rng(41)
    n, n_kv, dim = 40, 96, 64
    q = rng.standard_normal((1, 4, 8, dim)).astype(np.float32)
    k_own = rng.standard_normal((1, 2, n, dim)).astype(np.float32)
    v_own = rng.standard_normal((1, 2, n, dim)).astype(np.float32)
    rows = np.arange(n - 8, n)  # the last 8 positions, causal
    compact = np.where(np.arange(n)[None, :] <= rows[:, None], 0, -np.inf).astype(np.float32)
    want = _attention(q, k_own, v_own, compact[None, None], 0.125)
    cell_of = rng.permutation(n_kv)[:n]  # position p lies in cell cell_of[p]
    pos = rng.integers(0, n, n_kv)  # other sequences' cells: any positions
    pos[cell_of] = np.arange(n)
    k = rng.standard_normal((1, 2, n_kv, dim)).astype(np.float32)
    v = rng.standard_normal((1, 2, n_kv, dim)).astype(np.float32)
    k[:, :, cell_of], v[:, :, cell_of] = k_own, v_own
    scattered = np.full((8, n_kv), -np.inf, np.float32)
    scattered[:, cell_of] = compact
    order = np.argsort(pos, kind="stable")
    got = _attention(q, k, v, scattered[None, None], 0.125, order=order)
    np.testing.assert_array_equal(got, want)
    unordered = _attention(q, k, v, scattered[None, None], 0.125)
    assert not np.array_equal(unordered, want)
