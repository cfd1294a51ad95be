"""Logits processors and stopping criteria, shaped as llama-cpp-python's.

A program written for llama-cpp-python passes these to ``create_completion`` and
``generate``; they are plain lists of callables so that its own functions drop in:

::

    def no_eos(input_ids, scores):
        scores[llm.token_eos()] = -np.inf
        return scores

    llm("Q: ...", logits_processor=LogitsProcessorList([no_eos]),
        stopping_criteria=StoppingCriteriaList([lambda ids, logits: len(ids) > 64]))

``input_ids`` are the sequence so far (prompt and generated tokens, ``intc``), ``scores``
the next token's logits (``single``); a processor returns the scores to sample from (it
may change them in place) and a criterion whether to stop before sampling.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = [
    "LogitsProcessor",
    "LogitsProcessorList",
    "MinTokensLogitsProcessor",
    "StoppingCriteria",
    "StoppingCriteriaList",
]

LogitsProcessor = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], npt.NDArray[np.single]]
StoppingCriteria = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], bool]


class LogitsProcessorList(list[LogitsProcessor]):
    """Processors applied in order, each to what the one before returned."""

    def __call__(
        self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]
    ) -> npt.NDArray[np.single]:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list[StoppingCriteria]):
    """Stop when any criterion says so. Every criterion is called, even after one said
    stop (as llama-cpp-python does), so criteria that count calls stay in step."""

    def __call__(self, input_ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> bool:
        return any([criterion(input_ids, logits) for criterion in self])


class MinTokensLogitsProcessor:
    """Forbid ``token_eos`` until ``min_tokens`` tokens were generated. The first call
    takes the length of ``input_ids`` as the prompt's: one instance serves one
    generation."""

    def __init__(self, min_tokens: int, token_eos: int) -> None:
        self.min_tokens = min_tokens
        self.token_eos = token_eos
        self.prompt_tokens: int | None = None

    def __call__(
        self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]
    ) -> npt.NDArray[np.single]:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores
