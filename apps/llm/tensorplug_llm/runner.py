"""Running a llama GGUF model: weights on devices, a KV cache, and replayed step graphs.

:class:`ModelRunner` loads a model the way llama.cpp does: weights the host CPU computes on
are the file's own memory map (no copy), weights of other devices are uploaded into
their buffers, each block's KV cache is allocated (and zeroed) on the block's device.
:class:`~tensorplug.Scheduler` over those devices, with the host CPU backend last,
run the steps: a step graph of up to :data:`OWN_SCHEDULER_ROWS` rows (a token, a
server's decode step, a short prompt chunk) has a scheduler of its own that keeps it
split and allocated, so going from a prompt to generation and back, or from one
context length to the next, does not split and allocate a graph again (for a small
model, that Python is a visible share of a token); longer prompt steps share one.

A step is a graph of fixed shape — ``n_tokens`` new tokens attending to ``n_kv`` cache
rows, ``n_kv`` the used context rounded up to ``kv_pad`` times a power of two
(:meth:`ModelRunner.kv_width`) — kept in a small cache of built graphs. A graph that is
already allocated is computed again with new inputs, so decoding token after token
costs one set of input writes, one compute and one read of the logits.

Several sequences share the one KV cache (llama.cpp's unified cache): ``ModelRunner.kv``
(:class:`~tensorplug_llm.kv_cells.KVCells`) says which cache rows hold which sequences
at which positions, :meth:`ModelRunner.decode` evaluates a :class:`~tensorplug_llm.batch.Batch`
whose tokens may belong to different sequences (the mask comes from the cells), and
``eval``/``generate``/``n_past`` are sequence 0 on top of it. The engine
(``engine.py``) schedules many requests over those sequences.

Timings follow llama.cpp's split: batches of several tokens are "prompt" time, single
tokens "generation" time; each is divided into the scheduler's ``graph_compute`` (the
kernels and the copies between devices) and everything else (Python: building and
allocating graphs, writing inputs, reading logits).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tensorplug import collector, ops, registry
from tensorplug.alloc import alloc_tensors
from tensorplug.backend import Backend, Status
from tensorplug.buffer import Buffer, BufferType, BufferUsage
from tensorplug.errors import BackendNotFoundError, ComputeAbortedError, RunError
from tensorplug.gguf import GGUFError, GGUFFile, GGUFStringError
from tensorplug.host import available_cores
from tensorplug.sched import Scheduler
from tensorplug.tensor import Tensor, new_tensor
from tensorplug.transfer import set_array
from tensorplug.types import Type

from .batch import Batch
from .encoder import EncoderWeights, build_encoder_step
from .kv_cells import ContextFullError, KVCells
from .lora import LoraAdapter
from .model import (
    KVCache,
    LlamaConfig,
    LlamaWeights,
    StepGraph,
    build_k_shift,
    build_step,
    kv_rotation,
)  # fmt: skip
from .placement import Placement, by_priority, host_cpu
from .pooling import pool, pooling_kind
from .rope import RopeOverrides
from .sampling import Sampler, TokenSampler
from .step_io import StepIO
from .threads import ThreadGovernor
from .tokenizer import Vocab

if TYPE_CHECKING:
    from os import PathLike

    from tensorplug.device import Device

__all__ = [
    "ContextFullError",
    "Generation",
    "ModelRunner",
    "SplitSummary",
    "Timings",
    "embedding_model_message",
]

#: Built step graphs kept for replay (step sizes x context lengths x outputs), at the
#: least: a server cycles through the bucketed prompt sizes, its decode sizes and a few
#: ``n_kv``; its warm-up builds 10 prompt sizes and 1..``-np`` decode sizes at two
#: ``n_kv`` (``engine.WARM_UP_LEVELS``) and asks to keep them all
#: (:meth:`ModelRunner.keep_graphs`: 52 graphs for ``-np 16``).
GRAPH_CACHE = 40
#: Tensors below this many bytes are copied out of the file rather than mapped (where
#: weights are mapped): Linux maps in the page cache's whole large folios around the
#: pages of a mapping it is asked for, so the few KiB of each layer's norms, interleaved
#: with the repacked products' bytes, could make up to a folio each resident: tens of
#: megabytes for a model's norms, where copying them costs their own few KiB.
COPIED_BELOW = 1 << 20
#: The largest step graph that gets a scheduler of its own, which keeps it allocated
#: (a server's steps: ``engine.WARM_UP_ROWS``); its compute buffer holds a few rows'
#: activations (1.3 MiB at 64 rows for SmolLM2-135M; about 9x that for a 7B model).
OWN_SCHEDULER_ROWS = 64
#: The token counts (and output counts) :meth:`ModelRunner.step_rows` rounds a padded step up
#: to, before the powers of two and one and a half times them: up to 4 a step runs at its
#: own size, then at the row counts where the CPU switches kernels (numba attention and
#: most fused products up to 8 rows, Q4_1/Q8_0/Q6_K's fused products up to 12,
#: Q4_0/Q4_K's up to 16), so padding never moves a step from one kernel to another that
#: rounds otherwise. Above 16 rows a prompt step's cost grows with its rows (decoding +
#: BLAS), so the sizes grow by at most 1.5x: padding wastes a third at worst, a fifth on
#: average, where each new size costs a graph.
STEP_SIZES = (8, 12, 16)
#: The fewest outputs a padded step computes: a prompt's last token alone or beside up to
#: three decoding requests' (a server's usual mix) is one shape, not four; the 3 extra
#: output rows cost a fraction of a prompt step.
PADDED_OUTPUTS = 4
#: Seconds after a prompt batch whose generation steps the thread governor does not time
#: (a backend's library threads may still spin then; ``ThreadGovernor.pause``)
AFTER_BATCH_SECONDS = 0.15
#: Token counts of the warm-up's steps: a prompt (the prompt path: kernels, threads and
#: their buffers) and one token. Between them they load every kernel a prompt of any
#: length takes (the CPU's fused few-row kernels are the token step's; a test checks it),
#: so a third, short prompt step would only build the plan of its own length: a
#: noticeable share of a small model's launch, for prompts of exactly that length
WARM_UP_STEPS = (24, 1)


@dataclass
class Timings:
    """Where the time went, in seconds (llama.cpp's prompt / eval split)."""

    load_s: float = 0.0
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    prompt_compute_s: float = 0.0
    gen_tokens: int = 0
    gen_s: float = 0.0
    gen_compute_s: float = 0.0
    samples: int = 0
    sample_s: float = 0.0
    graphs_built: int = 0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s else float("nan")

    @property
    def gen_tps(self) -> float:
        return self.gen_tokens / self.gen_s if self.gen_s else float("nan")


@dataclass
class Generation:
    tokens: list[int]
    prompt_logits: np.ndarray | None = None  # (n_prompt, n_vocab) when asked for
    stopped_at_eos: bool = False


@dataclass(frozen=True)
class SplitSummary:
    """How the scheduler cut a step graph: per split its backend, node count and the
    tensors copied in from other backends before it runs."""

    n_nodes: int
    splits: tuple[tuple[str, int, tuple[str, ...]], ...]
    copied_bytes: int

    @property
    def n_splits(self) -> int:
        return len(self.splits)

    @property
    def n_copies(self) -> int:
        return sum(len(inputs) for _, _, inputs in self.splits)


@dataclass
class _DeviceMemory:
    weights: int = 0
    kv_cache: int = 0
    mapped: bool = False
    #: bytes of weights (as in the file) per extra buffer type they went to (``CPU_REPACK``)
    extra: dict[str, int] = field(default_factory=dict)
    buffers: list[Buffer] = field(default_factory=list)


def _check_cache_devices(cache: KVCache, cfg: LlamaConfig, placement: Placement) -> None:
    """Refuse a quantized cache on a device that cannot read it: its attention (and the
    cache's rotation) would go to another device every step, with the whole cache."""
    if not (cache.type_k.is_quantized or cache.type_v.is_quantized):
        return
    hd = cfg.head_dim
    q = new_tensor(Type.F32, (1, 1, hd), "probe_q")
    k = new_tensor(cache.type_k, (1, 1, hd), "probe_k")
    v = new_tensor(cache.type_v, (1, 1, hd), "probe_v")
    probes = [ops.flash_attn_ext(q, k, v, scale=1.0, online=True)]
    rot = kv_rotation(cache.type_k, hd, widest=True) or kv_rotation(cache.type_v, hd, False)
    if rot:
        probes.append(ops.hadamard(new_tensor(Type.F32, (1, hd), "probe_rows"), rot))
    for dev in dict.fromkeys(placement.layers):
        if not all(dev.supports_op(node) for node in probes):
            raise RunError(
                f"a {cache.type_names} KV cache is read by the CPU backend only, and "
                f"{dev.name} holds blocks: keep the cache f16 (-ctk f16 -ctv f16), or put "
                "the blocks on the CPU (-ngl 0)"
            )


class ModelRunner:
    """A llama model ready to evaluate tokens.

    ``placement`` says where blocks live (default: every block and the output layer on
    the best GPU, token embeddings on the CPU — llama.cpp's ``-ngl 999`` — or
    everything on the CPU when there is no GPU).
    ``n_ctx`` defaults to the training context capped at 512; ``n_batch`` is the prompt
    chunk; ``use_mmap=False`` copies CPU weights into their own buffer instead of
    computing from the file's mapping (whose pages are mapped in while the model loads,
    as llama.cpp's ``MAP_POPULATE`` does, not faulted in by the first prompt).
    ``warmup`` evaluates a few tokens once, so that kernel builds and first-use costs
    are not counted as prompt time (:meth:`warm_up`: a caller that knows its first
    prompt's length passes False and warms up for that length).
    ``repack`` lets a device keep the weights of matrix products in an extra buffer type
    of its own where it offers one (the CPU's ``CPU_REPACK``, as llama.cpp does): those
    weights are then copied in at load rather than read from the file's mapping, and a
    tied output layer is stored a second time, beside the mapped token embeddings.
    ``n_threads`` fixes the thread count of every backend with ggml's ``set_n_threads``
    extension (the CPU's); left out, a :class:`ThreadGovernor` picks it for generation
    steps from their measured times, so a machine busy with other work does not make
    every parallel kernel wait for its last thread (``threads.py``).
    ``batch_invariant`` asks every backend that offers the choice (the CPU's
    ``set_batch_invariant``) to sum each row as if it were alone, so that a sequence's
    numbers never depend on the sequences decoded beside it, as the server's engine
    needs; left False, the CPU sums as ggml does, llama.cpp's logits to the bit, which
    like ggml's depend on how many rows a step holds (:meth:`set_batch_invariant`).
    ``rope`` overrides the file's rope settings as a llama.cpp context's parameters do
    (llama-cpp-python's ``rope_freq_base``, ``rope_scaling_type``, ``yarn_*``).
    ``flash_attn`` computes attention as ggml's flash attention kernel does (llama.cpp's
    ``flash_attn``), not as its graph without it.
    ``cache_type`` is the KV cache's type, K's when ``cache_type_v`` gives V's (llama.cpp's
    ``type_k``/``type_v``): F16, F32, BF16, or Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1, which
    attention reads as ggml's flash attention kernel does whatever ``flash_attn`` says.
    ``lora``: LoRA adapter files and their scales, applied at run time beside the
    products they adapt, as llama.cpp applies them (:mod:`.lora`).

    Each new prompt length builds a step graph and plan that are kept; every few of them
    Python's cyclic collector walks the whole process (over a hundred thousand objects
    with numba loaded, as long as many of a small model's tokens). An application that owns its
    process can call ``gc.collect(1); gc.freeze()`` once the model is loaded, as
    ``tensorplug run``/``chat``/``serve`` do, so that collections walk only what came
    after (a full ``gc.collect()`` first also frees older garbage, and takes as long as
    such a walk).
    """

    def __init__(
        self,
        model: str | PathLike[str] | GGUFFile,
        *,
        placement: Placement | None = None,
        n_ctx: int | None = None,
        n_batch: int = 256,
        cache_type: Type | str = Type.F16,
        cache_type_v: Type | str | None = None,
        kv_pad: int = 256,
        use_mmap: bool = True,
        warmup: bool = True,
        on_progress: Callable[[str, int, int], None] | None = None,
        n_threads: int | None = None,
        repack: bool = True,
        batch_invariant: bool = False,
        rope: RopeOverrides | None = None,
        flash_attn: bool = False,
        lora: Sequence[tuple[str | PathLike[str], float]] = (),
    ) -> None:
        start = time.perf_counter()
        #: the runner again, on the same file and settings, its memory taken anew
        #: (:meth:`restore`)
        self._again = functools.partial(
            ModelRunner, placement=placement, n_ctx=n_ctx, n_batch=n_batch,
            cache_type=cache_type, cache_type_v=cache_type_v, kv_pad=kv_pad, use_mmap=use_mmap,
            warmup=False,
            n_threads=n_threads, repack=repack, batch_invariant=batch_invariant, rope=rope,
            flash_attn=flash_attn, lora=lora,
        )  # fmt: skip
        self.released = False
        self.repack = repack
        self._extra_bufts: dict[Device, list[BufferType]] = {}  # by _extra_buft
        self._progress = on_progress or (lambda stage, done, total: None)
        self.file = model if isinstance(model, GGUFFile) else GGUFFile(model)
        self.config = cfg = dataclasses.replace(
            LlamaConfig.from_gguf(self.file, rope), flash_attn=flash_attn
        )
        try:
            self.vocab: Vocab | None = Vocab.from_gguf(self.file)
            self.vocab_error = ""
        except GGUFStringError:
            raise  # a damaged file: refused, not run on token ids as one without a tokenizer
        except GGUFError as e:
            self.vocab, self.vocab_error = None, str(e)
        self.n_ctx = n_ctx or min(cfg.n_ctx_train, 512)
        if n_batch < 1 or kv_pad < 1 or self.n_ctx < 1:
            raise RunError(f"need n_ctx, n_batch, kv_pad >= 1 (got {n_ctx}, {n_batch}, {kv_pad})")
        # a bidirectional encoder must see its whole input in one step (llama.cpp's
        # n_ubatch >= n_tokens for non-causal attention)
        self.n_batch = min(n_batch, self.n_ctx) if cfg.causal else self.n_ctx
        self.kv_pad = kv_pad
        self.placement = placement or Placement.offload(cfg.n_layer, cfg.n_layer + 1)
        if len(self.placement.layers) != cfg.n_layer:
            raise RunError(
                f"the placement has {len(self.placement.layers)} blocks; the model has "
                f"{cfg.n_layer}"
            )
        p = self.placement
        self.weights: LlamaWeights | EncoderWeights
        if cfg.arch.encoder:
            self.weights = EncoderWeights.from_gguf(self.file, cfg)
        else:
            self.weights = w = LlamaWeights.from_gguf(
                self.file, cfg, share_output=p.output is p.input, n_ctx=self.n_ctx
            )
            if w.output is w.tok_embd and self._extra_buft(p.output, w.output) is not None:
                # get_rows reads the embeddings, products the output layer: two copies
                self.weights = LlamaWeights.from_gguf(self.file, cfg, False, self.n_ctx)
        #: the LoRA adapters applied to the products (:mod:`.lora`), in the order given
        self.adapters: list[LoraAdapter] = []
        for path, scale in lora:
            if not isinstance(self.weights, LlamaWeights):
                raise RunError(f"{self.file.path.name}: LoRA adapters apply to decoder models")
            adapter = LoraAdapter.open(path, self.weights, cfg.arch.name, scale)
            self.weights.attach(adapter)
            self.adapters.append(adapter)
        type_v = None if cache_type_v is None else Type.parse(cache_type_v)
        self.cache = KVCache.describe(cfg, self.n_ctx, Type.parse(cache_type), type_v)
        _check_cache_devices(self.cache, cfg, self.placement)
        self.memory: dict[Device, _DeviceMemory] = {}
        self._load(use_mmap)
        #: whether some weights are the file's mapping (checked before each step)
        self._mapped = any(mem.mapped for mem in self.memory.values())
        devices = by_priority([*p.devices(), host_cpu()])
        self.backends: list[Backend] = [d.init_backend() for d in devices]
        #: runs the prompt steps of more than :data:`OWN_SCHEDULER_ROWS` rows. A step graph
        #: of up to that many rows runs on a scheduler of its own (``_own_scheds``, by
        #: ``id(graph)``), which keeps it allocated: a server alternates prompt steps of a
        #: few padded sizes with decode steps of 1..``-np`` sequences, at a few ``n_kv``,
        #: and allocating a graph again at each switch would cost several small-model
        #: tokens' time (more on a busy machine), most of it the scheduler's split, a few
        #: times for every request.
        self.sched = Scheduler(self.backends)
        #: the scheduler of the step computed last, its graph split and allocated there
        self.last_scheduler = self.sched
        self._own_scheds: dict[int, Scheduler] = {}
        self._graphs: OrderedDict[tuple[int, int, int, bool], StepGraph] = OrderedDict()
        self._keep_graphs = GRAPH_CACHE  # how many of them (keep_graphs)
        #: which cache rows hold which sequences at which positions
        self.kv = KVCells(self.n_ctx)
        #: the step graphs' inputs and outputs, written and read through kept host views
        self._io = StepIO()
        self.timings = Timings()
        #: the splits of the prompt and generation graphs the schedulers hold, as they
        #: made them (the warm-up's, until a step of another shape)
        self.split_summaries: dict[str, SplitSummary] = {}
        if self.n_batch > OWN_SCHEDULER_ROWS:
            self.sched.reserve(self._graph(self.n_batch, self.n_ctx, self.n_batch).graph)
        #: picks the thread count of generation steps while no count is fixed
        self.governor: ThreadGovernor | None = None
        self._threads: int | None = None  # the count last given to the backends
        self._thread_setters = [
            (be, setter) for be in self.backends if (setter := _thread_setter(be)) is not None
        ]
        if n_threads is not None:
            self.set_n_threads(n_threads)
        self.batch_invariant = False
        self.set_batch_invariant(batch_invariant)
        self._most_outputs: int | None = None  # set_step_outputs
        governed = n_threads is None and bool(self._thread_setters) and available_cores() > 1
        if governed:
            self.governor = ThreadGovernor(self._apply_threads, available_cores())
        if warmup:
            self.warm_up()
        self.timings.load_s = time.perf_counter() - start

    # -- threads ------------------------------------------------------------------------------

    def set_n_threads(self, n_threads: int) -> None:
        """Fix the thread count of every backend that has ``set_n_threads`` (the CPU's),
        ending the governor's choice (llama.cpp's ``-t``)."""
        if not isinstance(n_threads, int) or isinstance(n_threads, bool) or n_threads < 1:
            raise RunError(f"n_threads must be an integer >= 1, got {n_threads!r}")
        self.governor = None
        self._apply_threads(n_threads)

    def set_step_outputs(self, most: int | None) -> None:
        """The output rows of a padded step with more than :data:`PADDED_OUTPUTS`
        outputs: ``most`` (rounded up by :meth:`step_rows`, at most the step's rows)
        where it has at most ``most``, else its own count rounded up; None: always its
        own count rounded up. A server whose steps carry one output per slot gives its
        slot count: a prompt step then has two shapes (beside a few decodes, beside
        many), where each count of decodes beside it would be one more graph to build,
        on the request that first meets it."""
        if most is not None and (not isinstance(most, int) or isinstance(most, bool)
                                 or most < 1):  # fmt: skip
            raise RunError(f"set_step_outputs: most must be an int >= 1 or None, got {most!r}")
        self._most_outputs = most

    def set_batch_invariant(self, invariant: bool) -> None:
        """Sum each row as if it were alone (True: a sequence's numbers never depend on
        the sequences in its steps), or in ggml's orders, llama.cpp's bits (False), on
        every backend whose registration offers ``set_batch_invariant`` (the CPU's;
        ``TENSORPLUG_CPU_GGML_PRODUCT_ORDER`` overrides it). Backends without the
        choice are left as they are."""
        if not isinstance(invariant, bool):
            raise RunError(f"batch_invariant must be True or False, got {invariant!r}")
        for backend in self.backends:
            setter = _extension(backend, "set_batch_invariant")
            if setter is not None:
                setter(backend, invariant)
        self.batch_invariant = invariant

    def keep_graphs(self, n: int) -> None:
        """Keep at least ``n`` built step graphs for replay (:data:`GRAPH_CACHE` at the
        least), and the plans a backend binds for them, on every backend whose
        registration offers ``keep_plans`` (the CPU's): a server that cycles through
        more step shapes than are kept builds each again when it comes back to it, a
        graph build, an allocation and a plan on a request's first token (the engine's
        warm-up asks for every shape it prepares)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RunError(f"keep_graphs: n must be an int >= 1, got {n!r}")
        self._keep_graphs = max(GRAPH_CACHE, n)
        for backend in self.backends:
            keep = _extension(backend, "keep_plans")
            if keep is not None:
                keep(backend, self._keep_graphs)

    def set_lora_scales(self, scales: Sequence[float]) -> None:
        """Apply each LoRA adapter at its scale of ``scales`` (in the order they were
        given; 0 switches one off): the step graphs are built again with them."""
        if len(scales) != len(self.adapters):
            raise RunError(f"{len(scales)} scales for {len(self.adapters)} LoRA adapters")
        for adapter, scale in zip(self.adapters, scales, strict=True):
            adapter.rescale(float(scale))
        for sg in self._graphs.values():
            if (own := self._own_scheds.pop(id(sg.graph), None)) is not None:
                own.free()
        self._graphs.clear()

    def _apply_threads(self, n_threads: int) -> None:
        if n_threads == self._threads:
            return
        for backend, setter in self._thread_setters:
            setter(backend, n_threads)
        self._threads = n_threads

    # -- loading ----------------------------------------------------------------------------

    def _load(self, use_mmap: bool) -> None:
        """Weights to their devices (mapped or uploaded), KV caches allocated and zeroed."""
        w, p = self.weights, self.placement
        weights: dict[Device, dict[int, Tensor]] = {}  # a shared tensor is loaded once
        caches: dict[Device, list[Tensor]] = {}
        for dev, tensors in [
            (p.input, w.input_tensors()),
            *((dev, w.layer_tensors(i)) for i, dev in enumerate(p.layers)),
            (p.output, w.output_tensors()),
        ]:
            group = weights.setdefault(dev, {})
            for t in tensors:
                group.setdefault(id(t), t)
        for i, dev in enumerate(p.layers):
            caches.setdefault(dev, []).extend(self.cache.layer_tensors(i))
        self._load_adapters(weights)
        n_tensors, done = sum(len(g) for g in weights.values()), 0
        products = {id(t) for t in w.product_weights()}
        # token embeddings that only get_rows reads (the output layer is a matrix of its
        # own, or a repacked copy of them): a prompt reads a few rows, so their pages are
        # not mapped in ahead (most of Gemma 3's file)
        only_rows = w.tok_embd is not getattr(w, "output", None)
        for dev, group in weights.items():
            mem = self.memory.setdefault(dev, _DeviceMemory())
            pairs: list[tuple[str, Tensor]] = []
            extra: dict[BufferType, list[tuple[str, Tensor]]] = {}
            for t in group.values():
                buft = self._extra_buft(dev, t) if id(t) in products else None
                (pairs if buft is None else extra.setdefault(buft, [])).append((w.by_name[t], t))

            def uploaded(name: str) -> None:
                nonlocal done
                done += 1
                self._progress("loading weights", done, n_tensors)

            for buft, chosen in extra.items():  # copied in, in the buffer type's layout
                if (buf := self.file.upload_tensors(chosen, buft, uploaded)) is not None:
                    mem.buffers.append(buf)
                    size = sum(t.nbytes for _, t in chosen)
                    mem.extra[buft.name] = mem.extra.get(buft.name, 0) + size

            if use_mmap and dev.caps.buffer_from_host_ptr:
                sparse = {name for name, t in pairs if only_rows and t is w.tok_embd}
                # a small tensor (a norm, a bias) is copied rather than mapped: mapping its
                # pages in maps the whole large folios of the page cache around them too
                small: list[tuple[str, Tensor]] = []
                mapped: list[tuple[str, Tensor]] = []
                for name, t in pairs:
                    (small if name not in sparse and t.nbytes < COPIED_BELOW else mapped).append(
                        (name, t)
                    )
                if small and (buf := self.file.upload_tensors(small, dev.buffer_type(),
                                                                uploaded)) is not None:  # fmt: skip
                    mem.buffers.append(buf)
                if mapped:
                    mem.buffers += self.file.map_tensors(mapped, dev, sparse)
                mem.mapped = True
                done += len(mapped)
                self._progress("loading weights", done, n_tensors)
            elif (buf := self.file.upload_tensors(pairs, dev.buffer_type(), uploaded)) is not None:
                mem.buffers.append(buf)
            mem.weights += sum(t.nbytes for t in group.values())
        for dev, kv in caches.items():
            buf = alloc_tensors(kv, dev.buffer_type(), BufferUsage.ANY)
            if buf is not None:
                if not buf.buft.zeroed:  # masked rows are multiplied by 0: no NaNs there
                    buf.clear(0)
                mem = self.memory.setdefault(dev, _DeviceMemory())
                mem.buffers.append(buf)
                mem.kv_cache += buf.size

    def _load_adapters(self, weights: dict[Device, dict[int, Tensor]]) -> None:
        """Each LoRA pair beside the weight it adapts, in the device's plain buffer type
        (never a repacked layout: llama.cpp keeps them out of extra buffer types too)."""
        if not self.adapters:
            return
        device_of = {id(t): dev for dev, group in weights.items() for t in group.values()}
        by_gguf = {name: t for t, name in self.weights.by_name.items()}
        for adapter in self.adapters:
            per_device: dict[Device, list[tuple[str, Tensor]]] = {}
            for name, pair in adapter.pairs.items():
                dev = device_of[id(by_gguf[name])]
                per_device.setdefault(dev, []).extend(
                    [(pair.a.name, pair.a), (pair.b.name, pair.b)]
                )
            for dev, pairs in per_device.items():
                buf = adapter.file.upload_tensors(pairs, dev.buffer_type())
                if buf is not None:
                    mem = self.memory.setdefault(dev, _DeviceMemory())
                    mem.buffers.append(buf)
                    mem.weights += sum(t.nbytes for _, t in pairs)

    def _extra_buft(self, dev: Device, weight: Tensor) -> BufferType | None:
        """The first extra buffer type of ``dev`` that takes ``weight`` (a matrix that
        only products read), or None (none does, or ``repack`` is off). The plugins'
        hooks are asked once per device, not once per weight."""
        if not self.repack:
            return None
        bufts = self._extra_bufts.get(dev)
        if bufts is None:
            bufts = self._extra_bufts[dev] = registry.extra_buffer_types(dev)
        return next((b for b in bufts if b.accepts(weight)), None)

    def warm_up(self, n_prompt: int | None = None) -> None:
        """Prepare a prompt-shaped step (:meth:`prepare`: built, allocated, its plan bound
        and every kernel it calls made ready) and run a token-shaped one once: the first
        step of a shape builds kernels, plans and caches, which is loading, not prompt
        time. The constructor does this unless told ``warmup=False``. The prompt step of
        :data:`WARM_UP_STEPS` makes ready every kernel a prompt of any length takes.
        It is prepared, not computed: computing it would add a large share of a small
        model's load, and the kernel loads that computing would do, preparing does too.

        ``n_prompt``: the length of the prompt the caller evaluates next, where it knows
        it (``tensorplug run`` does). The prompt step is then that long (up to
        ``n_batch``), so the prompt runs on the plan built here instead of building its
        own after a 24-token plan that nothing uses again: both the load and a short
        prompt take less time. The step is prepared, not computed, since computing a
        long prompt's step would be its whole work again.

        With a thread governor, the token step also runs at each thread count it may
        choose (the most last, where the governor starts): a backend may run other
        kernels at another count (the CPU's serial ones at one thread), and their first
        load from numba's cache would otherwise fall on the governor's first trial, a
        few tokens into the first generation, and skew its timing. The governor times
        none of these steps."""
        started = time.perf_counter()
        steps = (n_prompt, *WARM_UP_STEPS[1:]) if n_prompt else WARM_UP_STEPS
        governor, self.governor = self.governor, None
        try:
            self._progress("warming up", 0, len(steps))
            for done, n in enumerate(steps, start=1):
                n = min(n, self.n_batch, self.n_ctx - self.n_past)
                if n > 1:
                    self.prepare(n)  # bound, its kernels made ready: no throw-away compute
                elif n == 1:
                    self.eval([0])
                self._progress("warming up", done, len(steps))
            for count in reversed(governor.counts if governor is not None else []):
                if self.n_past >= self.n_ctx:
                    break
                self._apply_threads(count)
                self.eval([0])
            self.reset()
        finally:
            if governor is not None:  # back, at the count its next step expects
                self.governor = governor
                self._apply_threads(governor.applied)
        # loading, not prompt time: a warm-up after the constructor adds to its load time
        load_s = self.timings.load_s + time.perf_counter() - started
        self.timings = Timings(load_s=load_s, graphs_built=self.timings.graphs_built)
        # split_summaries stay: they describe the graphs the schedulers still hold

    # -- evaluation ---------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        """Tokens of sequence 0 in the cache (its highest position + 1): the
        single-sequence API (``eval``, ``generate``) continues there. Setting it lower
        keeps only the first ``n`` (``kv.seq_rm(0, n)``): how a chat keeps the prefix
        its next turn shares with the cache."""
        return self.kv.seq_pos_max(0) + 1

    @n_past.setter
    def n_past(self, n: int) -> None:
        held = self.n_past
        if not 0 <= n <= held:
            raise RunError(
                f"n_past can only go back: sequence 0 holds {held} tokens, asked for {n}"
            )
        self.kv.seq_rm(0, n)

    def reset(self) -> None:
        """Forget the context (every sequence): the next tokens start at position 0."""
        self.kv.clear()

    def eval(
        self,
        tokens: Sequence[int] | np.ndarray,
        all_logits: bool = False,
        *,
        prompt: bool | None = None,
    ) -> np.ndarray:
        """Process ``tokens`` of sequence 0 after the ``n_past`` already in the cache.

        Returns the logits of the last token ``(n_vocab,)``, or with ``all_logits`` of
        every token ``(len(tokens), n_vocab)``. Long inputs run in chunks of
        ``n_batch``. ``prompt`` says which timings the step counts in; None: by its
        size, as llama.cpp counts (batches are prompt time, single tokens generation),
        which would count a one-token prompt as a generated token. An encoder (BERT) has
        no logits: its rows are the final hidden states ``(n_embd,)``; :meth:`embed`
        pools them.
        """
        ids = self._checked(tokens, "eval")
        out = self.decode(Batch.single(ids, self.n_past, 0, all_logits=all_logits), prompt=prompt)
        return out if all_logits else out[-1]

    def _checked(self, tokens: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
        """``tokens`` as int64 ids, refused unless they fit the context after the
        ``n_past`` tokens of sequence 0 (:meth:`decode` checks the ids themselves)."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise RunError(f"{what} needs at least one token")
        n_past = self.n_past
        if n_past + ids.size > self.n_ctx:
            raise ContextFullError(
                f"{n_past} tokens in the context + {ids.size} new ones exceed n_ctx = "
                f"{self.n_ctx}; use a larger context (--ctx-size) or fewer tokens"
            )
        return ids  # int64: an id past int32 is refused by its value, not wrapped

    def decode(
        self,
        batch: Batch,
        *,
        prompt: bool | None = None,
        embeddings: bool = False,
        pad: bool = False,
    ) -> np.ndarray:
        """Evaluate a batch of tokens of any sequences (llama.cpp's ``llama_decode``).

        Each token is written to a free cache cell and attends to the cells of its
        sequences at positions up to its own. Returns the logits of the flagged tokens,
        in batch order ``(n_flagged, n_vocab)``; with ``embeddings``, their final hidden
        states ``(n_flagged, n_embd)`` instead (what :meth:`embed` pools: the engine
        computes embeddings this way, beside other sequences). Batches longer than
        ``n_batch`` run in chunks; a chunk's tokens see the earlier chunks. ``prompt``
        as for :meth:`eval`. Positions must continue a sequence (beyond what it holds);
        a batch is checked whole before anything is written. ``pad``: run each chunk at
        :meth:`step_rows` tokens, so that steps of varying sizes (a server's) replay a
        few graphs (see :meth:`_step`).
        """
        self._check_tokens(batch.tokens)
        self._check_positions(batch)
        if self.kv.n_ctx - self.kv.n_used < len(batch):
            self.kv.find_slot(len(batch))  # raises ContextFullError with the numbers
        if self.kv.has_shift:
            self.apply_shift()
        outs = [
            self._step(chunk, prompt, embeddings, pad=pad) for chunk in batch.chunks(self.n_batch)
        ]
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def _check_tokens(self, ids: np.ndarray) -> None:
        if ids.size == 1 and 0 <= int(ids[0]) < self.config.n_vocab:
            return  # a generated token: no numpy pass over one id
        bad = ids[(ids < 0) | (ids >= self.config.n_vocab)]
        if bad.size:
            raise RunError(
                f"token id {int(bad[0])} is outside the vocabulary (0..{self.config.n_vocab - 1})"
            )

    def _check_positions(self, batch: Batch) -> None:
        """Each sequence's new positions must come after those it holds: two cells of a
        sequence at one position would both be attended to."""
        firsts: dict[int, int] = {}
        for p, ids in zip(batch.pos.tolist(), batch.seq_ids, strict=True):
            for s in ids:
                firsts[s] = min(p, firsts.get(s, p))
        for s, first in firsts.items():
            held = self.kv.seq_pos_max(s)
            if first <= held:
                raise RunError(
                    f"sequence {s} already holds positions up to {held}; a batch continues it "
                    f"at {held + 1} or later (got {first}): remove positions first (seq_rm)"
                )

    def _graph(
        self, n_tokens: int, n_kv: int, n_outputs: int, embeddings: bool = False
    ) -> StepGraph:
        """The step graph of this shape, built once (with a scheduler of its own for up
        to :data:`OWN_SCHEDULER_ROWS` rows)."""
        key = (n_tokens, n_kv, n_outputs, embeddings)
        sg = self._graphs.get(key)
        if sg is None:
            cfg, w, cache = self.config, self.weights, self.cache
            with collector.paused():  # ~850 tensors for SmolLM2, all kept (collector.py)
                if isinstance(w, EncoderWeights):
                    sg = build_encoder_step(cfg, w, cache, n_tokens, n_kv, n_outputs)
                else:
                    sg = build_step(cfg, w, cache, n_tokens, n_kv, n_outputs, embeddings)
            self._graphs[key] = sg
            if n_tokens <= OWN_SCHEDULER_ROWS:
                self._own_scheds[id(sg.graph)] = Scheduler(self.backends)
            self.timings.graphs_built += 1
            if len(self._graphs) > self._keep_graphs:
                held = {id(self.sched.allocated)}
                old = next(k for k, g in self._graphs.items() if id(g.graph) not in held)
                gone = self._graphs.pop(old)
                if (own := self._own_scheds.pop(id(gone.graph), None)) is not None:
                    own.free()
        else:
            self._graphs.move_to_end(key)
        return sg

    def step_rows(self, n_tokens: int) -> int:
        """The token count a padded step of ``n_tokens`` runs at: itself up to 4, else
        the next of :data:`STEP_SIZES`, 24, 32, 48, 64, 96... (at most ``n_batch``). Prompt
        chunks come in every length; rounded up, their steps repeat a few shapes whose
        graphs, allocations and plans are kept, where each new length costs a graph
        build, an allocation and a CPU plan (for a small model, more than computing a
        short chunk)."""
        if n_tokens <= 4:
            return n_tokens
        size = next((s for s in STEP_SIZES if n_tokens <= s), 0)
        if not size:
            power = 1 << (n_tokens - 1).bit_length()  # 17..32 -> 32; then 24 if it will do
            size = power * 3 // 4 if n_tokens <= power * 3 // 4 else power
        return min(size, max(self.n_batch, n_tokens))

    def _step(
        self,
        batch: Batch,
        prompt: bool | None = None,
        embeddings: bool = False,
        *,
        pad: bool = False,
    ) -> np.ndarray:
        """One graph compute: ``batch`` (at most ``n_batch`` tokens) written to free
        cells, the logits of its flagged tokens (of its last token when none is
        flagged: a graph has at least one output) read back; with ``embeddings``, their
        final hidden states instead.

        With ``pad``, a causal step runs at :meth:`step_rows` tokens: the rows past the
        batch are padding (token 0, written to free cells no sequence holds, each
        attending only to its own cell), so they read and change nothing a real token
        sees; each row is computed on its own, so the real rows come out as in a step
        of their own size when the kernels give a row the same numbers at any row count
        (the CPU's repacked integer kernels do, for every type with a repacked layout;
        its decode + BLAS path for the others rounds by row count, as re-chunking a
        prompt already does)."""
        start = time.perf_counter()
        T = len(batch)
        pad = pad and self.config.causal and not embeddings
        seqs = {s for ids in batch.seq_ids for s in ids}
        padded, cells, end, n_kv = self._shape(T, pad, seqs)
        self.kv.assign(cells[:T], batch.pos, batch.seq_ids)
        flagged = np.flatnonzero(batch.logits)
        out_rows = flagged if flagged.size else np.array([T - 1])
        if pad:  # outputs rounded up too, repeating real ones (see _outputs)
            out_rows = np.resize(out_rows, self._outputs(out_rows.size, padded, pad))
        is_prompt = T > 1 if prompt is None else prompt  # by size: llama.cpp's rule (see eval)
        sg, sched = self._allocated(padded, n_kv, out_rows.size, embeddings)
        self.last_scheduler = sched
        # an encoder's tokens all see each other: as if each were at the step's last position
        seen_from = batch.pos if self.config.causal else np.full_like(batch.pos, batch.pos.max())
        write = self._io.write
        write(sg.tokens, _padded(batch.tokens.astype(np.int32), padded))
        write(sg.pos, _padded(batch.pos, padded))
        write(sg.kv_idx, cells)
        mask = self.kv.mask(seen_from, batch.seq_ids, n_kv, sg.mask_window)
        write(sg.mask, _padded_mask(mask, cells[T:]))
        if sg.mask_swa is not None:
            mask = self.kv.mask(batch.pos, batch.seq_ids, n_kv, self.config.n_swa)
            write(sg.mask_swa, _padded_mask(mask, cells[T:]))
        if sg.kv_order is not None:
            # the cells past the step's own sequences last: a row's walk stops before them
            write(sg.kv_order, self.kv.position_order(n_kv, end))
        if sg.out_ids is not None:
            write(sg.out_ids, out_rows.astype(np.int32))
        self._governed_threads(T)
        if self._mapped:
            # a truncated file would be a SIGBUS in the kernels, which nothing can catch
            self.file.check_unchanged()
        t_compute = time.perf_counter()
        status = sched.graph_compute(sg.graph)
        compute = time.perf_counter() - t_compute
        if status is not Status.SUCCESS:
            raise ComputeAbortedError(f"the step graph did not compute: {status.name}")
        logits = self._io.read(sg.logits)
        # rows in out_rows' order, or every row of the step (a graph with as many outputs
        # as tokens has no out_ids): the flagged ones either way
        if sg.out_ids is not None:
            logits = logits[: flagged.size]
        elif flagged.size == 1:  # a view, not numpy's copy by index (a token's step)
            logits = logits[int(flagged[0]) : int(flagged[0]) + 1]
        elif flagged.size < logits.shape[0]:  # (equal: every row, flagged in order)
            logits = logits[flagged]
        total = time.perf_counter() - start
        t = self.timings
        if is_prompt:
            t.prompt_tokens += T
            t.prompt_s += total
            t.prompt_compute_s += compute
        else:
            t.gen_tokens += T
            t.gen_s += total
            t.gen_compute_s += compute
        if self.governor is not None:  # it times generation steps, which are single tokens
            if T > 1:
                self.governor.pause(AFTER_BATCH_SECONDS)
            else:
                self.governor.step_done(total)
        return logits

    def prepare(self, n_tokens: int, n_outputs: int = 1, *, pad: bool = False) -> None:
        """Build, allocate and bind (each backend's ``graph_prepare``: the CPU's plan) the
        step that a batch of ``n_tokens`` new tokens runs on next, ``n_outputs`` of them
        flagged for logits (a prompt: its last; a decode step of several sequences:
        each), without computing it or writing the cache: that batch then starts
        computing at once. ``pad`` as for :meth:`decode`. Kernels that the step calls
        only when it runs (the CPU's row kernels, its activations' quantizers) load then,
        unless a computed step loaded them (:meth:`warm_up`).

        The warm-up does this for a long prompt's length, where it computed a
        throw-away step of that length: the whole prompt's work again."""
        if not isinstance(n_tokens, int) or not 1 <= n_tokens <= self.n_batch:
            raise RunError(f"prepare takes 1 to n_batch = {self.n_batch} tokens, got {n_tokens!r}")
        if not isinstance(n_outputs, int) or not 1 <= n_outputs <= n_tokens:
            raise RunError(
                f"prepare: n_outputs must be 1 to n_tokens = {n_tokens}, got {n_outputs!r}"
            )
        pad = pad and self.config.causal
        padded, _, _, n_kv = self._shape(n_tokens, pad)
        sg, sched = self._allocated(padded, n_kv, self._outputs(n_outputs, padded, pad))
        self._governed_threads(n_tokens)  # the count the step will run at
        sched.prepare(sg.graph)

    def _governed_threads(self, n_tokens: int) -> None:
        """Under a governor, the thread count a step of ``n_tokens`` runs at. Prompts
        use every core: their products split into many chunks that idle threads claim,
        so a busy core slows a prompt little; and a backend whose rounding depends on its
        thread count (BLAS's own threading does) still gives a prompt the same numbers
        however busy the machine was."""
        if self.governor is not None:
            self._apply_threads(self.governor.counts[0] if n_tokens > 1 else self.governor.applied)

    def _shape(
        self, n_tokens: int, pad: bool, seqs: set[int] | None = None
    ) -> tuple[int, np.ndarray, int, int]:
        """A step of ``n_tokens`` new tokens (``pad``: at :meth:`step_rows`) of the
        sequences ``seqs``, now: its row count, the free cells it takes (not taken yet),
        the end of the cells it can see (one past the last cell those sequences hold
        and its own; ``seqs`` None: every used cell) and the cache rows it reads
        (``n_kv``: that end rounded up by :meth:`kv_width`). Cells past them
        that only other sequences hold (idle slots, the prompt cache) are never read: a
        step's width, and with it its attention and its graph, is its own sequences'."""
        n_free = self.kv.n_ctx - self.kv.n_used
        padded = min(self.step_rows(n_tokens), max(n_free, n_tokens)) if pad else n_tokens
        cells = self.kv.find_slot(padded)
        held = self.kv.used_max if seqs is None else self.kv.extent(seqs)
        rows_max = max(held, int(cells[-1]) + 1)  # cells come ascending
        return padded, cells, rows_max, self.kv_width(rows_max)

    def kv_width(self, rows: int) -> int:
        """The ``n_kv`` of a step that reads the first ``rows`` cache rows: ``kv_pad``
        times the smallest power of two that holds them, at most ``n_ctx``.

        Each width is a graph of its own for every step shape, and a new graph costs a
        build, an allocation and a plan (tens of milliseconds of Python for a small
        model: a server's stream stalls that long on it). Widths that double keep them
        to a handful however long the context grows (4 for 2048 cells of 256), where
        steps of ``kv_pad`` would be 8, or 128 for 32768 cells. What a wider step costs
        is its mask, whose hidden columns the CPU's attention never reads (it stops at
        the last column a row sees), so its numbers are the same at any width; a
        backend whose attention reads every column reads at most twice the columns it
        needs."""
        level = max(1, -(-rows // self.kv_pad))
        return min(self.n_ctx, self.kv_pad << (level - 1).bit_length())

    def kv_widths(self) -> list[int]:
        """Every ``n_kv`` a step can have (:meth:`kv_width`), narrowest first."""
        widths = [min(self.n_ctx, self.kv_pad)]
        while widths[-1] < self.n_ctx:
            widths.append(self.kv_width(widths[-1] + 1))
        return widths

    def _outputs(self, n_outputs: int, padded: int, pad: bool) -> int:
        """The output rows of a step of ``padded`` rows reading ``n_outputs`` tokens'
        logits: padded, rounded up too (at least 4: a prompt's last token beside 0-3
        decoding ones is one shape; more, :meth:`set_step_outputs`)."""
        if not pad:
            return n_outputs
        most = self._most_outputs
        if n_outputs > PADDED_OUTPUTS and most is not None and n_outputs <= most:
            n_outputs = most
        return min(self.step_rows(max(n_outputs, PADDED_OUTPUTS)), padded)

    def _allocated(
        self, n_tokens: int, n_kv: int, n_outputs: int, embeddings: bool = False
    ) -> tuple[StepGraph, Scheduler]:
        """The step graph of this shape, allocated on the scheduler that runs it."""
        sg = self._graph(n_tokens, n_kv, n_outputs, embeddings)
        sched = self._own_scheds.get(id(sg.graph)) or self.sched_for(n_tokens)
        if sched.allocated is not sg.graph:
            sched.alloc_graph(sg.graph)
            kind = "prompt" if n_tokens > 1 else "generation"
            self.split_summaries[kind] = self._summarize(sg, sched)
        return sg, sched

    def apply_shift(self) -> None:
        """Re-rope the K rows whose positions ``kv.seq_add`` moved (llama.cpp's K-shift);
        ``decode`` calls it before a step reads them. A small graph, built per call:
        shifts are rare (a context shift), their row counts vary."""
        cells, deltas = self.kv.take_shift()
        if not cells.size:
            return
        if isinstance(self.weights, EncoderWeights):  # attends both ways: no positions to move
            raise RunError("an encoder's cache cannot be shifted: evaluate the text afresh")
        shift = build_k_shift(self.config, self.weights, self.cache, int(cells.size))
        self.sched.alloc_graph(shift.graph)
        set_array(shift.cells, cells.astype(np.int32))
        set_array(shift.delta, deltas.astype(np.int32))
        status = self.sched.graph_compute(shift.graph)
        if status is not Status.SUCCESS:
            raise ComputeAbortedError(f"the K-shift graph did not compute: {status.name}")

    def generate(
        self,
        prompt: Sequence[int],
        n_predict: int,
        sampler: TokenSampler | None = None,
        *,
        on_token: Callable[[int], None] | None = None,
        stop_at_eos: bool = True,
        prompt_logits: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> Generation:
        """Evaluate ``prompt`` (sequence 0, after ``n_past``) then sample up to ``n_predict``
        tokens one at a time.

        The last sampled token is not evaluated (nothing would read its logits).
        ``on_progress(done, total)`` follows the prompt chunk by chunk. ``sampler``: a
        :class:`TokenSampler` (its penalties see the prompt) or the default greedy
        :class:`Sampler`.
        """
        if self.config.arch.encoder:
            raise RunError(embedding_model_message(self.file.path, self.config.arch.name))
        sampler = sampler or Sampler()
        sampler.accept_prompt(prompt)
        n = len(prompt)
        if n == 0:
            raise RunError("generate needs a prompt of at least one token (e.g. BOS)")
        kept = []
        for s in range(0, n, self.n_batch):
            chunk = prompt[s : s + self.n_batch]
            kept.append(self.eval(chunk, all_logits=prompt_logits, prompt=True))
            if on_progress is not None:
                on_progress(min(s + self.n_batch, n), n)
        logits = kept[-1][-1] if prompt_logits else kept[-1]
        out = Generation([], np.concatenate(kept) if prompt_logits else None)
        # EOS and the end-of-turn tokens (<end_of_turn>, <|im_end|>...), as llama.cpp's eog
        eog = self.vocab.eog if self.vocab is not None else frozenset()
        while len(out.tokens) < n_predict:
            t0 = time.perf_counter()
            tok = sampler(logits)
            self.timings.sample_s += time.perf_counter() - t0
            self.timings.samples += 1
            out.tokens.append(tok)
            if on_token is not None:
                on_token(tok)
            if stop_at_eos and tok in eog:
                out.stopped_at_eos = True
                break
            if len(out.tokens) == n_predict or self.n_past >= self.n_ctx:
                break
            logits = self.eval([tok])
        return out

    # -- embeddings -----------------------------------------------------------------------------

    def embed(
        self,
        tokens: Sequence[int] | np.ndarray,
        pooling: str | None = None,
        *,
        normalize: bool = False,
    ) -> np.ndarray:
        """The embedding of ``tokens``: the final hidden states (a decoder's after its
        output norm, llama.cpp's ``t_embd``) pooled into one ``(n_embd,)`` vector.

        ``pooling`` is ``mean``, ``cls`` (the first token), ``last`` or ``none`` (every
        token's row, ``(n_tokens, n_embd)``); None takes the file's ``pooling_type``, or
        ``mean`` when the file has none (llama.cpp would give per-token rows there,
        which its server's embeddings endpoint refuses). ``normalize`` divides by the
        Euclidean norm, as llama-server does (llama-cpp-python's ``embed`` returns raw
        vectors unless asked, as here). The tokens are evaluated as a sequence of their
        own: the context is cleared before and after. An encoder sees them in one step
        (bidirectional attention): its ``n_batch`` is its whole context.
        """
        kind = pooling_kind(pooling, self.config.pooling)
        self.reset()
        ids = self._checked(tokens, "embed")  # an encoder's n_batch is its whole context
        self._check_tokens(ids)  # _step, unlike decode, takes them as they are
        try:
            batch = Batch.single(ids, 0, 0, all_logits=True)
            hidden = np.concatenate(
                [self._step(c, prompt=True, embeddings=True) for c in batch.chunks(self.n_batch)]
            )
        finally:
            self.reset()
        return pool(hidden, kind, normalize=normalize)

    # -- reporting ------------------------------------------------------------------------------

    def sched_for(self, n_tokens: int) -> Scheduler:
        """The shared scheduler that runs steps of ``n_tokens`` tokens (a graph of up to
        :data:`OWN_SCHEDULER_ROWS` rows has its own, in ``_own_scheds``)."""
        return self.sched

    @property
    def _scheds(self) -> list[Scheduler]:
        return [self.sched, *self._own_scheds.values()]

    def _summarize(self, sg: StepGraph, sched: Scheduler) -> SplitSummary:
        splits = tuple(
            (
                self.backends[sp.backend_id].name,
                sp.end - sp.start,
                tuple(t.name or t.op.value for t in sp.inputs),
            )
            for sp in sched.splits
        )
        copied = sum(t.nbytes for sp in sched.splits for t in sp.inputs)
        return SplitSummary(len(sg.graph.nodes), splits, copied)

    def compute_buffers(self) -> list[tuple[str, int]]:
        """Each backend's compute memory: the schedulers' buffers."""
        return [(be.name, sum(s.buffer_size(be) for s in self._scheds)) for be in self.backends]

    def __enter__(self) -> ModelRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def release(self) -> None:
        """Give the model's memory back (weights, KV cache, compute buffers, backends)
        and keep what describes it (the file, its settings, config, vocabulary, the
        cells' bookkeeping, emptied): a server asleep (``--sleep-idle-seconds``).
        Nothing may run until :meth:`restore`. What the cache held is lost."""
        if self.released:
            return
        self.close()
        self.kv.clear()
        self._graphs.clear()
        self._own_scheds = {}
        self.released = True

    def restore(self) -> None:
        """Take the memory :meth:`release` gave back: the weights loaded as at first,
        with the threads, the row order and the graphs kept as they were set."""
        if not self.released:
            return
        again = self._again(self.file)
        kept = {"kv": self.kv, "timings": self.timings, "_again": self._again}
        threads, keep, invariant = (
            self._threads if self.governor is None else None,
            self._keep_graphs,
            self.batch_invariant,
        )
        vars(self).update({k: v for k, v in vars(again).items() if k not in kept})
        self.keep_graphs(keep)
        self.set_batch_invariant(invariant)
        if threads is not None:
            self.set_n_threads(threads)
        self.released = False

    def close(self) -> None:
        """Free the scheduler, the buffers and the backends."""
        for sched in self._scheds:
            sched.free()
        for mem in self.memory.values():
            for buf in mem.buffers:
                buf.free()
        for be in self.backends:
            be.free()
        self.memory = {}


def _padded(values: np.ndarray, n: int) -> np.ndarray:
    """``values`` followed by zeros up to ``n`` entries (a padded step's inputs)."""
    if values.size == n:
        return values
    out = np.zeros(n, dtype=values.dtype)
    out[: values.size] = values
    return out


def _padded_mask(mask: np.ndarray, pad_cells: np.ndarray) -> np.ndarray:
    """The real tokens' mask with a row per padding token below it, each seeing only
    the cell it writes: a row that saw nothing would be NaN, and the K/V it writes
    (into a free cell that later steps read, masked) must stay finite."""
    if not pad_cells.size:
        return mask
    rows = np.full((pad_cells.size, mask.shape[1]), -np.inf, dtype=mask.dtype)
    rows[np.arange(pad_cells.size), pad_cells] = 0
    return np.concatenate([mask, rows])


def embedding_model_message(path: object, arch: str) -> str:
    """What to say when someone asks an encoder to generate text."""
    return (
        f"{path}: '{arch}' is an embedding model (a bidirectional encoder with no output "
        "layer), so it cannot generate text; compute embeddings with "
        "tensorplug_llm.ModelRunner(path).embed(tokens)"
    )


def _thread_setter(backend: Backend) -> Callable[[Backend, int], None] | None:
    """ggml's ``set_n_threads`` extension of ``backend``'s registration, if it has one."""
    return _extension(backend, "set_n_threads")


def _extension(backend: Backend, name: str) -> Callable[..., None] | None:
    """The ``get_proc`` function ``name`` of ``backend``'s registration, if it has one.
    A registration used without being registered (tests, embedders) has no hooks: its
    own ``get_proc`` answers."""
    reg = backend.device.reg
    if reg is None:
        return None
    try:
        return registry.get_proc(reg, name)
    except BackendNotFoundError:
        return reg.get_proc(name)
