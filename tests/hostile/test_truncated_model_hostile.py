"""A model file truncated while it is in use: reading it is a GGUFError saying so, never
a SIGBUS that kills the process; and weights loaded with use_mmap=False (--no-mmap) are
read with file reads, never copied out of the mapping."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorplug_llm.tiny import write_tiny_llama

MESSAGE = "the model file changed or was truncated while in use"

#: Maps the model (or opens it), truncates it after the header, then reads: exit code 3
#: and the message when refused, a signal (negative code) when the read crashed.
CHILD = """
import os, sys
from tensorplug.gguf import GGUFError, GGUFFile
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner

path, mode = sys.argv[1], sys.argv[2]
f = GGUFFile(path)
keep = f.data_offset + 64  # the metadata stays; the weights are gone
try:
    if mode == "mapped":  # the CPU computes from the file's mapping
        model = ModelRunner(f, placement=Placement.on(host_cpu(), 2), warmup=False)
        os.truncate(path, keep)
        model.eval([1, 5, 6])
    elif mode == "no-mmap":  # copies: loading must read the file, not the mapping
        os.truncate(path, keep)
        ModelRunner(f, placement=Placement.on(host_cpu(), 2), warmup=False, use_mmap=False)
    else:  # the bytes of one tensor
        os.truncate(path, keep)
        f.tensor_bytes("output.weight").sum()
except GGUFError as e:
    print(e)
    sys.exit(3)
print("read it")
"""


@pytest.mark.parametrize("mode", ["mapped", "no-mmap", "tensor-bytes"])
def test_a_file_truncated_while_in_use_is_an_error_not_a_crash(tmp_path: Path, mode: str) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", "f32", 0)
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 3, f"exit {done.returncode}: {done.stdout}{done.stderr[-1500:]}"
    assert MESSAGE in done.stdout or "the file ends inside tensor" in done.stdout


def test_no_mmap_loads_with_file_reads(tmp_path: Path) -> None:
    """use_mmap=False copies the weights with file reads; the mapping is not read."""
    from tensorplug.gguf import GGUFFile
    from tensorplug_llm.placement import Placement, host_cpu
    from tensorplug_llm.runner import ModelRunner

    f = GGUFFile(write_tiny_llama(tmp_path / "t.gguf", "f32", 0))
    read: list[str] = []
    original = f.read_into

    def read_into(name: str, *args: Any) -> None:
        read.append(name)
        original(name, *args)

    f.read_into = read_into  # type: ignore[method-assign, assignment]
    f.tensor_bytes = None  # type: ignore[assignment, method-assign]  # the mapping: not used
    with ModelRunner(f, placement=Placement.on(host_cpu(), 2), warmup=False, use_mmap=False) as m:
        m.eval([1, 5, 6])
    assert "token_embd.weight" in read and "blk.1.ffn_down.weight" in read
