"""llama.cpp's ``--split-mode row``: every block's weights split over several devices.

Megatron-style tensor parallelism through the meta device: Q, K, V, gate and up are
split by rows (each member computes some heads and some of the FFN width), the
attention output and down projections by their reduction axis (each member's partial
sum is all-reduced), and the KV cache by heads, so attention never leaves a member.
Each member gets whole KV heads with their query heads; ``--tensor-split 3,1`` sets the
proportions (default: even). Norms, embeddings and a tied output stay mirrored.

Proportions are rounded to whole KV heads and whole quantization blocks of the FFN, and
a member that rounding leaves with none gets one from the largest share: ``3,1`` over
a model with 2 KV heads gives each device one head (attention cannot be split finer)
and the FFN 3:1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

from tensorplug.device import Device
from tensorplug.errors import TensorplugError
from tensorplug.gguf import GGUFFile
from tensorplug.meta import MetaDevice, SplitState, even_sizes, meta_device
from tensorplug.tensor import Tensor

from .model import LlamaConfig

__all__ = ["RowSizes", "row_split_device", "row_split_sizes"]

_BLOCK = re.compile(
    r"^blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$"
)
_CACHE = re.compile(r"^cache_[kv]_l\d+$")


class RowSizes(NamedTuple):
    """Each member's share: KV heads (with their query heads) and FFN rows."""

    kv_heads: tuple[int, ...]
    ffn: tuple[int, ...]


def row_split_sizes(
    f: GGUFFile, n_devices: int, proportions: Sequence[float] | None = None
) -> RowSizes:
    """How ``f``'s blocks are shared among ``n_devices`` at ``proportions`` (default
    even): every member gets at least one KV head and one FFN block, else an error that
    says why."""
    cfg = LlamaConfig.from_gguf(f)
    if cfg.n_expert:
        raise TensorplugError(
            f"the model is a mixture of {cfg.n_expert} experts, which the row split does not "
            "lay out yet; use --split-mode layer"
        )
    n = n_devices
    weights = list(proportions) if proportions else [1.0] * n
    if len(weights) != n:
        raise TensorplugError(
            f"--tensor-split gives {len(weights)} proportions for {n} devices; give one per device"
        )
    if 0 in weights:
        raise TensorplugError(
            f"--tensor-split {','.join(f'{w:g}' for w in weights)} gives a device no share; "
            "leave that device out of --device instead"
        )
    if cfg.n_head_kv < n:
        raise TensorplugError(
            f"the model has {cfg.n_head_kv} KV heads, fewer than the {n} devices of the row "
            "split: every device needs at least one head; use fewer devices or --split-mode layer"
        )
    block = _ffn_block(f)
    if cfg.n_ff // block < n:
        raise TensorplugError(
            f"the FFN's {cfg.n_ff} rows are {cfg.n_ff // block} blocks of {block}, fewer than the "
            f"{n} devices of the row split; use fewer devices or --split-mode layer"
        )
    kv_heads = _at_least_one(even_sizes(cfg.n_head_kv, weights))
    ffn = tuple(u * block for u in _at_least_one(even_sizes(cfg.n_ff // block, weights)))
    return RowSizes(kv_heads, ffn)


def _at_least_one(parts: Sequence[int]) -> tuple[int, ...]:
    """``parts`` with every 0 raised to 1, taken from the largest part (the first of
    equals); the sum is kept. The caller makes sure the sum is at least ``len(parts)``."""
    out = list(parts)
    for i, part in enumerate(out):
        if part == 0:
            j = out.index(max(out))
            out[j] -= 1
            out[i] = 1
    return tuple(out)


def row_split_device(
    f: GGUFFile, devices: Sequence[Device], proportions: Sequence[float] | None = None
) -> MetaDevice:
    """A meta device over ``devices`` laying out ``f``'s llama weights and KV cache."""
    cfg = LlamaConfig.from_gguf(f)
    if cfg.arch.fused or cfg.arch.encoder or cfg.arch.qk_norm_full:
        # a fused QKV or gate-up matrix would need a split in segments, an encoder's
        # biases the same split as their rows, a norm over a whole projection the sum of
        # squares of every member's share: not laid out here yet
        raise TensorplugError(
            f"{f.path}: --split-mode row does not split '{cfg.arch.name}' models yet (fused "
            "or biased projections, or norms across heads); use --split-mode layer"
        )
    kv_heads, ffn = row_split_sizes(f, len(devices), proportions)
    hd, group = cfg.head_dim, cfg.n_head // cfg.n_head_kv
    q_rows = tuple(h * group * hd for h in kv_heads)
    kv_rows = tuple(h * hd for h in kv_heads)
    states = {
        "attn_q": SplitState.split(1, q_rows),
        "attn_k": SplitState.split(1, kv_rows),
        "attn_v": SplitState.split(1, kv_rows),
        "attn_output": SplitState.split(0, q_rows),
        "ffn_gate": SplitState.split(1, ffn),
        "ffn_up": SplitState.split(1, ffn),
        "ffn_down": SplitState.split(0, ffn),
    }
    cache = SplitState.split(0, kv_rows)

    def split_state(t: Tensor) -> SplitState | None:
        if _CACHE.match(t.name):
            return cache
        m = _BLOCK.match(t.name)
        return states[m.group(1)] if m else None

    return meta_device(devices, split_state)


def _ffn_block(f: GGUFFile) -> int:
    """The granularity of an FFN split: every FFN matrix's quantization block."""
    sizes = {1}
    for name, info in f.tensors.items():
        if re.match(r"^blk\.\d+\.ffn_(gate|up|down)\.weight$", name):
            sizes.add(info.type.block_size)
    return math.lcm(*sizes)
