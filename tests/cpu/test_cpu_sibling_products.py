"""Products of one activation run as one kernel call (a layer's Q, K, V; gate and up).

Joined or not, every product must give the same bits, and a product may be joined to
an earlier one only when nothing in between touches its memory: these graphs put a
write into the activation, or a reader of reused memory, between the products.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_helpers import backend_for, place, q8_activations

import tensorplug as tp
from tensorplug import ops
from tensorplug.quants import dequantize, quantize

pytest.importorskip("numba", reason="the joined kernel is numba's (pip install numba)")

RNG = np.random.default_rng(7)
N = 512


def _jit():  # type: ignore[no-untyped-def]
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    if jit is None:
        pytest.skip("numba kernels unavailable")
    return jit


def _weights(t: tp.Type, rows: int) -> tuple[tp.Tensor, np.ndarray, np.ndarray]:
    raw = np.ascontiguousarray(quantize(RNG.standard_normal((rows, N)).astype(np.float32), t))
    return tp.new_tensor(t, (rows, N)), raw, dequantize(raw, t).astype(np.float64)


#: products that may go together (rows: 4k, 4k+2): the same rounding of the activations
FAMILIES = {
    "Q8_0": [(tp.Type.Q4_0, 96), (tp.Type.Q8_0, 6), (tp.Type.Q5_0, 258)],
    "Q8_1": [(tp.Type.Q4_1, 96), (tp.Type.Q5_1, 6), (tp.Type.Q4_1, 258)],
    "Q8_K": [(tp.Type.Q4_K, 96), (tp.Type.Q6_K, 6), (tp.Type.Q4_K, 258)],
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("n_tok", [1, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_joined_products_give_each_products_own_bits(family: str, n_tok: int, threads: int) -> None:
    jit = _jit()
    kinds = FAMILIES[family]
    x = RNG.standard_normal((n_tok, N)).astype(np.float32)
    products = []
    for t, rows in kinds:
        raw = np.ascontiguousarray(quantize(RNG.standard_normal((rows, N)).astype(np.float32),
                                            t))  # fmt: skip
        products.append((t, raw.reshape(rows, -1, t.type_size), np.full((n_tok, rows), np.nan,
                                                                        np.float32)))  # fmt: skip
    before = jit.n_threads
    try:
        jit.set_num_threads(threads)
        alone = []
        for t, blocks, out in products:
            one = np.empty_like(out)
            jit.bind_matvec(t, blocks, x, one)()
            alone.append(one)
        joined = jit.bind_matvec_siblings(x, products)
        assert joined is not None
        joined()
    finally:
        jit.set_num_threads(before)
    for (_, _, out), one in zip(products, alone, strict=True):
        assert np.array_equal(out, one)


def test_products_that_cannot_be_joined_are_refused() -> None:
    jit = _jit()
    x = RNG.standard_normal((1, N)).astype(np.float32)

    def product(t: tp.Type, rows: int) -> tuple[tp.Type, np.ndarray, np.ndarray]:
        raw = np.zeros((rows, N // t.block_size * t.type_size), np.uint8)
        return t, raw.reshape(rows, -1, t.type_size), np.empty((1, rows), np.float32)

    q4 = product(tp.Type.Q4_0, 8)
    assert jit.bind_matvec_siblings(x, [q4]) is None  # one product: nothing to join
    assert jit.bind_matvec_siblings(x, [q4] * 4) is None  # more than MAX_SIBLINGS
    assert jit.bind_matvec_siblings(x, [q4, product(tp.Type.Q4_0, 3)]) is None  # < 4 rows
    assert jit.bind_matvec_siblings(x, [q4, product(tp.Type.Q2_K, 8)]) is None  # no int8
    # activations rounded to Q8_0 for one, Q8_K or Q8_1 for the other
    assert jit.bind_matvec_siblings(x, [q4, product(tp.Type.Q4_K, 8)]) is None
    assert jit.bind_matvec_siblings(x, [q4, product(tp.Type.Q4_1, 8)]) is None
    t, blocks, _ = q4
    strided = (t, blocks, np.empty((1, 16), np.float32)[:, ::2])  # typed differently
    assert jit.bind_matvec_siblings(x, [q4, strided]) is None


def _qkv_graph(n_tok: int = 1) -> tuple[tp.Graph, dict[str, tp.Tensor], dict[str, np.ndarray]]:
    """h → q (then read by ``rq``), k, v: the graph order of a model's attention."""
    h = tp.new_tensor(tp.Type.F32, (n_tok, N))
    (wq, rq_raw, wq64), (wk, rk_raw, wk64), (wv, rv_raw, wv64) = (
        _weights(tp.Type.Q4_0, 64), _weights(tp.Type.Q8_0, 16), _weights(tp.Type.Q5_0, 16)
    )  # fmt: skip
    q = ops.mul_mat(wq, h)
    rq = ops.scale(q, 2.0)
    k = ops.mul_mat(wk, h)
    v = ops.mul_mat(wv, h)
    g = tp.Graph(rq)
    g.expand(k)
    g.expand(v)
    tensors = {"h": h, "wq": wq, "wk": wk, "wv": wv, "q": q, "rq": rq, "k": k, "v": v}
    values = {"wq": rq_raw, "wk": rk_raw, "wv": rv_raw, "wq64": wq64, "wk64": wk64, "wv64": wv64}
    return g, tensors, values


def _set_raw(t: tp.Tensor, raw: np.ndarray) -> None:
    """Write ``raw``'s bytes into ``t`` through its buffer's set_tensor (``t`` is placed)."""
    assert t.buffer is not None
    t.buffer.set_tensor(t, memoryview(raw.tobytes()))


def _fill(tensors: dict[str, tp.Tensor], values: dict[str, np.ndarray], h: np.ndarray) -> None:
    tp.set_array(tensors["h"], h)
    for name in ("wq", "wk", "wv"):
        _set_raw(tensors[name], values[name])


def _steps(backend: tp.Backend) -> int:
    plan = backend._cached  # type: ignore[attr-defined]
    return len(plan.steps)


def test_a_model_layers_products_are_joined_and_keep_their_values() -> None:
    _jit()
    g, t, w = _qkv_graph()
    place(g)
    h = RNG.standard_normal((1, N)).astype(np.float32)
    _fill(t, w, h)
    backend = backend_for()
    backend.graph_compute(g)
    assert _steps(backend) == 2  # q, k and v in one step, then the scale
    hq = q8_activations(h)
    for name, ref in (("rq", 2 * hq @ w["wq64"].T), ("k", hq @ w["wk64"].T),
                      ("v", hq @ w["wv64"].T)):  # fmt: skip
        np.testing.assert_allclose(tp.get_array(t[name]), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reused", ["q", "rq"])
def test_a_result_whose_memory_is_used_in_between_is_staged(reused: str) -> None:
    """v's result takes memory that is used between q and v, as a graph allocator may
    lay it out: q's, which ``rq`` reads, or ``rq``'s, which it writes. Computed early
    straight into place, v would overwrite q before ``rq`` reads it, or be overwritten
    by ``rq``."""
    _jit()
    g, t, w = _qkv_graph()
    buf = tp.alloc_tensors([*g.leafs, *(n for n in g.nodes if n is not t["v"])],
                           tp.host_buffer_type())  # fmt: skip
    assert buf is not None
    tp.tensor_alloc(buf, t["v"], t[reused].offset)
    h = RNG.standard_normal((1, N)).astype(np.float32)
    _fill(t, w, h)
    backend = backend_for()
    backend.graph_compute(g)
    assert _steps(backend) == 3  # joined; v copied into place after the scale
    hq = q8_activations(h)
    if reused == "q":  # rq's memory is its own (when v took it, v overwrote it, as ordered)
        np.testing.assert_allclose(tp.get_array(t["rq"]), 2 * hq @ w["wq64"].T, rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(tp.get_array(t["v"]), hq @ w["wv64"].T, rtol=1e-5, atol=1e-5)


def test_a_product_after_a_write_into_its_activation_is_not_joined() -> None:
    """k reads h after ``cpy`` overwrote it: joined with q, it would see the old h."""
    _jit()
    h = tp.new_tensor(tp.Type.F32, (1, N))
    z = tp.new_tensor(tp.Type.F32, (1, N))
    (wq, rq_raw, wq64), (wk, rk_raw, wk64) = _weights(tp.Type.Q4_0, 8), _weights(tp.Type.Q4_0, 8)
    q = ops.mul_mat(wq, h)
    written = ops.cpy(z, h)
    k = ops.mul_mat(wk, h)
    g = tp.Graph(q)
    g.expand(written)
    g.expand(k)
    place(g)
    h_old, z_new = (RNG.standard_normal((1, N)).astype(np.float32) for _ in range(2))
    tp.set_array(h, h_old)
    tp.set_array(z, z_new)
    _set_raw(wq, rq_raw)
    _set_raw(wk, rk_raw)
    backend = backend_for()
    backend.graph_compute(g)
    assert _steps(backend) == 3
    np.testing.assert_allclose(tp.get_array(q), q8_activations(h_old) @ wq64.T, rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(tp.get_array(k), q8_activations(z_new) @ wk64.T, rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def _repacked_qkv(
    n_tok: int, repack: tuple[bool, bool, bool]
) -> tuple[tp.Graph, dict[str, tp.Tensor], dict[str, np.ndarray], np.ndarray]:
    """:func:`_qkv_graph`'s layer for ``n_tok`` rows, its weights repacked where
    ``repack`` says (q, k, v) and everything else in host memory."""
    from tensorplug_cpu.device import create_reg

    repack_buft = create_reg().device(0).repack_buffer_type()  # type: ignore[attr-defined]
    g, t, w = _qkv_graph(n_tok)
    weights = [t[n] for n, r in zip(("wq", "wk", "wv"), repack, strict=True) if r]
    if weights:
        tp.alloc_tensors(weights, repack_buft)
    rest = [x for x in (*g.leafs, *g.nodes) if x.buffer is None]
    tp.alloc_tensors(rest, tp.host_buffer_type())
    hv = RNG.standard_normal((n_tok, N)).astype(np.float32)
    tp.set_array(t["h"], hv)
    for name in ("wq", "wk", "wv"):
        tp.set_array(t[name], w[name])
    return g, t, w, hv


@pytest.mark.parametrize("batch_invariant", [False, True])
@pytest.mark.parametrize("n_tok", [1, 5, 40, 127, 128])
@pytest.mark.parametrize("threads", [1, 2])
def test_repacked_products_are_joined_and_keep_their_bits(
    n_tok: int, threads: int, batch_invariant: bool
) -> None:
    """q, k and v repacked: one step at q's place (one job or parallel region on two
    threads) for every step below QUANTIZE_APART_ROWS rows (dozens of busy slots'
    generation step, a short prompt), each product's bits those of its own kernel, run
    alone, in both arithmetic orders. A longer prompt's products stay apart."""
    from tensorplug_cpu.kernels.siblings import JOINT_MOST_ROWS

    _jit()
    g, t, w, hv = _repacked_qkv(n_tok, (True, True, True))
    backend = backend_for()
    tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
    tp.get_proc("CPU", "set_batch_invariant")(backend, batch_invariant)  # type: ignore[misc]
    backend.graph_compute(g)
    # q, k and v in one step, then the scale; past the bound each in its own
    assert _steps(backend) == (2 if n_tok <= JOINT_MOST_ROWS else 4)
    joined = {name: tp.get_array(t[name]) for name in ("rq", "k", "v")}
    hq = q8_activations(hv)
    for name, ref in (("rq", 2 * hq @ w["wq64"].T), ("k", hq @ w["wk64"].T),
                      ("v", hq @ w["wv64"].T)):  # fmt: skip
        # float32 sums of N terms: an error relative to the largest value, not each one
        np.testing.assert_allclose(joined[name], ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    for name in ("k", "v"):  # each product alone, in a graph of its own
        alone = ops.mul_mat(t["w" + name], t["h"])
        tp.alloc_tensors([alone], tp.host_buffer_type())
        backend.graph_compute(tp.Graph(alone))
        np.testing.assert_array_equal(tp.get_array(alone), joined[name])


def test_repacked_and_plain_weights_are_not_joined() -> None:
    _jit()
    g, t, w, hv = _repacked_qkv(1, (True, False, True))
    backend = backend_for()
    backend.graph_compute(g)
    assert _steps(backend) == 3  # q and v joined; k, in host memory, on its own
    np.testing.assert_allclose(tp.get_array(t["k"]), q8_activations(hv) @ w["wk64"].T,
                               rtol=1e-5, atol=1e-5)  # fmt: skip


#: a layer's q, k and v weight types as K-quant mixes lay them out: types whose products
#: read the quantized activations' sums differently (Q4_K integers, Q5_K scaled floats,
#: Q2_K over 16, Q6_K over 16 times -32) beside each other
MIXES = [
    (tp.Type.Q4_K, tp.Type.Q5_K, tp.Type.Q4_K),
    (tp.Type.Q5_K, tp.Type.Q5_K, tp.Type.Q4_K),
    (tp.Type.Q2_K, tp.Type.Q6_K, tp.Type.Q2_K),
    (tp.Type.Q6_K, tp.Type.Q6_K, tp.Type.Q2_K),
]


@pytest.mark.parametrize("types", MIXES, ids=lambda ts: "+".join(t.name for t in ts))
@pytest.mark.parametrize("n_tok", [1, 20])
@pytest.mark.parametrize("threads", [1, 2])
def test_repacked_k_quant_mixes_keep_each_products_bits(
    types: tuple[tp.Type, ...], n_tok: int, threads: int
) -> None:
    """Repacked q, k and v of a K-quant mix, joined where their activations' sums agree:
    each product's bits are its own kernel's, run alone, and near the float product of
    the activations as ggml rounds them. 20 rows: quantized apart, on every thread."""
    from tensorplug_cpu.device import create_reg
    from tensorplug_cpu.kernels.activations import round_rows

    _jit()
    h = tp.new_tensor(tp.Type.F32, (n_tok, N))
    made = [_weights(t, rows) for t, rows in zip(types, (32, 16, 16), strict=True)]
    outs = [ops.mul_mat(w, h) for w, _, _ in made]
    g = tp.Graph(outs[0])
    for out in outs[1:]:
        g.expand(out)
    repack_buft = create_reg().device(0).repack_buffer_type()  # type: ignore[attr-defined]
    tp.alloc_tensors([w for w, _, _ in made], repack_buft)
    tp.alloc_tensors([x for x in (*g.leafs, *g.nodes) if x.buffer is None],
                     tp.host_buffer_type())  # fmt: skip
    hv = RNG.standard_normal((n_tok, N)).astype(np.float32)
    tp.set_array(h, hv)
    for w, raw, _ in made:
        _set_raw(w, raw)
    backend = backend_for()
    tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
    backend.graph_compute(g)
    joined = [tp.get_array(out).copy() for out in outs]
    for (w, _, w64), got in zip(made, joined, strict=True):
        ref = round_rows(hv, w.type).astype(np.float64) @ w64.T
        np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())
        alone = ops.mul_mat(w, h)
        tp.alloc_tensors([alone], tp.host_buffer_type())
        backend.graph_compute(tp.Graph(alone))
        np.testing.assert_array_equal(tp.get_array(alone), got)
