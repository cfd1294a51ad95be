"""How long the context is, and what happens when generation reaches its end.

The commands' default context is the model's trained length, as llama.cpp's is since
``-c 0`` became its default, capped by what fits in memory (llama.cpp's ``--fit``): a
128k-token model must not ask a laptop for 16 GiB of KV cache. The memory a context
costs grows linearly with its length — each block's K and V rows, and the prompt
step's attention scores (``n_batch`` x ``n_ctx`` per head, in float32, with their
softmax) — so the longest context that fits is the free memory of each device that
holds blocks, less the weights it holds and a margin, divided by what one position
costs there. The library's own default stays llama.cpp's ``llama_context_default_params``
one (at most 512): a program that embeds the model chooses its context itself.

At the end of the context, generation stops (with a line saying so) or, with
``--context-shift``, makes room as llama.cpp's does: the first ``n_keep`` tokens stay,
half of the rest is dropped, and generation goes on. Today's cache holds one sequence at
positions 0..n_past-1, so the kept tail is evaluated again at its new positions rather
than re-roped in place: slower than llama.cpp's K-shift, and exactly what evaluating the
shortened text from scratch gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensorplug.cli import format_bytes
from tensorplug.types import Type, row_size

if TYPE_CHECKING:
    from tensorplug.device import Device
    from tensorplug.gguf import GGUFFile

    from .model import LlamaConfig
    from .placement import Placement
    from .runner import Generation, ModelRunner
    from .sampling import Sampler

__all__ = [
    "FIT_MARGIN",
    "MIN_FITTED_CONTEXT",
    "ContextChoice",
    "bytes_per_position",
    "choose_context",
    "generate_with_shift",
    "rope_scaling_note",
]

#: Memory left free on each device when the context is fitted (llama.cpp's ``--fit-target``
#: default, 1024 MiB): compute buffers, the allocator's rounding, everything else running.
FIT_MARGIN = 1 << 30
#: A fitted context is never shorter than this (or the trained length, if shorter): the
#: commands' old default, which every model here runs in.
MIN_FITTED_CONTEXT = 512


@dataclass(frozen=True)
class ContextChoice:
    """A context length and why it was chosen (shown in the run header)."""

    n_ctx: int
    reason: str


def bytes_per_position(
    cfg: LlamaConfig, cache_type: Type, n_layer: int, n_batch: int, type_v: Type | None = None
) -> int:
    """What one more context position costs on a device holding ``n_layer`` blocks: K and
    V rows in the cache type (V's ``type_v`` when it has its own), and the prompt step's
    attention scores and softmax (float32, one layer at a time: the allocator reuses
    them) and mask (float16) for a batch of ``n_batch`` tokens."""
    v = cache_type if type_v is None else type_v
    kv = n_layer * (row_size(cache_type, cfg.n_embd_kv) + row_size(v, cfg.n_embd_kv))
    scores = n_batch * (2 * cfg.n_head * 4 + 2) if n_layer else 0
    return kv + scores


def choose_context(
    f: GGUFFile,
    cfg: LlamaConfig,
    placement: Placement,
    cache_type: Type,
    n_batch: int,
    requested: int = 0,
    margin: int = FIT_MARGIN,
    type_v: Type | None = None,
) -> ContextChoice:
    """``requested`` (``-c``) when given, else the trained length capped by what fits
    on every device that holds blocks."""
    trained = cfg.n_ctx_train
    if requested > 0:
        if requested > trained:
            return ContextChoice(requested, f"-c {requested}; " + rope_scaling_note(cfg))
        return ContextChoice(requested, f"-c {requested}")
    weights = _weights_by_device(f, placement)
    blocks: dict[Device, int] = {}
    for dev in placement.layers:
        blocks[dev] = blocks.get(dev, 0) + 1
    n_ctx, tightest = trained, ""
    for dev, n_layer in blocks.items():
        free, _total = dev.memory()
        if free <= 0:  # the device cannot say: nothing to fit against
            continue
        per = bytes_per_position(cfg, cache_type, n_layer, min(max(n_batch, 1), trained), type_v)
        room = free - weights.get(dev, 0) - margin
        fits = max(room, 0) // per
        if fits < n_ctx:
            n_ctx = int(fits)
            held = format_bytes(weights.get(dev, 0))
            tightest = (
                f"{dev.name} has {format_bytes(free)} free; less {held}"
                f" of weights and a {format_bytes(margin)} margin, at {format_bytes(per)} per "
                "position (KV cache and attention scores)"
            )
    if not tightest:
        return ContextChoice(trained, "the model's trained length, which fits in memory")
    floor = min(trained, MIN_FITTED_CONTEXT)
    if n_ctx < floor:
        return ContextChoice(floor, f"the least tried ({floor}), though it may not fit: {tightest}")
    return ContextChoice(
        n_ctx, f"the trained length ({trained}) capped by memory: {tightest}; -c sets it"
    )


def rope_scaling_note(cfg: LlamaConfig) -> str:
    """What a context beyond the trained length runs on: the file's rope scaling, or
    none (then the positions past it are ones the model never saw)."""
    trained = cfg.n_ctx_train
    if cfg.rope_ext_factor > 0:
        how = f"YaRN, factor {1 / cfg.rope_scale:g} from {cfg.rope_n_ctx_orig or trained}"
        return f"longer than the trained {trained}; the file's rope scaling applies ({how})"
    if cfg.rope_scale != 1.0:
        how = f"linear, factor {1 / cfg.rope_scale:g}"
        return f"longer than the trained {trained}; the file's rope scaling applies ({how})"
    return (
        f"longer than the trained {trained}, and the file has no rope scaling: the model "
        "has never seen positions past it, expect the text to degrade there"
    )


def _weights_by_device(f: GGUFFile, placement: Placement) -> dict[Device, int]:
    """Bytes of the file's tensors each device holds (as stored in the file)."""
    out: dict[Device, int] = {}
    for name, info in f.tensors.items():
        number = name.split(".")[1] if name.startswith("blk.") else ""
        if number.isdigit() and int(number) < len(placement.layers):
            dev = placement.layers[int(number)]
        elif name.startswith("token_embd"):
            dev = placement.input
        else:
            dev = placement.output
        out[dev] = out.get(dev, 0) + info.nbytes
    return out


def generate_with_shift(
    model: ModelRunner,
    prompt: Sequence[int],
    n_predict: int,
    sampler: Sampler,
    *,
    n_keep: int,
    on_token: Callable[[int], None] | None = None,
    on_shift: Callable[[int, int], None] | None = None,
    stop_at_eos: bool = True,
    prompt_logits: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
) -> Generation:
    """:meth:`ModelRunner.generate` that, at the end of the context, keeps the first ``n_keep``
    tokens, drops half of the rest and goes on (llama.cpp's context shift), until
    ``n_predict`` tokens, an end-of-generation token, or a context too small to shift
    (``n_keep`` leaves less than two positions to drop). ``on_shift(n_kept, n_dropped)``
    is told of each shift. The tokens kept after ``n_keep`` are evaluated again at their
    new positions (the module's docstring says why)."""
    start = model.n_past
    gen = model.generate(
        prompt,
        n_predict,
        sampler,
        on_token=on_token,
        stop_at_eos=stop_at_eos,
        prompt_logits=prompt_logits,
        on_progress=on_progress,
    )
    # what the cache holds (positions start..n_past-1) and, last, the token sampled after it
    history = list(prompt) + gen.tokens
    while not gen.stopped_at_eos and len(gen.tokens) < n_predict and model.n_past >= model.n_ctx:
        keep = min(max(n_keep, 0), model.n_past - start)
        n_discard = (model.n_past - start - keep) // 2
        if n_discard < 1:
            break
        history = history[:keep] + history[keep + n_discard :]
        if on_shift is not None:
            on_shift(start + keep, n_discard)
        model.n_past = start + keep
        more = model.generate(
            history[keep:],
            n_predict - len(gen.tokens),
            sampler,
            on_token=on_token,
            stop_at_eos=stop_at_eos,
        )
        gen.tokens += more.tokens
        gen.stopped_at_eos = more.stopped_at_eos
        history += more.tokens
    return gen
