"""llama-cpp-python's draft models (``llama_cpp.llama_speculative``): a draft model
proposes the tokens that may come next, ``Llama.generate`` evaluates them with the
token it sampled in one step, and keeps those its own sampling agrees with. The text
is the one generation would give without them; what changes is how many steps it takes.

:class:`LlamaPromptLookupDecoding` proposes by prompt lookup: the continuation of the
earliest earlier occurrence of the sequence's last few tokens (editing and
summarising repeat their input). Its choice is llama-cpp-python's, so a generation's
steps, and with them the last bits of its logits, are llama-cpp-python's too."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LlamaDraftModel", "LlamaPromptLookupDecoding"]


class LlamaDraftModel(abc.ABC):
    """What ``Llama(draft_model=...)`` calls: the tokens so far in, proposed ones out."""

    @abc.abstractmethod
    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        """The tokens that may follow ``input_ids`` (none: an empty array)."""


class LlamaPromptLookupDecoding(LlamaDraftModel):
    """Prompt lookup decoding (Saxena, 2023): find the last ``n`` tokens earlier in the
    sequence, for ``n`` from ``max_ngram_size`` down to 1, and propose up to
    ``num_pred_tokens`` of what followed the first occurrence that has a continuation."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10) -> None:
        if max_ngram_size < 1 or num_pred_tokens < 1:
            raise ValueError(
                f"max_ngram_size and num_pred_tokens must be at least 1, got {max_ngram_size} "
                f"and {num_pred_tokens}"
            )
        self.max_ngram_size = max_ngram_size
        self.num_pred_tokens = num_pred_tokens

    @staticmethod
    def find_candidate_pred_tokens(
        input_ids: npt.NDArray[np.intc], max_ngram_size: int, num_pred_tokens: int
    ) -> npt.NDArray[np.intc]:
        """The proposal for ``input_ids`` (the method llama-cpp-python names so)."""
        ids = np.asarray(input_ids)
        length = ids.shape[0]
        for n in range(min(max_ngram_size, length - 1), 0, -1):
            tail = ids[length - n :]
            windows = np.lib.stride_tricks.sliding_window_view(ids, n)
            for start in np.flatnonzero((windows == tail).all(axis=1)):
                begin = int(start) + n
                end = min(begin + num_pred_tokens, length)
                if begin < end:
                    return ids[begin:end]
        return np.array([], dtype=np.intc)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        return self.find_candidate_pred_tokens(input_ids, self.max_ngram_size, self.num_pred_tokens)
