"""llama-cpp-python's constructor keywords, checked and mapped onto what loads a model.

``Llama(model_path, **keywords)`` takes every keyword llama-cpp-python's does. Each one
either does what llama-cpp-python documents, or — where it names a llama.cpp feature
tensorplug does not have (NUMA placement, a quantized KV cache) —
is refused with an error that names it and says why, so that no setting is
silently ignored. The RoPE and YaRN keywords override the model file's rope as
llama.cpp's context does (:mod:`tensorplug_llm.rope`). Settings that only tune
llama.cpp's own machinery and change no result (``no_perf``, ``numa=False``,
``offload_kqv=True``) are accepted.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tensorplug.types import Type

from ..kv_types import CACHE_TYPES
from ..rope import RopeOverrides

__all__ = ["LLAMA_DEFAULT_SEED", "LoadOptions", "load_options"]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# llama.cpp's enumerations, by their values in llama-cpp-python
LLAMA_SPLIT_MODE_NONE, LLAMA_SPLIT_MODE_LAYER, LLAMA_SPLIT_MODE_ROW = 0, 1, 2
_POOLING = {-1: None, 0: "none", 1: "mean", 2: "cls", 3: "last"}
_RANK_POOLING = 4

#: every keyword of llama-cpp-python 0.3's ``Llama.__init__`` after ``model_path``,
#: with its default there
DEFAULTS: dict[str, Any] = {
    "n_gpu_layers": 0, "split_mode": LLAMA_SPLIT_MODE_LAYER, "main_gpu": 0,
    "tensor_split": None, "vocab_only": False, "use_mmap": True, "use_mlock": False,
    "kv_overrides": None, "seed": LLAMA_DEFAULT_SEED, "n_ctx": 512, "n_batch": 512,
    "n_ubatch": 512, "n_threads": None, "n_threads_batch": None, "rope_scaling_type": -1,
    "pooling_type": -1, "attention_type": -1, "rope_freq_base": 0.0,
    "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0, "yarn_attn_factor": 1.0,
    "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0,
    "logits_all": False, "embedding": False, "offload_kqv": True, "flash_attn": False,
    "op_offload": None, "swa_full": None, "no_perf": False, "last_n_tokens_size": 64,
    "lora_base": None, "lora_scale": 1.0, "lora_path": None, "numa": False,
    "chat_format": None, "chat_handler": None, "draft_model": None, "tokenizer": None,
    "type_k": None, "type_v": None, "spm_infill": False, "verbose": True,
}  # fmt: skip

#: keywords whose only accepted value is their default, and why another is refused
_UNSUPPORTED = {
    "attention_type": "the model's own attention (causal or not) is always used",
    "offload_kqv": "the KV cache always lives beside its block",
    "op_offload": "there is no host-operation offload switch",
    "swa_full": "a sliding-window cache is always sized by the model",
    "numa": "there is no NUMA placement switch",
    "tokenizer": "the model file's own tokenizer is always used",
}


@dataclass(frozen=True)
class LoadOptions:
    """The checked keywords, in the terms the model runner takes."""

    model_path: str
    n_gpu_layers: int
    split_mode: int
    main_gpu: int
    tensor_split: tuple[float, ...] | None
    vocab_only: bool
    use_mmap: bool
    seed: int
    n_ctx: int  # 0: the model's trained length
    n_batch: int
    n_ubatch: int
    n_threads: int | None
    n_threads_batch: int | None
    pooling: str | None  # None: the file's
    logits_all: bool
    embedding: bool
    flash_attn: bool
    last_n_tokens_size: int
    chat_format: str | None
    chat_handler: Any
    #: lock the loaded model in RAM (:mod:`tensorplug_llm.memory_lock`)
    use_mlock: bool
    #: proposes tokens for generate to check in one step (llama-cpp-python's
    #: ``LlamaDraftModel``: a callable of the ids so far); None: one token a step
    draft_model: Any
    #: a LoRA adapter file, applied at ``lora_scale`` (:mod:`tensorplug_llm.lora`)
    lora_path: str | None
    lora_scale: float
    #: llama-cpp-python's ``lora_base``, kept as given: llama.cpp's adapter API has no
    #: base model, and llama-cpp-python 0.3 uses it nowhere either
    lora_base: str | None
    #: the KV cache's K and V types (llama.cpp's ``type_k``/``type_v``; F16 by default)
    type_k: Type
    type_v: Type
    spm_infill: bool
    verbose: bool
    rope: RopeOverrides = field(default_factory=RopeOverrides)  # the file's unless overridden
    #: metadata values that stand for the file's (llama.cpp's ``kv_overrides``)
    kv_overrides: dict[str, bool | int | float | str] = field(default_factory=dict)

    @property
    def lora(self) -> tuple[tuple[str, float], ...]:
        """The adapters for the runner: ``(path, scale)`` of each."""
        return () if self.lora_path is None else ((self.lora_path, self.lora_scale),)

    @property
    def step_tokens(self) -> int:
        """The runner's prompt chunk: llama.cpp evaluates a batch in micro-batches of
        ``n_ubatch``, and the rows of a step decide how ggml sums them."""
        return min(self.n_batch, self.n_ubatch)


def _lora_scale(scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"lora_scale must be a finite number, got {scale!r}")
    return float(scale)


def _lora_path(path: Any) -> str | None:
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ValueError(f"lora_path: no such LoRA adapter file: {path!r} (a .gguf adapter)")
    return os.fspath(path)


def _draft_model(draft: Any) -> Any:
    if draft is not None and not callable(draft):
        raise ValueError(
            f"draft_model must be a LlamaDraftModel (a callable of the token ids so far), got "
            f"{type(draft).__name__}"
        )
    return draft


def load_options(model_path: Any, given: Mapping[str, Any]) -> LoadOptions:
    """``given`` checked against llama-cpp-python's keywords (TypeError for one it does
    not take, ValueError for a value tensorplug cannot honour)."""
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise TypeError(
            f"Llama() got an unexpected keyword argument {unknown[0]!r} "
            "(the keywords are llama-cpp-python's: see docs/python-api.md)"
        )
    o = {**DEFAULTS, **given}
    for name, why in _UNSUPPORTED.items():
        value = o[name]
        if value != DEFAULTS[name] and not (name == "op_offload" and value is True):
            if name == "offload_kqv" and not o["n_gpu_layers"]:
                continue  # nothing is offloaded: where the cache lives does not change
            raise ValueError(f"{name}={value!r} is not supported: {why}; leave it out")
    if o["split_mode"] not in (LLAMA_SPLIT_MODE_NONE, LLAMA_SPLIT_MODE_LAYER, LLAMA_SPLIT_MODE_ROW):
        raise ValueError(
            f"split_mode must be 0 (none), 1 (layer) or 2 (row), got {o['split_mode']!r}"
        )
    main_gpu = o["main_gpu"]
    if isinstance(main_gpu, bool) or not isinstance(main_gpu, int) or main_gpu < 0:
        raise ValueError(f"main_gpu must be an accelerator's index (0, 1, ...), got {main_gpu!r}")
    _split_shares(o["tensor_split"])
    pooling = o["pooling_type"]
    if pooling == _RANK_POOLING:
        raise ValueError("pooling_type=4 (rank) is not supported: no reranking models yet")
    if pooling not in _POOLING:
        raise ValueError(
            f"pooling_type must be -1 (the model's), 0 (none), 1 (mean), 2 (cls) or "
            f"3 (last), got {pooling!r}"
        )
    type_k, type_v = _cache_type("type_k", o["type_k"]), _cache_type("type_v", o["type_v"])
    for name in ("n_ctx", "n_batch", "n_ubatch", "last_n_tokens_size"):
        _count(name, o[name], minimum=0 if name in ("n_ctx", "last_n_tokens_size") else 1)
    for name in ("n_threads", "n_threads_batch"):
        if o[name] is not None:
            _count(name, o[name], minimum=-1)
    _count("n_gpu_layers", o["n_gpu_layers"], minimum=-1)
    seed = o["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or not -1 <= seed <= 0xFFFFFFFF:
        raise ValueError(f"seed must be an integer from 0 to 2**32-1 (or -1), got {seed!r}")
    split = o["tensor_split"]
    return LoadOptions(
        model_path=str(model_path),
        n_gpu_layers=o["n_gpu_layers"],
        split_mode=o["split_mode"],
        main_gpu=o["main_gpu"],
        tensor_split=tuple(float(x) for x in split) if split is not None else None,
        vocab_only=bool(o["vocab_only"]),
        use_mmap=bool(o["use_mmap"]),
        seed=LLAMA_DEFAULT_SEED if seed == -1 else seed,
        n_ctx=o["n_ctx"],
        n_batch=o["n_batch"],
        n_ubatch=o["n_ubatch"],
        n_threads=_threads(o["n_threads"]),
        n_threads_batch=_threads(o["n_threads_batch"]),
        pooling=_POOLING[pooling],
        # a draft's tokens are checked against their own rows' logits, as llama-cpp-python
        logits_all=bool(o["logits_all"]) or o["draft_model"] is not None,
        embedding=bool(o["embedding"]),
        flash_attn=bool(o["flash_attn"]),
        last_n_tokens_size=o["last_n_tokens_size"],
        chat_format=o["chat_format"],
        chat_handler=o["chat_handler"],
        draft_model=_draft_model(o["draft_model"]),
        use_mlock=bool(o["use_mlock"]),
        lora_path=_lora_path(o["lora_path"]),
        lora_scale=_lora_scale(o["lora_scale"]),
        lora_base=None if o["lora_base"] is None else str(o["lora_base"]),
        type_k=type_k,
        type_v=type_v,
        spm_infill=bool(o["spm_infill"]),
        verbose=bool(o["verbose"]),
        rope=_rope(o),
        kv_overrides=_overrides(o["kv_overrides"]),
    )


def _overrides(value: Any) -> dict[str, bool | int | float | str]:
    """``kv_overrides``: None, or a dict of metadata keys to a bool, int, float or str
    (llama-cpp-python's check; whether a value can stand for its key is the file's,
    :meth:`tensorplug.gguf.GGUFFile.override`)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"kv_overrides must be a dict of metadata keys to values, got {value!r}")
    for key, v in value.items():
        if not isinstance(v, bool | int | float | str):
            raise ValueError(f"Unknown value type for {key}: {v!r} (kv_overrides values are "
                             "bool, int, float or str)")  # fmt: skip
    return dict(value)


#: llama-cpp-python's rope keywords -> :class:`RopeOverrides`' fields
_ROPE_KEYWORDS = {
    "rope_freq_base": "freq_base", "rope_freq_scale": "freq_scale",
    "yarn_ext_factor": "ext_factor", "yarn_attn_factor": "attn_factor",
    "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow",
}  # fmt: skip


def _rope(o: Mapping[str, Any]) -> RopeOverrides:
    """The rope keywords, typed as llama.cpp's context parameters (its float32 fields and
    enumeration; None for the scaling type is llama-cpp-python's "unspecified")."""
    kind = -1 if o["rope_scaling_type"] is None else o["rope_scaling_type"]
    if isinstance(kind, bool) or not isinstance(kind, int):
        raise ValueError(
            f"rope_scaling_type must be an integer (-1: the model's, 0 none, 1 linear, "
            f"2 yarn, 3 longrope), got {kind!r}"
        )
    numbers = {}
    for name, attr in _ROPE_KEYWORDS.items():
        value = o[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        numbers[attr] = float(value)
    _count("yarn_orig_ctx", o["yarn_orig_ctx"], minimum=0)
    return RopeOverrides(scaling_type=kind, orig_ctx=o["yarn_orig_ctx"], **numbers)


#: the most accelerators ``tensor_split`` may name (llama.cpp's ``LLAMA_MAX_DEVICES``)
MAX_DEVICES = 16


def _split_shares(split: Any) -> None:
    """``tensor_split``: None, or each accelerator's share of the split (finite, >= 0,
    at least one above 0; at most :data:`MAX_DEVICES`), as llama.cpp takes it."""
    if split is None:
        return
    try:
        shares = [float(x) for x in split]
    except (TypeError, ValueError):
        raise ValueError(
            f"tensor_split must be a list of numbers (each accelerator's share), got {split!r}"
        ) from None
    if len(shares) > MAX_DEVICES or not all(math.isfinite(x) and x >= 0 for x in shares):
        raise ValueError(
            f"tensor_split must hold at most {MAX_DEVICES} finite shares >= 0, got {split!r}"
        )
    if not any(shares):
        raise ValueError(f"tensor_split must give some accelerator a share above 0, got {split!r}")


def _count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _threads(value: int | None) -> int | None:
    """llama.cpp reads a thread count of 0 or less as "pick one": the runner then picks."""
    return value if value is not None and value > 0 else None


def _cache_type(name: str, value: Any) -> Type:
    """K's or V's type in the KV cache, from llama.cpp's ``ggml_type`` ids (None: F16)."""
    if value is None:
        return Type.F16
    try:
        t = Type(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a ggml type id") from None
    if t not in CACHE_TYPES:
        ids = ", ".join(f"{int(c)} ({c.name.lower()})" for c in CACHE_TYPES)
        raise ValueError(f"{name}={value!r} ({t.name}) is not a KV cache type: use one of {ids}")
    return t
