"""NaN in is NaN out, as ggml: a NaN that an op turns into a plausible number (a NaN
query row attended into zeros) hides broken weights behind believable logits."""

from __future__ import annotations

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import ops


def _backend(name: str) -> tp.Backend:
    dev = tp.dev_by_name(name)
    if dev is None:
        pytest.skip(f"no {name} device (pip install pocl-binary-distribution for OpenCL)")
    return dev.init_backend()


def _attend(be: tp.Backend, qv: np.ndarray, n_kv: int, softcap: float) -> np.ndarray:
    B, _, n_q, D = qv.shape
    rng = np.random.default_rng(3)
    q = tp.new_tensor("f32", qv.shape, "q")
    k = tp.new_tensor("f16", (B, 2, n_kv, D), "k")
    v = tp.new_tensor("f16", (B, 2, n_kv, D), "v")
    mask = tp.new_tensor("f16", (1, 1, n_q, n_kv), "mask")
    out = ops.flash_attn_ext(q, k, v, mask, scale=D**-0.5, logit_softcap=softcap)
    tp.alloc_tensors([q, k, v, mask, out], be.buffer_type())
    tp.set_array(q, qv)
    tp.set_array(k, rng.standard_normal(k.shape).astype(np.float16))
    tp.set_array(v, rng.standard_normal(v.shape).astype(np.float16))
    mv = np.zeros(mask.shape, np.float16)
    mv[..., n_kv - 3 :] = -np.inf  # the cache's padding
    tp.set_array(mask, mv)
    be.graph_compute(tp.Graph(out))
    be.synchronize()
    return tp.get_array(out)


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
@pytest.mark.parametrize(
    ("n_q", "softcap"),
    [(1, 0.0), (4, 0.0), (12, 0.0), (12, 30.0)],
    ids=["token", "few", "prompt", "prompt-softcap"],
)
def test_flash_attention_keeps_a_nan_query_row_nan(device: str, n_q: int, softcap: float) -> None:
    be = _backend(device)
    qv = np.random.default_rng(5).standard_normal((1, 4, n_q, 16)).astype(np.float32)
    clean = _attend(be, qv, 20, softcap)
    qv[0, 1, n_q - 1, 3] = np.nan  # one value of query row n_q-1 of head 1
    got = _attend(be, qv, 20, softcap)
    assert np.isnan(got[0, n_q - 1, 1]).all(), "the NaN query row must attend to NaN"
    finite = np.ones(got.shape, bool)
    finite[0, n_q - 1, 1] = False
    np.testing.assert_array_equal(got[finite], clean[finite])  # nothing else moved
