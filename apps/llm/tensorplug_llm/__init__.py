"""Running real GGUF language models on tensorplug: the llama family (Llama, Mistral,
SmolLM2, Mixtral), Qwen 2/3 and Gemma 3 over one block builder, their tokenizers, a KV
cache, the scheduler, sampling and chat.

::

    from tensorplug.models import Llama, Placement, Sampler, SamplerParams

    model = Llama("model.gguf", n_ctx=2048)  # every block on the best device by default
    # or: Llama("model.gguf", placement=Placement.offload(n_layer=32, n_gpu_layers=20))
    ids = model.vocab.encode("Once upon a time")
    gen = model.generate(ids, 32, Sampler(SamplerParams(temperature=0.8, seed=1)))
    print(model.vocab.decode(ids + gen.tokens), model.timings.gen_tps)

Modules: :mod:`.arch` (the architectures, as switches of one block builder),
:mod:`.model` (hyper-parameters, weights, KV cache, step graphs),
:mod:`.runner` (loading, placement on devices, evaluation, generation, timings),
:mod:`.tokenizer` (SentencePiece, BPE, WordPiece; ``tensorplug tokenize``),
:mod:`.sampling`, :mod:`.placement`, :mod:`.tiny` (random-weight GGUF models for demos
and tests), :mod:`.chat` (``tensorplug chat``) and :mod:`.cli` (``tensorplug run``,
:func:`~.cli.demo_model`). Nothing here
imports the ``gguf`` package until a file is read or written.
"""

from __future__ import annotations

from .cli import demo_model
from .model import KVCache, LlamaConfig, LlamaWeights, StepGraph, build_step
from .placement import Placement
from .runner import ContextFullError, Generation, Llama, SplitSummary, Timings
from .sampling import Sampler, SamplerParams
from .tiny import TINY_DIMS, tiny_vocab, write_tiny_llama
from .tokenizer import StreamDecoder, Vocab

__all__ = [
    "TINY_DIMS",
    "ContextFullError",
    "Generation",
    "KVCache",
    "Llama",
    "LlamaConfig",
    "LlamaWeights",
    "Placement",
    "Sampler",
    "SamplerParams",
    "SplitSummary",
    "StepGraph",
    "StreamDecoder",
    "Timings",
    "Vocab",
    "build_step",
    "demo_model",
    "tiny_vocab",
    "write_tiny_llama",
]
