"""The llama runner's logits against an independent float64 numpy llama.

Tolerances (error = largest |runner - reference| over the largest |reference logit|):

* Exact-weight comparisons: the reference dequantizes the very bytes in the file with
  ``gguf.quants``, and every tensorplug backend dequantizes F16/Q8_0/Q4_0 exactly (a
  block scale times a small integer is exact in float32), so the weights are identical
  and only float32 rounding in the runner remains: 1e-5 for every weight type (measured:
  2e-7 to 1e-6). With the default F16 KV cache, the cache must hold the reference's K
  and V to one f16 step of each row's largest value, and the reference's attention then
  reads the runner's cache: a K or V value that float32 and float64 round to
  neighbouring halves would otherwise move every later position (measured: one such
  value at position 9 of 18 moved seven positions by up to 8e-5). A flip in the query's
  or the attention weights' f16 rounding stays in its own position's logits, which
  ``rounded_err`` allows for; the other positions are held to 1e-5 (measured: 4e-7).
* ggml's rounding of activations: the CPU rounds each product's activations as
  llama.cpp's does for the weight type (Q8_0 blocks for Q8_0 and Q4_0, F16 values for
  F16 weights), repacked or not, so its logits are held to the reference with the same
  rounding (``q8=True``), at the same 1e-5 (measured: 4e-8 to 7e-8 repacked; the exact
  reference is 6e-3 to 2e-2 away). The OpenCL backend's products are exact.
* Quantization error (each type against the float32 master weights it was made from):
  the logits' relative RMS error must stay within 4x the weights' own relative RMS
  quantization error, which the test measures from the files (F16 ~2e-4, Q8_0 ~5e-3,
  Q4_0 ~9e-2). Errors of the ~17 matrices of a 2-block model add up to about 2.5x
  (measured 2.3-2.5x for all three types); a wrong dequantization would be O(1).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

import tensorplug as tp
from tensorplug import registry
from tensorplug.device import Device
from tensorplug.transfer import get_array
from tensorplug_llm.model import LlamaWeights
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ContextFullError, ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

TYPES = ["f32", "f16", "q8_0", "q4_0"]
#: 20 ids: BOS, then a mix of merged and single-character tokens of the tiny vocabulary.
TOKENS = [1, 259, 288, 300, 270, 265, 280, 290, 300, 310, 270, 275, 285, 295, 305, 315, 260, 262]
SEED = 3


def _device(name: str) -> Device:
    dev = registry.dev_by_name(name)
    if dev is None:
        pytest.skip(f"no {name} device (install and configure its plugin: `tensorplug devices`)")
    return dev


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("llama")
    files = {t: write_tiny_llama(folder / f"tiny-{t}.gguf", t, SEED) for t in TYPES}
    files["tied"] = write_tiny_llama(folder / "tiny-tied.gguf", "q8_0", SEED, tied=True)
    files["freqs"] = write_tiny_llama(folder / "tiny-freqs.gguf", "f16", SEED, rope_freqs=True)
    for kind in ("linear", "yarn"):
        files[kind] = write_tiny_llama(
            folder / f"tiny-{kind}.gguf", "f32", SEED, rope_scaling=(kind, 4.0)
        )
    return files


@pytest.fixture
def run() -> Iterator[list[ModelRunner]]:
    opened: list[ModelRunner] = []
    yield opened
    for m in opened:
        m.close()


def _llama(
    opened: list[ModelRunner], path: Path, placement: Placement, **kw: object
) -> ModelRunner:
    m = ModelRunner(path, placement=placement, **kw)  # type: ignore[arg-type]
    opened.append(m)
    return m


def _repacked(m: ModelRunner) -> bool:
    """Whether the model's matrices are stored repacked (products with Q8_0 activations)."""
    names = {t.require_allocated().name for t in m.weights.product_weights()}
    assert len(names) == 1, f"matrices in several kinds of memory: {names}"
    return names == {"CPU_REPACK"}


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
@pytest.mark.parametrize("wtype", TYPES)
def test_logits_match_reference(
    models: dict[str, Path], run: list[ModelRunner], wtype: str, device: str
) -> None:
    dev = _device(device)
    m = _llama(run, models[wtype], Placement.on(dev, 2), cache_type="f32")
    got = m.eval(TOKENS, all_logits=True)
    assert _repacked(m) == (device == "CPU" and wtype in ("q8_0", "q4_0"))
    want = ref.logits(ref.load(models[wtype]), TOKENS, q8=device == "CPU")
    assert got.shape == (len(TOKENS), 320)
    if device != "CPU":
        assert ref.rel_err(got, want) <= 1e-5
    else:  # F16 activations keep 11 bits, so a rounding flips more often, and a prompt's
        # F16 products are BLAS's, in the host's OpenBLAS kernel's order: two positions of
        # 18 flip with its SkylakeX kernels, three with its Haswell ones on a Zen 5 (every
        # other position within 2.4e-7; a wrong rounding would move them all)
        assert ref.rounded_err(got, want, flipped_rows=3 if wtype == "f16" else 2) <= 1e-5


@pytest.mark.parametrize("wtype", ["q8_0", "q4_0"])
def test_cpu_prompt_products_without_repacking_round_as_ggml(
    models: dict[str, Path], run: list[ModelRunner], wtype: str
) -> None:
    m = _llama(run, models[wtype], Placement.on(host_cpu(), 2), cache_type="f32", repack=False)
    assert not _repacked(m)
    got = m.eval(TOKENS, all_logits=True)
    model = ref.load(models[wtype])
    assert ref.rounded_err(got, ref.logits(model, TOKENS, q8=True)) <= 1e-5
    # and the activations' rounding is visible: the exact products are elsewhere
    assert ref.rel_err(got, ref.logits(model, TOKENS)) > 1e-3


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
@pytest.mark.parametrize("wtype", ["f32", "q4_0"])
def test_f16_cache_matches_reference_rounding_kv(
    models: dict[str, Path], run: list[ModelRunner], wtype: str, device: str
) -> None:
    m = _llama(run, models[wtype], Placement.on(_device(device), 2))  # default: F16 cache
    got = m.eval(TOKENS, all_logits=True)
    model, q8 = ref.load(models[wtype]), device == "CPU"
    cache = [(get_array(k), get_array(v)) for k, v in zip(m.cache.k, m.cache.v, strict=True)]
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    want = ref.logits(model, TOKENS, kv_dtype=np.float16, q8=q8, kv_cache=cache, kv_seen=seen)
    for (k, v), (own_k, own_v) in zip(cache, seen, strict=True):
        for stored, own in ((k, own_k), (v, own_v)):
            assert stored.dtype == np.float16
            step = 2.0 ** (np.floor(np.log2(np.abs(own).max(axis=1))) - 10)  # row's largest's
            assert (np.abs(stored[: len(TOKENS)] - own).max(axis=1) <= step).all()
    # the query's and the attention weights' f16 roundings flip two positions of 18 on an
    # AVX2 host; a wrong rounding moves every position but the first by 6e-5 or more
    err = ref.rel_err(got, want) if not q8 else ref.rounded_err(got, want, flipped_rows=4)
    assert err <= 1e-5
    # and the cache's rounding is visible: without it the reference is further away
    assert ref.rel_err(got, ref.logits(model, TOKENS, q8=q8)) > 2e-5


@pytest.mark.parametrize("wtype", ["f16", "q8_0", "q4_0"])
def test_quantization_error_stays_near_the_weights_error(
    models: dict[str, Path], run: list[ModelRunner], wtype: str
) -> None:
    master, stored = ref.load(models["f32"]), ref.load(models[wtype])
    weight_err = np.mean(
        [
            np.linalg.norm(stored.w[k] - w) / np.linalg.norm(w)
            for k, w in master.w.items()
            if w.ndim == 2
        ]
    )
    expected = {"f16": (1e-4, 3e-4), "q8_0": (3e-3, 8e-3), "q4_0": (6e-2, 1.2e-1)}[wtype]
    assert expected[0] < weight_err < expected[1]
    m = _llama(run, models[wtype], Placement.on(host_cpu(), 2), cache_type="f32")
    got = m.eval(TOKENS, all_logits=True)
    want = ref.logits(master, TOKENS)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 4 * weight_err


def test_tied_output_uses_the_token_embeddings(
    models: dict[str, Path], run: list[ModelRunner]
) -> None:
    m = _llama(run, models["tied"], Placement.on(host_cpu(), 2), cache_type="f32", repack=False)
    assert "output.weight" not in m.file.tensors
    assert isinstance(m.weights, LlamaWeights)
    assert m.weights.output is m.weights.tok_embd
    got = m.eval(TOKENS, all_logits=True)
    assert ref.rounded_err(got, ref.logits(ref.load(models["tied"]), TOKENS, q8=True)) <= 1e-5


def test_tied_output_is_repacked_beside_the_mapped_embeddings(
    models: dict[str, Path], run: list[ModelRunner]
) -> None:
    """As llama.cpp: get_rows reads the embeddings from the file's mapping, the output
    layer's products read a repacked copy of the same bytes."""
    m = _llama(run, models["tied"], Placement.on(host_cpu(), 2), cache_type="f32")
    w = m.weights
    assert isinstance(w, LlamaWeights)
    assert w.output is not w.tok_embd
    assert w.by_name[w.output] == w.by_name[w.tok_embd] == "token_embd.weight"
    assert w.output.require_allocated().name == "CPU_REPACK"
    assert w.tok_embd.require_allocated().is_host
    assert np.array_equal(tp.get_array(w.output), tp.get_array(w.tok_embd))
    got = m.eval(TOKENS, all_logits=True)
    assert ref.rounded_err(got, ref.logits(ref.load(models["tied"]), TOKENS, q8=True)) <= 1e-5


def test_tied_output_on_another_device_gets_its_own_copy(
    models: dict[str, Path], run: list[ModelRunner]
) -> None:
    gpu = _device("OpenCL0")
    m = _llama(run, models["tied"], Placement.offload(2, 3, gpu=gpu), cache_type="f32")
    assert isinstance(m.weights, LlamaWeights)
    assert m.weights.output is not m.weights.tok_embd
    assert m.weights.output.buffer is not None and not m.weights.output.buffer.is_host
    got = m.eval(TOKENS, all_logits=True)
    assert ref.rel_err(got, ref.logits(ref.load(models["tied"]), TOKENS)) <= 1e-5


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_rope_frequency_factors(
    models: dict[str, Path], run: list[ModelRunner], device: str
) -> None:
    """Llama 3.1's rope_freqs.weight divides each pair's angle; every block reads it."""
    m = _llama(run, models["freqs"], Placement.on(_device(device), 2), cache_type="f32")
    assert isinstance(m.weights, LlamaWeights)
    assert all(layer.rope_freqs is not None for layer in m.weights.layers)
    got = m.eval(TOKENS, all_logits=True)
    model, q8 = ref.load(models["freqs"]), device == "CPU"  # F16: the CPU rounds to F16
    # an activation that float32 and float64 round to neighbouring halves moves a position
    # by ~3e-4 (F16's boundaries are 16 times closer than Q8's: such flips are common)
    assert ref.rel_err(got, ref.logits(model, TOKENS, q8=q8)) <= (5e-4 if q8 else 1e-5)
    del model.w["rope_freqs.weight"]  # the factors matter: without them the logits differ
    assert ref.rel_err(got, ref.logits(model, TOKENS, q8=q8)) > 1e-3


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_rope_scaling_for_longer_contexts(
    models: dict[str, Path], run: list[ModelRunner], device: str, kind: str
) -> None:
    """``llama.rope.scaling.*``: linear divides every frequency by the factor, YaRN
    interpolates only the slow pairs and scales attention; the reference implements both."""
    m = _llama(run, models[kind], Placement.on(_device(device), 2), cache_type="f32")
    assert m.config.rope_scale == 0.25
    got = m.eval(TOKENS, all_logits=True)
    model = ref.load(models[kind])
    assert (model.scaling, model.factor, model.n_ctx_orig) == (kind, 4.0, m.config.n_ctx_train // 4)
    assert ref.rel_err(got, ref.logits(model, TOKENS)) <= 1e-5
    for other in ("none", "linear", "yarn"):  # the scaling matters: each other one differs
        if other != kind:
            model.scaling = other
            assert ref.rel_err(got, ref.logits(model, TOKENS)) > 1e-3, other


def _placements() -> list[tuple[str, Placement]]:
    cpu = host_cpu()
    out = [("cpu", Placement.on(cpu, 2))]
    gpu = registry.dev_by_name("OpenCL0")
    if gpu is not None:
        out += [
            ("opencl", Placement.on(gpu, 2)),
            ("ngl=1", Placement.offload(2, 1, gpu=gpu)),  # block 1 on OpenCL, output on CPU
            ("ngl=2", Placement.offload(2, 2, gpu=gpu)),  # both blocks on OpenCL
        ]
    return out


@pytest.mark.parametrize("cache", ["f32", "f16"])
@pytest.mark.parametrize(
    ("label", "placement"), _placements(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_incremental_decoding_matches_whole_sequence(
    models: dict[str, Path], run: list[ModelRunner], label: str, placement: Placement, cache: str
) -> None:
    """One token at a time through the KV cache (and odd-sized chunks, with a small
    kv_pad so that the step graphs change shape on the way) gives the logits of the
    whole sequence at once."""
    m = _llama(run, models["q8_0"], placement, cache_type=cache, kv_pad=8, n_batch=5)
    whole = m.eval(TOKENS, all_logits=True)
    m.reset()
    one_by_one = np.stack([m.eval([t]) for t in TOKENS])
    m.reset()
    chunks = np.concatenate(
        [m.eval(TOKENS[:3], all_logits=True), m.eval(TOKENS[3:10], all_logits=True)]
        + [m.eval([t])[None] for t in TOKENS[10:]]
    )
    tol = 1e-5 if cache == "f32" else 2e-5
    assert ref.rel_err(one_by_one, whole) <= tol
    assert ref.rel_err(chunks, whole) <= tol
    assert m.timings.graphs_built >= 4  # chunk sizes and context lengths changed shape
    if label.startswith("ngl"):
        assert m.split_summaries["generation"].n_splits >= 2


def test_offloaded_blocks_split_the_graph_and_match(
    models: dict[str, Path], run: list[ModelRunner]
) -> None:
    gpu = _device("OpenCL0")
    m = _llama(run, models["f32"], Placement.offload(2, 1, gpu=gpu), cache_type="f32")
    got = m.eval(TOKENS, all_logits=True)
    assert ref.rel_err(got, ref.logits(ref.load(models["f32"]), TOKENS)) <= 1e-5
    summary = m.split_summaries["prompt"]
    assert [name for name, _, _ in summary.splits] == ["CPU", "OpenCL0", "CPU"]
    assert "kq_mask" in summary.splits[1][2]  # graph inputs are copied to the device
    assert m.memory[gpu].weights > 0 and not m.memory[gpu].mapped
    assert m.memory[host_cpu()].mapped


def test_greedy_generation_follows_the_reference(
    models: dict[str, Path], run: list[ModelRunner]
) -> None:
    m = _llama(run, models["f32"], Placement.on(host_cpu(), 2), cache_type="f32")
    gen = m.generate(TOKENS[:6], 8, stop_at_eos=False)
    model = ref.load(models["f32"])
    seq = TOKENS[:6] + gen.tokens
    want = ref.logits(model, seq).argmax(axis=1)
    assert gen.tokens == [int(t) for t in want[5:-1]]
    assert m.timings.gen_tokens == 7 and m.timings.prompt_tokens == 6
    assert m.n_past == len(seq) - 1  # the last sampled token is not evaluated


def test_context_full_and_bad_ids_are_refused(
    models: dict[str, Path], run: list[ModelRunner]
) -> None:
    m = _llama(run, models["q4_0"], Placement.on(host_cpu(), 2), n_ctx=16)
    with pytest.raises(ContextFullError, match="n_ctx = 16"):
        m.eval(list(range(3, 20)))
    with pytest.raises(ValueError, match="token id 320 is outside the vocabulary"):
        m.eval([1, 320])
    m.eval(list(range(3, 19)))
    with pytest.raises(ContextFullError, match="16 tokens in the context"):
        m.eval([5])


def test_partial_offload_pins_every_node_and_copy(
    models: dict[str, Path], run: list[ModelRunner]
) -> None:
    """-ngl 2 on the 2-block model: both blocks on OpenCL0, embeddings and output on the
    CPU. The CPU takes nothing it does not have to (ggml spreads the other backends'
    assignments first): even the output's rms_norm stays on OpenCL0, so a step copies
    the five graph inputs in (the cells' position order too: OpenCL's attention ignores
    it, but it is an operand of the op) and that norm out, and nothing else."""
    gpu = _device("OpenCL0")
    m = _llama(run, models["f32"], Placement.offload(2, 2, gpu=gpu), cache_type="f32")
    m.eval(TOKENS[:4])
    m.eval([300])  # a generation step: its graph is the one left in the scheduler
    summary = m.split_summaries["generation"]
    assert [(name, inputs) for name, _, inputs in summary.splits] == [
        ("CPU", ()),
        ("OpenCL0", ("inp_embd", "inp_pos", "inp_kv_idx", "kq_mask", "inp_kv_order")),
        ("CPU", ("rms_norm",)),
    ]
    assert summary.n_copies == 6
    sched = m.last_scheduler
    step = sched.allocated
    assert step is not None
    where = {t.name: sched.get_tensor_backend(t) for t in step.nodes if t.name}
    for i in range(2):
        for name in (f"attn_norm-{i}", f"ffn_norm-{i}", f"ffn_inp-{i}", f"l_out-{i}"):
            backend = where[name]
            assert backend is not None and backend.name == "OpenCL0", name
    result_norm, inp_embd = where["result_norm"], where["inp_embd"]
    assert result_norm is not None and inp_embd is not None
    assert result_norm.name == "CPU" and inp_embd.name == "CPU"
    last_norm = next(t for t in step.nodes if t.op.value == "rms_norm" and not t.name)
    assert sched.get_tensor_backend(last_norm).name == "OpenCL0"  # type: ignore[union-attr]
