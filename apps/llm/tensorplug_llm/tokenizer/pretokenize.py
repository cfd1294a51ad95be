"""BPE pre-tokenizers: the regexes that cut text into words before merging.

A GGUF file names its pre-tokenizer in ``tokenizer.ggml.pre``; llama.cpp maps the name
to a list of regexes (``llm_tokenizer_bpe`` in ``llama-vocab.cpp``) and a few flags
(``load`` there). The regexes apply in turn: each one cuts every piece the previous
ones left into its matches *and* the text between them — nothing is dropped — and a
lookahead never sees past the end of the piece it is cutting.

llama.cpp runs them on ``std::regex`` over a "collapsed" text (one byte per Unicode
category), or a hand-written matcher for the GPT-2 and Llama 3 patterns; the
``regex`` package understands ``\\p{L}`` and friends directly and gives the same
words. Its ``\\s`` is Unicode White_Space, the set llama.cpp uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import regex

__all__ = ["PRE_TOKENIZERS", "PreTokenizer", "pre_tokenizer"]

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SEED_CODER = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BAILINGMOE = (
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)
# upper-then-lower and lower-only letter runs, written with ASCII classes under a lookahead
_UPPER = r"((?=[\p{L}])([^a-z]))"
_LOWER = r"((?=[\p{L}])([^A-Z]))"
TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"  # …。，、।۔،
# the Han, Hiragana and Katakana blocks as written in llama.cpp's tables
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_HAN_KANA = r"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
# DeepSeek's cased-letter class, spelt out range by range (\p{LC} of an older Unicode)
_DEEPSEEK_LETTERS = (
    r"A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    r"\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    r"\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    r"\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    r"\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57"
    r"\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    r"\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    r"\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d"
    r"\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b"
    r"\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f"
    r"\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    r"\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    r"\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_PUNCT_LEFT = r"[\p{P}\$\+<=>\^~\|"


@dataclass(frozen=True)
class PreTokenizer:
    """What ``tokenizer.ggml.pre`` selects: the regexes and the flags that go with them.

    ``clean_spaces``: decoding removes the space GPT-2 style tokenizers put before
    punctuation; ``ignore_merges``: a word that is a whole token is taken as is
    (Llama 3, tiktoken-converted vocabularies); ``add_bos``: the model wants BOS by
    default even when the file does not say so; ``no_bos``: it has none.
    """

    regexes: tuple[str, ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False
    no_bos: bool = False

    @cached_property
    def _compiled(self) -> tuple[regex.Pattern[str], ...]:
        # compiled on first use: importing the table must stay cheap, and ``regex`` (slow
        # to import) is imported by the first BPE text, not by every model's launch
        import regex

        return tuple(regex.compile(r) for r in self.regexes)

    def split(self, text: str) -> list[str]:
        """``text`` cut into words; joined together they give ``text`` back."""
        pieces = [text] if text else []
        for pattern in self._compiled:
            out: list[str] = []
            for piece in pieces:
                pos = 0
                for m in pattern.finditer(piece):
                    start, end = m.span()
                    if start > pos:
                        out.append(piece[pos:start])
                    if end > start:
                        out.append(piece[start:end])
                    pos = end
                if pos < len(piece):
                    out.append(piece[pos:])
            pieces = out
        return pieces


def _pre(*regexes: str, **flags: bool) -> PreTokenizer:
    return PreTokenizer(tuple(regexes), **flags)


_NO_CLEAN = {"clean_spaces": False}
_GROUPS: list[tuple[tuple[str, ...], PreTokenizer]] = [
    (
        ("default",),
        _pre(_PUNCT_LEFT + r"]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    ),
    (
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ),
        _pre(LLAMA3, ignore_merges=True, add_bos=True),
    ),
    (("dbrx", "smaug-bpe"), _pre(LLAMA3)),
    (
        ("deepseek-llm",),
        _pre(
            r"[\r\n]",
            rf"\s?[{_DEEPSEEK_LETTERS}]+",
            r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
            r"\s+$",
            _CJK,
            r"\p{N}+",
            **_NO_CLEAN,
        ),
    ),
    (
        ("deepseek-coder",),
        _pre(r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}", **_NO_CLEAN),
    ),
    (
        ("deepseek-v3", "hunyuan-dense", "joyai-llm"),
        _pre(
            r"\p{N}{1,3}",
            _HAN_KANA,
            r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
            r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            **_NO_CLEAN,
        ),
    ),
    (("falcon",), _pre(_PUNCT_LEFT + r"`]+", GPT2, r"[0-9][0-9][0-9]")),
    (
        ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"),
        _pre(r"\p{N}", GPT2),
    ),
    (("command-r", "smollm"), _pre(r"\p{N}", GPT2, **_NO_CLEAN)),
    (
        (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
        ),
        _pre(GPT2),
    ),
    (("trillion", "granite-docling"), _pre(GPT2, **_NO_CLEAN)),
    (
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"),
        _pre(QWEN2, **_NO_CLEAN),
    ),
    (("megrez", "stablelm2"), _pre(QWEN2)),
    (("grok-2",), _pre(QWEN2, **_NO_CLEAN)),
    (("qwen35",), _pre(QWEN35, **_NO_CLEAN)),
    (("poro-chat",), _pre(BLOOM, **_NO_CLEAN)),
    (("bloom", "gpt3-finnish"), _pre(BLOOM)),
    (("viking",), _pre(BLOOM, r"\p{N}", **_NO_CLEAN)),
    (("chatglm-bpe", "glm4"), _pre(LLAMA3, no_bos=True)),
    (("tekken",), _pre(TEKKEN, clean_spaces=False, ignore_merges=True, add_bos=True)),
    (("gpt-4o", "llama4", "kanana2"), _pre(GPT4O, **_NO_CLEAN)),
    (("seed-coder",), _pre(SEED_CODER, **_NO_CLEAN)),
    (("bailingmoe", "bailingmoe2", "llada-moe"), _pre(BAILINGMOE, **_NO_CLEAN)),
]

PRE_TOKENIZERS: dict[str, PreTokenizer] = {name: pre for names, pre in _GROUPS for name in names}


def pre_tokenizer(name: str) -> PreTokenizer | None:
    """The pre-tokenizer named ``name`` (``""`` is llama.cpp's fallback, ``default``),
    or None for a name we do not know."""
    return PRE_TOKENIZERS.get(name or "default")
