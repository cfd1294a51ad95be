"""llama-server's ``/completion``: a prompt of text and token ids in, its response shape
out (``content``, ``tokens``, ``stop_type``, ``timings``, ``completion_probabilities``),
streamed as its chunks (``{"content": ..., "stop": false}`` then a last one with
``"stop": true`` and the totals, no ``[DONE]``)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

from ..api import LLM, InvalidRequestError, Stream
from .native_schema import NativeCompletionRequest, Prompt
from .relay import Canceller
from .timings import llama_timings

__all__ = ["NativeCompletion", "generation_settings", "prompt_ids", "token_piece"]

#: the chain this engine runs, in its order (llama.cpp's default, less DRY and XTC)
DEFAULT_SAMPLERS = ("penalties", "top_k", "typ_p", "top_p", "min_p", "temperature")


def prompt_ids(llm: LLM, prompt: Prompt | list[int], param: str = "prompt") -> list[int]:
    """``prompt``'s tokens as llama-server reads them: text with control tokens parsed,
    token ids as they are, and BOS first when the prompt begins with text and the model
    wants one."""
    parts = [prompt] if isinstance(prompt, str) else list(prompt)
    n_vocab = len(llm.vocab.tokens)
    ids: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            ids += llm.vocab.encode(part, add_bos=None if i == 0 else False, parse_special=True)
        elif not 0 <= part < n_vocab:
            raise InvalidRequestError(
                f"token id {part} is outside the vocabulary (0 to {n_vocab - 1})", f"{param}[{i}]"
            )
        else:
            ids.append(part)
    if not ids:
        raise InvalidRequestError("the prompt is empty: give a text or token ids", param)
    return ids


def token_piece(llm: LLM, token: int) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 (``/tokenize``)."""
    raw = llm.vocab.piece(token, special=True)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def generation_settings(llm: LLM, body: NativeCompletionRequest) -> dict[str, Any]:
    """The request's settings as llama-server echoes them (``generation_settings``,
    ``/props``' ``params``)."""
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    return {
        "n_predict": body.budget(),
        "seed": body.seed if body.seed >= 0 else 4294967295,
        "temperature": body.temperature,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": body.top_k,
        "top_p": body.top_p,
        "min_p": body.min_p,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.1,
        "typical_p": body.typical_p,
        "repeat_last_n": body.repeat_last_n,
        "repeat_penalty": body.repeat_penalty,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "dry_multiplier": 0.0,
        "mirostat": 0,
        "stop": stop,
        "max_tokens": body.budget(),
        "n_keep": body.n_keep,
        "n_discard": 0,
        "logit_bias": logit_biases(llm, body),
        "ignore_eos": body.ignore_eos,
        "stream": body.stream,
        "n_probs": body.n_probs,
        "min_keep": body.min_keep,
        "grammar": body.grammar or "",
        "samplers": body.samplers or list(DEFAULT_SAMPLERS),
        "timings_per_token": body.timings_per_token,
        "post_sampling_probs": body.post_sampling_probs,
        "model": llm.model_name,
        "n_ctx": llm.n_ctx,
    }


def token_biases(llm: LLM, bias: dict[str, float] | None) -> dict[str, float] | None:
    """``logit_bias`` by token id: a key that is a text (llama-server's ``[" the ", -100]``)
    gives its bias to each of the text's tokens, as llama-server does."""
    if not bias:
        return bias
    out: dict[str, float] = {}
    for key, value in bias.items():
        ids = [key] if key.isdigit() else [str(t) for t in llm.tokenize(key, add_bos=False)]
        out.update(dict.fromkeys(ids, value))
    return out


def logit_biases(llm: LLM, body: NativeCompletionRequest) -> list[dict[str, Any]]:
    """``logit_bias`` as llama-server echoes it: ``[{"bias", "token"}]``, the request's
    then, with ``ignore_eos``, every end-of-generation token's ``-inf`` (as JSON
    ``null``, as its JSON library writes an infinity)."""
    request = body.logit_bias if isinstance(body.logit_bias, dict) else {}  # validated: a dict
    given = [
        {"bias": b if math.isfinite(b) else None, "token": int(t) if t.isdigit() else t}
        for t, b in request.items()
    ]
    eog = sorted(llm.vocab.eog) if body.ignore_eos else []
    return given + [{"bias": None, "token": t} for t in eog]


class NativeCompletion:
    """One ``/completion`` request: :meth:`start` submits it, the returned stream yields
    llama-server's chunks (``stream``) or its one response."""

    def __init__(
        self,
        llm: LLM,
        body: NativeCompletionRequest,
        defaults: dict[str, Any],
        prompt: Prompt | None = None,
        index: int = 0,
    ) -> None:
        self.llm, self.body = llm, body
        self.prompt = body.prompts()[0] if prompt is None else prompt
        self.index = index
        given = body.model_fields_set
        self.budget = body.budget()
        if "n_predict" not in given and "max_tokens" not in given:
            self.budget = int(defaults.get("n_predict", self.budget))
        self.sampling = body.sampling()
        self.sampling["logit_bias"] = token_biases(llm, self.sampling.get("logit_bias"))
        if "temperature" not in given and "temperature" in defaults:
            self.sampling["temperature"] = defaults["temperature"]
        if "seed" not in given and defaults.get("seed", -1) >= 0:
            self.sampling["seed"] = defaults["seed"]
        self.started = time.monotonic()
        self.first: float | None = None
        self.ids: list[int] = []
        self.text: list[str] = []
        self.tokens: list[int] = []
        self.probs: list[dict[str, Any]] = []
        self.finish: dict[str, Any] = {}

    def start(self) -> Stream:
        param = "prompt" if len(self.body.prompts()) == 1 else f"prompt[{self.index}]"
        self.ids = prompt_ids(self.llm, self.prompt, param)
        b = self.body
        stream = self.llm.stream_tokens(
            self.ids,
            None if self.budget < 0 else self.budget,
            n_probs=b.n_probs,
            stop=b.stop or None,
            response_format=b.constraint(),
            ignore_eos=b.ignore_eos,
            return_progress=b.return_progress and b.stream,
            slot=b.id_slot if b.id_slot >= 0 else None,
            n_keep=b.n_keep,
            cache_reuse=b.n_cache_reuse,
            **self.sampling,
        )
        return Stream(self._chunks(stream), [Canceller(stream)])

    def _chunks(self, pieces: Stream) -> Iterator[dict[str, Any]]:
        for piece in pieces:
            if "progress" in piece:  # the prompt's evaluation, before any text
                progress = piece["progress"]
                report: dict[str, Any] = {
                    "index": self.index, "content": "", "tokens": [], "stop": False,
                    "id_slot": self.body.id_slot, "tokens_predicted": 0,
                    "tokens_evaluated": len(self.ids), "prompt_progress": progress,
                }  # fmt: skip
                if self.body.timings_per_token:  # the prompt's so far; no reply yet
                    so_far = progress["time_ms"] / 1000
                    report["timings"] = llama_timings(0.0, so_far, so_far,
                                                      progress["processed"] - progress["cache"], 0,
                                                      progress["cache"])  # fmt: skip
                yield report
                continue
            if self.first is None:
                self.first = time.monotonic()
            probs = [self._probs(*p) for p in piece["probs"]] if self.body.n_probs else []
            self.text.append(piece["text"])
            self.tokens += piece["tokens"]
            self.probs += probs
            if piece["finish"] is not None:
                self.finish = piece
            if self.body.stream and (piece["text"] or piece["tokens"]):
                chunk: dict[str, Any] = {
                    "index": self.index,
                    "content": piece["text"],
                    "tokens": piece["tokens"],
                    "stop": False,
                    "id_slot": self.body.id_slot,
                    "tokens_predicted": len(self.tokens),
                    "tokens_evaluated": len(self.ids),
                }
                if probs:
                    chunk["completion_probabilities"] = probs
                if self.body.timings_per_token:
                    chunk["timings"] = self._timings()
                yield chunk
        yield self._final()

    def _final(self) -> dict[str, Any]:
        streamed = self.body.stream
        text = "".join(self.text)
        stop_type = self.finish.get("finish") or "none"
        out: dict[str, Any] = {
            "index": self.index,
            "content": "" if streamed else text,
            "tokens": [] if streamed or not self.body.return_tokens else self.tokens,
            "id_slot": self.body.id_slot,
            "stop": True,
            "model": self.llm.model_name,
            "tokens_predicted": len(self.tokens),
            "tokens_evaluated": len(self.ids),
            "generation_settings": generation_settings(self.llm, self.body),
            "prompt": self.llm.vocab.decode(self.ids, special=True),
            "has_new_line": "\n" in text,
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": self.finish.get("stopping_word", ""),
            "tokens_cached": len(self.ids) + len(self.tokens),
            "timings": self._timings(),
        }
        if self.body.n_probs and not streamed:
            out["completion_probabilities"] = self.probs
        return out

    def _timings(self) -> dict[str, Any]:
        now = time.monotonic()
        first = self.first if self.first is not None else now
        cache_n = int(self.finish.get("prompt_tokens_reused", 0))
        return llama_timings(self.started, first, now, len(self.ids) - cache_n, len(self.tokens),
                             cache_n)  # fmt: skip

    def _probs(
        self, token: int, logprob: float | None, top: list[tuple[int, float]]
    ) -> dict[str, Any]:
        post = self.body.post_sampling_probs

        def entry(tid: int, lp: float | None) -> dict[str, Any]:
            text = self.llm.vocab.piece(tid).decode("utf-8", errors="replace")
            value = lp if lp is not None else 0.0
            e: dict[str, Any] = {"id": tid, "token": text, "bytes": list(text.encode())}
            if post:
                e["prob"] = math.exp(value)
            else:
                e["logprob"] = value
            return e

        key = "top_probs" if post else "top_logprobs"
        return {**entry(token, logprob), key: [entry(t, lp) for t, lp in top]}
