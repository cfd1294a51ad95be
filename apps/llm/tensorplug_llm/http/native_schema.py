"""The request bodies of llama-server's own routes (``/completion``, ``/tokenize``...),
as pydantic models with its field names and defaults.

A field llama-server has for a sampler this engine does not run (mirostat, DRY, XTC)
is accepted at its "off" value and refused by name otherwise: a request is never
answered as if it had been honoured when it was not."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from ..openai_schema import ChatRequest, constraint_format

__all__ = [
    "ApplyTemplateRequest",
    "DetokenizeRequest",
    "NativeCompletionRequest",
    "NativeEmbeddingRequest",
    "TokenizeRequest",
]

#: llama-server's sampler names (and one-letter forms) -> what leaving it out switches off
SAMPLER_LETTERS = {"e": "penalties", "d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p",
                   "m": "min_p", "x": "xtc", "t": "temperature", "s": "top_n_sigma"}  # fmt: skip
SAMPLERS = frozenset(SAMPLER_LETTERS.values()) | {"typical_p", "infill"}

Prompt = str | list[int | str]


class NativeCompletionRequest(BaseModel):
    """``/completion``'s body (llama-server's defaults)."""

    model_config = ConfigDict(extra="ignore")

    #: one prompt, or several (a list of texts, of lists, or of both): llama-server's
    #: "multiple prompts", answered as a list (streamed: chunks tagged by ``index``)
    prompt: Prompt | list[Prompt] = ""
    n_predict: StrictInt = Field(-1, ge=-1)
    #: the OpenAI name of ``n_predict``, which llama-server takes too
    max_tokens: StrictInt | None = Field(None, ge=-1)
    temperature: StrictFloat = Field(0.8, ge=-100.0, le=100.0)
    top_k: StrictInt = 40
    top_p: StrictFloat = Field(0.95, ge=0.0, le=1.0)
    min_p: StrictFloat = Field(0.05, ge=0.0, le=1.0)
    typical_p: StrictFloat = Field(1.0, ge=0.0, le=1.0)
    repeat_penalty: StrictFloat = Field(1.0, gt=0.0)
    repeat_last_n: StrictInt = Field(64, ge=-1)
    presence_penalty: StrictFloat = 0.0
    frequency_penalty: StrictFloat = 0.0
    seed: StrictInt = -1
    stop: str | list[str] = Field(default_factory=list)
    stream: StrictBool = False
    n_probs: StrictInt = Field(0, ge=0, le=20)
    post_sampling_probs: StrictBool = False
    grammar: str | None = None
    json_schema: dict[str, Any] | StrictBool | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, StrictFloat] | list[list[Any]] | None = None
    ignore_eos: StrictBool = False
    #: prefixes are always reused (the engine looks them up in every slot); accepted
    cache_prompt: StrictBool = True
    #: -1: the slot that holds the longest prefix of the prompt; else the slot it runs in
    id_slot: StrictInt = Field(-1, ge=-1)
    #: llama-server's per-request LoRA scales (taken when they are the server's)
    lora: list[dict[str, Any]] | None = None
    return_tokens: bool = False
    timings_per_token: StrictBool = False
    #: a stream reports the prompt's evaluation before the text (``prompt_progress``)
    return_progress: StrictBool = False
    samplers: list[str] | str | None = None
    n_keep: StrictInt = Field(0, ge=-1)
    #: the shortest cached run moved to its place in the prompt (None: the server's
    #: ``--cache-reuse``; 0: none)
    n_cache_reuse: StrictInt | None = Field(None, ge=0)
    min_keep: StrictInt = Field(0, ge=0)
    mirostat: StrictInt = 0
    dry_multiplier: StrictFloat = 0.0
    xtc_probability: StrictFloat = 0.0

    @field_validator("mirostat", "dry_multiplier", "xtc_probability")
    @classmethod
    def _off(cls, value: float) -> float:
        if value != 0:
            raise ValueError(
                "this sampler is not one tensorplug runs: leave it out or send 0 (off)"
            )
        return value

    @field_validator("logit_bias", mode="after")
    @classmethod
    def _bias_object(
        cls, bias: dict[str, float] | list[list[Any]] | None
    ) -> dict[str, float] | list[list[Any]] | None:
        return _logit_bias(bias)

    @field_validator("prompt", mode="before")
    @classmethod
    def _no_objects(cls, prompt: Any) -> Any:
        """llama-server's prompt objects ``{"prompt_string": TEXT}`` are that text (alone
        or in a list of prompts); one with ``multimodal_data`` is refused."""
        if isinstance(prompt, dict):
            return _prompt_string(prompt)
        if isinstance(prompt, list) and any(isinstance(p, dict) for p in prompt):
            return [_prompt_string(p) if isinstance(p, dict) else p for p in prompt]
        return prompt

    def prompts(self) -> list[Prompt]:
        """The prompts, as llama-server tells one from several: a list holding lists,
        or only texts (more than one), is several; a list of ids and texts is one."""
        p = self.prompt
        if not isinstance(p, list):
            return [p]
        if any(isinstance(x, list) for x in p) or (
            len(p) > 1 and all(isinstance(x, str) for x in p)
        ):
            return [x if isinstance(x, list | str) else [x] for x in p]  # type: ignore[misc]
        return [p]  # type: ignore[list-item]

    @field_validator("samplers")
    @classmethod
    def _known_samplers(cls, samplers: list[str] | str | None) -> list[str] | None:
        if samplers is None:
            return None
        names = (
            [SAMPLER_LETTERS.get(c, c) for c in samplers] if isinstance(samplers, str) else samplers
        )
        unknown = [n for n in names if n not in SAMPLERS]
        if unknown:
            raise ValueError(
                f"unknown sampler {unknown[0]!r}: the names are {', '.join(sorted(SAMPLERS))}"
            )
        return names

    @model_validator(mode="after")
    def _one_constraint(self) -> NativeCompletionRequest:
        constraint_format(self.response_format, self.grammar, self.json_schema)
        return self

    def constraint(self) -> dict[str, Any] | None:
        return constraint_format(self.response_format, self.grammar, self.json_schema)

    def budget(self) -> int:
        """``max_tokens`` where given, else ``n_predict``."""
        return self.max_tokens if self.max_tokens is not None else self.n_predict

    def sampling(self) -> dict[str, Any]:
        """:class:`~tensorplug_llm.sampling.SamplingParams`' fields; a sampler left out
        of ``samplers`` is switched off (the chain's order is llama.cpp's default)."""
        out: dict[str, Any] = {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "typical_p": self.typical_p,
            "repeat_penalty": self.repeat_penalty,
            "penalty_last_n": self.repeat_last_n,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": None if self.seed < 0 else self.seed,
            "logit_bias": self.logit_bias,
            "post_sampling_probs": self.post_sampling_probs,
        }
        if self.samplers is not None:
            chain = set(self.samplers)
            off = {"top_k": ("top_k", 0), "top_p": ("top_p", 1.0), "min_p": ("min_p", 0.0),
                   "typ_p": ("typical_p", 1.0)}  # fmt: skip
            for name, (field, value) in off.items():
                if name not in chain and not (name == "typ_p" and "typical_p" in chain):
                    out[field] = value
            if "penalties" not in chain:
                out.update(repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
            if "temperature" not in chain and self.temperature > 0:
                out["temperature"] = 1.0
        return out


def _logit_bias(bias: dict[str, float] | list[list[Any]] | None) -> dict[str, float] | None:
    """llama-server's ``[[id or text, bias], ...]`` (``false``: never) or OpenAI's object
    (a key that is not a token id is a text, each of whose tokens gets the bias:
    :func:`~.native_completion.token_biases`)."""
    if bias is None or isinstance(bias, dict):
        return bias
    out: dict[str, StrictFloat] = {}
    for i, pair in enumerate(bias):
        if (
            len(pair) != 2
            or not isinstance(pair[0], int | str)
            or isinstance(pair[0], bool)
            or not isinstance(pair[1], int | float)
        ):
            raise ValueError(f"logit_bias[{i}] must be [token_id or text, bias], got {pair!r}")
        value = pair[1]
        out[str(pair[0])] = float("-inf") if value is False else float(value)
    return out


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    content: str
    add_special: StrictBool = False
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[StrictInt]


def _prompt_string(prompt: dict[str, Any]) -> str:
    text = prompt.get("prompt_string")
    if prompt.get("multimodal_data") or not isinstance(text, str):
        raise ValueError(
            "a prompt object ({'prompt_string', 'multimodal_data'}) with multimodal data is "
            "input these models do not read: send the text ({'prompt_string': TEXT})"
        )
    return text


class ApplyTemplateRequest(ChatRequest):
    """``/apply-template``: a chat request, whose prompt is answered rather than run
    (tools, a continued final message, ``add_generation_prompt`` and
    ``chat_template_kwargs`` as the chat route renders them)."""


class NativeEmbeddingRequest(BaseModel):
    """``/embedding`` and ``/embeddings``: ``content`` (or OpenAI's ``input``): a text,
    texts, token ids or lists of them; ``embd_normalize``: -1 none, 0 max absolute, 1
    taxicab, 2 Euclidean (the default), p > 2 the p-norm."""

    model_config = ConfigDict(extra="ignore")

    content: str | list[str] | list[StrictInt] | list[list[StrictInt]] | None = None
    input: str | list[str] | list[StrictInt] | list[list[StrictInt]] | None = None
    embd_normalize: StrictInt = Field(2, ge=-1)

    @model_validator(mode="after")
    def _some_content(self) -> NativeEmbeddingRequest:
        if (self.content is None) == (self.input is None):
            raise ValueError("give the text to embed as 'content' (or 'input'), one of them")
        return self

    def items(self) -> list[str | list[int]]:
        given = self.content if self.content is not None else self.input
        assert given is not None
        if isinstance(given, str) or (given and all(isinstance(t, int) for t in given)):
            return [given]  # type: ignore[list-item]
        return list(given)  # type: ignore[arg-type]
