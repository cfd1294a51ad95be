"""RoPE's settings for a context: the model file's, overridden as llama.cpp overrides them.

llama.cpp reads a model's trained rope (``llama_hparams``: base, scale, scaling type,
YaRN's original context and knobs) and then, in ``llama_context``'s constructor, lets the
context's parameters (llama-cpp-python's ``rope_freq_base``, ``rope_scaling_type``,
``yarn_*`` keywords) replace them by rules of its own: 0 or a negative value means "the
model's", a scaling type of none forces the scale to 1, YaRN's extrapolation mix
defaults to 1 for YaRN only, and YaRN's magnitude is recomputed from the scale, whatever
``yarn_attn_factor`` says. :func:`resolve` applies those rules in float32, as the C code
does, so that the numbers the rope op receives are llama.cpp's to the bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["SCALING_TYPES", "RopeOverrides", "RopeParams", "RopeTrain", "resolve", "yarn_mscale"]

_F32 = np.float32

#: llama.cpp's ``llama_rope_scaling_type`` values
SCALING_TYPES = {-1: "unspecified", 0: "none", 1: "linear", 2: "yarn", 3: "longrope"}
_BY_NAME = {name: value for value, name in SCALING_TYPES.items()}


@dataclass(frozen=True)
class RopeOverrides:
    """A context's rope parameters (llama.cpp's ``llama_context_params``), each at its
    "the model's" value by default, as ``llama_context_default_params`` and
    llama-server's flags have them.

    ``scaling_type`` -1 (the file's), 0 none, 1 linear, 2 YaRN, 3 LongRoPE;
    ``freq_base``/``freq_scale`` 0: the file's; ``ext_factor`` < 0: 1 for YaRN, else 0;
    ``attn_factor``, ``beta_fast``, ``beta_slow`` < 0: the model's (1, and the file's
    betas or 32 and 1); ``orig_ctx`` 0: the file's original context (else its trained
    one). llama-cpp-python's ``Llama`` passes 1.0, 32.0 and 1.0 for the last three
    unless told otherwise, which replace a file's betas, as they do in llama.cpp."""

    scaling_type: int = -1
    freq_base: float = 0.0
    freq_scale: float = 0.0
    ext_factor: float = -1.0
    attn_factor: float = -1.0
    beta_fast: float = -1.0
    beta_slow: float = -1.0
    orig_ctx: int = 0

    def __post_init__(self) -> None:
        if self.scaling_type not in SCALING_TYPES:
            raise ValueError(
                f"rope_scaling_type must be -1 (the model's), 0 (none), 1 (linear), 2 (yarn) "
                f"or 3 (longrope), got {self.scaling_type!r}"
            )
        for name in ("freq_base", "freq_scale"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"rope_{name} must be a finite number >= 0 (0: the model file's), got {value!r}"
                )
        for name in ("ext_factor", "attn_factor", "beta_fast", "beta_slow"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(
                    f"yarn_{name} must be a finite number (negative: the model's), got {value!r}"
                )
        if not 0 <= self.orig_ctx < 2**32:
            raise ValueError(
                f"yarn_orig_ctx must be an integer from 0 (the model file's) to 2**32-1, "
                f"got {self.orig_ctx!r}"
            )


@dataclass(frozen=True)
class RopeTrain:
    """The model file's rope (llama.cpp's ``llama_hparams``): ``scaling`` is its
    ``rope.scaling.type`` (llama.cpp reads a file without one as linear), ``freq_scale``
    1/its factor (1 without one), ``attn_factor`` its ``rope.scaling.attn_factor``,
    ``yarn_log_mul`` its ``rope.scaling.yarn_log_multiplier`` (0: none)."""

    scaling: str = "linear"
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    attn_factor: float = 1.0
    n_ctx_orig: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    yarn_log_mul: float = 0.0


@dataclass(frozen=True)
class RopeParams:
    """What the rope op receives (llama.cpp's ``llama_cparams``): ``ggml_rope_ext``'s
    ``freq_base``, ``freq_scale``, ``ext_factor``, ``attn_factor``, ``beta_fast``,
    ``beta_slow`` and ``n_ctx_orig``."""

    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float
    beta_slow: float
    n_ctx_orig: int


def resolve(train: RopeTrain, given: RopeOverrides | None = None) -> RopeParams:
    """``llama_context``'s rules for ``train`` overridden by ``given``, in float32."""
    o = given or RopeOverrides()
    kind = o.scaling_type if o.scaling_type != -1 else _BY_NAME[train.scaling]
    base = _F32(o.freq_base) if o.freq_base != 0 else _F32(train.freq_base)
    scale = _F32(o.freq_scale) if o.freq_scale != 0 else _F32(train.freq_scale)
    if kind == _BY_NAME["none"]:
        scale = _F32(1)  # llama.cpp never scales when the type is none
    ext = _F32(o.ext_factor)
    if ext < 0:
        ext = _F32(1 if kind == _BY_NAME["yarn"] else 0)
    attn = _F32(o.attn_factor) if o.attn_factor >= 0 else _F32(1)
    if ext != 0:
        factor = _F32(1) / scale
        if train.yarn_log_mul != 0:  # mscale 1 against mscale_all_dims (Mistral 3)
            attn = _F32(_mscale(factor, _F32(1)) / _mscale(factor, _F32(train.yarn_log_mul)))
        else:
            attn = _mscale(factor, _F32(1))
        # ggml's rope multiplies by YaRN's 1 + 0.1·ln(factor) itself: cancelled here
        attn = _F32(attn * (_F32(1) / (_F32(1) + _F32(0.1) * _logf(factor))))
    attn = _F32(attn * _F32(train.attn_factor))
    beta_fast = _F32(o.beta_fast) if o.beta_fast >= 0 else _F32(train.beta_fast)
    beta_slow = _F32(o.beta_slow) if o.beta_slow >= 0 else _F32(train.beta_slow)
    return RopeParams(
        freq_base=float(base),
        freq_scale=float(scale),
        ext_factor=float(ext),
        attn_factor=float(attn),
        beta_fast=float(beta_fast),
        beta_slow=float(beta_slow),
        n_ctx_orig=o.orig_ctx or train.n_ctx_orig,
    )


def yarn_mscale(freq_scale: float, ext_factor: float) -> float:
    """The magnitude ggml's rope multiplies by on its own: ``1 + 0.1·ln(1/freq_scale)``
    when ``ext_factor`` ≠ 0, else 1 (a K-shift divides it out to only rotate)."""
    if ext_factor == 0:
        return 1.0
    return float(_F32(1) + _F32(0.1) * _logf(_F32(1) / _F32(freq_scale)))


def _mscale(scale: np.float32, mscale: np.float32) -> np.float32:
    """llama.cpp's ``get_mscale``: ``0.1·mscale·ln(scale) + 1`` above 1, else 1."""
    return _F32(1) if scale <= 1 else _F32(_F32(0.1) * mscale * _logf(scale) + _F32(1))


def _logf(x: np.float32) -> np.float32:
    """C's ``logf``, correctly rounded (glibc's is, but for rare last-bit cases)."""
    return _F32(math.log(float(x)))
