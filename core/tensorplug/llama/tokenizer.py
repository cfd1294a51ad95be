"""The llama (SentencePiece) tokenizer, from a GGUF file's ``tokenizer.ggml.*`` metadata.

Encoding follows llama.cpp's ``llm_tokenizer_spm``, so that the same text gives the
same ids: spaces become ``▁`` (with one prepended when ``add_space_prefix``), the text
is split into characters, and adjacent pieces are merged greedily — always the pair
whose merged text is the highest-scoring vocabulary entry, leftmost first on ties —
until no pair forms a token. A piece that is not a token is spelt as its UTF-8 bytes
with the ``<0xXX>`` byte tokens ("byte fallback").

Decoding maps ``▁`` back to spaces and byte tokens back to bytes; control tokens
(BOS/EOS) print as nothing. :class:`StreamDecoder` does it one token at a time for
streaming output, holding back an incomplete UTF-8 sequence until its last byte comes.
"""

from __future__ import annotations

import codecs
import heapq
from dataclasses import dataclass, field

from ..errors import RunError
from ..gguf import GGUFError, GGUFFile

__all__ = ["StreamDecoder", "TokenType", "Vocab"]

SPACE = "\u2581"  # ▁


class TokenType:
    """``tokenizer.ggml.token_type`` values (llama.cpp's ``llama_token_type``)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass
class Vocab:
    """A SentencePiece vocabulary: token texts, merge scores, types and special ids."""

    tokens: list[str]
    scores: list[float]
    types: list[int]
    bos: int | None = 1
    eos: int | None = 2
    unk: int | None = 0
    add_bos: bool = True
    add_space_prefix: bool = True
    _ids: dict[str, int] = field(init=False, repr=False)
    _byte_ids: list[int | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.scores) != n or len(self.types) != n:
            raise RunError(
                f"vocabulary: {n} tokens but {len(self.scores)} scores and {len(self.types)} types"
            )
        self._ids = {text: i for i, text in enumerate(self.tokens)}  # the last duplicate wins
        self._byte_ids = [self._ids.get(f"<0x{b:02X}>") for b in range(256)]

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Vocab:
        model = f.value("tokenizer.ggml.model", str)
        if model != "llama":
            raise GGUFError(
                f"{f.path}: tokenizer.ggml.model is {model!r}; only the llama (SentencePiece) "
                "tokenizer is implemented — pass token ids with --tokens instead of a prompt"
            )
        tokens = f.value("tokenizer.ggml.tokens", list)
        n = len(tokens)
        scores = f.value("tokenizer.ggml.scores", list, [0.0] * n)
        types = f.value("tokenizer.ggml.token_type", list, [TokenType.NORMAL] * n)
        for key, got in (("tokenizer.ggml.scores", scores), ("tokenizer.ggml.token_type", types)):
            if len(got) != n:
                raise GGUFError(f"{f.path}: {key} has {len(got)} entries for {n} tokens")

        def special(key: str, default: int | None) -> int | None:
            value: int | None = f.value(key, int, default)
            if value is not None and not 0 <= value < n:
                raise GGUFError(f"{f.path}: {key} = {value} is not a token id (0..{n - 1})")
            return value

        return cls(
            tokens=tokens,
            scores=[float(s) for s in scores],
            types=[int(t) for t in types],
            bos=special("tokenizer.ggml.bos_token_id", 1 if n > 1 else None),
            eos=special("tokenizer.ggml.eos_token_id", 2 if n > 2 else None),
            unk=special("tokenizer.ggml.unknown_token_id", 0 if n > 0 else None),
            add_bos=f.value("tokenizer.ggml.add_bos_token", bool, True),
            add_space_prefix=f.value("tokenizer.ggml.add_space_prefix", bool, True),
        )

    def __len__(self) -> int:
        return len(self.tokens)

    # -- encoding --------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text`` (with BOS first when ``add_bos``, default the file's)."""
        out: list[int] = []
        if (self.add_bos if add_bos is None else add_bos) and self.bos is not None:
            out.append(self.bos)
        if not text:
            return out
        if self.add_space_prefix:
            text = " " + text
        text = text.replace(" ", SPACE)
        for piece in self._merge(list(text)):
            tid = self._ids.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._byte_fallback(piece))
        return out

    def _merge(self, sym: list[str]) -> list[str]:
        """Merge adjacent symbols by score: a linked list over ``sym`` and a heap of
        candidate pairs ``(-score, left, right, merged length)``. A popped pair whose
        sides changed since it was pushed (a side merged away or grew) is stale."""
        n = len(sym)
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            tid = self._ids.get(sym[left] + sym[right])
            if tid is not None:
                length = len(sym[left]) + len(sym[right])
                heapq.heappush(heap, (-self.scores[tid], left, right, length))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != length:
                continue
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        return [s for s in sym if s]

    def _byte_fallback(self, piece: str) -> list[int]:
        ids = []
        for b in piece.encode("utf-8"):
            tid = self._byte_ids[b]
            if tid is None:
                tid = self.unk
            if tid is None:
                raise RunError(
                    f"cannot encode {piece!r}: the vocabulary has neither a byte token "
                    f"<0x{b:02X}> nor an unknown token"
                )
            ids.append(tid)
        return ids

    # -- decoding --------------------------------------------------------------------------

    def piece(self, tid: int) -> bytes:
        """The bytes token ``tid`` stands for in output text."""
        if not 0 <= tid < len(self.tokens):
            raise RunError(f"token id {tid} is outside the vocabulary (0..{len(self) - 1})")
        kind, text = self.types[tid], self.tokens[tid]
        if kind == TokenType.BYTE:
            return bytes([int(text[3:5], 16)])
        if kind in (TokenType.CONTROL, TokenType.UNUSED):
            return b""
        if kind == TokenType.UNKNOWN:
            return "\u2585".encode()  # ▅, as llama.cpp prints it
        if kind == TokenType.USER_DEFINED:
            return text.encode()
        return text.replace(SPACE, " ").encode()

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` as a whole: the space the encoder prepended is removed."""
        dec = StreamDecoder(self, strip_prefix=True)
        return "".join(dec.feed(t) for t in ids) + dec.flush()


class StreamDecoder:
    """Decodes one token at a time; returns the text that is complete so far.

    ``strip_prefix`` drops the leading space of the first visible piece (the one the
    encoder's ``add_space_prefix`` put there); use it when decoding from the start
    of a text, not when continuing one.
    """

    def __init__(self, vocab: Vocab, strip_prefix: bool = False) -> None:
        self.vocab = vocab
        self._strip = strip_prefix and vocab.add_space_prefix
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tid: int) -> str:
        raw = self.vocab.piece(tid)
        if self._strip and raw:
            self._strip = False
            if raw.startswith(b" "):
                raw = raw[1:]
        return self._utf8.decode(raw)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
