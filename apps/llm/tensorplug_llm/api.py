"""A Python API shaped like llama-cpp-python's: completions, chat, streaming, embeddings.

``LLM(llama).create_completion("Once upon a time", max_tokens=16)`` returns the dict
OpenAI's ``/v1/completions`` returns; ``stream=True`` returns an iterator of its chunk
dicts instead. ``create_chat_completion(messages)`` renders the conversation with the
GGUF's own chat template (:mod:`template`: sandboxed, message text never forging
control tokens) and answers like ``/v1/chat/completions``. The server sends exactly
these dicts, so the Python API and the HTTP API cannot drift apart.

The generation itself is the generator's (:mod:`generation`: the batching engine, or
one request at a time); this layer sees text, so it is where stop strings are found
(:mod:`stop_strings`) and the request cancelled when one matches.

``n`` choices of one prompt are submitted as a group (the engine evaluates the prompt
once and forks its cells); choice ``i`` samples with seed ``seed + i`` (so choice 0 is
the answer ``n=1`` gives with the same seed), and a stream carries each choice's
chunks under its ``index``, interleaved token by token.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.errors import RunError

from .generation import GenerationHandle, GenerationJob, Generator, GeneratorStats, TokenEvent
from .request import RequestError
from .stop_strings import StopMatcher
from .template import ChatTemplateError, prompt_ids

if TYPE_CHECKING:
    from .runner import Llama
    from .tokenizer import Vocab

__all__ = ["LLM", "InvalidRequestError", "Stream"]


class InvalidRequestError(RunError):
    """A request the API refuses; ``param`` names the field (OpenAI's error ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class _Piece:
    """Text that may be sent, with the token events it came from."""

    text: str
    events: list[TokenEvent]
    finish_reason: str | None = None


class Stream:
    """An iterator of response dicts (chunks) that can be cancelled from another
    thread: the server cancels it when its client goes away."""

    def __init__(
        self, chunks: Iterator[dict[str, Any]], handle: GenerationHandle | list[GenerationHandle]
    ) -> None:
        self._chunks = chunks
        self._handles = handle if isinstance(handle, list) else [handle]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._chunks

    def __next__(self) -> dict[str, Any]:
        return next(self._chunks)

    def cancel(self) -> None:
        for handle in self._handles:
            handle.cancel()


class LLM:
    """A model behind a generator, answering in OpenAI's shapes.

    ``generator`` defaults to the batching engine over ``llama`` with ``n_parallel``
    slots (:class:`~generation.EngineGenerator`).
    ``model_name`` is the ``model`` field of responses (default: the file's name).
    ``chat_template`` replaces the model file's ``tokenizer.chat_template``.
    Embeddings come from the same model through the generator (the engine evaluates
    them as sequences of their own beside the generations): no second copy of the
    weights. An encoder (BERT) file serves embeddings only; a completion is refused.
    """

    def __init__(
        self,
        llama: Llama,
        generator: Generator | None = None,
        *,
        n_parallel: int = 1,
        model_name: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        from .engine import Engine
        from .generation import EngineGenerator

        if llama.vocab is None:
            raise RunError(f"cannot serve {llama.file.path.name}: {llama.vocab_error}")
        self.llama = llama
        self.vocab: Vocab = llama.vocab
        self.generator: Generator = generator or EngineGenerator(Engine(llama, n_parallel))
        self.model_name = model_name or llama.file.path.name
        template = chat_template or llama.file.get("tokenizer.chat_template")
        self.chat_template = template if isinstance(template, str) and template.strip() else None
        self._longest_token: int | None = None

    # -- tokens -------------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self.vocab.encode(text, add_bos=add_bos)

    def _refuse_unfittable(self, n_chars: int, param: str) -> None:
        """Refuse, before tokenizing it, a text that cannot fit the context: no token
        covers more characters than its own text, so ``n_chars / longest token`` tokens
        at least. Tokenizing is linear but not cheap (a 16 MB prompt took a minute of a
        server thread only to be refused for its length)."""
        if self._longest_token is None:
            self._longest_token = max(1, max(len(t) for t in self.vocab.tokens))
        n_ctx = self.llama.n_ctx
        if n_chars > n_ctx * self._longest_token:
            raise InvalidRequestError(
                f"the {param} has {n_chars} characters: at least "
                f"{n_chars // self._longest_token} tokens, and the context holds {n_ctx} "
                "(n_ctx): shorten it",
                param,
            )

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.vocab.decode(list(tokens))

    def stats(self) -> GeneratorStats:
        return self.generator.stats()

    def close(self) -> None:
        self.generator.close()

    # -- completions --------------------------------------------------------------------------

    def create_completion(
        self,
        prompt: str | list[int],
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        stop: str | list[str] | None = None,
        stream: bool = False,
        logprobs: int | None = None,
        seed: int | None = None,
        response_format: Mapping[str, Any] | None = None,
        echo: bool = False,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        logit_bias: Mapping[str, float] | None = None,
        ignore_eos: bool = False,
        n: int = 1,
    ) -> dict[str, Any] | Stream:
        """OpenAI's ``text_completion`` (a dict), or with ``stream`` a :class:`Stream`
        of its chunks. ``logprobs=N``: the sampled token's logprob and the N most likely
        (OpenAI's completions ``logprobs`` object). ``n``: choices of the prompt (see
        the module's docstring for their seeds)."""
        self._check_generates("prompt")
        if isinstance(prompt, str):
            self._refuse_unfittable(len(prompt), "prompt")
        ids = prompt if isinstance(prompt, list) else self.tokenize(prompt)
        job = self._job(
            ids, max_tokens, logprobs or 0, response_format, temperature=temperature,
            top_p=top_p, top_k=top_k, min_p=min_p, seed=seed, repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            logit_bias=logit_bias,
        )  # fmt: skip
        job.ignore_eos = ignore_eos
        stops = _stops(stop)  # checked before anything runs
        handles = self._submit(job, n, response_format)
        pieces = [self._pieces(h, stops) for h in handles]
        prefix = self.detokenize(ids) if echo and isinstance(prompt, list) else prompt
        head = str(prefix) if echo else ""
        meta = _meta("cmpl", "text_completion", self.model_name)
        want_lp = logprobs is not None
        if stream:
            chunks = self._completion_chunks(pieces, meta, head, want_lp, len(ids))
            return Stream(chunks, handles)
        choices, n_generated = [], 0
        for i, choice in enumerate(pieces):
            text, events, finish = self._collect(choice)
            n_generated += len(events)
            lp = self._completion_logprobs(events, len(head)) if want_lp else None
            choices.append(_choice_text(head + text, lp, finish, i))
        return {**meta, "choices": choices, "usage": _usage(len(ids), n_generated)}

    def _completion_chunks(
        self,
        pieces: list[Iterator[_Piece]],
        meta: dict[str, Any],
        head: str,
        want_lp: bool,
        n_prompt: int,
    ) -> Iterator[dict[str, Any]]:
        """Chunks of a streamed completion, each choice's under its index; the last one
        carries ``usage`` (the prompt counted once)."""
        offsets, n = [len(head)] * len(pieces), 0
        if head:
            for i in range(len(pieces)):
                yield {**meta, "choices": [_choice_text(head, None, None, i)]}
        for i, piece, last in _interleave(pieces):
            lp = self._completion_logprobs(piece.events, offsets[i]) if want_lp else None
            offsets[i] += len(piece.text)
            n += len(piece.events)
            chunk = {**meta, "choices": [_choice_text(piece.text, lp, piece.finish_reason, i)]}
            if last:
                chunk["usage"] = _usage(n_prompt, n)
            yield chunk

    def _completion_logprobs(self, events: list[TokenEvent], offset: int) -> dict[str, Any]:
        tokens, offsets = [], []
        for e in events:
            offsets.append(offset)
            text = self._token_text(e.token)
            tokens.append(text)
            offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in events],
            "top_logprobs": [
                {self._token_text(t): lp for t, lp in e.top_logprobs or []} for e in events
            ],
            "text_offset": offsets,
        }

    # -- chat ---------------------------------------------------------------------------------

    def create_chat_completion(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        stop: str | list[str] | None = None,
        stream: bool = False,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        seed: int | None = None,
        response_format: Mapping[str, Any] | None = None,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        logit_bias: Mapping[str, float] | None = None,
        ignore_eos: bool = False,
        n: int = 1,
    ) -> dict[str, Any] | Stream:
        """OpenAI's ``chat.completion`` (a dict), or with ``stream`` a :class:`Stream` of
        ``chat.completion.chunk`` dicts; ``n`` choices as for :meth:`create_completion`.
        ``tools`` are not rendered yet: refused when given."""
        if tools:
            raise InvalidRequestError(
                "tools are not supported yet: the chat template is rendered without them",
                "tools",
            )
        self._check_generates("messages")
        ids = self.chat_prompt(messages)
        n_probs = (top_logprobs or 0) if logprobs else 0
        job = self._job(
            ids, max_tokens, n_probs, response_format, temperature=temperature, top_p=top_p,
            top_k=top_k, min_p=min_p, seed=seed, repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            logit_bias=logit_bias,
        )  # fmt: skip
        job.ignore_eos = ignore_eos
        stops = _stops(stop)  # checked before anything runs
        handles = self._submit(job, n, response_format, "messages")
        pieces = [self._pieces(h, stops) for h in handles]
        meta = _meta("chatcmpl", "chat.completion", self.model_name)
        if stream:
            return Stream(self._chat_chunks(pieces, meta, logprobs, len(ids)), handles)
        choices, n_generated = [], 0
        for i, choice in enumerate(pieces):
            text, events, finish = self._collect(choice)
            n_generated += len(events)
            choices.append(
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": {"content": self._chat_logprobs(events)} if logprobs else None,
                    "finish_reason": finish,
                }
            )
        return {**meta, "choices": choices, "usage": _usage(len(ids), n_generated)}

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """The conversation's tokens: the template's markup with control tokens parsed,
        the messages' text without (so a message cannot forge a turn)."""
        if self.chat_template is None:
            raise InvalidRequestError(
                f"{self.model_name} has no chat template (tokenizer.chat_template): use "
                "/v1/completions, or start the server with --chat-template FILE",
                "messages",
            )
        for i, m in enumerate(messages):
            if not isinstance(m.get("content"), str):
                raise InvalidRequestError(
                    "only text content is supported (a string)", f"messages[{i}].content"
                )
        self._refuse_unfittable(sum(len(m.get("content") or "") for m in messages), "messages")
        vocab = self.vocab
        bos = vocab.tokens[vocab.bos] if vocab.bos is not None else ""
        eos = vocab.tokens[vocab.eos] if vocab.eos is not None else ""
        try:
            return prompt_ids(vocab, self.chat_template, messages, bos, eos)
        except ChatTemplateError as e:  # a message that would forge a control token
            raise InvalidRequestError(str(e), "messages") from e

    def _chat_chunks(
        self, pieces: list[Iterator[_Piece]], meta: dict[str, Any], logprobs: bool, n_prompt: int
    ) -> Iterator[dict[str, Any]]:
        """Chunks of a streamed chat reply, each choice's under its index: the role
        first, the last chunk carrying ``usage`` (the prompt counted once)."""
        meta = {**meta, "object": "chat.completion.chunk"}
        for i in range(len(pieces)):
            first = {"role": "assistant", "content": ""}
            yield {**meta, "choices": [_choice_delta(first, None, None, i)]}
        n = 0
        for i, piece, last in _interleave(pieces):
            lp = {"content": self._chat_logprobs(piece.events)} if logprobs else None
            delta = {"content": piece.text} if piece.text else {}
            n += len(piece.events)
            chunk = {**meta, "choices": [_choice_delta(delta, lp, piece.finish_reason, i)]}
            if last:
                chunk["usage"] = _usage(n_prompt, n)
            yield chunk

    def _chat_logprobs(self, events: list[TokenEvent]) -> list[dict[str, Any]]:
        def entry(token: int, logprob: float | None) -> dict[str, Any]:
            text = self._token_text(token)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return [
            {
                **entry(e.token, e.logprob),
                "top_logprobs": [entry(t, lp) for t, lp in e.top_logprobs or []],
            }
            for e in events
        ]

    # -- embeddings ---------------------------------------------------------------------------

    def embed(self, texts: str | Sequence[str]) -> list[list[float]]:
        """One pooled embedding per text (pooled as ``Llama.embed`` pools: the file's
        ``pooling_type``, else mean), normalized to unit length as OpenAI's are."""
        one = isinstance(texts, str)
        items = [texts] if isinstance(texts, str) else list(texts)
        try:
            vectors = self.generator.embed([self.tokenize(text) for text in items])
        except RequestError as e:  # an empty text, one longer than the context
            raise InvalidRequestError(str(e), "input") from None
        out = []
        for vector in vectors:
            v = np.asarray(vector, dtype=np.float64)
            norm = float(np.linalg.norm(v))
            out.append((v / norm if norm > 0 else v).tolist())
        return out[:1] if one else out

    def create_embedding(self, input: str | Sequence[str]) -> dict[str, Any]:
        """OpenAI's ``/v1/embeddings`` response."""
        items = [input] if isinstance(input, str) else list(input)
        vectors = self.embed(items)
        n = sum(len(self.tokenize(t)) for t in items)
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ],
            "model": self.model_name,
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }

    # -- shared ---------------------------------------------------------------------------------

    def _job(
        self,
        ids: list[int],
        max_tokens: int | None,
        n_probs: int,
        response_format: Mapping[str, Any] | None,
        **sampling: Any,
    ) -> GenerationJob:
        if not ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        if max_tokens is not None and max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be at least 1 (got {max_tokens}); leave it out to generate "
                "until the end of the reply",
                "max_tokens",
            )
        if not 0 <= n_probs <= 20:
            raise InvalidRequestError(f"at most 20 top logprobs (got {n_probs})", "logprobs")
        sampling = {k: v for k, v in sampling.items() if v is not None}
        constraint = None
        if response_format is not None and response_format.get("type", "text") != "text":
            constraint = self._constraint(response_format)
        job = GenerationJob(list(ids), max_tokens, sampling, n_probs, constraint)
        check = getattr(self.generator, "check", None)
        if check is not None:
            try:
                check(job)
            except RunError as e:
                raise InvalidRequestError(str(e), getattr(e, "param", None)) from None
        return job

    def _constraint(self, response_format: Mapping[str, Any]) -> Any:
        from .constraint import constraint_for

        try:
            return constraint_for(self.vocab, dict(response_format), self.llama.config.n_vocab)
        except ImportError:
            raise InvalidRequestError(
                "structured output (response_format) needs llguidance: "
                "pip install 'tensorplug-llm[structured]'",
                "response_format",
            ) from None
        except (RunError, ValueError) as e:
            raise InvalidRequestError(str(e), getattr(e, "param", "response_format")) from None

    def _pieces(self, handle: GenerationHandle, stops: list[str]) -> Iterator[_Piece]:
        """The handle's tokens as text, with stop strings found (the request cancelled)
        and end-of-generation tokens left out of the text."""
        from .tokenizer import StreamDecoder

        decoder = StreamDecoder(self.vocab)
        matcher = StopMatcher(stops)
        eog = self.vocab.eog
        finish: str | None = None
        try:
            for event in handle:
                text = "" if event.token in eog else decoder.feed(event.token)
                if event.finish_reason is not None:
                    text += decoder.flush()
                got = matcher.feed(text)
                if got.stopped:
                    handle.cancel()
                    yield _Piece(got.text, [event], "stop")
                    return
                finish = event.finish_reason
                if finish is not None:
                    yield _Piece(got.text + matcher.flush(), [event], finish)
                    return
                yield _Piece(got.text, [event])
            # the handle ended without a finish: the request was cancelled
        finally:
            if finish is None:
                handle.cancel()

    def _check_generates(self, param: str) -> None:
        """An encoder (BERT) has no output layer: it serves embeddings only."""
        arch = self.llama.config.arch
        if arch.encoder:
            raise InvalidRequestError(
                f"{self.model_name} is an embedding model ('{arch.name}', a bidirectional "
                "encoder with no output layer): it serves /v1/embeddings only, it cannot "
                "generate text",
                param,
            )

    def _submit(
        self,
        job: GenerationJob,
        n: int,
        response_format: Mapping[str, Any] | None,
        field: str = "prompt",
    ) -> list[GenerationHandle]:
        """The job's ``n`` choices, submitted together: choice ``i`` samples with seed
        ``seed + i`` and has a constraint of its own. ``n`` is at most the generator's
        ``n_parallel``: the choices run side by side."""
        limit = self.generator.stats().n_parallel
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= limit:
            raise InvalidRequestError(
                f"n must be an integer from 1 to {limit} (the server's parallel slots, -np), "
                f"got {n!r}",
                "n",
            )
        try:
            if n == 1:
                return [self.generator.submit(job)]
            return list(self.generator.submit_choices(self._choices(job, n, response_format)))
        except RequestError as e:  # e.g. a prompt longer than the context
            raise InvalidRequestError(str(e), field) from None

    def _choices(
        self, job: GenerationJob, n: int, response_format: Mapping[str, Any] | None
    ) -> list[GenerationJob]:
        seed = job.sampling.get("seed")
        jobs = [job]
        for i in range(1, n):
            sampling = dict(job.sampling)
            if isinstance(seed, int) and seed >= 0:
                sampling["seed"] = seed + i
            constraint = None
            if job.constraint is not None and response_format is not None:
                constraint = self._constraint(response_format)
            jobs.append(replace(job, sampling=sampling, constraint=constraint))
        return jobs

    @staticmethod
    def _collect(pieces: Iterator[_Piece]) -> tuple[str, list[TokenEvent], str | None]:
        texts, events, finish = [], [], None
        for p in pieces:
            texts.append(p.text)
            events.extend(p.events)
            finish = p.finish_reason or finish
        return "".join(texts), events, finish

    def _token_text(self, token: int) -> str:
        return self.vocab.piece(token).decode("utf-8", errors="replace")


def _stops(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > 16:
        raise InvalidRequestError(f"at most 16 stop strings (got {len(stops)})", "stop")
    return stops


def _meta(prefix: str, kind: str, model: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _interleave(choices: list[Iterator[_Piece]]) -> Iterator[tuple[int, _Piece, bool]]:
    """``(index, piece, last)`` from every choice in turn until each has finished
    (``last``: no choice has more). The choices advance in the same engine steps, so
    taking one piece of each in turn keeps the stream in step with the generation."""
    live = list(enumerate(choices))
    pending: tuple[int, _Piece] | None = None
    while live:
        for i, it in list(live):
            piece = next(it, None)
            if piece is None:
                live.remove((i, it))
                continue
            if pending is not None:
                yield (*pending, False)
            pending = (i, piece)
    if pending is not None:
        yield (*pending, True)


def _choice_text(text: str, logprobs: Any, finish: str | None, index: int = 0) -> dict[str, Any]:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}


def _choice_delta(
    delta: dict[str, Any], logprobs: Any, finish: str | None, index: int = 0
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
