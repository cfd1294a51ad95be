"""Damaged and hostile GGUF files: each is refused with a GGUFError that says what is wrong,
quickly, without a crash, a hang or a huge allocation."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tensorplug.gguf import GGUFError, GGUFFile
from tensorplug_llm.tiny import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny_llama(tmp_path_factory.mktemp("g") / "t.gguf", "f32", 0).read_bytes()


def _kv_value_at(data: bytes, key: str) -> int:
    """Byte position of a metadata key's value (after its type)."""
    raw = key.encode()
    i = data.index(struct.pack("<Q", len(raw)) + raw)
    return i + 8 + len(raw) + 4


def _tensor_offset_at(data: bytes, name: str) -> int:
    raw = name.encode()
    i = data.rindex(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)
    n_dims = struct.unpack_from("<I", data, i)[0]
    return i + 4 + 8 * n_dims + 4


def _patched(tmp_path: Path, data: bytes, at: int, fmt: str, value: int) -> Path:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, at, value)
    path = tmp_path / "patched.gguf"
    path.write_bytes(bytes(buf))
    return path


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("llama.block_count", 2**31, r"block_count = 2147483648, but the file holds tensors for 2"),
        ("llama.block_count", 0, r"block_count = 0"),
        ("llama.context_length", 0, r"llama.context_length = 0; it must be at least 1"),
    ],
)
def test_impossible_sizes_are_refused_before_anything_is_built(
    tiny: bytes, tmp_path: Path, key: str, value: int, match: str
) -> None:
    from tensorplug_llm.model import LlamaConfig

    path = _patched(tmp_path, tiny, _kv_value_at(tiny, key), "<I", value)
    with pytest.raises(GGUFError, match=match):
        LlamaConfig.from_gguf(GGUFFile(path))


def test_overlapping_tensors_are_refused(tiny: bytes, tmp_path: Path) -> None:
    first = struct.unpack_from("<Q", tiny, _tensor_offset_at(tiny, "blk.0.attn_q.weight"))[0]
    path = _patched(tmp_path, tiny, _tensor_offset_at(tiny, "blk.0.attn_k.weight"), "<Q", first)
    with pytest.raises(GGUFError, match="overlap in the file"):
        GGUFFile(path)


def test_misaligned_tensor_data_is_refused(tiny: bytes, tmp_path: Path) -> None:
    at = _tensor_offset_at(tiny, "blk.0.attn_q.weight")
    offset = struct.unpack_from("<Q", tiny, at)[0]
    path = _patched(tmp_path, tiny, at, "<Q", offset + 4)
    with pytest.raises(GGUFError, match="not a multiple of general.alignment"):
        GGUFFile(path)


def test_arrays_nested_1200_deep_are_refused_without_recursion_error(tmp_path: Path) -> None:
    key = b"evil"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    head += struct.pack("<I", 9)  # the value is an array...
    head += struct.pack("<IQ", 9, 1) * 1200  # ...of one array, 1200 times over
    head += struct.pack("<IQ", 0, 0)  # the innermost: no uint8 at all
    path = tmp_path / "nested.gguf"
    path.write_bytes(head)
    with pytest.raises(GGUFError, match="nests arrays more than 16 deep"):
        GGUFFile(path)


def test_a_fifo_is_refused_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    code = f"from tensorplug.gguf import GGUFFile\nGGUFFile({str(fifo)!r})"
    # in a subprocess with a time limit: the bug this guards against is a hang
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "is not a regular file" in done.stderr and "GGUFError" in done.stderr


def _kv_string(key: str, length: int, payload: bytes) -> bytes:
    raw = key.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<IQ", 8, length) + payload


def test_a_string_longer_than_the_file_is_refused_not_clipped(tmp_path: Path) -> None:
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    head += _kv_string("general.architecture", 5, b"llama")
    head += _kv_string("general.name", 2**64 - 1, b"short")  # the last key: nothing after it
    path = tmp_path / "long-string.gguf"
    path.write_bytes(head)
    with pytest.raises(GGUFError, match="is truncated: metadata key 'general.name' needs bytes"):
        GGUFFile(path)


def test_dims_whose_product_overflows_name_the_tensor(tmp_path: Path) -> None:
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + _kv_string("general.architecture", 5, b"llama")
    head += struct.pack("<Q", 1) + b"w" + struct.pack("<I", 2) + struct.pack("<QQ", 2**40, 2**40)
    head += struct.pack("<IQ", 0, 0)
    head += b"\0" * (-len(head) % 32) + b"\0" * 64
    path = tmp_path / "huge.gguf"
    path.write_bytes(head)
    with pytest.raises(GGUFError, match="the data of tensor 'w' needs bytes"):
        GGUFFile(path)


def test_a_string_that_is_not_utf8_is_refused_naming_its_key(tmp_path: Path) -> None:
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    head += _kv_string("general.architecture", 5, b"llama")
    head += _kv_string("general.name", 4, b"ab\xc3(")  # a broken two-byte sequence
    path = tmp_path / "latin.gguf"
    path.write_bytes(head)
    f = GGUFFile(path)
    assert f.architecture == "llama"
    with pytest.raises(GGUFError, match=r"'general.name' holds a string that is not valid UTF-8"):
        f.get("general.name")
    r = subprocess.run(
        [sys.executable, "-m", "tensorplug", "run", str(write_tiny_llama(tmp_path / "t.gguf"))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_damaged_vocabulary_strings_are_a_one_line_cli_error(tiny: bytes, tmp_path: Path) -> None:
    data = bytearray(tiny)
    data[1919] ^= 0xFF  # inside a token of the vocabulary: no longer UTF-8
    path = tmp_path / "bad-vocab.gguf"
    path.write_bytes(bytes(data))
    r = subprocess.run(
        [sys.executable, "-m", "tensorplug", "run", str(path), "-n", "2", "--tokens", "1,2"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "'tokenizer.ggml.tokens' holds a string that is not valid UTF-8" in r.stderr
