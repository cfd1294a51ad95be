"""The SentencePiece tokenizer: llama.cpp's merge order, byte fallback, decoding."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from tensorplug.gguf import GGUFError, GGUFFile
from tensorplug_llm.tiny import tiny_vocab, write_tiny_llama
from tensorplug_llm.tokenizer import SPACE, StreamDecoder, TokenType, Vocab

N, C, B = TokenType.NORMAL, TokenType.CONTROL, TokenType.BYTE


def _vocab(pieces: Mapping[str, float], bytes_: bool = True, **kw: object) -> Vocab:
    """<unk> <s> </s>, optionally the 256 byte tokens, then ``pieces`` with their scores."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, C, C]
    if bytes_:
        tokens += [f"<0x{b:02X}>" for b in range(256)]
        types += [B] * 256
    scores = [0.0] * len(tokens)
    for text, score in pieces.items():
        tokens.append(text)
        scores.append(score)
        types.append(N)
    return Vocab(tokens, scores, types, **kw)  # type: ignore[arg-type]


def _pieces(v: Vocab, text: str, **kw: object) -> list[str]:
    return [v.tokens[i] for i in v.encode(text, **kw)]  # type: ignore[arg-type]


def test_the_highest_scoring_pair_merges_first() -> None:
    chars = {SPACE: -1, "a": -1, "b": -1, "c": -1}
    assert _pieces(_vocab(chars | {"ab": -5, "bc": -2}), "abc") == ["<s>", SPACE, "a", "bc"]
    assert _pieces(_vocab(chars | {"ab": -2, "bc": -5}), "abc") == ["<s>", SPACE, "ab", "c"]


def test_ties_merge_the_leftmost_pair() -> None:
    chars = {SPACE: -1, "a": -1}
    v = _vocab(chars | {"aa": -2})
    assert _pieces(v, "aaa", add_bos=False) == [SPACE, "aa", "a"]


def test_merges_continue_through_merged_pieces() -> None:
    v = _vocab({SPACE: -1, "t": -1, "h": -1, "e": -1, SPACE + "t": -3, "he": -2, SPACE + "the": -9})
    # "he" first (score -2), then "▁t" (-3); "▁t"+"he" forms "▁the"
    assert _pieces(v, "the the", add_bos=False) == [SPACE + "the", SPACE + "the"]


def test_spaces_and_prefix() -> None:
    v = _vocab({SPACE: -1, "a": -1})
    assert _pieces(v, "a  a", add_bos=False) == [SPACE, "a", SPACE, SPACE, "a"]
    no_prefix = _vocab({SPACE: -1, "a": -1}, add_space_prefix=False)
    assert _pieces(no_prefix, "a a", add_bos=False) == ["a", SPACE, "a"]
    assert v.encode("") == [1]
    assert v.encode("", add_bos=False) == []


def test_byte_fallback_spells_unknown_characters_in_utf8() -> None:
    v = _vocab({SPACE: -1, "a": -1})
    assert _pieces(v, "aé€", add_bos=False) == [
        SPACE, "a", "<0xC3>", "<0xA9>", "<0xE2>", "<0x82>", "<0xAC>",
    ]  # fmt: skip
    no_bytes = _vocab({SPACE: -1, "a": -1}, bytes_=False)
    assert _pieces(no_bytes, "aé", add_bos=False) == [SPACE, "a", "<unk>", "<unk>"]


def _naive_spm(v: Vocab, text: str) -> list[str]:
    """The same greedy merge, written the slow obvious way: scan every adjacent pair,
    merge the best (highest score, then leftmost), repeat."""
    ids = {t: i for i, t in enumerate(v.tokens)}
    sym = list(" " + text if v.add_space_prefix else text)
    sym = [s.replace(" ", SPACE) for s in sym]
    while True:
        best = None
        for i in range(len(sym) - 1):
            tid = ids.get(sym[i] + sym[i + 1])
            if tid is not None and (best is None or v.scores[tid] > best[0]):
                best = (v.scores[tid], i)
        if best is None:
            break
        i = best[1]
        sym[i : i + 2] = [sym[i] + sym[i + 1]]
    out = []
    for s in sym:
        out += [s] if s in ids else [f"<0x{b:02X}>" for b in s.encode()]
    return out


def test_matches_a_naive_implementation_on_random_text() -> None:
    tokens, scores, types = tiny_vocab(2000)
    v = Vocab(tokens, scores, types)
    rng = np.random.default_rng(0)
    alphabet = list("the quick brown fox and THE world, of tensors é€ 42\n")
    for _ in range(200):
        text = "".join(rng.choice(alphabet, size=rng.integers(1, 40)))
        assert _pieces(v, text, add_bos=False) == _naive_spm(v, text), repr(text)


def test_decode_inverts_encode() -> None:
    tokens, scores, types = tiny_vocab(600)
    v = Vocab(tokens, scores, types)
    for text in ["hello the world", "Über €5, of course!", "  two leading spaces", "a\nb\tc"]:
        ids = v.encode(text)
        assert ids[0] == v.bos
        assert v.decode(ids) == text


def test_stream_decoder_waits_for_whole_characters() -> None:
    v = _vocab({SPACE: -1, "a": -1})
    ids = v.encode("a€", add_bos=False)  # ▁ a <0xE2> <0x82> <0xAC>
    dec = StreamDecoder(v)
    parts = [dec.feed(i) for i in ids]
    assert parts == [" ", "a", "", "", "€"]
    assert dec.flush() == ""


def test_pieces_of_special_tokens() -> None:
    v = _vocab({SPACE + "x": -1})
    assert v.piece(1) == b"" and v.piece(2) == b""  # control tokens print nothing
    assert v.piece(0) == "\u2585".encode()  # <unk>
    assert v.piece(3 + 0x41) == b"A"
    assert v.piece(len(v) - 1) == b" x"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        v.piece(len(v))


def test_from_gguf(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", "q8_0", 0)
    v = Vocab.from_gguf(GGUFFile(path))
    assert len(v) == 320 and (v.bos, v.eos, v.unk) == (1, 2, 0)
    assert v.add_bos and v.add_space_prefix
    assert _pieces(v, "the", add_bos=False) == [SPACE + "the"]


def test_other_tokenizer_models_are_refused(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    def write(model: str) -> Path:
        path = tmp_path / f"{model}.gguf"
        w = GGUFWriter(str(path), "llama")
        w.add_tokenizer_model(model)
        w.add_token_list(["a", "b"])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    with pytest.raises(GGUFError, match="tokenizer.ggml.model is 't5'.*--tokens"):
        Vocab.from_gguf(GGUFFile(write("t5")))
    with pytest.raises(GGUFError, match="gpt2 .BPE. tokenizer needs tokenizer.ggml.merges"):
        Vocab.from_gguf(GGUFFile(write("gpt2")))
