"""Logits processors and stopping criteria as llama-cpp-python defines them: lists of
callables, applied in order (processors) or any of them (criteria), on numpy arrays."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tensorplug_llm.highlevel.processors import (
    LogitsProcessorList,
    MinTokensLogitsProcessor,
    StoppingCriteriaList,
)

IDS = np.array([1, 5, 7], dtype=np.intc)


def test_processors_apply_in_order_each_to_what_the_last_returned() -> None:
    def double(ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        return scores * 2

    def plus_len(
        ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]
    ) -> npt.NDArray[np.single]:
        return scores + len(ids)

    scores = np.array([0.0, 1.0, -1.0], dtype=np.single)
    chain = LogitsProcessorList([double, plus_len])
    assert len(chain) == 2 and chain[0] is double
    assert chain(IDS, scores).tolist() == [3.0, 5.0, 1.0]  # (s * 2) + 3, not (s + 3) * 2
    assert LogitsProcessorList([plus_len, double])(IDS, scores).tolist() == [6.0, 8.0, 4.0]


def test_an_empty_processor_list_returns_the_scores_themselves() -> None:
    scores = np.array([0.5, 0.25], dtype=np.single)
    assert LogitsProcessorList()(IDS, scores) is scores


def test_stopping_criteria_stop_when_any_says_so_and_all_are_called() -> None:
    calls: list[str] = []

    def yes(ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> bool:
        calls.append("yes")
        return True

    def no(ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> bool:
        calls.append("no")
        return False

    logits = np.zeros(4, np.single)
    assert StoppingCriteriaList([yes, no])(IDS, logits) is True
    assert calls == ["yes", "no"]  # the one after a stop still ran
    assert StoppingCriteriaList([no, no])(IDS, logits) is False
    assert StoppingCriteriaList()(IDS, logits) is False


def test_criteria_see_the_ids_and_logits_they_are_given() -> None:
    over_two = StoppingCriteriaList([lambda ids, logits: bool(len(ids) > 2)])
    assert over_two(IDS, np.zeros(3, np.single)) is True
    assert over_two(IDS[:2], np.zeros(3, np.single)) is False
    argmax_is_eos = StoppingCriteriaList([lambda ids, logits: int(np.argmax(logits)) == 2])
    assert argmax_is_eos(IDS, np.array([0, 1, 9], np.single)) is True


def test_min_tokens_forbids_eos_until_enough_were_generated() -> None:
    eos = 2
    proc = MinTokensLogitsProcessor(min_tokens=2, token_eos=eos)
    prompt = np.array([1, 4, 4], dtype=np.intc)
    first = proc(prompt, np.zeros(3, np.single))  # the prompt's length is taken here
    assert proc.prompt_tokens == 3 and first[eos] == -np.inf
    one = proc(np.append(prompt, 0).astype(np.intc), np.zeros(3, np.single))
    assert one[eos] == -np.inf
    two = proc(np.append(prompt, [0, 1]).astype(np.intc), np.zeros(3, np.single))
    assert two.tolist() == [0.0, 0.0, 0.0]
