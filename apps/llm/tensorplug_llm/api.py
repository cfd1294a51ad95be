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

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.errors import RunError

from .generation import GenerationHandle, GenerationJob, Generator, GeneratorStats, TokenEvent
from .request import PromptProgress, RequestError, RequestStopped
from .stop_strings import StopMatcher
from .template import ChatTemplateError, prompt_ids
from .terminal import printable
from .tool_calls import Call, ToolCallParser, ToolSyntax, syntax_for_template, tool_grammar
from .tool_prompt import prepare_messages, takes_tools
from .tool_spec import ToolSpec, ToolSpecError, tool_spec

if TYPE_CHECKING:
    from .runner import ModelRunner
    from .tokenizer import Vocab

__all__ = ["LLM", "ContextSizeError", "InvalidRequestError", "Stream"]


class InvalidRequestError(RunError):
    """A request the API refuses; ``param`` names the field (OpenAI's error ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextSizeError(InvalidRequestError):
    """A prompt that cannot fit the context: llama-server's ``exceed_context_size_error``
    in its words, with the two numbers a client needs to shorten it. ``n_chars``: the
    text's length where the tokens are a lower bound found without tokenizing it."""

    def __init__(
        self, n_prompt_tokens: int, n_ctx: int, param: str, n_chars: int | None = None
    ) -> None:
        size = f"{n_prompt_tokens} tokens"
        if n_chars is not None:
            size = f"at least {size}: the {param} has {n_chars} characters"
        super().__init__(
            f"request ({size}) exceeds the available context size ({n_ctx} tokens), try "
            f"increasing it: the context holds {n_ctx} (n_ctx); shorten the {param} or start "
            "the server with a larger context (-c)",
            param,
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


@dataclass(frozen=True)
class _Piece:
    """Text that may be sent, with the token events it came from; ``stop_word``: the
    stop string that ended it."""

    text: str
    events: list[TokenEvent]
    finish_reason: str | None = None
    stop_word: str | None = None
    #: a report of the prompt's evaluation (no text, no events), where it was asked for
    progress: PromptProgress | None = None


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
    ``pooling`` replaces the file's ``pooling_type`` (llama-server's ``--pooling``;
    ``none``: every token's row, which only :meth:`embed_tokens` gives).
    """

    def __init__(
        self,
        llama: ModelRunner,
        generator: Generator | None = None,
        *,
        n_parallel: int = 1,
        model_name: str | None = None,
        chat_template: str | None = None,
        pooling: str | None = None,
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
        if pooling is not None:
            from .pooling import pooling_kind

            pooling_kind(pooling, "none")  # a RunError naming the kinds
        self.pooling = pooling
        self._longest_token: int | None = None
        self._markers: frozenset[int] | None = None

    # -- tokens -------------------------------------------------------------------------------

    def tokenize(
        self, text: str, add_bos: bool | None = None, parse_special: bool = False
    ) -> list[int]:
        """``text``'s ids; ``parse_special``: control tokens written in it become theirs
        (llama-server's ``/tokenize`` and ``/completion`` read prompts so)."""
        return self.vocab.encode(text, add_bos=add_bos, parse_special=parse_special)

    @property
    def n_ctx(self) -> int:
        """The tokens one request may hold, prompt and reply (llama-server's context of
        a slot): the generator's per-sequence context, else the model's."""
        return self.generator.stats().n_ctx_seq or self.llama.n_ctx

    def check_fits(self, text: str, param: str) -> None:
        """Refuse (:class:`ContextSizeError`), before tokenizing it, a text too long for
        the context whatever its tokens."""
        self._refuse_unfittable(len(text), param)

    def _refuse_unfittable(self, n_chars: int, param: str) -> None:
        """Refuse, before tokenizing it, a text that cannot fit the context: no token
        covers more characters than its own text, so ``n_chars / longest token`` tokens
        at least. Tokenizing is linear but not cheap (a prompt of megabytes holds a server
        thread for about a minute only to be refused for its length)."""
        if self._longest_token is None:
            self._longest_token = max(1, max(len(t) for t in self.vocab.tokens))
        n_ctx = self.n_ctx
        if n_chars > n_ctx * self._longest_token:
            raise ContextSizeError(n_chars // self._longest_token, n_ctx, param, n_chars)

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
        job.ignore_eos, job.logprobs = ignore_eos, logprobs is not None
        stops = _stops(stop)  # checked before anything runs
        handles = self._submit(job, n, lambda: self._constraint(response_format or {}))
        pieces = [self._pieces(h, stops) for h in handles]
        prefix = self.detokenize(ids) if echo and isinstance(prompt, list) else prompt
        head = str(prefix) if echo else ""
        meta = _meta("cmpl", "text_completion", self.model_name)
        want_lp = logprobs is not None
        if stream:
            chunks = self._completion_chunks(pieces, meta, head, want_lp, len(ids), handles)
            return Stream(chunks, handles)
        choices, n_generated = [], 0
        for i, choice in enumerate(pieces):
            text, events, finish = self._collect(choice)
            n_generated += len(events)
            lp = self._completion_logprobs(events, len(head)) if want_lp else None
            choices.append(_choice_text(head + text, lp, finish, i))
        return {**meta, "choices": choices, "usage": _usage(len(ids), n_generated, handles)}

    def _completion_chunks(
        self,
        pieces: list[Iterator[_Piece]],
        meta: dict[str, Any],
        head: str,
        want_lp: bool,
        n_prompt: int,
        handles: Sequence[GenerationHandle],
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
                chunk["usage"] = _usage(n_prompt, n, handles)
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

    def stream_tokens(
        self,
        ids: list[int],
        max_tokens: int | None = None,
        *,
        n_probs: int = 0,
        stop: str | list[str] | None = None,
        response_format: Mapping[str, Any] | None = None,
        ignore_eos: bool = False,
        return_progress: bool = False,
        slot: int | None = None,
        n_keep: int = 0,
        cache_reuse: int | None = None,
        **sampling: Any,
    ) -> Stream:
        """One generation as llama-server's ``/completion`` reports it: a :class:`Stream`
        of dicts, one per piece of text, with ``text``, ``tokens`` (its ids), ``probs``
        (``(id, logprob, [(id, logprob), ...])`` per token, ``n_probs`` most likely; the
        logprob None where ``n_probs`` is 0),
        ``finish`` (None, then ``"eos"``, ``"limit"`` or ``"word"``) and
        ``stopping_word``; the last one also ``prompt_tokens_reused`` (cells taken
        from the cache). ``return_progress``: before the text, a dict with ``progress``
        (llama-server's ``prompt_progress``) when the request is admitted and after
        each chunk of its prompt. ``slot``: the engine's slot it runs in (llama-server's
        ``id_slot``; None: whichever suits). ``n_keep``: the first tokens a context
        shift keeps (-1: the prompt; the engine's ``context_shift``). ``cache_reuse``: the
        shortest run of the slot's cached tokens moved to where the prompt has them
        (llama-server's ``n_cache_reuse``; None: the engine's ``cache_reuse``).
        ``sampling``: :class:`~.sampling.SamplingParams`' fields."""
        self._check_generates("prompt")
        job = self._job(ids, max_tokens, n_probs, response_format, **sampling)
        job.ignore_eos, job.report_progress, job.slot = ignore_eos, return_progress, slot
        job.logprobs = n_probs > 0
        job.n_keep, job.cache_reuse = n_keep, cache_reuse
        stops = _stops(stop)
        [handle] = self._submit(job, 1, lambda: None)

        def chunks() -> Iterator[dict[str, Any]]:
            for piece in self._pieces(handle, stops):
                if piece.progress is not None:
                    yield {"text": "", "tokens": [], "probs": [], "finish": None,
                           "stopping_word": "", "progress": _progress(piece.progress)}  # fmt: skip
                    continue
                finish = None
                if piece.finish_reason is not None:
                    finish = "limit" if piece.finish_reason == "length" else "eos"
                    finish = "word" if piece.stop_word is not None else finish
                chunk: dict[str, Any] = {
                    "text": piece.text,
                    "tokens": [e.token for e in piece.events],
                    "probs": [
                        (e.token, e.logprob, list(e.top_logprobs or [])) for e in piece.events
                    ],
                    "finish": finish,
                    "stopping_word": piece.stop_word or "",
                }
                if finish is not None:
                    chunk["prompt_tokens_reused"] = getattr(handle, "prompt_tokens_reused", 0)
                yield chunk

        return Stream(chunks(), handle)

    # -- chat ---------------------------------------------------------------------------------

    def create_chat_completion(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool = True,
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
        *,
        prompt_ids: list[int] | None = None,
        stop_sequence: bool = False,
        continue_final_message: bool = False,
        template_context: Mapping[str, Any] | None = None,
        return_progress: bool = False,
    ) -> dict[str, Any] | Stream:
        """OpenAI's ``chat.completion`` (a dict), or with ``stream`` a :class:`Stream` of
        ``chat.completion.chunk`` dicts; ``n`` choices as for :meth:`create_completion`.
        ``prompt_ids``: the conversation already rendered (by a named chat format of
        the Python API) instead of by the chat template. ``stop_sequence``: a streamed
        choice that a stop string ended carries it as ``stop_sequence`` in its finishing
        chunk's choice (Anthropic's API reports it; OpenAI's has no such field).
        ``return_progress``: a streamed reply's prompt evaluation is reported as
        llama-server reports it, a chunk with an assistant role delta and
        ``prompt_progress`` when the request is admitted and after each prompt chunk.

        ``tools`` (OpenAI's function tools) are rendered by the model's template and the
        reply is read for calls in the template's syntax (:mod:`tool_calls`): they come
        back as ``message.tool_calls`` with ``finish_reason`` ``"tool_calls"``.
        ``tool_choice``: ``"auto"`` (the default with tools: the model decides),
        ``"none"`` (the tools are not shown), ``"required"`` or ``{"type": "function",
        "function": {"name": ...}}``: the reply is constrained (llguidance) to be such
        calls, with arguments valid for the function's ``parameters`` schema;
        ``parallel_tool_calls`` false: at most one call. Each choice is read for calls
        on its own.
        """
        self._check_generates("messages")
        try:
            spec = tool_spec(tools, tool_choice, parallel_tool_calls)
        except ToolSpecError as e:
            raise InvalidRequestError(str(e), e.param) from None
        if prompt_ids is None:
            ids = self.chat_prompt(
                messages, spec, continue_final=continue_final_message, context=template_context
            )
        else:
            ids = prompt_ids
        n_probs = (top_logprobs or 0) if logprobs else 0
        job = self._job(
            ids, max_tokens, n_probs, response_format, temperature=temperature, top_p=top_p,
            top_k=top_k, min_p=min_p, seed=seed, repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            logit_bias=logit_bias, constraint=self._tool_constraint(spec, response_format),
        )  # fmt: skip
        job.ignore_eos, job.report_progress = ignore_eos, return_progress and stream
        job.logprobs = bool(logprobs)
        stops = _stops(stop)  # checked before anything runs

        def fresh_constraint() -> Any:
            return self._tool_constraint(spec, response_format) or self._constraint(
                response_format or {}
            )

        handles = self._submit(job, n, fresh_constraint, "messages")
        shown = self._marker_tokens() if spec.active else frozenset()
        pieces = [self._pieces(h, stops, shown) for h in handles]
        parsers = [
            ToolCallParser(self.tool_syntax, spec.names()) if spec.active else None for _ in handles
        ]
        meta = _meta("chatcmpl", "chat.completion", self.model_name)
        if stream:
            chunks = self._chat_chunks(pieces, meta, logprobs, len(ids), parsers, stop_sequence,
                                       handles)  # fmt: skip
            return Stream(chunks, handles)
        choices, n_generated = [], 0
        for i, (choice, parser) in enumerate(zip(pieces, parsers, strict=True)):
            text, events, finish = self._collect(choice)
            n_generated += len(events)
            calls: list[Call] = []
            if parser is not None:
                head, calls = parser.feed(text)
                tail, more = parser.finish()
                text, calls = head + tail, calls + more
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["content"] = text or None
                message["tool_calls"] = [c.as_openai() for c in calls]
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": {"content": self._chat_logprobs(events)} if logprobs else None,
                    "finish_reason": _finish(finish, bool(calls)),
                }
            )
        return {**meta, "choices": choices, "usage": _usage(len(ids), n_generated, handles)}

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: ToolSpec | None = None,
        *,
        continue_final: bool = False,
        context: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The conversation's tokens: the template's markup with control tokens parsed,
        the messages' text without (so a message cannot forge a turn). ``tools``: the
        request's tools, rendered as the template does (:mod:`tool_prompt`).
        ``continue_final``: the last message is the assistant's reply begun, which the
        model continues: the messages before it are rendered ready for the reply and its
        text follows, as llama.cpp continues a final message (an "assistant prefill").
        ``context``: more of the template's variables (``enable_thinking``,
        ``add_generation_prompt``, ``date_string``...: :func:`~.template.render`)."""
        continued = ""
        if continue_final:
            last = messages[-1] if messages else {}
            text = last.get("content") or ""
            assistant = last.get("role") == "assistant" and not last.get("tool_calls")
            if not assistant or not isinstance(text, str):
                raise InvalidRequestError(
                    "only an assistant message of text can be continued: make the last "
                    "message the assistant's reply begun, or do not ask to continue it",
                    "messages",
                )
            continued, messages = text, messages[:-1]
            context = {**(context or {}), "add_generation_prompt": True}
        if self.chat_template is None:
            raise InvalidRequestError(
                f"{self.model_name} has no chat template (tokenizer.chat_template): use "
                "/v1/completions, or start the server with --chat-template FILE",
                "messages",
            )
        for i, m in enumerate(messages):
            content = m.get("content")
            if content is None and m.get("role") == "assistant" and m.get("tool_calls"):
                continue
            if not isinstance(content, str):
                raise InvalidRequestError(
                    "only text content is supported (a string)", f"messages[{i}].content"
                )
        n_chars = sum(len(m.get("content") or "") for m in messages) + len(continued)
        self._refuse_unfittable(n_chars, "messages")
        shown = tools.functions if tools is not None and tools.active else ()
        native = takes_tools(self.chat_template)
        try:
            prepared = prepare_messages(
                messages, shown, native, has_system_role="system" in self.chat_template
            )
        except ToolSpecError as e:
            raise InvalidRequestError(str(e), e.param) from None
        template_tools = [f.as_tool() for f in shown] if shown and native else None
        self._refuse_control_text(prepared, template_tools)
        vocab = self.vocab
        bos = vocab.tokens[vocab.bos] if vocab.bos is not None else ""
        eos = vocab.tokens[vocab.eos] if vocab.eos is not None else ""
        try:
            return prompt_ids(
                vocab, self.chat_template, prepared, bos, eos, template_tools, continued, context
            )
        except ChatTemplateError as e:  # a message that would forge a control token
            raise InvalidRequestError(str(e), "messages") from e

    def _refuse_control_text(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> None:
        """Tools and earlier calls reach the template as data that it writes as its own
        markup (``tojson``), where a control token would act as one: refused, as a
        message that forges one is."""
        fields = [("tools", tools)] + [
            (f"messages[{i}].tool_calls", m.get("tool_calls")) for i, m in enumerate(messages)
        ]
        for param, value in fields:
            token = (
                self.vocab.control_text_in(json.dumps(value, ensure_ascii=False)) if value else None
            )
            if token is not None:
                raise InvalidRequestError(
                    f"{param} writes the control token {printable(token)!r}: remove it (the chat "
                    "template writes this field as its own markup, where it would act as one)",
                    param,
                )

    @property
    def tool_syntax(self) -> ToolSyntax:
        """How this model writes tool calls: its chat template's syntax (the table of
        :mod:`tool_calls`), the generic one when the template takes no tools."""
        template = self.chat_template or ""
        return syntax_for_template(template, takes_tools(template) if template else False)

    def _marker_tokens(self) -> frozenset[int]:
        """Control tokens that begin or shape a call (``[TOOL_CALLS]``, ``<|python_tag|>``):
        shown as their text while reading a reply for calls (they decode to nothing
        otherwise, and the parser would never see the call begin)."""
        if self._markers is None:
            texts = {*self.tool_syntax.markers, "[ARGS]", "[CALL_ID]"}
            self._markers = frozenset(
                i for i, t in enumerate(self.vocab.tokens) if t in texts and not self.vocab.piece(i)
            )
        return self._markers

    def _tool_constraint(self, spec: ToolSpec, response_format: Mapping[str, Any] | None) -> Any:
        """The constraint of the calls ``tool_choice`` allows. ``required`` or a named
        function: the reply is those calls. ``auto``, for a syntax whose calls begin with a
        marker (hermes, mistral): free text until the marker, the calls' grammar from
        there on (:class:`~.constraint.LazyGrammarConstraint`), so a call the model
        starts is a call with valid arguments; None without llguidance, with a
        ``response_format``, or for a syntax whose calls are a leading JSON object."""
        if not spec.active:
            return None
        forced = bool(spec.forced)
        formatted = response_format is not None and response_format.get("type", "text") != "text"
        if forced and formatted:
            raise InvalidRequestError(
                "response_format cannot be combined with a tool_choice that forces a call "
                "(the reply is then the call)",
                "response_format",
            )
        syntax = self.tool_syntax
        lazy = not forced and not formatted and not syntax.leading_json and syntax.markers
        if not forced and not lazy:
            return None
        try:
            from .constraint import (
                ConstraintError,
                GrammarConstraint,
                LazyGrammarConstraint,
                grammar_literal,
                llg_tokenizer,
            )

            functions = spec.forced or spec.functions
            parallel = spec.parallel and spec.choice != "function"
            grammar = tool_grammar(
                syntax, functions, parallel, lambda t: grammar_literal(self.vocab, t)
            )
            n_vocab = self.llama.config.n_vocab
            calls = GrammarConstraint(llg_tokenizer(self.vocab), grammar, "tools", n_vocab)
        except ImportError:
            if lazy:
                return None  # auto without llguidance: the reply is only read for calls
            raise InvalidRequestError(
                f"tool_choice {spec.choice!r} needs llguidance, a dependency of "
                "tensorplug-llm missing here: pip install 'llguidance>=1.9'",
                "tool_choice",
            ) from None
        except ConstraintError as e:  # a parameters schema llguidance cannot follow
            raise InvalidRequestError(str(e), "tools") from None
        except RunError as e:  # a vocabulary llguidance cannot work with (no end token)
            if lazy:
                return None
            raise InvalidRequestError(str(e), "tool_choice") from None
        if forced:
            return calls
        return LazyGrammarConstraint(self.vocab, syntax.markers[0], lambda: calls, n_vocab)

    def _chat_chunks(
        self,
        pieces: list[Iterator[_Piece]],
        meta: dict[str, Any],
        logprobs: bool,
        n_prompt: int,
        parsers: list[ToolCallParser | None],
        stop_sequence: bool = False,
        handles: Sequence[GenerationHandle] = (),
    ) -> Iterator[dict[str, Any]]:
        """Chunks of a streamed chat reply, each choice's under its index: the role
        first, the last chunk carrying ``usage`` (the prompt counted once). With tools,
        a call goes out as OpenAI streams one, once it is complete: a delta with its
        ``index``, ``id``, ``type`` and ``name``, then one with its arguments."""
        meta = {**meta, "object": "chat.completion.chunk"}
        for i in range(len(pieces)):
            first = {"role": "assistant", "content": ""}
            yield {**meta, "choices": [_choice_delta(first, None, None, i)]}
        n = 0
        n_calls = [0] * len(pieces)
        for i, piece, last_piece in _interleave(pieces):
            if piece.progress is not None:
                role = {"role": "assistant", "content": None}
                progress = _progress(piece.progress)
                yield {**meta, "choices": [_choice_delta(role, None, None, i)],
                       "prompt_progress": progress}  # fmt: skip
                continue
            parser = parsers[i]
            lp = {"content": self._chat_logprobs(piece.events)} if logprobs else None
            text, calls = piece.text, list[Call]()
            if parser is not None:
                text, calls = parser.feed(piece.text)
                if piece.finish_reason is not None:
                    tail, more = parser.finish()
                    text, calls = text + tail, calls + more
            n += len(piece.events)
            deltas: list[dict[str, Any]] = [{"content": text}] if text else []
            for call in calls:
                deltas += _call_deltas(call, n_calls[i])
                n_calls[i] += 1
            finish = piece.finish_reason and _finish(piece.finish_reason, n_calls[i] > 0)
            for k, delta in enumerate(deltas or [{}]):
                last = k == max(len(deltas), 1) - 1
                chunk = {
                    **meta,
                    "choices": [_choice_delta(delta, lp if k == 0 else None,
                                              finish if last else None, i)],
                }  # fmt: skip
                if last and last_piece:
                    chunk["usage"] = _usage(n_prompt, n, handles)
                if last and stop_sequence and piece.stop_word is not None:
                    chunk["choices"][0]["stop_sequence"] = piece.stop_word
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

    def embed(
        self,
        texts: str | Sequence[str] | Sequence[Sequence[int]],
        stopped: Callable[[], bool] | None = None,
    ) -> list[list[float]]:
        """One pooled embedding per text or token id list (pooled as ``ModelRunner.embed``
        pools: the file's ``pooling_type``, else mean), normalized to unit length as
        OpenAI's are. ``stopped``: as :meth:`embed_tokens`'s."""
        if self.pooling == "none":
            raise InvalidRequestError(
                "the server pools with 'none' (a row per token), which OpenAI's embeddings "
                "cannot carry: use /embeddings, or start the server with another --pooling",
                "input",
            )
        one = isinstance(texts, str)
        items: list[str | Sequence[int]] = [texts] if isinstance(texts, str) else list(texts)
        vectors = self.embed_tokens([self._embedding_ids(item) for item in items], stopped=stopped)
        out = []
        for vector in vectors:
            v = np.asarray(vector, dtype=np.float64)
            norm = float(np.linalg.norm(v))
            out.append((v / norm if norm > 0 else v).tolist())
        return out[:1] if one else out

    def embed_tokens(
        self,
        ids: Sequence[Sequence[int]],
        pooling: str | None = None,
        stopped: Callable[[], bool] | None = None,
    ) -> list[np.ndarray]:
        """Each id list's embedding as the model gives it, not normalized: pooled by
        ``pooling`` (default: the server's, else the file's), ``(n_tokens, n_embd)`` rows
        with ``none``. ``stopped``: asked while they wait or run; once true they are
        cancelled and :class:`~tensorplug_llm.request.RequestStopped` raised (a server's
        client that left, its deadline)."""
        try:
            return self.generator.embed([list(t) for t in ids], pooling or self.pooling, stopped)
        except RequestStopped:
            raise
        except RequestError as e:  # an empty text, one longer than the context
            raise InvalidRequestError(str(e), "input") from None

    def _embedding_ids(self, item: str | Sequence[int]) -> list[int]:
        if isinstance(item, str):
            return self.tokenize(item)
        n_vocab = len(self.vocab.tokens)
        bad = next((t for t in item if not isinstance(t, int) or not 0 <= t < n_vocab), None)
        if bad is not None or not item:
            raise InvalidRequestError(
                f"a token id list must hold ids from 0 to {n_vocab - 1}"
                + (f", got {bad!r}" if bad is not None else ", got an empty list"),
                "input",
            )
        return list(item)

    def create_embedding(
        self,
        input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
        stopped: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """OpenAI's ``/v1/embeddings`` response; ``input``: a text, texts, a list of token
        ids or lists of them (OpenAI takes all four). ``stopped``: as
        :meth:`embed_tokens`'s."""
        items: list[Any]
        if isinstance(input, str) or (input and all(isinstance(t, int) for t in input)):
            items = [input]
        else:
            items = list(input)
        vectors = self.embed(items, stopped=stopped)
        n = sum(len(self._embedding_ids(t)) for t in items)
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
        constraint: Any = None,
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
        if response_format is not None and "type" not in response_format:
            raise InvalidRequestError(
                "response_format must name its type: text, json_object, json_schema, regex "
                f"or grammar (got {dict(response_format)!r})",
                "response_format.type",
            )
        if (
            constraint is None
            and response_format is not None
            and response_format.get("type", "text") != "text"
        ):
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
                "structured output (response_format) needs llguidance, a dependency of "
                "tensorplug-llm missing here: pip install 'llguidance>=1.9'",
                "response_format",
            ) from None
        except (RunError, ValueError) as e:
            raise InvalidRequestError(str(e), getattr(e, "param", "response_format")) from None

    def _pieces(
        self, handle: GenerationHandle, stops: list[str], shown: frozenset[int] = frozenset()
    ) -> Iterator[_Piece]:
        """The handle's tokens as text, with stop strings found (the request cancelled)
        and end-of-generation tokens left out of the text; the control tokens ``shown``
        are written as their text."""
        from .tokenizer import StreamDecoder

        decoder = StreamDecoder(self.vocab)
        matcher = StopMatcher(stops)
        eog = self.vocab.eog
        finish: str | None = None
        events: Callable[[], Iterator[TokenEvent | PromptProgress]] | None = getattr(
            handle, "events", None
        )  # a handle that can report its prompt's progress (the engine's)
        try:
            for event in handle if events is None else events():
                if isinstance(event, PromptProgress):
                    yield _Piece("", [], progress=event)
                    continue
                if event.token in shown:
                    text = decoder.flush() + self.vocab.tokens[event.token]
                else:
                    text = "" if event.token in eog else decoder.feed(event.token)
                if event.finish_reason is not None:
                    text += decoder.flush()
                got = matcher.feed(text)
                if got.stopped:
                    handle.cancel()
                    yield _Piece(got.text, [event], "stop", matcher.matched)
                    return
                finish = event.finish_reason
                if finish is not None:
                    yield _Piece(got.text + matcher.flush(), [event], finish)
                    return
                yield _Piece(got.text, [event])
            # the handle ended without a finish: the request was cancelled
        except RequestError as e:
            from .constraint import ConstraintError

            cause = e.__cause__
            if isinstance(cause, ConstraintError):  # a grammar past its budget mid-reply
                raise InvalidRequestError(str(cause), cause.param) from None
            raise
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
        fresh_constraint: Callable[[], Any],
        field: str = "prompt",
    ) -> list[GenerationHandle]:
        """The job's ``n`` choices, submitted together: choice ``i`` samples with seed
        ``seed + i`` and, where the job is constrained, has a constraint of its own
        (``fresh_constraint()``: a constraint keeps the state of one reply). ``n`` is at
        most the generator's ``n_parallel``: the choices run side by side."""
        limit = self.generator.stats().n_parallel
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= limit:
            raise InvalidRequestError(
                f"n must be an integer from 1 to {limit} (the server's parallel slots, -np), "
                f"got {n!r}",
                "n",
            )
        n_ctx = self.n_ctx
        if len(job.prompt) >= n_ctx:  # as llama-server's: no room left for a token
            raise ContextSizeError(len(job.prompt), n_ctx, field)
        try:
            if n == 1:
                return [self.generator.submit(job)]
            return list(self.generator.submit_choices(self._choices(job, n, fresh_constraint)))
        except RequestError as e:  # e.g. a prompt longer than the context
            raise InvalidRequestError(str(e), field) from None

    def _choices(
        self, job: GenerationJob, n: int, fresh_constraint: Callable[[], Any]
    ) -> list[GenerationJob]:
        seed = job.sampling.get("seed")
        jobs = [job]
        for i in range(1, n):
            sampling = dict(job.sampling)
            if isinstance(seed, int) and seed >= 0:
                sampling["seed"] = seed + i
            constraint = fresh_constraint() if job.constraint is not None else None
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


def _progress(p: PromptProgress) -> dict[str, int]:
    """llama-server's ``prompt_progress`` object."""
    return {"total": p.total, "cache": p.cache, "processed": p.processed, "time_ms": p.time_ms}


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


def _usage(
    prompt: int, completion: int, handles: Sequence[GenerationHandle] = ()
) -> dict[str, Any]:
    """OpenAI's ``usage``; where the generator says how many prompt tokens it found in
    the cache (the engine's handles do), also ``prompt_tokens_details.cached_tokens``,
    as llama-server and OpenAI report them (llama-cpp-python's in-process calls have
    no such field, and keep its shape)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    cached = getattr(handles[0], "prompt_tokens_reused", None) if handles else None
    if isinstance(cached, int):
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _interleave(choices: list[Iterator[_Piece]]) -> Iterator[tuple[int, _Piece, bool]]:
    """``(index, piece, last)`` from every choice in turn until each has finished
    (``last``: no choice has more). The choices advance in the same engine steps, so
    taking one piece of each in turn keeps the stream in step with the generation.

    A piece goes out as soon as it comes: a choice's piece with a finish reason is its
    last, so ``last`` is known without waiting for another piece (which would send
    every token a step late: the first one after the second step, not the first). A
    choice that ends without a finish (cancelled) leaves no last piece; when it is the
    last one, an empty piece carries ``last``."""
    live = list(enumerate(choices))
    while live:
        for i, it in list(live):
            piece = next(it, None)
            if piece is None or piece.finish_reason is not None:
                live.remove((i, it))
            if piece is not None:
                yield i, piece, not live and piece.finish_reason is not None
            elif not live:
                yield i, _Piece("", []), True


def _choice_text(text: str, logprobs: Any, finish: str | None, index: int = 0) -> dict[str, Any]:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}


def _choice_delta(
    delta: dict[str, Any], logprobs: Any, finish: str | None, index: int = 0
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def _finish(finish: str | None, called: bool) -> str | None:
    """A reply that ended by itself after calling tools finishes with "tool_calls"."""
    return "tool_calls" if called and finish == "stop" else finish


def _call_deltas(call: Call, index: int) -> list[dict[str, Any]]:
    head = {"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": ""}}  # fmt: skip
    args = {"index": index, "function": {"arguments": call.arguments}}
    return [{"tool_calls": [head]}, {"tool_calls": [args]}]
