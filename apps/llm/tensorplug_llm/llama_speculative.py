"""llama-cpp-python's module path of its draft models, so that ``from
llama_cpp.llama_speculative import LlamaPromptLookupDecoding`` runs with the package's
name changed (:mod:`.highlevel.speculative` holds them)."""

from .highlevel.speculative import LlamaDraftModel, LlamaPromptLookupDecoding

__all__ = ["LlamaDraftModel", "LlamaPromptLookupDecoding"]
