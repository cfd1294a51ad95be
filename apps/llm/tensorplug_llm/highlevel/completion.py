"""llama-cpp-python's text completions: the prompt's tokens, the generation loop, and the
``text_completion`` dicts and chunks it returns.

The rules are llama-cpp-python's, so a program reads the same fields with the same
meaning: a string prompt gets the model's BOS (and EOS or SEP where the model asks) and
its control tokens parsed; a token prompt is used as it is; ``max_tokens`` None or
``<= 0`` runs to the end of the context; generation stops at an end-of-generation token
(not part of the text), at the first of the ``stop`` strings found (cut before it), at
``max_tokens`` ("length"), or when a stopping criterion says so ("stop"); ``logprobs``
needs ``logits_all=True`` and lists each token's logprob, the ``logprobs`` most likely
tokens and the chosen one, and where each token's text begins.

Where llama-cpp-python is wrong we are not: ``text_offset`` counts characters of the
prompt's text also when the prompt was given as token ids (llama-cpp-python adds the
number of tokens), and ``suffix`` uses the model's own fill-in-the-middle tokens (it
writes token 0 in their place) and is refused for a model without them.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..tokenizer import Vocab
    from .processors import StoppingCriteriaList
    from .session import SampleSettings, Session

__all__ = ["CompletionRequest", "complete", "logits_to_logprobs", "prompt_tokens"]


@dataclass
class CompletionRequest:
    """One call's arguments beyond the sampler's."""

    prompt: str | list[int]
    prompt_tokens: list[int]
    max_tokens: int | None
    stop: list[str]
    logprobs: int | None
    echo: bool
    stream: bool
    model: str
    seed: int | None
    stopping_criteria: StoppingCriteriaList | None
    #: text appended to a non-streamed completion (a suffix the model could not fill)
    suffix_text: str = ""


def logits_to_logprobs(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """log-softmax, as llama-cpp-python's ``Llama.logits_to_logprobs`` (float32)."""
    x = np.asarray(logits, dtype=np.single)
    top = np.amax(x, axis=axis, keepdims=True)
    top[~np.isfinite(top)] = 0
    shifted = x - top
    with np.errstate(divide="ignore"):
        lse = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return np.asarray(shifted - lse, dtype=np.single)


def prompt_tokens(
    vocab: Vocab, prompt: str | Sequence[int], suffix: str | None, spm_infill: bool, fim: Any
) -> list[int]:
    """The prompt's tokens as llama-cpp-python builds them (see the module's docstring).
    ``fim``: the model's (prefix, suffix, middle) token ids, or None."""
    if not isinstance(prompt, str):
        ids = [int(t) for t in prompt]
        if suffix is None:
            return ids
        head = ids
    else:
        head = vocab.encode(prompt, add_bos=False, parse_special=suffix is None) if prompt else []
    bos = [vocab.bos] if vocab.add_bos and vocab.bos is not None else []
    if suffix is None:
        tail = [vocab.sep] if vocab.add_sep and vocab.sep is not None else []
        if not tail and vocab.add_eos and vocab.eos is not None:
            tail = [vocab.eos]
        tokens = bos + head + tail
    else:
        if fim is None:
            raise ValueError(
                "suffix needs a model with fill-in-the-middle tokens "
                "(tokenizer.ggml.fim_pre_token_id, fim_suf_token_id, fim_mid_token_id): "
                "this model has none; leave suffix out"
            )
        pre, suf, mid = fim
        suffix_ids = [suf, *vocab.encode(suffix, add_bos=False)] if suffix else [suf]
        prefix_ids = [pre, *head]
        body = suffix_ids + prefix_ids if spm_infill else prefix_ids + suffix_ids
        tokens = bos + body + [mid]
    if vocab.bos is not None and tokens[:2] == [vocab.bos, vocab.bos]:
        warnings.warn(
            f'Detected duplicate leading "{vocab.tokens[vocab.bos]}" in prompt, this will '
            "likely reduce response quality, consider removing it...",
            RuntimeWarning,
            stacklevel=3,
        )
    return tokens


class _Text:
    """The completion's bytes so far, and how much of them may be sent."""

    def __init__(self, vocab: Vocab, stops: list[bytes]) -> None:
        self.vocab = vocab
        self.stops = stops
        self.data = b""

    def add(self, token: int) -> None:
        self.data += self.vocab.piece(token)

    def stop_at(self) -> int | None:
        """Where the first ``stop`` string (in the list's order) begins, if one is in."""
        for s in self.stops:
            at = self.data.find(s)
            if at >= 0:
                return at
        return None

    def safe_end(self) -> int:
        """How many bytes can be sent without splitting a UTF-8 character or sending
        the start of a stop string."""
        end = len(self.data)
        for s in self.stops:
            for k in range(min(len(s) - 1, end), 0, -1):
                if self.data.endswith(s[:k]):
                    end = min(end, len(self.data) - k)
                    break
        return _utf8_boundary(self.data, end)


def _utf8_boundary(data: bytes, end: int) -> int:
    """``end`` moved back before a UTF-8 character it would cut."""
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back
            continue
        if byte & 0x80 == 0:
            return end
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return end if back >= need else end - back
    return end


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="ignore")


def complete(
    session: Session, settings: SampleSettings, request: CompletionRequest, vocab: Vocab
) -> Iterator[dict[str, Any]]:
    """The completion's dicts: one (with ``usage``) or, streaming, its chunks."""
    tokens = request.prompt_tokens
    n_ctx = session.n_ctx
    if not tokens:
        raise ValueError("the prompt is empty: give some text or token ids")
    if len(tokens) >= n_ctx:
        raise ValueError(f"Requested tokens ({len(tokens)}) exceed context window of {n_ctx}")
    if request.logprobs is not None and not session.logits_all:
        raise ValueError("logprobs is not supported for models created with logits_all=False")
    max_tokens = request.max_tokens
    if max_tokens is None or max_tokens <= 0:
        max_tokens = n_ctx - len(tokens)
    max_tokens = min(max_tokens, n_ctx - len(tokens))
    meta = {
        "id": f"cmpl-{uuid.uuid4()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": request.model,
    }
    text = _Text(vocab, [s.encode("utf-8") for s in request.stop])
    completion: list[int] = []
    finish = "length"
    sent = 0  # bytes of the text already streamed
    prompt_text = (
        request.prompt if isinstance(request.prompt, str) else vocab.decode(list(request.prompt))
    )
    offset = len(prompt_text)  # where the completion's text begins (characters)
    streamed = _StreamedLogprobs(offset)
    if request.stream and request.echo:
        yield _chunk(meta, prompt_text, None, None)
    generator = session.generate(
        tokens, settings, stopping_criteria=request.stopping_criteria, seed=request.seed
    )
    stopped_by_criteria = True
    cut: int | None = None
    for token in generator:
        if token in vocab.eog:
            finish, stopped_by_criteria = "stop", False
            break
        completion.append(token)
        text.add(token)
        cut = text.stop_at()
        if cut is not None:
            finish, stopped_by_criteria = "stop", False
            break
        if request.stream:
            end = text.safe_end()
            if end > sent:
                lp = streamed.take(session, vocab, request, tokens, completion, end)
                yield _chunk(meta, _decode(text.data[sent:end]), lp, None)
                sent = end
        if len(completion) >= max_tokens:
            stopped_by_criteria = False
            break
    generator.close()
    if stopped_by_criteria and request.stopping_criteria is not None:
        finish = "stop"  # the loop ended because a criterion said so
    data = text.data if cut is None else text.data[:cut]
    if request.stream:
        if len(data) > sent:
            yield _chunk(meta, _decode(data[sent:]), None, None)
        yield _chunk(meta, "", None, finish)
        return
    body = _decode(data)
    logprobs = None
    if request.logprobs is not None:
        logprobs = _all_logprobs(session, vocab, request, tokens, completion, offset)
    if request.echo:
        body = prompt_text + body
    body += request.suffix_text
    yield {
        **meta,
        "choices": [{"text": body, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": len(tokens),
            "completion_tokens": len(completion),
            "total_tokens": len(tokens) + len(completion),
        },
    }


def _chunk(meta: dict[str, Any], text: str, logprobs: Any, finish: str | None) -> dict[str, Any]:
    return {
        **meta,
        "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
    }


def _entries(
    session: Session,
    vocab: Vocab,
    top_n: int,
    tokens: Sequence[int],
    rows: Sequence[int],
    start: int,
) -> dict[str, list[Any]]:
    """The logprob entries of ``tokens``, token ``i`` predicted by scores row ``rows[i]``
    (negative: no row, the prompt's first token), its text at character ``start`` on."""
    out: dict[str, list[Any]] = {
        "tokens": [],
        "text_offset": [],
        "token_logprobs": [],
        "top_logprobs": [],
    }
    for token, row in zip(tokens, rows, strict=True):
        piece = _decode(vocab.piece(token))
        out["tokens"].append(piece)
        out["text_offset"].append(start)
        start += len(piece)
        if row < 0:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        logprobs = logits_to_logprobs(session.scores[row])
        best = np.argsort(-logprobs, kind="stable")[:top_n]
        top = {_decode(vocab.piece(int(i))): float(logprobs[i]) for i in best}
        top[piece] = float(logprobs[token])
        out["token_logprobs"].append(float(logprobs[token]))
        out["top_logprobs"].append(top)
    return out


class _StreamedLogprobs:
    """Which generated tokens a streamed chunk carries the logprobs of: those whose text
    has been sent in full (a token whose bytes end a character late goes with the
    chunk that completes it)."""

    def __init__(self, offset: int) -> None:
        self.next = 0  # the first token not listed yet
        self.chars = offset  # where its text begins, in characters of the whole text

    def take(
        self,
        session: Session,
        vocab: Vocab,
        request: CompletionRequest,
        prompt: list[int],
        completion: list[int],
        sent_end: int,
    ) -> dict[str, list[Any]] | None:
        if request.logprobs is None:
            return None
        end_bytes = sum(len(vocab.piece(t)) for t in completion[: self.next])
        k = self.next
        while k < len(completion) and end_bytes + len(vocab.piece(completion[k])) <= sent_end:
            end_bytes += len(vocab.piece(completion[k]))
            k += 1
        fresh = completion[self.next : k]
        rows = [len(prompt) - 1 + i for i in range(self.next, k)]
        entries = _entries(session, vocab, request.logprobs, fresh, rows, self.chars)
        self.chars += sum(len(_decode(vocab.piece(t))) for t in fresh)
        self.next = k
        return entries


def _all_logprobs(
    session: Session,
    vocab: Vocab,
    request: CompletionRequest,
    prompt: list[int],
    completion: list[int],
    offset: int,
) -> dict[str, list[Any]]:
    """A whole completion's logprobs; with ``echo`` the prompt's tokens first (its
    leading BOS left out, and the first listed token without logprobs, as OpenAI
    answers)."""
    assert request.logprobs is not None
    if request.echo:
        skip = 1 if prompt and prompt[0] == vocab.bos else 0
        shown = prompt[skip:] + completion
        rows = [skip + i - 1 for i in range(len(shown))]
        if rows:
            rows[0] = -1
        return _entries(session, vocab, request.logprobs, shown, rows, 0)
    rows = [len(prompt) - 1 + i for i in range(len(completion))]
    return _entries(session, vocab, request.logprobs, completion, rows, offset)
