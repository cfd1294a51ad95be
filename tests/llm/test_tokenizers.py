"""Tokenizers against llama.cpp: its fixtures case by case, decoding, WordPiece, special
tokens, the pre-tokenizer table and ``tensorplug tokenize``."""

from __future__ import annotations

import gzip
import io
import json
import shutil
from pathlib import Path

import pytest

from tensorplug.cli import main
from tensorplug.errors import RunError
from tensorplug.gguf import GGUFError, GGUFFile
from tensorplug_llm.tokenizer import SPACE, StreamDecoder, TokenType, Vocab
from tensorplug_llm.tokenizer.bpe import BYTE_TO_CHAR, byte_decode, byte_encode
from tensorplug_llm.tokenizer.pretokenize import PRE_TOKENIZERS, pre_tokenizer
from tensorplug_llm.tokenizer.special import partition
from tensorplug_llm.tokenizer.wpm import bert_words

DATA = Path(__file__).parents[1] / "data" / "vocab"
VOCABS = ("llama-spm", "llama-bpe", "gpt-2", "qwen2")
SEP = "\n__ggml_vocab_test__\n"


def _cases(name: str) -> list[tuple[str, list[int]]]:
    """The fixture's (text, ids) pairs, read as llama.cpp's test-tokenizer-0 reads them."""
    raw = (DATA / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode()
    texts = raw.split(SEP)
    if raw.endswith(SEP):
        texts.pop()  # the marker ends the last case too
    lines = (DATA / f"ggml-vocab-{name}.gguf.out").read_bytes().decode().splitlines()
    assert len(texts) == len(lines) == 46, name
    return [(t, [int(i) for i in line.split()]) for t, line in zip(texts, lines, strict=True)]


CASES = [(name, i, text, ids) for name in VOCABS for i, (text, ids) in enumerate(_cases(name))]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vocab")
    out = {}
    for name in VOCABS:
        out[name] = folder / f"ggml-vocab-{name}.gguf"
        with gzip.open(DATA / f"ggml-vocab-{name}.gguf.gz") as src, open(out[name], "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


@pytest.fixture(scope="module")
def vocabs(paths: dict[str, Path]) -> dict[str, Vocab]:
    return {name: Vocab.from_gguf(GGUFFile(path)) for name, path in paths.items()}


# -- llama.cpp's fixtures ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "i", "text", "ids"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_llama_cpp_fixture(
    vocabs: dict[str, Vocab], name: str, i: int, text: str, ids: list[int]
) -> None:
    # test-tokenizer-0: add_special=false, parse_special=false
    assert vocabs[name].encode(text, add_bos=False) == ids, repr(text)


def test_the_fixtures_select_each_algorithm(vocabs: dict[str, Vocab]) -> None:
    got = {name: (v.model, v.pre, v.add_bos, v.bos) for name, v in vocabs.items()}
    assert got == {
        "llama-spm": ("llama", "default", True, 1),
        "llama-bpe": ("gpt2", "llama-bpe", True, 128000),  # Llama 3 wants BOS by default
        "gpt-2": ("gpt2", "gpt-2", False, 50256),
        "qwen2": ("gpt2", "qwen2", False, 151643),
    }
    assert vocabs["llama-bpe"].encode("Hello")[:1] == [128000]
    assert vocabs["qwen2"].encode("Hello") == vocabs["qwen2"].encode("Hello", add_bos=False)


# -- decoding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VOCABS)
def test_pieces_give_every_fixture_text_back(vocabs: dict[str, Vocab], name: str) -> None:
    v = vocabs[name]
    for text, ids in _cases(name):
        dec = StreamDecoder(v, strip_prefix=True)
        assert "".join(dec.feed(t) for t in ids) + dec.flush() == text
        with_bos = v.encode(text, add_bos=True)
        assert with_bos[0] == v.bos
        if name in ("llama-spm", "qwen2"):  # no clean-up of spaces: decode is exact
            assert v.decode(with_bos) == text


def test_bpe_decoding_cleans_spaces_before_punctuation(vocabs: dict[str, Vocab]) -> None:
    text = "Hello , world ! It 's a ' quote ' here ."
    clean = "Hello, world! It's a'quote'here."  # llama.cpp's three passes, quirks and all
    assert vocabs["gpt-2"].decode(vocabs["gpt-2"].encode(text)) == clean
    assert vocabs["qwen2"].decode(vocabs["qwen2"].encode(text)) == text  # qwen2: clean_spaces off


def test_control_tokens_print_only_when_asked(vocabs: dict[str, Vocab]) -> None:
    v = vocabs["qwen2"]
    ids = v.encode("<|im_start|>user", parse_special=True)
    assert v.decode(ids) == "user"
    assert v.decode(ids, special=True) == "<|im_start|>user"


def test_byte_level_table_is_gpt2s() -> None:
    assert BYTE_TO_CHAR[ord(" ")] == "\u0120" and BYTE_TO_CHAR[ord("\n")] == "\u010a"
    assert BYTE_TO_CHAR[ord("a")] == "a" and len(set(BYTE_TO_CHAR)) == 256
    text = "naïve 🦙\t\x00"
    assert byte_decode(byte_encode(text)) == text.encode()


# -- special tokens ----------------------------------------------------------------------------


def test_parse_special_finds_control_tokens_only_when_asked(vocabs: dict[str, Vocab]) -> None:
    v = vocabs["qwen2"]
    text = "<|im_start|>user\nHi<|im_end|>"
    parsed = v.encode(text, parse_special=True)
    assert parsed[0] == 151644 and parsed[-1] == 151645
    assert parsed[1:-1] == v.encode("user\nHi")
    plain = v.encode(text)
    assert 151644 not in plain and 151645 not in plain
    assert v.decode(plain) == text  # typed text stays text


def test_user_defined_tokens_are_always_found(vocabs: dict[str, Vocab]) -> None:
    v = vocabs["qwen2"]
    assert v.types[151646] == TokenType.USER_DEFINED and v.tokens[151646] == "[PAD151646]"
    assert v.encode("a[PAD151646]b") == [*v.encode("a"), 151646, *v.encode("b")]


def test_spm_prefixes_a_space_after_a_special_token(vocabs: dict[str, Vocab]) -> None:
    v = vocabs["llama-spm"]
    hello = v.encode("Hello", add_bos=False)
    assert v.tokens[hello[0]] == SPACE + "Hello"
    assert v.encode("<s>Hello</s>", add_bos=False, parse_special=True) == [1, *hello, 2]
    assert v.encode("<s>Hello", parse_special=True) == [1, 1, *hello]  # BOS twice, as asked


def test_llama3_special_tokens(vocabs: dict[str, Vocab]) -> None:
    v = vocabs["llama-bpe"]
    ids = v.encode("<|start_header_id|>user<|end_header_id|>", parse_special=True)
    assert [v.tokens[i] for i in ids] == [
        "<|begin_of_text|>", "<|start_header_id|>", "user", "<|end_header_id|>",
    ]  # fmt: skip
    assert {v.tokens[i] for i in v.eog} == {"<|end_of_text|>", "<|eot_id|>"}


def test_partition_tries_longer_tokens_first() -> None:
    specials = [("<a><b>", 7), ("<a>", 5), ("<b>", 6)]
    assert partition("x<a><b>y<a>z<b>", specials) == ["x", 7, "y", 5, "z", 6]
    assert partition("<a><a>", specials) == [5, 5]
    assert partition("", specials) == []


# -- WordPiece ---------------------------------------------------------------------------------

_WORDS = ["hello", "world", "un", "the", "cafe", ",", "!", "'", "中", "文"]
_PIECES = ["aff", "able", "s", "llo"]


def _bert(**kw: object) -> Vocab:
    """[PAD] [UNK] [CLS] [SEP] [MASK], word starts with ▁, continuations without."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [SPACE + w for w in _WORDS] + _PIECES
    types = [TokenType.CONTROL] * 5 + [TokenType.NORMAL] * (len(tokens) - 5)
    types[1] = TokenType.UNKNOWN
    args: dict[str, object] = {"bos": 2, "eos": None, "unk": 1, "sep": 3, "add_sep": True}
    return Vocab(tokens, [0.0] * len(tokens), types, model="bert", add_space_prefix=False,
                 **(args | kw))  # type: ignore[arg-type]  # fmt: skip


def _wp(v: Vocab, text: str, **kw: object) -> list[str]:
    return [v.tokens[i] for i in v.encode(text, **kw)]  # type: ignore[arg-type]


def test_wordpiece_longest_match_first() -> None:
    v = _bert()
    assert _wp(v, "Hello, World!") == [
        "[CLS]", SPACE + "hello", SPACE + ",", SPACE + "world", SPACE + "!", "[SEP]",
    ]  # fmt: skip
    assert _wp(v, "unaffable worlds", add_bos=False) == [
        SPACE + "un", "aff", "able", SPACE + "world", "s",
    ]  # fmt: skip


def test_wordpiece_unknown_words_and_normalisation() -> None:
    v = _bert()
    # a word with any uncuttable rest is one [UNK]; accents stripped, case folded
    assert _wp(v, "the xyz CAFÉ", add_bos=False) == [SPACE + "the", "[UNK]", SPACE + "cafe"]
    assert _wp(v, "中文the", add_bos=False) == [SPACE + "中", SPACE + "文", SPACE + "the"]
    assert bert_words("Ünïcode\tcafé's\x00 $5 a\u200bb") == [
        "unicode", "cafe", "'", "s", "$", "5", "ab",
    ]  # fmt: skip
    assert bert_words("Café", lowercase=False, strip_accents=False) == ["Café"]
    assert _wp(_bert(lowercase=False, strip_accents=False), "Hello", add_bos=False) == ["[UNK]"]


def test_wordpiece_decoding() -> None:
    v = _bert()
    ids = v.encode("hello, world! unaffable")
    assert v.decode(ids) == "hello, world! unaffable"
    assert v.decode(ids, special=True) == "[CLS] hello, world! unaffable[SEP]"


def test_bert_vocab_from_gguf(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    v = _bert()
    path = tmp_path / "bert.gguf"
    w = GGUFWriter(str(path), "bert")
    w.add_tokenizer_model("bert")
    w.add_token_list(v.tokens)
    w.add_token_types(v.types)
    w.add_bos_token_id(2)
    w.add_sep_token_id(3)
    w.add_unk_token_id(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    loaded = Vocab.from_gguf(GGUFFile(path))
    assert (loaded.model, loaded.bos, loaded.sep, loaded.unk, loaded.add_sep) == (
        "bert",
        2,
        3,
        1,
        True,
    )
    assert loaded.encode("Hello!") == v.encode("Hello!") == [2, 5, 11, 3]


# -- pre-tokenizers ----------------------------------------------------------------------------


def test_llama3_splits_numbers_in_threes_and_keeps_contractions() -> None:
    pre = pre_tokenizer("llama-bpe")
    assert pre is not None
    assert pre.split("1234567 it's OK'LL\n\n  x") == [
        "123", "456", "7", " it", "'s", " OK", "'LL", "\n\n", " ", " x",
    ]  # fmt: skip
    gpt2 = pre_tokenizer("gpt-2")
    assert gpt2 is not None
    assert gpt2.split("it's 1234  x") == ["it", "'s", " 1234", " ", " x"]


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_every_pre_tokenizer_compiles_and_loses_nothing(name: str) -> None:
    text = "Hello, y'all! 3333 апельсин 我想在apple工作 😁\n\n\t  ~~x’s"
    assert "".join(PRE_TOKENIZERS[name].split(text)) == text


def test_unknown_pre_tokenizers_and_models_are_refused(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    with pytest.raises(RunError, match="unknown BPE pre-tokenizer 'nope'.*known: .*qwen2"):
        Vocab(["a"], [0.0], [1], model="gpt2", pre="nope", bos=None, eos=None, unk=None)
    with pytest.raises(RunError, match="tokenizer model 'rwkv' is not implemented"):
        Vocab(["a"], [0.0], [1], model="rwkv", bos=None, eos=None, unk=None)
    path = tmp_path / "pre.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("my-new-model")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="unknown BPE pre-tokenizer 'my-new-model'"):
        Vocab.from_gguf(GGUFFile(path))


# -- tensorplug tokenize -----------------------------------------------------------------------


def test_cli_prints_ids_and_pieces(
    paths: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tokenize", str(paths["llama-spm"]), "Hello 🦙\n"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["     1 -> '<s>'", " 15043 -> ' Hello'"]
    assert lines[-1] == "    13 -> '\\n'" and "'\\xf0'" in lines[-5]
    assert main(["tokenize", str(paths["qwen2"]), "<|im_end|>x", "--parse-special", "--ids"]) == 0
    assert capsys.readouterr().out == "[151645, 87]\n"
    assert main(["tokenize", str(paths["llama-spm"]), "Hi", "--no-bos", "--ids"]) == 0
    assert capsys.readouterr().out == "[6324]\n"


def test_cli_jsonl_matches_the_fixtures(
    paths: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("gpt-2", "llama-bpe"):
        cases = _cases(name)
        stdin = "".join(json.dumps(text) + "\n" for text, _ in cases)
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        assert main(["tokenize", str(paths[name]), "--jsonl", "--no-bos"]) == 0
        got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert got == [ids for _, ids in cases]


@pytest.mark.parametrize(
    ("argv", "stdin", "message"),
    [
        (["missing.gguf", "x"], "", "cannot read missing.gguf: No such file or directory"),
        (["{spm}", "--jsonl"], '"ok"\nnot json\n', "stdin line 2 is not JSON"),
        (["{spm}", "--jsonl"], '["a"]\n', "stdin line 1 holds a JSON list, not a string"),
        (["{spm}", "text", "--jsonl"], "", "--jsonl reads its texts from stdin"),
        # undecodable argv bytes arrive as lone surrogates; JSON can spell one outright
        (["{spm}", "a\udcffb"], "", "TEXT is not UTF-8 (byte 0xff at offset 1)"),
        (["{spm}", "--jsonl"], '"a\\ud800"\n', "'\\ud800' at index 1: a lone surrogate"),
    ],
)
def test_cli_mistakes_are_one_line(
    paths: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    stdin: str,
    message: str,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    argv = [a.replace("{spm}", str(paths["llama-spm"])) for a in argv]
    assert main(["tokenize", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tensorplug tokenize: error: ") and message in err
    assert err.count("\n") == 1
