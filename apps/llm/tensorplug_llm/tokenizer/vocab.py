"""One vocabulary object for every tokenizer a GGUF file can name.

:class:`Vocab` holds what ``tokenizer.ggml.*`` says — token texts, scores, types,
special ids and flags — and picks the algorithm by ``tokenizer.ggml.model``: ``llama``
(SentencePiece, :mod:`.spm`), ``gpt2`` (byte-level BPE, :mod:`.bpe`, with the
pre-tokenizer ``tokenizer.ggml.pre`` names) or ``bert`` (WordPiece, :mod:`.wpm`). The
steps around the algorithm are llama.cpp's ``llama_vocab::tokenize``: special tokens
are cut out of the raw text first (:mod:`.special`), the algorithm encodes what is
left, BOS/EOS/SEP are added as the file asks.

Decoding turns each id into its bytes (:meth:`Vocab.piece`); :class:`StreamDecoder`
does it one token at a time for streaming output, holding back an incomplete UTF-8
sequence until its last byte comes.
"""

from __future__ import annotations

import codecs
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Protocol

import numpy as np

from tensorplug.errors import RunError
from tensorplug.gguf import GGUFError, GGUFFile

from .bpe import BpeTokenizer, byte_decode
from .pretokenize import PRE_TOKENIZERS, PreTokenizer, pre_tokenizer
from .special import Fragment, by_length, partition
from .spm import SPACE, SpmTokenizer
from .wpm import WpmTokenizer

__all__ = ["MODELS", "SPACE", "StreamDecoder", "TokenType", "Vocab"]

MODELS = ("llama", "gpt2", "bert")


class TokenType:
    """``tokenizer.ggml.token_type`` values (llama.cpp's ``llama_token_type``)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# tokens that end a turn (llama.cpp's list): they stop generation and, like control
# tokens, are found by parse_special even where a converter typed them as normal
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek's <｜end▁of▁sentence｜>
})  # fmt: skip

# per-model defaults, before the file's keys: (bos, eos, unk, sep, add_bos, add_space_prefix)
_DEFAULTS: dict[str, tuple[int | None, int | None, int | None, int | None, bool, bool]] = {
    "llama": (1, 2, 0, None, True, True),
    "gpt2": (11, 11, None, None, False, False),
    "bert": (101, None, 100, 102, True, False),
}


class _Algorithm(Protocol):
    def encode(self, text: str, after_special: bool) -> list[int]: ...


@dataclass
class Vocab:
    """A tokenizer vocabulary: token texts, scores, types, special ids, model flags.

    Built by :meth:`from_gguf`, or directly (tests, tiny models) — the defaults are a
    SentencePiece vocabulary's. ``merges`` are BPE's ranked rules ``"a b"``;
    ``clean_spaces`` None takes the model's default (BPE and WordPiece on, unless the
    pre-tokenizer says otherwise). ``scores`` and ``types`` are any sequences; from a
    file they are compact arrays (``array('d')``, ``array('i')``): as lists, Gemma 3's
    262,144 held 8 MB more.
    """

    tokens: list[str]
    scores: Sequence[float]
    types: Sequence[int]
    bos: int | None = 1
    eos: int | None = 2
    unk: int | None = 0
    add_bos: bool = True
    add_space_prefix: bool = True
    model: str = "llama"
    pre: str = "default"
    merges: list[str] = field(default_factory=list, repr=False)
    sep: int | None = None
    add_eos: bool = False
    add_sep: bool = False
    lowercase: bool = True
    strip_accents: bool = True
    clean_spaces: bool | None = None
    _ids: dict[str, int] = field(init=False, repr=False)
    _algo: _Algorithm = field(init=False, repr=False)
    _specials: list[tuple[str, int]] = field(init=False, repr=False)
    _user_defined: list[tuple[str, int]] = field(init=False, repr=False)
    _eog: frozenset[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.scores) != n or len(self.types) != n:
            raise RunError(
                f"vocabulary: {n} tokens but {len(self.scores)} scores and {len(self.types)} types"
            )
        for name in ("bos", "eos", "unk", "sep"):
            tid = getattr(self, name)
            if tid is not None and not 0 <= tid < n:
                raise RunError(f"vocabulary: {name} = {tid} is not a token id (0..{n - 1})")
        self._ids = {text: i for i, text in enumerate(self.tokens)}  # the last duplicate wins
        self._algo = self._algorithm()
        special = [int(TokenType.CONTROL), int(TokenType.USER_DEFINED), int(TokenType.UNKNOWN)]
        eog = {self._ids[text] for text in EOG_TEXTS if text in self._ids}
        self._eog = frozenset(eog | ({self.eos} if self.eos is not None else set()))
        marked = np.flatnonzero(np.isin(np.asarray(self.types, dtype=np.int64), special))
        ids = eog | set(marked.tolist())
        self._specials = by_length(self.tokens, sorted(ids))
        self._user_defined = [
            (text, i) for text, i in self._specials if self.types[i] == TokenType.USER_DEFINED
        ]

    def _algorithm(self) -> _Algorithm:
        if self.model == "llama":
            return SpmTokenizer(self._ids, self.scores, self.unk, self.add_space_prefix)
        if self.model == "gpt2":
            return BpeTokenizer(self._ids, self.merges, self.pre_tokenizer)
        if self.model == "bert":
            return WpmTokenizer(self._ids, self.unk, self.lowercase, self.strip_accents)
        raise RunError(
            f"tokenizer model {self.model!r} is not implemented (known: {', '.join(MODELS)})"
        )

    @property
    def pre_tokenizer(self) -> PreTokenizer:
        """The BPE pre-tokenizer ``pre`` names."""
        pre = pre_tokenizer(self.pre)
        if pre is None:
            raise RunError(
                f"unknown BPE pre-tokenizer {self.pre!r} (tokenizer.ggml.pre); known: "
                f"{', '.join(sorted(PRE_TOKENIZERS))}"
            )
        return pre

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Vocab:
        """The vocabulary of a GGUF file, with llama.cpp's defaults for missing keys."""
        model = f.value("tokenizer.ggml.model", str)
        if model not in _DEFAULTS:
            raise GGUFError(
                f"{f.path}: tokenizer.ggml.model is {model!r}; the tokenizers implemented "
                f"are {', '.join(MODELS)} — pass token ids with --tokens instead of a prompt"
            )
        bos, eos, unk, sep, add_bos, add_space_prefix = _DEFAULTS[model]
        tokens = f.strings("tokenizer.ggml.tokens") or _items(
            f, "tokenizer.ggml.tokens", (str,), "strings"
        )
        n = len(tokens)
        scores = _numbers(f, "tokenizer.ggml.scores", "d") or array("d", bytes(8 * n))
        types = _numbers(f, "tokenizer.ggml.token_type", "i") or array("i", [TokenType.NORMAL]) * n
        for key, got in (("tokenizer.ggml.scores", scores), ("tokenizer.ggml.token_type", types)):
            if len(got) != n:
                raise GGUFError(f"{f.path}: {key} has {len(got)} entries for {n} tokens")
        pre_name, clean = "default", model == "bert"
        merges: list[str] = []
        if model == "gpt2":
            pre_name = f.value("tokenizer.ggml.pre", str, "default")
            pre = pre_tokenizer(pre_name)
            if pre is None:
                raise GGUFError(
                    f"{f.path}: unknown BPE pre-tokenizer {pre_name!r} (tokenizer.ggml.pre); "
                    f"known: {', '.join(sorted(PRE_TOKENIZERS))}"
                )
            merges = f.strings("tokenizer.ggml.merges") or _items(
                f, "tokenizer.ggml.merges", (str,), "strings like 'a b'", None
            )
            if merges is None:
                raise GGUFError(f"{f.path}: a gpt2 (BPE) tokenizer needs tokenizer.ggml.merges")
            # llama.cpp's test: a space after the first char (``map``: tens of thousands
            # of rules checked in about half the time a loop of the same test takes)
            spaces = list(map(str.find, merges, repeat(" "), repeat(1)))
            if -1 in spaces:
                i = spaces.index(-1)
                _bad_item(f, "tokenizer.ggml.merges", "strings like 'a b'", i, merges[i])
            add_bos, clean = pre.add_bos, pre.clean_spaces
            if pre.no_bos:
                bos = None

        def special(key: str, default: int | None) -> int | None:
            if default is not None and default >= n:
                default = None  # llama.cpp disables a default id outside the vocabulary
            value: int | None = f.value(key, int, default)
            if value is not None and not 0 <= value < n:
                raise GGUFError(f"{f.path}: {key} = {value} is not a token id (0..{n - 1})")
            return value

        lowercase = f.value("tokenizer.ggml.normalizer.lowercase", bool, True)
        return cls(
            tokens=tokens,
            scores=scores,
            types=types,
            bos=special("tokenizer.ggml.bos_token_id", bos),
            eos=special("tokenizer.ggml.eos_token_id", eos),
            unk=special("tokenizer.ggml.unknown_token_id", unk),
            sep=special("tokenizer.ggml.seperator_token_id", sep),  # GGUF's spelling
            add_bos=f.value("tokenizer.ggml.add_bos_token", bool, add_bos),
            add_eos=f.value("tokenizer.ggml.add_eos_token", bool, False),
            add_sep=f.value("tokenizer.ggml.add_sep_token", bool, model == "bert"),
            add_space_prefix=f.value("tokenizer.ggml.add_space_prefix", bool, add_space_prefix),
            model=model,
            pre=pre_name,
            merges=merges,
            lowercase=lowercase,
            strip_accents=f.value("tokenizer.ggml.normalizer.strip_accents", bool, lowercase),
            clean_spaces=clean,
        )

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def eog(self) -> frozenset[int]:
        """Ids that end generation: EOS and the end-of-turn tokens llama.cpp knows."""
        return self._eog

    # -- encoding --------------------------------------------------------------------------

    def encode(
        self, text: str, add_bos: bool | None = None, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text``.

        ``add_bos``: None adds what the file asks for (BOS, and EOS or SEP where the model
        wants them), False adds nothing, True forces BOS (BERT's CLS) and keeps the rest.
        ``parse_special``: control tokens written in ``text`` (``<|im_start|>``) become
        their ids — for chat templates, not for text a user typed. User-defined tokens
        are always recognised.
        """
        return self.encode_parts([(text, parse_special)], add_bos)

    def encode_parts(
        self, parts: Sequence[tuple[str, bool]], add_bos: bool | None = None
    ) -> list[int]:
        """Token ids of the text ``parts`` make, each ``(text, parse_special)``: control
        tokens are found only in the parts that allow it (a chat template's own markup),
        never in the others (the messages, which must not be able to forge them).

        Adjacent text is encoded as one piece, across part boundaries, so the result is
        :meth:`encode` of the joined text wherever no control token is written in a part
        that may not have one; ``add_bos`` is :meth:`encode`'s.
        """
        fragments: list[Fragment] = []
        for text, parse_special in parts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate, e.g. from undecodable bytes
                raise RunError(
                    f"cannot tokenize text with {text[e.start]!r} at index {e.start}: a lone "
                    "surrogate is not a character (was the text decoded from invalid UTF-8?)"
                ) from None
            specials = self._specials if parse_special else self._user_defined
            for frag in partition(text, specials):
                if isinstance(frag, str) and fragments and isinstance(fragments[-1], str):
                    fragments[-1] += frag
                else:
                    fragments.append(frag)
        out: list[int] = []
        wanted = self.add_bos if add_bos is None else add_bos
        if wanted and self.bos is not None:
            out.append(self.bos)
        after_special = True  # the first fragment gets SPM's space prefix, as after a special
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
            else:
                out.extend(self._algo.encode(frag, after_special))
                after_special = False
        if add_bos is not False:
            if self.model == "bert":
                if self.add_sep and self.sep is not None:
                    out.append(self.sep)
            elif self.add_eos and self.eos is not None:
                out.append(self.eos)
        return out

    def control_text_in(self, text: str) -> str | None:
        """The first control token (or end-of-turn token) written in ``text``, if any: what
        ``parse_special`` would turn into its id."""
        for token, tid in self._specials:
            if self.types[tid] != TokenType.USER_DEFINED and token in text:
                return token
        return None

    # -- decoding --------------------------------------------------------------------------

    @property
    def strips_leading_space(self) -> bool:
        """Whether decoding from the start drops the first space: the one SPM prepends,
        or the phantom space before BERT's first word."""
        return self.add_space_prefix or self.model == "bert"

    def piece(self, tid: int, special: bool = False) -> bytes:
        """The bytes token ``tid`` stands for in output text; control tokens are empty
        unless ``special`` (then, like user-defined tokens, they print their text)."""
        if not 0 <= tid < len(self.tokens):
            raise RunError(f"token id {tid} is outside the vocabulary (0..{len(self) - 1})")
        kind, text = self.types[tid], self.tokens[tid]
        if kind == TokenType.BYTE and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            return bytes([int(text[3:5], 16)])
        if kind in (TokenType.CONTROL, TokenType.UNKNOWN) and special:
            return text.encode()
        if kind in (TokenType.CONTROL, TokenType.UNUSED):
            return b""
        if kind == TokenType.UNKNOWN:
            return "\u2585".encode()  # ▅, as llama.cpp prints it
        if kind == TokenType.USER_DEFINED:
            return text.encode()
        if self.model == "gpt2":
            return byte_decode(text)
        return text.replace(SPACE, " ").encode()

    def decode(self, ids: list[int], special: bool = False) -> str:
        """Text of ``ids`` as a whole: the space the encoder prepended is removed and, for
        BPE and WordPiece vocabularies, the spaces they put before punctuation."""
        dec = StreamDecoder(self, strip_prefix=True, special=special)
        text = "".join(dec.feed(t) for t in ids) + dec.flush()
        clean = self.clean_spaces if self.clean_spaces is not None else self.model != "llama"
        return _clean_spaces(text) if clean else text


def _items(
    f: GGUFFile, key: str, kinds: tuple[type, ...], what: str, default: list | None = None
) -> list:
    """The array ``key``, every item one of ``kinds`` (bool is no number here): a token
    list of integers or scores stored as strings otherwise failed later, far from the key,
    as a TypeError or ValueError traceback."""
    items: list | None = f.value(key, list, default)
    if items is None or items is default:
        return items  # type: ignore[return-value]
    for i, item in enumerate(items):
        if not isinstance(item, kinds) or isinstance(item, bool):
            _bad_item(f, key, what, i, item)
    return items


#: the range of a GGUF token type (llama.cpp reads them as int32)
_INT32 = (-(2**31), 2**31 - 1)


def _numbers(f: GGUFFile, key: str, typecode: str) -> array | None:
    """The number array ``key`` as ``array(typecode)`` (``"d"``: numbers, ``"i"``: 32-bit
    integers), or None where it is missing: read whole where the file stores numbers of
    the kind asked, else item by item with :func:`_items`' checks and messages."""
    integer = typecode == "i"
    too_wide = GGUFError(
        f"{f.path}: {key} holds integers outside 32 bits; the file is damaged or was not "
        "written by a GGUF converter"
    )
    got = f.numbers(key)
    if got is not None and (got.dtype.kind in "iu" or not integer):
        if integer and got.size and (got.min() < _INT32[0] or got.max() > _INT32[1]):
            raise too_wide
        return array(typecode, got.astype(np.int32 if integer else np.float64).tobytes())
    kinds, what = ((int,), "integers") if integer else ((int, float), "numbers")
    items = _items(f, key, kinds, what, None)
    if items is None:
        return None
    try:
        return array(typecode, items)
    except OverflowError:
        raise too_wide from None


def _bad_item(f: GGUFFile, key: str, what: str, i: int, item: object) -> None:
    shown = repr(item) if len(repr(item)) <= 40 else repr(item)[:37] + "..."
    raise GGUFError(
        f"{f.path}: {key} must be a list of {what}, but item {i} is "
        f"{type(item).__name__} {shown}; the file is damaged or was not written by a GGUF "
        "converter"
    )


def _clean_spaces(text: str) -> str:
    """llama.cpp's ``clean_spaces``: no space before ``? ! . ,``, none around a lone
    apostrophe, none before the contractions ``'s 'm 're 've``."""
    text = re.sub(r" (?=[?!.,])", "", text)
    text = text.replace(" ' ", "'")
    return re.sub(r" '(?=s|m|re|ve)", "'", text)


class StreamDecoder:
    """Decodes one token at a time; returns the text that is complete so far.

    ``strip_prefix`` drops the leading space of the first visible piece (the one the
    encoder's ``add_space_prefix`` put there); use it when decoding from the start
    of a text, not when continuing one.
    """

    def __init__(self, vocab: Vocab, strip_prefix: bool = False, special: bool = False) -> None:
        self.vocab = vocab
        self.special = special
        self._strip = strip_prefix and vocab.strips_leading_space
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tid: int) -> str:
        raw = self.vocab.piece(tid, self.special)
        if self._strip and raw:
            self._strip = False
            if raw.startswith(b" "):
                raw = raw[1:]
        return self._utf8.decode(raw)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
