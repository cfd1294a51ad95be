"""tensorplug.gguf: metadata, tensors, zero-copy mapping, uploads and clear errors."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from tensorplug import gguf_index, registry
from tensorplug.buffer import BufferUsage
from tensorplug.errors import UnsupportedError
from tensorplug.gguf import (
    GGUFError,
    GGUFFile,
    GGUFStringError,
    StringArray,
    populate_mapping,
    release_mapping,
)
from tensorplug.host import host_buffer_type
from tensorplug.transfer import get_array, tensor_set
from tensorplug.types import Type
from tensorplug_llm.model import LlamaConfig, LlamaWeights
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import COPIED_BELOW, ModelRunner
from tensorplug_llm.tiny import write_tiny_llama


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny-q4_0.gguf", "q4_0", 1)


def test_import_tensorplug_does_not_import_gguf() -> None:
    code = (
        "import sys, tensorplug, tensorplug.gguf, tensorplug_llm.runner, tensorplug_llm.run_cli; "
        "print('gguf' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_metadata_and_tensor_descriptions(tiny: Path) -> None:
    f = GGUFFile(tiny)
    reader = GGUFReader(tiny)
    assert f.architecture == "llama" and f.version == 3
    assert f.value("llama.embedding_length", int) == 64
    assert f.value("llama.attention.layer_norm_rms_epsilon", float) == pytest.approx(1e-5)
    assert f.value("llama.rope.freq_base", float) == 10000.0
    assert f.get("tokenizer.ggml.tokens")[:3] == ["<unk>", "<s>", "</s>"]
    assert f.get("no.such.key", 7) == 7
    keys = f.keys()
    assert "general.architecture" in keys and "GGUF.version" not in keys
    assert len(f.tensors) == len(reader.tensors) == 2 * 9 + 3
    for t in reader.tensors:
        info = f.tensors[t.name]
        assert info.shape == tuple(reversed(t.shape.tolist()))  # numpy order
        assert info.offset == t.data_offset and info.nbytes == t.n_bytes
        assert np.array_equal(f.tensor_bytes(t.name), t.data.reshape(-1).view(np.uint8))
    q = f.tensors["blk.0.attn_q.weight"]
    assert (q.type, q.shape, q.nbytes) == (Type.Q4_0, (64, 64), 64 * 2 * 18)
    assert f.tensors["blk.0.attn_norm.weight"].type == Type.F32


def test_overrides_stand_for_the_files_values_of_their_kind(tiny: Path) -> None:
    """llama.cpp's metadata overrides: every reader sees them (get, value, keys, in),
    the file does not change, a new key is added, and a value of another kind than the
    key it replaces is refused naming both."""
    f = GGUFFile(tiny)
    f.override({"llama.embedding_length": 32, "llama.rope.freq_base": 5e5,
                "general.name": "renamed", "tokenizer.ggml.add_bos_token": False,
                "my.own.key": True})  # fmt: skip
    assert f.value("llama.embedding_length", int) == 32
    assert f.get("llama.rope.freq_base") == 5e5 and f.get("general.name") == "renamed"
    assert f.get("tokenizer.ggml.add_bos_token") is False
    assert "my.own.key" in f and f.keys().count("my.own.key") == 1 and f.get("my.own.key")
    assert f.numbers("llama.embedding_length") is None and f.length("general.name") is None
    assert GGUFFile(tiny).value("llama.embedding_length", int) == 64  # the file is as it was
    for values, said in [
        ({"llama.embedding_length": 32.0}, "a float, but the file's '.*' is an int"),
        ({"llama.embedding_length": True}, "is a bool, but the file's"),
        ({"tokenizer.ggml.tokens": "x"}, "is an array"),
        ({"general.name": None}, "must be a bool, int, float or str"),
        ({"": 1}, "non-empty string"),
    ]:  # fmt: skip
        with pytest.raises(GGUFError, match=said):
            GGUFFile(tiny).override(values)  # type: ignore[arg-type]


def _odd_arrays(path: Path) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_array("a.strings", ["x", "", "ü€", "tab\tnewline\n"])
    w.add_array("a.floats", [1.5, -2.25])
    w.add_array("a.bools", [True, False, True])
    w.add_array("a.nested", [[1, 2], [3]])
    w.add_array("a.nested_strings", [["p", "q"], [""], ["r"]])
    w.add_tensor("t", np.arange(8, dtype=np.float32))
    _finish(w)
    return path


@pytest.mark.parametrize("opened", ["parsed", "kept"])
@pytest.mark.parametrize("which", ["tiny", "odd arrays"])
def test_metadata_equals_the_stock_readers(
    tiny: Path, tmp_path: Path, which: str, opened: str
) -> None:
    """GGUFFile parses metadata arrays in bulk, and a later open reads the header kept
    by the first (tensorplug.gguf_index); every value must be what gguf's own reader
    gives (this catches a gguf release that changes the reader's internals)."""
    path = tiny if which == "tiny" else _odd_arrays(tmp_path / "odd.gguf")
    first = GGUFFile(path)
    assert gguf_index.load(path, os.stat(path)) is not None  # kept for the next open
    f, stock = (GGUFFile(path) if opened == "kept" else first), GGUFReader(path)
    assert f.keys() == [k for k in stock.fields if not k.startswith("GGUF.")]
    assert f.version == stock.fields["GGUF.version"].contents()
    for key, field in stock.fields.items():
        assert f.get(key) == field.contents(), key
        numbers, strings = f.numbers(key), f.strings(key)
        assert (f.length(key), strings) == (first.length(key), first.strings(key)), key
        assert (numbers is None) == (first.numbers(key) is None), key
        if numbers is not None:
            assert numbers.dtype == first.numbers(key).dtype, key  # type: ignore[union-attr]
            assert numbers.tolist() == field.contents(), key
    assert [t.offset for t in f.tensors.values()] == [t.data_offset for t in stock.tensors]
    assert f.tensors == first.tensors
    assert (f.alignment, f.data_offset) == (stock.alignment, stock.data_offset)


def test_whole_arrays_of_numbers_and_of_strings(tmp_path: Path) -> None:
    """``numbers`` gives an array of numbers as one numpy array (its own copy, in the
    file's type) and ``strings`` an array of strings as read whole; anything else is
    None, for ``get`` to read item by item."""
    f = GGUFFile(_odd_arrays(tmp_path / "odd.gguf"))
    floats = f.numbers("a.floats")
    assert floats is not None and floats.dtype == np.float32
    assert floats.tolist() == f.get("a.floats") == [1.5, -2.25]
    floats[0] = 7  # a copy: the mapped file (read-only) is not written
    assert f.get("a.floats") == [1.5, -2.25]
    assert f.strings("a.strings") == f.get("a.strings") == ["x", "", "ü€", "tab\tnewline\n"]
    for key in ("a.strings", "a.bools", "a.nested", "general.architecture", "missing"):
        assert f.numbers(key) is None, key
    for key in ("a.floats", "a.nested_strings", "general.architecture", "missing"):
        assert f.strings(key) is None, key


@pytest.mark.parametrize("zero", [False, True], ids=["text", "an item holding a zero"])
def test_string_arrays_read_whole_equal_the_stock_readers(
    tmp_path: Path, zero: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A string array is decoded in one pass, split at the zero each item's length ends
    with; items of every length (empty ones, multi-byte characters, lengths of 256 and
    more, whose second byte is not zero) must come back as gguf's reader gives them, and
    an item that holds a zero itself must not split (it is read item by item)."""
    if not zero:  # the one pass must do it alone

        def item_by_item(self: StringArray) -> list[str]:
            raise AssertionError("read item by item")

        monkeypatch.setattr(StringArray, "_decode_each", item_by_item)
    rng = random.Random(7)  # (numpy's strings drop trailing zeros)
    alphabet = "abc Ġ ü€漢😀\t\n" + "\x00" * zero
    words = ["".join(rng.choices(alphabet, k=rng.randrange(12))) for _ in range(3000)]
    words += ["", "x" * 300, "é" * 200, ""]
    assert ("\x00" in "".join(words)) == zero
    path = tmp_path / "vocab.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", words)
    w.add_tensor("t", np.arange(8, dtype=np.float32))
    _finish(w)
    stock = GGUFReader(path).fields["tokenizer.ggml.tokens"].contents()
    assert GGUFFile(path).strings("tokenizer.ggml.tokens") == stock == words


def test_length_counts_an_arrays_items_without_reading_them(tmp_path: Path) -> None:
    """``length`` is an array's item count as its header gives it (an array of arrays
    counts the arrays), and None for a scalar or a missing key."""
    f = GGUFFile(_odd_arrays(tmp_path / "odd.gguf"))
    for key in ("a.strings", "a.floats", "a.bools"):
        assert f.length(key) == len(f.get(key)), key
    assert [f.length("a.nested"), f.length("a.nested_strings")] == [2, 3]
    assert f.length("general.architecture") is None
    assert f.length("missing") is None


def test_a_string_array_item_that_is_not_utf8_names_its_key(tmp_path: Path) -> None:
    """Array items are decoded when read (not when the file opens), and a bad one is a
    GGUFStringError (a damaged file) naming the key, as a bad single string is."""
    path = _odd_arrays(tmp_path / "odd.gguf")
    raw = path.read_bytes()
    assert raw.count("ü€".encode()) == 1
    path.write_bytes(raw.replace("ü€".encode(), b"\xff" * 5))
    f = GGUFFile(path)  # opens: nothing is decoded yet
    assert f.get("a.floats") == [1.5, -2.25]
    with pytest.raises(GGUFStringError, match="'a.strings' holds a string that is not valid UTF-8"):
        f.get("a.strings")


def test_a_kept_header_is_of_the_file_as_it_is_now(tmp_path: Path) -> None:
    """A file rewritten at the same path (new contents, same size) is parsed again,
    never read through the header kept for its old contents; a file with a string
    that is not UTF-8 is not kept, so a later open still names the key."""
    path = tmp_path / "m.gguf"
    for value in ("first", "other"):  # same length: only the identity tells them apart
        w = GGUFWriter(str(path), "llama")
        w.add_string("a.text", value)
        w.add_tensor("t", np.arange(8, dtype=np.float32))
        _finish(w)
        assert GGUFFile(path).get("a.text") == GGUFFile(path).get("a.text") == value
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"other", b"\xffther"))
    for _ in range(2):
        with pytest.raises(GGUFStringError, match="'a.text' holds a string that is not valid"):
            GGUFFile(path).get("a.text")


def test_a_damaged_kept_header_is_a_miss(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORPLUG_CACHE", str(tmp_path))  # only this test's entry
    GGUFFile(tiny)
    (entry,) = (tmp_path / "gguf").iterdir()
    for damage in (
        b"",
        b"{}",
        entry.read_bytes()[:-40],
        entry.read_bytes().replace(b'"value"', b'"valu"'),
    ):
        entry.write_bytes(damage)
        assert gguf_index.load(tiny, os.stat(tiny)) is None
        assert GGUFFile(tiny).architecture == "llama"  # parsed, and kept again
    assert gguf_index.load(tiny, os.stat(tiny)) is not None
    monkeypatch.setenv("TENSORPLUG_CACHE", "0")
    assert gguf_index.load(tiny, os.stat(tiny)) is None
    assert GGUFFile(tiny).architecture == "llama"


def test_writing_a_kept_header_drops_those_of_deleted_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries of model files that are gone, of another format, or damaged are removed
    when another entry is written; those of files still there stay."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TENSORPLUG_CACHE", str(cache))
    paths = []
    for name in ("a", "b", "c"):
        w = GGUFWriter(str(tmp_path / f"{name}.gguf"), "llama")
        w.add_tensor("t", np.arange(8, dtype=np.float32))
        _finish(w)
        paths.append(tmp_path / f"{name}.gguf")
    for path in paths[:2]:
        GGUFFile(path)
    folder = cache / "gguf"
    by_model = {json.loads(e.read_text())["path"]: e for e in folder.iterdir()}
    kept = {p: by_model[os.path.realpath(p)] for p in paths[:2]}
    older = folder / "older.json"  # as the first format wrote them: no path
    older.write_text(json.dumps({"format": gguf_index.FORMAT - 1}))
    (folder / "damaged.json").write_text("{")
    paths[0].unlink()  # a model deleted
    GGUFFile(paths[2])  # a new model's entry is written
    left = sorted(e.name for e in folder.iterdir())
    assert len(left) == 2 and kept[paths[1]].name in left and kept[paths[0]].name not in left
    assert gguf_index.load(paths[1], os.stat(paths[1])) is not None  # still a hit


def test_a_kept_header_opens_without_the_gguf_package(tiny: Path, tmp_path: Path) -> None:
    """The second process that opens a file neither imports ``gguf`` nor parses it."""
    code = (
        "import sys\nfrom tensorplug.gguf import GGUFFile\nf = GGUFFile(sys.argv[1])\n"
        "print(f.architecture, len(f.tensors), f.strings('tokenizer.ggml.tokens')[:2], "
        "'gguf' in sys.modules)"
    )
    env = {**os.environ, "TENSORPLUG_CACHE": str(tmp_path)}  # nothing kept yet
    runs = [subprocess.run([sys.executable, "-c", code, str(tiny)], capture_output=True,
                           text=True, check=True, env=env) for _ in range(2)]  # fmt: skip
    first, second = (run.stdout.split() for run in runs)
    assert first[-1] == "True" and second[-1] == "False"
    assert first[:-1] == second[:-1]


def test_string_arrays_cost_no_object_per_string(tmp_path: Path) -> None:
    """A vocabulary's strings stay in the file until read: two numpy views per string
    (the stock reader's way) took 90 MB for Gemma 3's 262,144 tokens before a weight
    was loaded. 100,000 strings here: 28 MB that way, under 1 MB kept now (an 8-byte
    end a string)."""
    import tracemalloc

    path = tmp_path / "vocab.gguf"
    words = [f"tok{i}" for i in range(100_000)]
    w = GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", words)
    w.add_tensor("t", np.arange(8, dtype=np.float32))
    _finish(w)
    tracemalloc.start()
    try:
        f = GGUFFile(path)
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 1 << 20, f"{kept / 1e6:.1f} MB kept by opening the file"
    assert f.get("tokenizer.ggml.tokens") == words
    assert f.value("tokenizer.ggml.tokens", list)[12345] == "tok12345"


def test_mapped_weights_are_the_file_itself(tiny: Path) -> None:
    f = GGUFFile(tiny)
    cpu = host_cpu()
    names = ["token_embd.weight", "blk.0.attn_norm.weight", "blk.1.ffn_down.weight"]
    tensors = {n: f.new_tensor(n) for n in names}
    buffers = f.map_tensors(tensors, cpu)
    for name, t in tensors.items():
        assert t.buffer is not None and t.buffer.usage is BufferUsage.WEIGHTS
        mem = t.buffer.host_array()[t.offset : t.offset + t.nbytes]
        assert np.shares_memory(mem, f.data)  # no copy: the mapping itself
        assert np.array_equal(get_array(t).reshape(-1).view(np.uint8), f.tensor_bytes(name))
    assert 1 <= len(buffers) <= len(names)
    with pytest.raises(UnsupportedError, match="read-only"):
        tensor_set(tensors["blk.0.attn_norm.weight"], np.zeros(64, np.float32))


def _mapped_rss_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = fields[-1] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def _one_big_tensor(path: Path, nbytes: int) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_tensor("big", np.arange(nbytes // 4, dtype=np.float32))
    _finish(w)
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_mapped_weights_are_mapped_in_at_once(tmp_path: Path) -> None:
    """map_tensors maps the weights' pages into the process when it wraps them, so the
    first computation does not take a page fault per page (llama.cpp's MAP_POPULATE)."""
    path = _one_big_tensor(tmp_path / "big.gguf", 8 << 20).resolve()
    f = GGUFFile(path)
    before = _mapped_rss_kib(path)
    assert before < 4 << 10  # the reader touched the header, not the data
    t = f.new_tensor("big")
    f.map_tensors({"big": t}, host_cpu())
    if not populate_mapping(f.data, 0, 4096):
        pytest.skip("this kernel refuses MADV_POPULATE_READ (Linux < 5.14)")
    assert _mapped_rss_kib(path) >= 8 << 10  # all 8 MiB of data, none of it read yet
    assert np.array_equal(get_array(t), np.arange(2 << 20, dtype=np.float32))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_uploaded_weights_leave_the_mapping(tmp_path: Path) -> None:
    """A copy of the weights needs no mapping of them any more: upload_tensors releases
    the pages it copied from (they stay readable, mapped in again on use)."""
    path = _one_big_tensor(tmp_path / "big.gguf", 8 << 20).resolve()
    f = GGUFFile(path)
    t = f.new_tensor("big")
    assert f.upload_tensors({"big": t}, host_buffer_type()) is not None
    assert _mapped_rss_kib(path) < 1 << 10  # of 8 MiB read to copy them
    assert np.array_equal(get_array(t), np.arange(2 << 20, dtype=np.float32))
    assert np.array_equal(f.tensor_bytes("big").view(np.float32), get_array(t))  # still there
    assert not release_mapping(f.data, 100, 4000)  # no whole page inside


def test_upload_reads_through_a_bounded_scratch_buffer(tmp_path: Path) -> None:
    """A tensor is read from the file a few MB at a time, whole rows, not whole: Gemma 3's
    178 MB output layer was held twice while it was copied."""
    import tracemalloc

    from tensorplug.gguf import UPLOAD_CHUNK, row_chunks

    path = tmp_path / "wide.gguf"
    values = np.arange(3000 * 2048, dtype=np.float32).reshape(3000, 2048)  # 24.6 MB
    w = GGUFWriter(str(path), "llama")
    w.add_tensor("wide", values)
    _finish(w)
    f = GGUFFile(path)
    info = f.tensors["wide"]
    chunks = row_chunks(info)
    step = UPLOAD_CHUNK // (64 * 8192) * 64 * 8192  # rows of 8 KiB, 64 at a time
    assert len(chunks) == -(-info.nbytes // step) > 1 and chunks[0] == (0, step)
    assert [b for _, b in chunks[:-1]] == [a for a, _ in chunks[1:]] and chunks[-1][
        1
    ] == info.nbytes
    t = f.new_tensor("wide")
    tracemalloc.start()
    try:
        buf = f.upload_tensors({"wide": t}, host_buffer_type())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert buf is not None and peak - buf.size < UPLOAD_CHUNK + (1 << 20), peak
    assert np.array_equal(get_array(t), values)


def test_repacked_weights_read_in_small_chunks_compute_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of a few rows (64 at a time, groups of eight for the CPU's repacked
    layouts) fill every matrix as one read did: same logits."""
    import tensorplug.gguf as gguf_module

    path = write_tiny_llama(tmp_path / "q4.gguf", "q4_0", 5, n_ff=384)
    placement = Placement.on(host_cpu(), 2)
    with ModelRunner(path, placement=placement, n_ctx=16) as whole:
        want = whole.eval([1, 300, 290, 260])
    monkeypatch.setattr(gguf_module, "UPLOAD_CHUNK", 1)  # one step of 64 rows per read
    assert len(gguf_module.row_chunks(GGUFFile(path).tensors["blk.0.ffn_up.weight"])) == 6
    with ModelRunner(path, placement=placement, n_ctx=16) as chunked:
        assert chunked.memory[host_cpu()].extra  # the products' weights were repacked
        assert np.array_equal(chunked.eval([1, 300, 290, 260]), want)


def test_mapping_works_where_pages_cannot_be_populated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensorplug.gguf as gguf_module

    monkeypatch.setattr(gguf_module, "MADV_POPULATE_READ", 1 << 30)  # advice no kernel knows
    f = GGUFFile(_one_big_tensor(tmp_path / "big.gguf", 1 << 16))
    assert not populate_mapping(f.data, 0, 1 << 16)
    t = f.new_tensor("big")
    f.map_tensors({"big": t}, host_cpu())  # the pages fault in on use instead
    assert np.array_equal(get_array(t), np.arange(1 << 14, dtype=np.float32))
    monkeypatch.setattr(gguf_module, "MADV_POPULATE_READ", None)  # a system without it
    assert not populate_mapping(f.data, 0, 1 << 16)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_weights_larger_than_free_memory_are_not_read_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Populating a model that cannot stay in memory would read it at load only to read
    it again while computing; such a range is left to fault in as it is used."""
    import tensorplug.gguf as gguf_module

    path = _one_big_tensor(tmp_path / "big.gguf", 4 << 20).resolve()
    monkeypatch.setattr(gguf_module, "host_memory", lambda: (1 << 20, 1 << 30))
    f = GGUFFile(path)
    t = f.new_tensor("big")
    f.map_tensors({"big": t}, host_cpu())
    assert not populate_mapping(f.data, 0, 4 << 20)
    assert _mapped_rss_kib(path) < 1 << 10  # none of the 4 MiB read ahead
    assert np.array_equal(get_array(t), np.arange(1 << 20, dtype=np.float32))


def _resident_bytes(data: np.ndarray, start: int, end: int) -> int:
    """Bytes of the whole pages within ``data[start:end]`` (a file's mapping) that are
    mapped into this process now: bit 63 ("present") of each page's entry in
    ``/proc/self/pagemap`` (``mincore`` would say what the page cache holds)."""
    import mmap

    page = mmap.PAGESIZE
    base = data.ctypes.data
    first, last = -(-(base + start) // page), (base + end) // page
    with open("/proc/self/pagemap", "rb") as fh:
        fh.seek(first * 8)
        entries = np.frombuffer(fh.read((last - first) * 8), np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum()) * page


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
@pytest.mark.parametrize("repack", [True, False])
def test_token_embeddings_only_get_rows_reads_are_not_mapped_in_ahead(
    tmp_path: Path, repack: bool
) -> None:
    """Token embeddings that only get_rows reads (a tied output layer reads its own
    repacked copy) are never mapped in: not at load (Gemma 3's 178 MB of them were
    resident for a few rows), nor as a prompt reads its rows, which come from the file
    (``HostBuffer.file_rows``): read through the mapping, Linux mapped in the cached
    pages around each (fault-around, 64 KiB, or a large folio: 57 KB to 2 MB seen).
    Where the output layer's products read the mapping itself (no repacking) all of it
    is mapped in."""
    path = write_tiny_llama(tmp_path / "tied.gguf", "q8_0", 3, tied=True, n_vocab=32768)
    tokens = [1, 300, 7000, 4242, 9000, 15000, 22000, 32000]
    m = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=16, repack=repack)
    try:
        info = m.file.tensors["token_embd.weight"]  # 2.2 MB: 544 pages
        resident = _resident_bytes(m.file.data, info.offset, info.offset + info.nbytes)
        logits = m.eval(tokens)
        after = _resident_bytes(m.file.data, info.offset, info.offset + info.nbytes)
        if repack:
            assert isinstance(m.weights, LlamaWeights)
            assert m.weights.output.require_allocated().name == "CPU_REPACK"
            # at load, mapping its neighbours may map in a page or two at its ends
            # (fault-around); the prompt's rows, read from the file, map in none
            assert resident <= info.nbytes // 4, f"{resident} of {info.nbytes} bytes resident"
            assert after == resident, f"{after - resident} bytes mapped in by the prompt"
        elif populate_mapping(m.file.data, 0, 4096):
            assert resident >= info.nbytes - 2 * 4096  # all its whole pages
    finally:
        m.close()
    placement = Placement.on(host_cpu(), 2)
    with ModelRunner(path, placement=placement, n_ctx=16, use_mmap=False, repack=repack) as copy:
        assert np.array_equal(logits, copy.eval(tokens))  # the same, read either way


def test_small_weights_are_copied_and_large_ones_mapped(tmp_path: Path) -> None:
    """Where weights are mapped, a tensor under COPIED_BELOW bytes (a norm) is copied
    out of the file instead: mapping its few KiB mapped in the cached large folios
    around it (~1 MiB a norm seen). The large ones are the file's own memory."""
    path = write_tiny_llama(tmp_path / "m.gguf", "f32", 3, n_vocab=8192)
    with ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=16, repack=False) as m:
        sizes = {False: [], True: []}  # type: dict[bool, list[int]]
        for t in m.weights.by_name:
            memory = t.require_allocated().host_array()
            sizes[bool(np.shares_memory(memory, m.file.data))].append(t.nbytes)
        assert sizes[False] and max(sizes[False]) < COPIED_BELOW
        assert sizes[True] and min(sizes[True]) >= COPIED_BELOW
        logits = m.eval([1, 2, 3])
    with ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=16, use_mmap=False) as copy:
        np.testing.assert_array_equal(logits, copy.eval([1, 2, 3]))


def test_mapping_splits_runs_at_misaligned_offsets(tmp_path: Path) -> None:
    """GGUF aligns tensors to 32 bytes; host buffers want 64: a tensor whose offset breaks
    the run's alignment starts a new buffer, and every tensor still reads correctly."""
    path = tmp_path / "odd.gguf"
    w = GGUFWriter(str(path), "llama")
    arrays = {f"t{i}": np.arange(8 * (i + 1), dtype=np.float32) + i for i in range(5)}
    for name, a in arrays.items():  # 32, 64, 96, 128, 160 bytes
        w.add_tensor(name, a)
    _finish(w)
    f = GGUFFile(path)
    tensors = {n: f.new_tensor(n) for n in arrays}
    buffers = f.map_tensors(list(tensors.items()), host_cpu())
    assert len(buffers) > 1
    for name, a in arrays.items():
        assert np.array_equal(get_array(tensors[name]), a)


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_upload_to_a_device_buffer_type(tiny: Path, device: str) -> None:
    dev = registry.dev_by_name(device)
    if dev is None:
        pytest.skip(f"no {device} device")
    f = GGUFFile(tiny)
    names = ["blk.0.attn_q.weight", "blk.0.ffn_norm.weight", "output.weight"]
    tensors = [(n, f.new_tensor(n)) for n in names]
    buf = f.upload_tensors(tensors, dev.buffer_type())
    assert buf is not None and buf.usage is BufferUsage.WEIGHTS and buf.buft is dev.buffer_type()
    for name, t in tensors:
        assert not np.shares_memory(get_array(t), f.data)
        assert np.array_equal(get_array(t).reshape(-1).view(np.uint8), f.tensor_bytes(name))


def test_loading_refuses_a_tensor_of_the_wrong_layout(tiny: Path) -> None:
    f = GGUFFile(tiny)
    from tensorplug.tensor import new_tensor

    wrong = new_tensor(Type.Q8_0, (64, 64), "q")
    with pytest.raises(GGUFError, match="cannot hold the file's 'blk.0.attn_q.weight'"):
        f.map_tensors({"blk.0.attn_q.weight": wrong}, host_cpu())


# -- bad files ----------------------------------------------------------------------------------


def _rewrite(
    src: Path,
    dst: Path,
    drop: Iterable[str] = (),
    change: dict[str, tuple[Any, GGUFValueType]] | None = None,
    tensors: Callable[[str, np.ndarray, GGMLQuantizationType], tuple[np.ndarray, Any]]
    | None = None,
    skip_tensors: Iterable[str] = (),
) -> Path:
    """Copy a GGUF file through the gguf reader and writer, dropping or changing keys,
    leaving out tensors, and (with ``tensors``) replacing tensor data and type."""
    r = GGUFReader(src)
    w = GGUFWriter(str(dst), "llama")
    change = change or {}
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        if key in change:
            continue
        main, sub = (
            field.types[0],
            field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None,
        )
        w.add_key_value(key, field.contents(), main, sub)
    for key, (value, vtype) in change.items():
        w.add_key_value(key, value, vtype)
    for t in r.tensors:
        if t.name in skip_tensors:
            continue
        data, raw = t.data, t.tensor_type
        if tensors is not None:
            data, raw = tensors(t.name, data, raw)
        quantized = raw not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
        w.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=raw if quantized else None)
    _finish(w)
    return dst


def _open_llama(path: Path) -> ModelRunner:
    return ModelRunner(path, placement=Placement.on(host_cpu(), 2))


def test_rewrite_helper_keeps_a_good_file_good(tiny: Path, tmp_path: Path) -> None:
    copy = _rewrite(tiny, tmp_path / "copy.gguf")
    a, b = GGUFFile(tiny), GGUFFile(copy)
    assert a.keys() == b.keys()
    assert all(np.array_equal(a.tensor_bytes(n), b.tensor_bytes(n)) for n in a.tensors)


def test_truncated_tensor_data_names_the_tensor(tiny: Path, tmp_path: Path) -> None:
    data = tiny.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) - 100])
    with pytest.raises(GGUFError, match=r"is truncated: the data of tensor 'output.weight'"):
        GGUFFile(bad)


@pytest.mark.parametrize(
    ("keep", "where"),
    [(2, "the magic number"), (30, "metadata key #0"), (2000, "metadata key 'tokenizer.ggml")],
)
def test_truncated_header_says_where(tiny: Path, tmp_path: Path, keep: int, where: str) -> None:
    bad = tmp_path / "head.gguf"
    bad.write_bytes(tiny.read_bytes()[:keep])
    with pytest.raises(GGUFError, match="truncated") as e:
        GGUFFile(bad)
    assert where in str(e.value)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(GGUFError, match=r"not a GGUF file: it starts with b'PK"):
        GGUFFile(tmp_path / "x.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(GGUFError, match="is empty"):
        GGUFFile(tmp_path / "empty.gguf")


def test_unknown_tensor_type_id_names_the_tensor(tiny: Path, tmp_path: Path) -> None:
    bad = tmp_path / "type99.gguf"
    bad.write_bytes(tiny.read_bytes())
    r = GGUFReader(bad, "r+")
    victim = r.tensors[3]
    victim.field.parts[4][0] = 99  # the tensor info's type field, written through the mapping
    r.data.flush()
    del r
    with pytest.raises(GGUFError, match=rf"tensor '{victim.name}' has unknown type id 99"):
        GGUFFile(bad)


def test_unsupported_tensor_type_names_tensor_and_type(tiny: Path, tmp_path: Path) -> None:
    """MXFP4 is a real ggml type (the gguf reader knows it) that tensorplug cannot compute."""

    def to_mxfp4(name: str, data: np.ndarray, raw: GGMLQuantizationType) -> tuple[np.ndarray, Any]:
        if name != "output.weight":
            return data, raw
        return np.zeros((320, 34), np.uint8), GGMLQuantizationType.MXFP4  # 2 blocks of 17 B

    bad = _rewrite(tiny, tmp_path / "mxfp4.gguf", tensors=to_mxfp4)
    f = GGUFFile(bad)  # the file itself is fine
    assert f.tensors["output.weight"].type_name == "MXFP4"
    with pytest.raises(GGUFError, match=r"tensor 'output.weight' is stored as MXFP4"):
        LlamaWeights.from_gguf(f, LlamaConfig.from_gguf(f))


@pytest.mark.parametrize(
    "key",
    ["llama.embedding_length", "llama.block_count", "llama.attention.head_count",
     "llama.attention.layer_norm_rms_epsilon", "llama.context_length"],
)  # fmt: skip
def test_missing_required_metadata_names_the_key(tiny: Path, tmp_path: Path, key: str) -> None:
    bad = _rewrite(tiny, tmp_path / "nokey.gguf", drop=[key])
    with pytest.raises(GGUFError, match=rf"required metadata key '{key}' is missing"):
        _open_llama(bad)


def test_optional_metadata_has_llama_defaults(tiny: Path, tmp_path: Path) -> None:
    path = _rewrite(
        tiny, tmp_path / "defaults.gguf",
        drop=["llama.attention.head_count_kv", "llama.rope.dimension_count",
              "llama.rope.freq_base", "llama.vocab_size"],
        tensors=lambda n, d, r: (d, r) if "attn_k" not in n and "attn_v" not in n
        else (np.concatenate([d, d]), r),  # MHA: as many KV heads as heads
    )  # fmt: skip
    cfg = LlamaConfig.from_gguf(GGUFFile(path))
    assert (cfg.n_head_kv, cfg.n_rot, cfg.rope_base, cfg.n_vocab) == (4, 16, 10000.0, 320)


def test_wrong_value_type_and_architecture(tiny: Path, tmp_path: Path) -> None:
    bad = _rewrite(
        tiny, tmp_path / "str.gguf", change={"llama.block_count": ("two", GGUFValueType.STRING)}
    )
    with pytest.raises(GGUFError, match=r"'llama.block_count' should be int, but holds str 'two'"):
        _open_llama(bad)
    other = _rewrite(
        tiny,
        tmp_path / "arch.gguf",
        change={"general.architecture": ("gpt2", GGUFValueType.STRING)},
    )
    with pytest.raises(GGUFError, match="general.architecture is 'gpt2'"):
        _open_llama(other)


def test_tensor_shape_that_contradicts_metadata(tiny: Path, tmp_path: Path) -> None:
    def narrow(name: str, data: np.ndarray, raw: GGMLQuantizationType) -> tuple[np.ndarray, Any]:
        return (data[:32], raw) if name == "blk.1.ffn_up.weight" else (data, raw)

    bad = _rewrite(tiny, tmp_path / "shape.gguf", tensors=narrow)
    with pytest.raises(
        GGUFError, match=r"tensor 'blk.1.ffn_up.weight' \(Q4_0\[32, 64\]\) has shape \(32, 64\), "
        r"but the model needs \(128, 64\) \(from llama.embedding_length=64.*feed_forward_length"
    ):  # fmt: skip
        _open_llama(bad)


def test_missing_tensor_is_named(tiny: Path, tmp_path: Path) -> None:
    bad = _rewrite(tiny, tmp_path / "missing.gguf", skip_tensors=["blk.1.attn_v.weight"])
    with pytest.raises(GGUFError, match="tensor 'blk.1.attn_v.weight' is missing"):
        _open_llama(bad)
