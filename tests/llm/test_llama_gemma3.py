"""Gemma 3 in the runner against a float64 numpy twin written from llama.cpp's graph.

The twin (``src/models/gemma3.cpp``): embeddings × √n_embd; per block RMS norm, Q/K
per-head RMS norms before NEOX rope, attention, an RMS norm of its output before the
residual add, then the same around a GELU-tanh gated FFN; a sliding window on 5 of
every 6 blocks, whose rope base is 10000 whatever the file says; a tied output. The
tiny model has 6 blocks and a window of 4 positions, so an 11-token prompt exercises
the window, both rope bases and the global block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_llama_reference as ref
from gguf import GGUFReader

from tensorplug import registry
from tensorplug.gguf import GGUFError
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

WINDOW = 4
TOKENS = [1, 300, 301, 302, 310, 259, 288, 270, 305, 311, 299]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf"
    return write_tiny_llama(path, "f32", 3, arch="gemma3", sliding_window=WINDOW,
                            n_layer=6, rope_base=1e6)  # fmt: skip


def _weights(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    r = GGUFReader(path)
    w = {t.name: np.asarray(t.data, np.float64).reshape(tuple(reversed(t.shape.tolist())))
         for t in r.tensors}  # fmt: skip
    meta = {k: f.contents() for k, f in r.fields.items() if k.startswith("gemma3.")}
    return w, meta


def _rope_neox(x: np.ndarray, base: float) -> np.ndarray:
    """x (T, H, D): rotate pairs (i, i + D/2) of token t by t·base^(-2i/D)."""
    T, _, D = x.shape
    half = D // 2
    angle = np.arange(T, dtype=np.float64)[:, None, None] * base ** (-np.arange(half) * 2 / D)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(angle) - b * np.sin(angle),
                           a * np.sin(angle) + b * np.cos(angle)], axis=-1)  # fmt: skip


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def twin_logits(path: Path, tokens: list[int]) -> np.ndarray:
    w, meta = _weights(path)
    eps, base = (
        float(meta["gemma3.attention.layer_norm_rms_epsilon"]),
        float(meta["gemma3.rope.freq_base"]),
    )
    n_head, n_kv_head = (
        int(meta["gemma3.attention.head_count"]),
        int(meta["gemma3.attention.head_count_kv"]),
    )
    window, n_layer = int(meta["gemma3.attention.sliding_window"]), int(meta["gemma3.block_count"])
    T, emb = len(tokens), w["token_embd.weight"]
    x = emb[tokens] * np.sqrt(emb.shape[1])
    hd = int(meta.get("gemma3.attention.key_length", emb.shape[1] // n_head))
    group = n_head // n_kv_head
    back = np.arange(T)[:, None] - np.arange(T)[None, :]
    rms = ref._rms
    for i in range(n_layer):
        p = f"blk.{i}."
        swa = (i + 1) % 6 != 0
        h = rms(x, eps) * w[p + "attn_norm.weight"]
        q = (
            rms((h @ w[p + "attn_q.weight"].T).reshape(T, n_head, hd), eps)
            * w[p + "attn_q_norm.weight"]
        )
        k = (
            rms((h @ w[p + "attn_k.weight"].T).reshape(T, n_kv_head, hd), eps)
            * w[p + "attn_k_norm.weight"]
        )
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, n_kv_head, hd)
        q, k = _rope_neox(q, 1e4 if swa else base), _rope_neox(k, 1e4 if swa else base)
        visible = (back >= 0) & ((back < window) if swa else True)
        out = np.empty((T, n_head, hd))
        for head in range(n_head):
            s = q[:, head] @ k[:, head // group].T / np.sqrt(hd)
            s = np.where(visible, s, -np.inf)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, head] = (e / e.sum(axis=1, keepdims=True)) @ v[:, head // group]
        attn = out.reshape(T, -1) @ w[p + "attn_output.weight"].T
        x = x + rms(attn, eps) * w[p + "post_attention_norm.weight"]
        h = rms(x, eps) * w[p + "ffn_norm.weight"]
        g = _gelu_tanh(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        x = x + rms(g @ w[p + "ffn_down.weight"].T, eps) * w[p + "post_ffw_norm.weight"]
    return (rms(x, eps) * w["output_norm.weight"]) @ emb.T


def test_gemma3_matches_its_float64_twin(model: Path) -> None:
    want = twin_logits(model, TOKENS)
    m = ModelRunner(model, placement=Placement.on(host_cpu(), 6), cache_type="f32", warmup=False)
    try:
        assert m.config.arch.name == "gemma3" and m.config.n_swa == WINDOW
        assert [m.config.is_swa(i) for i in range(6)] == [True] * 5 + [False]
        got = m.eval(TOKENS, all_logits=True)
        # token by token through the cache: the window must hold across steps too
        m.reset()
        stepped = np.stack([np.atleast_2d(m.eval([t]))[-1] for t in TOKENS])
    finally:
        m.close()
    assert ref.rel_err(got, want) <= 1e-4  # float32 (ggml's GELU table) vs float64
    assert ref.rel_err(stepped, want) <= 1e-4


def test_heads_wider_than_n_embd_over_n_head_match_the_twin(tmp_path: Path) -> None:
    """Gemma 3 270M's heads are 256 wide with n_embd 640 and 4 heads (key_length); the
    tiny writer's ``head_dim`` writes such a model (the benchmark's 270M size), and the
    runner reads it as llama.cpp does: Q and the attention output n_head·256 wide."""
    path = write_tiny_llama(tmp_path / "wide.gguf", "f32", 5, arch="gemma3",
                            sliding_window=WINDOW, n_layer=6, head_dim=32)  # fmt: skip
    m = ModelRunner(path, placement=Placement.on(host_cpu(), 6), cache_type="f32", warmup=False)
    try:
        assert (m.config.head_dim, m.config.n_embd, m.config.n_head) == (32, 64, 4)
        got = m.eval(TOKENS, all_logits=True)
    finally:
        m.close()
    assert ref.rel_err(got, twin_logits(path, TOKENS)) <= 1e-4


def test_without_the_window_the_result_changes(model: Path) -> None:
    """The window really masks: a twin that ignores it differs (guards the test)."""
    want = twin_logits(model, TOKENS)
    m = ModelRunner(model, placement=Placement.on(host_cpu(), 6), cache_type="f32", warmup=False)
    try:
        object.__setattr__(m.config, "n_swa", 0)  # every block global
        m._graphs.clear()
        got = m.eval(TOKENS, all_logits=True)
    finally:
        m.close()
    assert ref.rel_err(got, want) > 1e-3


def test_an_unknown_architecture_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "falcon.gguf"
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError, match=r"'falcon'.*'llama'.*'gemma3'"):
        ModelRunner(path, warmup=False)
    assert registry.dev_by_name("CPU") is not None
