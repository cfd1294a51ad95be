"""Where tensorplug's resident memory goes from launch to the first tokens, beside llama.cpp's.

    python benchmarks/profile_memory.py [--models 100M:q4_0,PATH.gguf,...] [--threads 2]
        [--prompt 128] [--gen 8] [--batch 128] [--llama-python PATH]

Each model runs in two fresh processes, one per engine, loaded as
``benchmarks/bench_vs_llamacpp.py`` loads it (same context of prompt + gen + 8 tokens,
same batch, same threads, F16 KV cache; tensorplug on the CPU only). After each stage of
loading and running, the process reads its own ``/proc/self/status``: resident memory
now (``VmRSS``), split into anonymous pages (``RssAnon``: the heap, numpy arrays, numba's
compiled code, repacked weights, KV cache, compute buffers) and file-backed ones
(``RssFile``: shared libraries and the model file's mapped pages), and the peak so far
(``VmHWM``, which ``bench_vs_llamacpp.py`` compares too). The
stages of tensorplug: the bare interpreter, ``import numpy``, ``import numba`` (with
llvmlite), ``import tensorplug``, plugin discovery (every installed backend; the
OpenCL plugin with pocl loads its driver here), opening the GGUF file (metadata), the
tokenizer's vocabulary, weights copied into the CPU's repacked buffers, weights mapped
from the file, the KV cache, the compute buffers reserved, the warm-up steps (numba's
cache loads: compiled kernel code), the first prompt, and generation. llama.cpp's
stages are coarser (its loader is one call): interpreter, numpy, ``import llama_cpp``,
model and context, warm-up, prompt, generation. Model sizes are ``SIZE:TYPE`` of the
tiny-model writer (``100M``, ``660M``, as in ``bench_vs_llamacpp.py``) or paths of
``.gguf`` files. Memory figures do not depend on what else the machine runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_llamacpp import (  # the benchmark's models and interpreters
    AUTO,
    BUILD_HINT,
    Spec,
    add_run_arguments,
    find_llama_python,
    model_path,
    parse_counts,
    parse_models,
    prompt_tokens,
)

#: ``/proc/self/status`` fields recorded at each stage
FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")
Stage = tuple[str, dict[str, float]]


def status_mb() -> dict[str, float]:
    """This process's memory now, MB (Linux's ``/proc/self/status``; empty elsewhere)."""
    found: dict[str, float] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in FIELDS:
                    found[key] = int(value.split()[0]) * 1024 / 1e6
    except OSError:
        pass
    return found


class Recorder:
    """Memory after each named stage, in the order they happened."""

    def __init__(self) -> None:
        self.stages: list[Stage] = []

    def mark(self, label: str) -> None:
        self.stages.append((label, status_mb()))

    def after(self, owner: Any, name: str, label: str) -> None:
        """Mark ``label`` each time ``owner.name`` (a function or method) returns."""
        original: Callable[..., Any] = getattr(owner, name)

        def marked(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self.mark(label)
            return result

        setattr(owner, name, marked)


def worker_tensorplug(path: str, threads: int, n_prompt: int, n_gen: int, batch: int) -> list:
    rec = Recorder()
    rec.mark("interpreter")
    import numpy  # noqa: F401  # the stage is the import

    rec.mark("import numpy")
    import numba  # noqa: F401

    rec.mark("import numba (llvmlite)")
    import tensorplug  # noqa: F401

    rec.mark("import tensorplug")
    from tensorplug import registry

    registry.load_all()
    rec.mark("plugin discovery")
    from tensorplug import gguf
    from tensorplug_llm import model as llm_model
    from tensorplug_llm import runner, tokenizer
    from tensorplug_llm.placement import Placement
    from tensorplug_llm.runner import ModelRunner

    rec.mark("import tensorplug_llm")
    rec.after(tokenizer.Vocab, "from_gguf", "vocabulary")
    rec.after(llm_model.LlamaWeights, "from_gguf", "weights described")
    rec.after(gguf.GGUFFile, "upload_tensors", "weights copied (repacked)")
    rec.after(gguf.GGUFFile, "map_tensors", "weights mapped")
    rec.after(ModelRunner, "_load", "KV cache")
    rec.after(runner.Scheduler, "reserve", "compute buffers reserved")
    rec.after(ModelRunner, "warm_up", "warm-up (numba cache loads)")
    file = gguf.GGUFFile(path)
    rec.mark("GGUF opened (metadata)")
    n_layer = int(file.value(f"{file.architecture}.block_count", int))
    placement = Placement.on(registry.dev_by_name("CPU"), n_layer)  # type: ignore[arg-type]
    m = ModelRunner(file, placement=placement, n_ctx=n_prompt + n_gen + 8, n_batch=batch,
              n_threads=None if threads == AUTO else threads, warmup=False)  # fmt: skip
    m.warm_up(n_prompt)  # as bench_vs_llamacpp.py (and `tensorplug run`) warm up
    prompt = prompt_tokens(n_prompt, m.config.n_vocab)
    tok = int(m.eval(prompt).argmax())
    rec.mark(f"first prompt ({n_prompt} tokens)")
    for _ in range(n_gen):
        tok = int(m.eval([tok]).argmax())
    rec.mark(f"generation ({n_gen} tokens)")
    return rec.stages


def worker_llamacpp(path: str, threads: int, n_prompt: int, n_gen: int, batch: int) -> list:
    import os

    rec = Recorder()
    rec.mark("interpreter")
    import numpy  # noqa: F401

    rec.mark("import numpy")
    import llama_cpp

    rec.mark("import llama_cpp")
    threads = threads or os.cpu_count() or 1
    llm = llama_cpp.Llama(path, n_ctx=n_prompt + n_gen + 8, n_threads=threads,
                          n_threads_batch=threads, n_batch=batch, n_ubatch=batch,
                          verbose=False)  # fmt: skip
    rec.mark("model and context loaded")
    n_vocab = llm.n_vocab()
    llm.eval(prompt_tokens(8, n_vocab))
    llm.reset()
    rec.mark("warm-up")
    prompt = prompt_tokens(n_prompt, n_vocab)
    llm.eval(prompt)
    rec.mark(f"first prompt ({n_prompt} tokens)")
    for i in range(n_gen):
        llm.eval([prompt[i % n_prompt]])
    rec.mark(f"generation ({n_gen} tokens)")
    return rec.stages


def run_worker(exe: str, engine: str, path: Path, threads: int, a: argparse.Namespace) -> list:
    cmd = [exe, __file__, "--worker", engine, "--model", str(path),
           "--threads", str(threads or "auto"), "--prompt", str(a.prompt), "--gen", str(a.gen),
           "--batch", str(a.batch)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed on {path.name}:\n{done.stderr[-2000:]}")
    stages: list = json.loads(done.stdout.strip().splitlines()[-1])
    return stages


def table(engine: str, stages: list) -> str:
    """One line per stage: the memory after it and what it added."""
    lines = [f"  {engine:10} {'stage':34} {'RSS':>7} {'+RSS':>7} {'anon':>7} {'file':>7} "
             f"{'peak':>7}"]  # fmt: skip
    previous = 0.0
    for label, mem in stages:
        rss = mem.get("VmRSS", 0.0)
        lines.append(f"  {'':10} {label:34} {rss:7.1f} {rss - previous:+7.1f} "
                     f"{mem.get('RssAnon', 0.0):7.1f} {mem.get('RssFile', 0.0):7.1f} "
                     f"{mem.get('VmHWM', 0.0):7.1f}")  # fmt: skip
        previous = rss
    return "\n".join(lines)


def peak(stages: list) -> float:
    return max(mem.get("VmHWM", 0.0) for _, mem in stages)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = add_run_arguments(p, "100M:q4_0", "2", 8).parse_args(argv)
    threads = parse_counts(a.threads, "--threads")
    for name in ("prompt", "gen", "batch"):
        if getattr(a, name) < 1:
            raise SystemExit(f"--{name} must be >= 1")
    if a.worker:
        fn = worker_tensorplug if a.worker == "tensorplug" else worker_llamacpp
        print(json.dumps(fn(a.model, threads[0], a.prompt, a.gen, a.batch)))
        return 0
    specs: list[Spec] = parse_models(a.models)
    llama_python = find_llama_python(a.llama_python)
    if llama_python is None:
        print(BUILD_HINT, file=sys.stderr)
    print(f"resident memory, MB (1e6 bytes), after each stage; prompt {a.prompt} tokens in "
          f"batches of {a.batch}, {a.gen} generated, F16 KV cache; anon: anonymous pages, "
          "file: file-backed (libraries, the mapped model), peak: VmHWM so far")  # fmt: skip
    for spec in specs:
        path = model_path(spec, a.cache)
        for n in threads:
            started = time.perf_counter()
            ours = run_worker(sys.executable, "tensorplug", path, n, a)
            print(f"\n{spec.name} ({path.name}), {n or 'auto'} threads")
            print(table("tensorplug", ours))
            if llama_python is not None:
                theirs = run_worker(llama_python, "llamacpp", path, n, a)
                print(table("llama.cpp", theirs))
                ratio = peak(ours) / peak(theirs)
                print(f"  peak: tensorplug {peak(ours):.1f} MB, llama.cpp {peak(theirs):.1f} MB, "
                      f"ratio {ratio:.2f}  ({time.perf_counter() - started:.0f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
