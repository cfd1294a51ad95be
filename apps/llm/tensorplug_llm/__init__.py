"""Running real GGUF language models on tensorplug: the llama family (Llama, Mistral,
SmolLM2, Mixtral), Qwen 2/3, Qwen 3 MoE, Phi-3, Gemma 2/3, SmolLM3, Granite, OLMo 2 and
Mistral 3 over one block builder, BERT encoders for embeddings, their tokenizers, a KV
cache, the scheduler, sampling and chat.

``Llama`` is llama-cpp-python's class (:mod:`.highlevel`: a program written for
llama-cpp-python runs with its import changed); :class:`ModelRunner` is the runner
underneath, for programs that want the steps themselves::

    from tensorplug_llm import Llama, ModelRunner

    llm = Llama(model_path="model.gguf", n_ctx=2048)
    print(llm("Once upon a time", max_tokens=32)["choices"][0]["text"])

    model = ModelRunner("model.gguf", n_ctx=2048)  # every block on the best device
    ids = model.vocab.encode("Once upon a time")
    print(model.vocab.decode(ids + model.generate(ids, 32).tokens))

Modules: :mod:`.arch` (the architectures, as switches of one block builder),
:mod:`.model` (hyper-parameters, weights, KV cache, step graphs), :mod:`.encoder` (the
BERT family's weights and graph),
:mod:`.runner` (loading, placement on devices, evaluation, generation, timings),
:mod:`.tokenizer` (SentencePiece, BPE, WordPiece; ``tensorplug tokenize``),
:mod:`.sampling` (llama.cpp's sampler chain, logprobs), :mod:`.constraint` (structured
output through llguidance), :mod:`.placement`, :mod:`.tiny` (random-weight GGUF models
for demos and tests; :mod:`.tiny_bert` the same for BERT), :mod:`.chat` (``tensorplug
chat``), :mod:`.run_cli` (``tensorplug run``, :func:`~.run_cli.demo_model`),
:mod:`.demo` (``tensorplug demo``) and :mod:`.embed_cli` (``tensorplug embed``);
:mod:`.commands` adds them to the ``tensorplug`` command. Nothing here imports the
``gguf`` package until a file is read or written.

The names below are imported on first use (PEP 562), not with the package: the
``tensorplug`` command imports :mod:`.commands` each time it starts, which imports this
package first, and a ``tensorplug devices`` must not pay for the runner and tokenizers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorplug.lazy import lazy_exports

if TYPE_CHECKING:
    from .batch import Batch
    from .constraint import Constraint, ConstraintError, constraint_for
    from .engine import Engine
    from .highlevel.cache import LlamaCache, LlamaDiskCache, LlamaRAMCache
    from .highlevel.grammar import LlamaGrammar
    from .highlevel.llama import Llama
    from .highlevel.processors import (
        LogitsProcessor,
        LogitsProcessorList,
        StoppingCriteria,
        StoppingCriteriaList,
    )
    from .highlevel.speculative import LlamaDraftModel, LlamaPromptLookupDecoding
    from .highlevel.state import LlamaState
    from .highlevel.tokenizer import LlamaTokenizer
    from .kv_cells import KVCells
    from .model import KVCache, LlamaConfig, LlamaWeights, StepGraph, build_step
    from .placement import Placement
    from .request import Request, RequestError, RequestHandle, TokenEvent
    from .run_cli import demo_model
    from .runner import ContextFullError, Generation, ModelRunner, SplitSummary, Timings
    from .sampling import SampledToken, Sampler, SamplerParams, SamplingParams, TokenSampler
    from .tiny import TINY_DIMS, tiny_vocab, write_tiny_llama
    from .tiny_bert import write_tiny_bert
    from .tokenizer import StreamDecoder, Vocab

#: Each public name and the module that defines it.
_HOMES = {
    "Batch": "batch",
    "Engine": "engine",
    "Llama": "highlevel.llama", "LlamaState": "highlevel.state",
    "LlamaCache": "highlevel.cache", "LlamaRAMCache": "highlevel.cache",
    "LlamaDiskCache": "highlevel.cache", "LlamaGrammar": "highlevel.grammar",
    "LlamaTokenizer": "highlevel.tokenizer",
    "LlamaDraftModel": "highlevel.speculative",
    "LlamaPromptLookupDecoding": "highlevel.speculative",
    "LogitsProcessor": "highlevel.processors", "LogitsProcessorList": "highlevel.processors",
    "StoppingCriteria": "highlevel.processors", "StoppingCriteriaList": "highlevel.processors",
    "Request": "request", "RequestError": "request", "RequestHandle": "request",
    "TokenEvent": "request",
    "KVCells": "kv_cells",
    "Constraint": "constraint", "ConstraintError": "constraint", "constraint_for": "constraint",
    "KVCache": "model", "LlamaConfig": "model", "LlamaWeights": "model",
    "StepGraph": "model", "build_step": "model",
    "Placement": "placement",
    "demo_model": "run_cli",
    "ContextFullError": "runner", "Generation": "runner", "ModelRunner": "runner",
    "SplitSummary": "runner", "Timings": "runner",
    "Sampler": "sampling", "SamplerParams": "sampling", "SampledToken": "sampling",
    "SamplingParams": "sampling", "TokenSampler": "sampling",
    "TINY_DIMS": "tiny", "tiny_vocab": "tiny", "write_tiny_llama": "tiny",
    "write_tiny_bert": "tiny_bert",
    "StreamDecoder": "tokenizer", "Vocab": "tokenizer",
}  # fmt: skip


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "TINY_DIMS",
    "Batch",
    "Constraint",
    "ConstraintError",
    "ContextFullError",
    "Engine",
    "Generation",
    "KVCache",
    "KVCells",
    "Llama",
    "LlamaCache",
    "LlamaConfig",
    "LlamaDiskCache",
    "LlamaDraftModel",
    "LlamaGrammar",
    "LlamaPromptLookupDecoding",
    "LlamaRAMCache",
    "LlamaState",
    "LlamaTokenizer",
    "LlamaWeights",
    "LogitsProcessor",
    "LogitsProcessorList",
    "ModelRunner",
    "Placement",
    "Request",
    "RequestError",
    "RequestHandle",
    "SampledToken",
    "Sampler",
    "SamplerParams",
    "SamplingParams",
    "SplitSummary",
    "StepGraph",
    "StoppingCriteria",
    "StoppingCriteriaList",
    "StreamDecoder",
    "Timings",
    "TokenEvent",
    "TokenSampler",
    "Vocab",
    "build_step",
    "constraint_for",
    "demo_model",
    "tiny_vocab",
    "write_tiny_bert",
    "write_tiny_llama",
]
