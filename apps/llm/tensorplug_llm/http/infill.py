"""llama-server's ``/infill``: fill-in-the-middle for code editors (llama.vim,
continue.dev). The prompt is built from the model's FIM tokens as llama.cpp's
``format_prompt_infill`` builds it, and answered as ``/completion`` answers:

    [FIM_REP]myproject\\n [FIM_SEP]filename0\\n extra 0 ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

The prefix keeps its last 3/4 of a batch, the suffix its first 1/4 less the prompt,
the extra files (``input_extra``, oldest cut first) what the context has left after a
batch and twice ``n_predict``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from ..api import LLM, InvalidRequestError, Stream
from .native_completion import NativeCompletion
from .native_schema import NativeCompletionRequest, Prompt
from .service import ServiceDep

__all__ = ["Fim", "InfillRequest", "fim_tokens", "infill_ids", "router"]

router = APIRouter()

#: each FIM token's GGUF key, and the texts llama.cpp looks for when the key is missing
FIM_TOKENS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pre": ("tokenizer.ggml.fim_pre_token_id",
            ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "▁<PRE>")),
    "suf": ("tokenizer.ggml.fim_suf_token_id",
            ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>")),
    "mid": ("tokenizer.ggml.fim_mid_token_id",
            ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>")),
    "rep": ("tokenizer.ggml.fim_rep_token_id",
            ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    "sep": ("tokenizer.ggml.fim_sep_token_id", ("<|file_sep|>", "<file_sep>")),
}  # fmt: skip

#: what separates extra files where the model has no FIM_SEP token
SNIPPET = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class Fim:
    pre: int | None
    suf: int | None
    mid: int | None
    rep: int | None
    sep: int | None


def fim_tokens(llm: LLM) -> Fim:
    """The model's FIM token ids: its GGUF keys, else the tokens llama.cpp recognises by
    their text."""
    tokens = llm.vocab.tokens
    n = len(tokens)
    found: dict[str, int | None] = {}
    for name, (key, texts) in FIM_TOKENS.items():
        value = llm.llama.file.value(key, int, None)
        if value is None or not 0 <= value < n:
            value = next((i for i, t in enumerate(tokens) if t in texts), None)
        found[name] = value
    return Fim(**found)


class InputExtra(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str
    filename: str = "tmp"


class InfillRequest(NativeCompletionRequest):
    """``/infill``'s body: ``/completion``'s fields, ``prompt`` a text written after the
    prefix (the start of the middle), and the code around the cursor."""

    prompt: str = ""  # type: ignore[assignment]
    input_prefix: str | list[int | str]
    input_suffix: str | list[int | str]
    input_extra: list[InputExtra] = Field(default_factory=list)


def _mixed(llm: LLM, value: str | list[int | str], param: str) -> list[int]:
    """Text (no BOS, control tokens not parsed) or token ids, or both mixed."""
    n = len(llm.vocab.tokens)
    ids: list[int] = []
    for i, part in enumerate([value] if isinstance(value, str) else value):
        if isinstance(part, str):
            ids += llm.vocab.encode(part, add_bos=False)
        elif not 0 <= part < n:
            raise InvalidRequestError(
                f"token id {part} is outside the vocabulary (0 to {n - 1})", f"{param}[{i}]"
            )
        else:
            ids.append(part)
    return ids


def infill_ids(llm: LLM, body: InfillRequest) -> list[int]:
    """The prompt's tokens, as llama.cpp's ``format_prompt_infill`` orders and cuts them;
    400 for a model without FIM tokens."""
    fim = fim_tokens(llm)
    missing = [k for k in ("pre", "suf", "mid") if getattr(fim, k) is None]
    if missing:
        keys = ", ".join(FIM_TOKENS[k][0] for k in missing)
        raise InvalidRequestError(
            f"{llm.model_name} cannot fill in the middle: it has no FIM tokens ({keys} are "
            "missing and no token is written as one); serve a code model trained for it "
            "(Qwen2.5-Coder, CodeGemma, StarCoder2, DeepSeek-Coder...)",
            "input_prefix",
        )
    assert fim.pre is not None and fim.suf is not None and fim.mid is not None
    vocab = llm.vocab

    def text(s: str) -> list[int]:
        return vocab.encode(s, add_bos=False)

    extra: list[int] = []
    if fim.rep is not None:
        extra += [fim.rep, *text("myproject\n")]
    for chunk in body.input_extra:
        if fim.sep is not None:
            extra += [fim.sep, *text(chunk.filename + "\n")]
        else:
            extra += text(SNIPPET)
        extra += text(chunk.text)
    if fim.sep is not None:
        extra += [fim.sep, *text("filename\n")]
    prefix = _mixed(llm, body.input_prefix, "input_prefix")
    suffix = _mixed(llm, body.input_suffix, "input_suffix")
    prompt = vocab.encode(body.prompt, add_bos=False, parse_special=True)
    n_batch, n_ctx = llm.llama.n_batch, llm.n_ctx
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * body.budget()), len(extra))
    head = [fim.pre, *prefix[len(prefix) - n_prefix :], *prompt]
    if vocab.add_bos and vocab.bos is not None:
        head.insert(0, vocab.bos)
    return [*extra[len(extra) - n_extra :], *head, fim.suf, *suffix[:n_suffix], fim.mid]


@router.post("/infill")
async def infill(body: InfillRequest, request: Request, svc: ServiceDep) -> Response:
    llm = svc.llm

    def start() -> Stream:
        ids = infill_ids(llm, body)
        return NativeCompletion(llm, body, svc.config.defaults, cast(Prompt, ids)).start()

    def last(chunks: list[dict[str, Any]]) -> Any:
        return chunks[-1]

    return await svc.answer(request, body.stream, start, merge=last, done=None)
