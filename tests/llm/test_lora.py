"""LoRA adapters (``Llama(lora_path=..., lora_scale=...)``, ``ModelRunner(lora=...)``):
each adapted product is ``W·x + s·B·(A·x)`` at run time, as llama.cpp's
``build_lora_mm``; an adapter that does not fit the model is refused with llama.cpp's
reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lora_files import write_lora

from tensorplug.gguf import GGUFFile
from tensorplug_llm import Llama
from tensorplug_llm.lora import LoraError
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

TARGETS = ["blk.0.attn_q.weight", "blk.1.attn_v.weight", "blk.0.ffn_up.weight",
           "blk.1.ffn_down.weight", "blk.0.attn_output.weight", "output.weight"]  # fmt: skip
IDS = [1, 5, 9, 14, 3, 7]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("lora") / "tiny.gguf", "f32", 3)


def _logits(model: Path, lora: list[tuple[Path, float]] | None = None) -> np.ndarray:
    runner = ModelRunner(model, placement=Placement.on(host_cpu(), 2), n_ctx=64, warmup=False,
                         lora=[(str(p), s) for p, s in lora or []])  # fmt: skip
    try:
        return np.asarray(runner.eval(IDS, all_logits=True), dtype=np.float64)
    finally:
        runner.close()


def _merged(base: Path, adapter: Path, scale: float, out: Path) -> Path:
    """``base`` with each adapted weight replaced by ``W + s·B·A`` (F32): the model the
    adapter makes, written out as a plain file."""
    import gguf

    f, lora = GGUFFile(base), GGUFFile(adapter)
    alpha = float(lora.get("adapter.lora.alpha", 0.0))
    w = gguf.GGUFWriter(str(out), str(f.get("general.architecture")))
    for key in f.keys():  # noqa: SIM118 (GGUFFile's keys, not a dict)
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = f.get(key)
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
    for name, info in f.tensors.items():
        values = f.read_tensor(name).view(np.float32).reshape(info.shape).astype(np.float64)
        if name + ".lora_a" in lora.tensors:
            a = lora.read_tensor(name + ".lora_a").view(np.float32).reshape(-1, info.shape[1])
            b = lora.read_tensor(name + ".lora_b").view(np.float32).reshape(info.shape[0], -1)
            s = scale * alpha / a.shape[0] if alpha else scale
            values = values + s * (b.astype(np.float64) @ a.astype(np.float64))
        w.add_tensor(name, values.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_an_adapter_computes_the_model_whose_weights_it_adds_to(
    base: Path, tmp_path: Path, scale: float
) -> None:
    adapter = write_lora(tmp_path / "a.gguf", base, TARGETS, rank=4, alpha=8.0)
    got = _logits(base, [(adapter, scale)])
    want = _logits(_merged(base, adapter, scale, tmp_path / "merged.gguf"))
    plain = _logits(base)
    assert np.abs(got - plain).max() > 0.1  # it changes the model
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)  # the model it stands for


def test_without_alpha_the_scale_is_the_users(base: Path, tmp_path: Path) -> None:
    with_alpha = write_lora(tmp_path / "a.gguf", base, TARGETS, rank=4, alpha=4.0, seed=1)
    without = write_lora(tmp_path / "b.gguf", base, TARGETS, rank=4, alpha=None, seed=1)
    # alpha / rank = 1: both scale B·A by the user's scale alone
    np.testing.assert_array_equal(
        _logits(base, [(with_alpha, 0.7)]), _logits(base, [(without, 0.7)])
    )


def test_an_f16_adapter_and_a_scale_of_zero(base: Path, tmp_path: Path) -> None:
    adapter = write_lora(tmp_path / "h.gguf", base, TARGETS, dtype=np.float16)
    assert np.abs(_logits(base, [(adapter, 1.0)]) - _logits(base)).max() > 0.1
    np.testing.assert_array_equal(_logits(base, [(adapter, 0.0)]), _logits(base))


def test_the_python_api_takes_llama_cpp_pythons_keywords(base: Path, tmp_path: Path) -> None:
    adapter = write_lora(tmp_path / "a.gguf", base, TARGETS)
    plain = Llama(model_path=str(base), n_ctx=64, verbose=False)
    llm = Llama(model_path=str(base), n_ctx=64, lora_path=str(adapter), lora_scale=0.5,
                lora_base="ignored.gguf", verbose=False)  # fmt: skip
    assert (llm.lora_path, llm.lora_scale, llm.lora_base) == (str(adapter), 0.5, "ignored.gguf")
    a = llm("the", max_tokens=8, temperature=0)["choices"][0]["text"]
    b = plain("the", max_tokens=8, temperature=0)["choices"][0]["text"]
    assert a != b
    with pytest.raises(ValueError, match="no such LoRA adapter file"):
        Llama(model_path=str(base), lora_path=str(tmp_path / "absent.gguf"), verbose=False)
    with pytest.raises(ValueError, match="lora_scale must be a finite number"):
        Llama(model_path=str(base), lora_path=str(adapter), lora_scale=float("nan"), verbose=False)
    plain.close()
    llm.close()


PAIR = {"a": np.zeros((4, 64), np.float32), "b": np.zeros((64, 4), np.float32)}


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"extra": {"blk.9.attn_q.weight.lora_a": PAIR["a"],
                    "blk.9.attn_q.weight.lora_b": PAIR["b"]}}, "does not exist in base model"),
        ({"targets": ["token_embd.weight"]}, "is not supported"),
        ({"kind": "model"}, "expect general.type to be 'adapter'"),
        ({"extra": {"blk.0.attn_q.weight.lora_a": PAIR["a"]}}, "missing one component"),
        ({"extra": {"blk.0.attn_q.weight.delta": np.zeros(4, np.float32)}},
         "unexpected suffix"),
        ({"extra": {"blk.0.attn_q.weight.lora_a": PAIR["a"][:, :32],
                    "blk.0.attn_q.weight.lora_b": PAIR["b"]}}, "incorrect shape"),
    ],
)  # fmt: skip
def test_an_adapter_that_does_not_fit_is_refused_with_llama_cpps_reason(
    base: Path, tmp_path: Path, kwargs: dict[str, Any], says: str
) -> None:
    targets = kwargs.pop("targets", [] if "extra" in kwargs else TARGETS)
    adapter = write_lora(tmp_path / "bad.gguf", base, targets, **kwargs)
    with pytest.raises(LoraError, match=says):
        ModelRunner(base, n_ctx=32, warmup=False, lora=[(str(adapter), 1.0)])
    with pytest.raises(ValueError, match="Failed to initialize LoRA adapter"):
        Llama(model_path=str(base), lora_path=str(adapter), verbose=False)


def test_an_adapter_of_another_architecture_or_shape_is_refused(base: Path, tmp_path: Path) -> None:
    other = write_tiny_llama(tmp_path / "wide.gguf", "f32", 3, n_embd=128, n_ff=256)
    wide = write_lora(tmp_path / "wide-lora.gguf", other, ["blk.0.attn_q.weight"])
    with pytest.raises(LoraError, match="incorrect shape"):
        ModelRunner(base, n_ctx=32, warmup=False, lora=[(str(wide), 1.0)])
    gemma = write_tiny_llama(tmp_path / "g.gguf", "f32", 3, arch="gemma3")
    g_lora = write_lora(tmp_path / "g-lora.gguf", gemma, ["blk.0.attn_q.weight"])
    with pytest.raises(LoraError, match="arch mismatch"):
        ModelRunner(base, n_ctx=32, warmup=False, lora=[(str(g_lora), 1.0)])
