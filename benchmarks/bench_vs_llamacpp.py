"""tensorplug's CPU backend against llama.cpp on the same models, same machine, same run.

    python benchmarks/bench_vs_llamacpp.py [--models 100M:q4_0,100M:q8_0,100M:q4_k]
        [--threads 1,2,auto] [--prompt 128] [--gen 32] [--batch 128] [--repeats 2]
        [--rounds 3] [--cold 1] [--load N] [--as-avx2] [--llama-python PATH]

Models are written once into ``--cache`` by the tiny-model writer (random weights, a
llama graph): ``100M`` (8 blocks, n_embd 768, 12 heads / 4 KV heads, n_ff 2048, vocab
32000), ``660M`` (TinyLlama's widths, 12 blocks: n_embd 2048, 32 / 4 heads, n_ff
5632) and ``270M``, Gemma 3 270M's graph and shapes (``gemma3``: 18 blocks, n_embd 640,
4 / 1 heads of 256, n_ff 2048, vocab 262,144, a 512-token window on 5 blocks of 6; every
matrix of the one type, the token embeddings too). Each entry is ``size:type``, or the
path of a downloaded ``.gguf`` (a real model: SmolLM2, Gemma 3 …), measured as it is.

Every measurement is a fresh process — tensorplug's runner, or llama.cpp through
llama-cpp-python (an interpreter that has it: this one, ``--llama-python``, or
``~/peers/bin/python``; without one the script says how to build it, CPU-only, 5–15
minutes) — run interleaved (tensorplug, llama.cpp, tensorplug, …) ``--rounds`` times, so
a slow minute of the machine hurts both. A process loads the model, evaluates a warm-up,
then a ``--prompt``-token prompt in batches of ``--batch`` (llama.cpp's ``n_batch``;
tensorplug's ``n_batch``) and ``--gen`` greedy single-token steps (each engine feeds
back its own argmax, as a generation does: each step reads a new token's embedding row),
then the same prompt ``--repeats`` times more from an empty context (llama-bench's way:
steady throughput, the median of the repeats), all with an F16 KV cache, with
``--threads`` threads (tensorplug: its numba and worker-pool threads; llama.cpp:
``n_threads``). The first prompt is what a user waits for. tensorplug's worker warms up
as ``tensorplug run`` does, knowing the prompt's length: the plan of the prompt's first
batch is built while loading (``ModelRunner.warm_up(n_prompt)``), so the first prompt
does not include it (a new length, a new plan: a noticeable share of a small model's
first prompt), and the launch column does. ``auto`` runs each engine as a user gets it
without ``-t``: tensorplug's runner with its thread governor (every core, fewer for
generation steps while timing shows other work holding the cores), llama.cpp with one
thread per core (llama-cli's default on a machine without SMT). The table gives tokens/s
as median (min–max) per engine, and the ratio tensorplug / llama.cpp (above 1.00
tensorplug is faster) as the median of each round's own ratio: the two runs of a round
are seconds apart, so a slow phase of a shared machine cancels out of it.

Both engines' own packages are compiled to bytecode first, as installing them does
(:func:`compile_bytecode`), so that no timed launch compiles a source file.

tensorplug's worker loads the model as ``tensorplug run`` does, freezing what lives as
long as the process out of the garbage collector's way once it is loaded (the command
does so; the library leaves it to the program that owns the process).

Each process also reports when its first generated token came, counted from the
moment the driver started it (interpreter, imports, loading, warm-up and the first
prompt: what a user waits for after pressing enter; llama.cpp's warm-up evaluation is
in it too, as llama-cli runs one), and its peak resident memory (``ru_maxrss``; where
it goes, stage by stage: ``benchmarks/profile_memory.py``). A
second table gives both per engine, the medians of the rounds, and ``--cold`` (1)
more tensorplug runs per model and thread count with numba's disk cache empty (a
fresh ``NUMBA_CACHE_DIR``): a new install's first run, which compiles the kernels it
uses (0: none; they take tens of seconds each).

``--load N`` starts N busy processes (a Python loop each) for the whole run, to see
how each engine copes with a machine that is doing something else.

``--time-limit S`` ends any measurement process still running after S seconds (under
load, llama.cpp's spinning threads made one 100M run take minutes, and SmolLM2's did
not end within ten). A worker reports each part as it finishes (first prompt,
generation, prompts again), so an ended one still gives what it finished, and for the
first prompt or the generation it was in, a bound: it had not done their tokens in the
time it had, so its tokens/s was below ``tokens / time`` (the prompts again, a median,
and what it never began are unknown: ``-``). Such a cell is printed with ``<`` (each
round's figure is a value or an upper bound, so their median bounds the true median
from above), a ratio with ``>`` or ``<`` as the bounded engine turns it, ``?`` when
both were bounded; a launch that never reached its first token is ``>`` the limit, and
a peak RSS is the peak so far (``>``).

``--as-avx2`` measures both engines as an AVX2 host (Haswell to Zen 3: no AVX-512, no
VNNI) runs them, on a machine that has more: tensorplug's workers compile and run an
AVX2 host's kernels (``NUMBA_CPU_FEATURES``, ``tensorplug_cpu.system.AVX2_FEATURES``)
and OpenBLAS its Haswell ones, and llama.cpp must be a build without AVX-512 (the
script refuses one whose system information names it, and says how to build one). The
cores, caches and memory stay this machine's, so these are the AVX2 code paths' figures,
not an AVX2 machine's. numpy's own loops still take what the CPU has.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perf_docs  # docs/performance.md's tables (--write-docs)

SIZES: dict[str, dict[str, int]] = {
    "100M": {"n_vocab": 32000, "n_embd": 768, "n_layer": 8, "n_head": 12, "n_head_kv": 4,
             "n_ff": 2048, "n_ctx": 512},
    "660M": {"n_vocab": 32000, "n_embd": 2048, "n_layer": 12, "n_head": 32, "n_head_kv": 4,
             "n_ff": 5632, "n_ctx": 512},
    "270M": {"n_vocab": 262144, "n_embd": 640, "n_layer": 18, "n_head": 4, "n_head_kv": 1,
             "head_dim": 256, "n_ff": 2048, "n_ctx": 2048},
}  # fmt: skip
#: sizes written in another architecture than llama's, with the writer's keywords for it
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "270M": {"arch": "gemma3", "sliding_window": 512, "rope_base": 1e6, "eps": 1e-6},
}
BUILD_HINT = (
    "llama.cpp is measured through llama-cpp-python, which is not installed for any "
    "interpreter found. Build it once, CPU-only (5-15 minutes), in a venv of its own:\n"
    "  python3 -m venv ~/peers && ~/peers/bin/pip install numpy gguf\n"
    '  CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF" '
    "~/peers/bin/pip install llama-cpp-python==0.3.36\n"
    "then run this script again (it finds ~/peers/bin/python), or pass --llama-python."
)

AVX2_BUILD_HINT = (
    "--as-avx2 compares the engines as an AVX2 host (no AVX-512, no VNNI) runs them, so "
    "llama.cpp must be built without them too; {exe} reports: {info}\nBuild one once, "
    "in a venv of its own:\n"
    "  python3 -m venv ~/peers-avx2\n"
    '  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON '
    "-DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF "
    '-DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF" ~/peers-avx2/bin/pip install --no-cache-dir '
    "--no-binary llama-cpp-python llama-cpp-python==0.3.36\n"
    "(--no-cache-dir: pip's wheel cache, shared by every venv, would hand back a native "
    "build made before, whatever CMAKE_ARGS say), then pass --llama-python "
    "~/peers-avx2/bin/python."
)
#: what llama.cpp's system information names for instructions an AVX2 host lacks
_BEYOND_AVX2 = ("AVX512 = 1", "AVX512_VNNI = 1", "AVX_VNNI = 1", "AVX512_BF16 = 1", "AMX")


@dataclass(frozen=True)
class Spec:
    size: str
    type: str
    file: Path | None = None  # a given GGUF file instead of a written model

    @property
    def name(self) -> str:
        return self.type if self.file is not None else f"{self.size}:{self.type}"


def parse_models(text: str) -> list[Spec]:
    specs = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        if item.endswith(".gguf"):
            file = Path(item).expanduser()
            if not file.is_file():
                raise SystemExit(f"model file {item!r} does not exist")
            specs.append(Spec("file", file.stem[:12], file))
            continue
        size, _, wtype = item.partition(":")
        if size not in SIZES or not wtype:
            raise SystemExit(
                f"bad model {item!r}: write SIZE:TYPE with SIZE one of {sorted(SIZES)} and "
                "TYPE a weight type (f32, f16, q8_0, q4_0, q4_k...), or the path of a .gguf"
            )
        specs.append(Spec(size, wtype.lower()))
    if not specs:
        raise SystemExit("--models is empty")
    return specs


#: where the written models are kept (``--cache``)
MODEL_CACHE = Path.home() / ".cache" / "tensorplug-bench"

#: ``--threads auto``: each engine's own choice (see the module's docstring)
AUTO = 0


def parse_counts(text: str, what: str) -> list[int]:
    """Thread counts; ``auto`` is :data:`AUTO`."""
    words = [v.strip() for v in text.split(",") if v.strip()]
    try:
        values = [AUTO if v == "auto" else int(v) for v in words]
    except ValueError:
        values = []
    if not values or any(v < 1 and w != "auto" for v, w in zip(values, words, strict=True)):
        raise SystemExit(
            f"{what} must be a comma-separated list of integers >= 1 or 'auto', got {text!r}"
        )
    return values


def model_path(spec: Spec, cache: Path) -> Path:
    """The model's file, written on first use (the writer is tensorplug's)."""
    from tensorplug_llm.tiny import write_tiny_llama  # deferred: a worker may lack it

    if spec.file is not None:
        return spec.file
    path = cache / f"bench-{spec.size}-{spec.type}.gguf"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"writing {path.name} ...", file=sys.stderr, flush=True)
        partial = path.with_suffix(".partial")
        dims: dict[str, Any] = dict(SIZES[spec.size])  # the writer's **dims: ints
        write_tiny_llama(partial, spec.type, seed=1, **ARCHITECTURES.get(spec.size, {}), **dims)
        partial.rename(path)
    return path


# -- workers: one measurement per process ---------------------------------------------------


def prompt_tokens(n: int, n_vocab: int) -> list[int]:
    """The benchmarks' prompt of ``n`` ids: fixed, and none of the first three (special)."""
    return [(7919 * i + 13) % (n_vocab - 3) + 3 for i in range(n)]


def _again(
    reset: Callable[[], object],
    evaluate: Callable[[list[int]], object],
    prompt: list[int],
    repeats: int,
) -> float:
    """Median tokens/s of ``repeats`` evaluations of ``prompt`` from an empty context."""
    speeds = []
    for _ in range(repeats):
        reset()
        t = time.perf_counter()
        evaluate(prompt)
        speeds.append(len(prompt) / (time.perf_counter() - t))
    return statistics.median(speeds)


def load_tensorplug(path: str | Path, threads: int, n_ctx: int, n_batch: int, warm: int) -> Any:
    """A ``tensorplug_llm.runner.ModelRunner`` of the model at ``path`` on the CPU, loaded as
    ``tensorplug run`` loads it and warmed up for ``warm``-token prompts, with the
    collector's generations as the command leaves them."""
    from tensorplug import registry
    from tensorplug.gguf import GGUFFile
    from tensorplug_llm.placement import Placement
    from tensorplug_llm.runner import ModelRunner

    file = GGUFFile(path)
    n_layer = int(file.value(f"{file.architecture}.block_count", int))
    placement = Placement.on(registry.dev_by_name("CPU"), n_layer)  # type: ignore[arg-type]
    # as `tensorplug run` does before and after loading its model (the process is the
    # command's): the ~150,000 long-lived objects of the imports and the model leave the
    # collector's generations, or loading and the first prompt's new graph set off full
    # collections walking them all (a large share of a small model's first prompt).
    # ModelRunner itself never freezes, so a program's own objects stay collectable
    # (runner.ModelRunner's docstring)
    gc.collect(1)
    gc.freeze()
    m = ModelRunner(file, placement=placement, n_ctx=n_ctx, n_batch=n_batch,
              n_threads=None if threads == AUTO else threads, warmup=False)  # fmt: skip
    m.warm_up(warm)  # as `tensorplug run` warms up: it knows its prompt's length
    gc.collect(1)
    gc.freeze()
    return m


#: a worker's report of what it has finished (:func:`_run_worker` prints each one)
Report = Callable[[dict], None]


def _no_report(part: dict) -> None:
    """What a worker called in-process (the tests) does with its parts: nothing."""


def worker_tensorplug(
    path: str, threads: int, n_prompt: int, n_gen: int, batch: int, repeats: int,
    report: Report = _no_report,
) -> dict:  # fmt: skip
    m = load_tensorplug(path, threads, n_prompt + n_gen + 8, batch, n_prompt)
    prompt = prompt_tokens(n_prompt, m.config.n_vocab)
    m.reset()
    report({"prompt_from": time.time()})
    t0 = time.perf_counter()
    tok = int(m.eval(prompt).argmax())  # eval gives the last token's logits (n_vocab,)
    first_token_at = time.time()
    t1 = time.perf_counter()
    report({"prompt": n_prompt / (t1 - t0), "first_token_at": first_token_at,
            "gen_from": time.time(), "peak_rss_mb": _peak_rss_mb()})  # fmt: skip
    for _ in range(n_gen):
        tok = int(m.eval([tok]).argmax())
    t2 = time.perf_counter()
    report({"gen": n_gen / (t2 - t1), "peak_rss_mb": _peak_rss_mb()})
    again = _again(m.reset, m.eval, prompt, repeats)
    m.close()
    return {"prompt": n_prompt / (t1 - t0), "gen": n_gen / (t2 - t1), "again": again,
            "first_token_at": first_token_at, "peak_rss_mb": _peak_rss_mb()}  # fmt: skip


def worker_llamacpp(
    path: str, threads: int, n_prompt: int, n_gen: int, batch: int, repeats: int,
    report: Report = _no_report,
) -> dict:  # fmt: skip
    import llama_cpp
    import numpy as np

    threads = threads or os.cpu_count() or 1
    llm = llama_cpp.Llama(path, n_ctx=n_prompt + n_gen + 8, n_threads=threads,
                          n_threads_batch=threads, n_batch=batch, n_ubatch=batch,
                          verbose=False)  # fmt: skip
    n_vocab = llm.n_vocab()
    llm.eval(prompt_tokens(8, n_vocab))  # warm-up, as tensorplug's runner does at load
    llm.reset()
    prompt = prompt_tokens(n_prompt, n_vocab)
    report({"prompt_from": time.time()})
    t0 = time.perf_counter()
    llm.eval(prompt)

    def last_argmax() -> int:  # llm.scores holds logits only with logits_all
        row = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.ctypeslib.as_array(row, shape=(n_vocab,)).argmax())

    tok = last_argmax()  # the first token, as tensorplug's
    first_token_at = time.time()
    t1 = time.perf_counter()
    report({"prompt": n_prompt / (t1 - t0), "first_token_at": first_token_at,
            "gen_from": time.time(), "peak_rss_mb": _peak_rss_mb()})  # fmt: skip
    for _ in range(n_gen):  # greedy, as tensorplug's: each step reads a new token's row
        llm.eval([tok])
        tok = last_argmax()
    t2 = time.perf_counter()
    report({"gen": n_gen / (t2 - t1), "peak_rss_mb": _peak_rss_mb()})
    again = _again(llm.reset, llm.eval, prompt, repeats)
    return {"prompt": n_prompt / (t1 - t0), "gen": n_gen / (t2 - t1), "again": again,
            "first_token_at": first_token_at, "peak_rss_mb": _peak_rss_mb()}  # fmt: skip


def _peak_rss_mb() -> float:
    """This process's peak resident memory in MB: Linux's ``VmHWM``, the high-water mark
    of this process's own address space. Not ``ru_maxrss``: Linux carries that across
    ``exec`` from the process that forked it (``exec_mmap`` keeps the old address
    space's mark), so every worker would report at least the driver's own resident size
    (hundreds of MB once it has written the test models, for either engine). Elsewhere
    ``ru_maxrss`` (macOS counts it in bytes)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e6  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6


def _run_worker(args: argparse.Namespace) -> None:
    """One measurement, each finished part printed as a JSON line when it is done (what
    the driver keeps of a process it ends at ``--time-limit``), then the whole."""
    fn = worker_tensorplug if args.worker == "tensorplug" else worker_llamacpp

    def report(part: dict) -> None:
        print(json.dumps(part), flush=True)

    report(fn(args.model, args.threads[0], args.prompt, args.gen, args.batch, args.repeats,
              report))  # fmt: skip


# -- the driver -----------------------------------------------------------------------------


def find_llama_python(given: str | None) -> str | None:
    candidates = [given] if given else [sys.executable, str(Path.home() / "peers/bin/python")]
    for exe in candidates:
        if exe and Path(exe).exists():
            probe = subprocess.run([exe, "-c", "import llama_cpp"], capture_output=True)
            if probe.returncode == 0:
                return exe
    return None


def llama_system_info(exe: str) -> str:
    """llama.cpp's own line of the instructions its build uses (``AVX2 = 1 | …``)."""
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    done = subprocess.run([exe, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "(unknown)"


def own_packages() -> list[str]:
    """What tensorplug's worker imports of tensorplug's, as top-level packages: the
    core, the application, and every backend plugin (discovery imports them all)."""
    from importlib.metadata import entry_points

    plugins = (ep.value.split(":")[0].split(".")[0] for ep in
               entry_points(group="tensorplug.backends"))  # fmt: skip
    return sorted({"tensorplug", "tensorplug_llm", *plugins})


def compile_bytecode(exe: str, packages: Sequence[str]) -> None:
    """Write the bytecode of ``packages`` (top-level names, as ``exe`` imports them)
    before any launch is timed, as installing them does: a checkout's files edited
    since their last import, where ``PYTHONDONTWRITEBYTECODE`` is set (or the folder is
    read-only), were compiled from source at every launch (a noticeable share of
    tensorplug's), which no installed package does. What cannot be written stays as
    it is."""
    code = ("import compileall, importlib.util, sys\n"
            "for name in sys.argv[1:]:\n"
            "    spec = importlib.util.find_spec(name)\n"
            "    for folder in (spec.submodule_search_locations or []) if spec else []:\n"
            "        compileall.compile_dir(folder, quiet=2)\n")  # fmt: skip
    subprocess.run([exe, "-c", code, *packages], capture_output=True)


def worker_env(engine: str, a: argparse.Namespace) -> dict[str, str]:
    """The environment of a worker: ``--as-avx2`` gives tensorplug's an AVX2 host's
    kernels (``NUMBA_CPU_FEATURES``) and OpenBLAS's (its Haswell kernels)."""
    env = dict(os.environ)
    if a.as_avx2 and engine == "tensorplug":
        from tensorplug_cpu.system import AVX2_FEATURES

        env.update(NUMBA_CPU_FEATURES=AVX2_FEATURES, OPENBLAS_CORETYPE="Haswell")
    return env


def measure(
    exe: str, engine: str, path: Path, threads: int, a: argparse.Namespace,
    numba_cache: str | None = None, limited: bool = True,
) -> dict:  # fmt: skip
    """One worker's figures, with ``launch``: seconds from starting it to its first
    generated token, and ``bounds`` (:func:`bounded_result`: empty for a worker that
    ended on its own). ``numba_cache``: the folder numba's disk cache is read from and
    written to (a fresh one: a first run). ``limited``: ended at ``--time-limit``."""
    env = worker_env(engine, a)
    if numba_cache is not None:
        env["NUMBA_CACHE_DIR"] = numba_cache
    if threads != AUTO:
        env.update({name: str(threads) for name in
                    ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                     "NUMBA_NUM_THREADS")})  # fmt: skip
    cmd = [exe, __file__, "--worker", engine, "--model", str(path),
           "--threads", str(threads or "auto"), "--prompt", str(a.prompt), "--gen", str(a.gen),
           "--batch", str(a.batch), "--repeats", str(a.repeats)]  # fmt: skip
    started = time.time()
    limit = a.time_limit if limited and a.time_limit else None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=limit)
    except subprocess.TimeoutExpired as ended:  # killed by run(): what it had finished
        out = ended.stdout.decode(errors="replace") if isinstance(ended.stdout, bytes) else ""
        return bounded_result(out, started, a)
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed on {path.name}:\n{done.stderr[-2000:]}")
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    result["launch"] = result.pop("first_token_at") - started
    result["bounds"] = {}
    return result


def bounded_result(out: str, started: float, a: argparse.Namespace) -> dict:
    """A worker ended at ``--time-limit``, from the parts it printed (``out``): those it
    finished as they are; the first prompt or the generation it was in as an upper
    bound, its tokens over the time it had (``bounds[key] = "<"``); the prompts again (a
    median of several) and what it never began unknown, None (a prompt's speed says
    nothing of a generation's). ``launch`` is ``>`` the limit if no token came; the peak
    RSS is the last it printed (``>``), or None."""
    parts: dict = {}
    for line in out.splitlines():
        try:
            part = json.loads(line)
        except ValueError:  # a line cut short by the kill
            continue
        if isinstance(part, dict):
            parts.update(part)
    deadline = started + a.time_limit
    result: dict = {"bounds": {}, "peak_rss_mb": parts.get("peak_rss_mb")}
    if result["peak_rss_mb"] is not None:
        result["bounds"]["peak_rss_mb"] = ">"
    if "first_token_at" in parts:
        result["launch"] = parts["first_token_at"] - started
    else:
        result["launch"], result["bounds"]["launch"] = float(a.time_limit), ">"
    for key, tokens in (("prompt", a.prompt), ("gen", a.gen)):
        if key in parts:
            result[key] = parts[key]
        elif f"{key}_from" in parts:  # one timed stretch, unfinished when it was ended
            result[key] = tokens / max(deadline - parts[f"{key}_from"], 1e-9)
            result["bounds"][key] = "<"
        else:
            result[key] = None
    # the median of several prompts: one unfinished bounds none of the others
    result["again"] = parts.get("again")
    return result


def measure_cold(path: Path, threads: int, a: argparse.Namespace) -> dict:
    """A tensorplug worker whose numba cache starts empty: a new install's first run.
    Its compile-ahead process (``tensorplug_cpu/kernels/ahead.py``) outlives it, to finish
    the cache for a next run; this cache is thrown away, so it is ended here: left to
    run, it would take a core from the measurements after it (a two-thread prompt at the
    speed of one)."""
    with tempfile.TemporaryDirectory(prefix="tensorplug-cold-numba-") as cache:
        try:
            return measure(sys.executable, "tensorplug", path, threads, a, numba_cache=cache)
        finally:
            end_compilers_of(cache)


def end_compilers_of(cache: str) -> None:
    """Kill the processes whose ``NUMBA_CACHE_DIR`` is ``cache`` (read from ``/proc``;
    elsewhere nothing is found and nothing is done)."""
    wanted = f"NUMBA_CACHE_DIR={cache}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue


def paired_ratio(ours: list[float], theirs: list[float]) -> float:
    """The median of round ``i``'s ``ours[i] / theirs[i]``: a ratio of medians would
    set one round's fast minute against another's slow one."""
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


def _stats(values: list[float | None], mark: str = "", digits: int = 1) -> str:
    """``median (min-max)`` of the known values, the median after ``mark`` (``<``, ``>``:
    some are bounds that way, see ``--time-limit``); ``-`` if none is known."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    median = f"{mark}{statistics.median(known):.{digits}f}"
    return f"{median:>8} ({min(known):.{digits}f}-{max(known):.{digits}f})"


def _mark(runs: list[dict], key: str) -> str:
    """``<`` or ``>`` where some run's ``key`` is a bound that way (``bounds``), ``?``
    if both ways, else nothing."""
    marks = {r.get("bounds", {}).get(key) for r in runs if r.get(key) is not None} - {None}
    return "?" if len(marks) > 1 else next(iter(marks), "")


_OPPOSITE = {"<": ">", ">": "<", "": "", "?": "?"}


def _ratio(ours: list[dict], theirs: list[dict], key: str) -> str:
    """The median of the rounds' ratios of ``key``, from the rounds where both are known:
    a bound in ours bounds the ratio the same way, one in llama.cpp's the other way
    (``?``: both ways, so neither); ``-`` when no round knows both."""
    rounds = [(m, t) for m, t in zip(ours, theirs, strict=True)
              if m.get(key) is not None and t.get(key) is not None]  # fmt: skip
    if not rounds:
        return "-"
    mine, ref = ([r[key] for r in runs] for runs in zip(*rounds, strict=True))
    marks = {_mark([m for m, _ in rounds], key),
             _OPPOSITE[_mark([t for _, t in rounds], key)]} - {""}  # fmt: skip
    mark = "?" if len(marks) > 1 else next(iter(marks), "")
    return f"{mark}{paired_ratio(mine, ref):.2f}"


def compared(ours: list[dict], theirs: list[dict], key: str) -> str:
    """Both engines' ``key`` over the rounds, and the median of the rounds' ratios
    (:func:`_ratio`)."""
    ratio = _ratio(ours, theirs, key)
    # a launch of a few tenths of a second, in tenths, would hide what the ratio is made of
    digits = 2 if key == "launch" else 1
    engines = (_stats([r.get(key) for r in runs], _mark(runs, key), digits)
               for runs in (ours, theirs))  # fmt: skip
    return " ".join(f"{cell:>24}" for cell in engines) + f" {ratio:>6}"


def start_row(ours: list[dict], theirs: list[dict], cold: list[dict]) -> str:
    """Launch to first token (warm; tensorplug's first run) and peak RSS of each engine,
    ratios tensorplug / llama.cpp (below 1.00 tensorplug is quicker, or smaller)."""
    cells = []
    for key in ("launch", "peak_rss_mb"):
        cell = compared(ours, theirs, key)
        if key == "launch":
            first = "-"
            if cold:
                first = f"{_mark(cold, key)}{statistics.median(r[key] for r in cold):.2f}"
            cell += f" {first:>10}"
        cells.append(cell)
    return " | ".join(cells)


#: docs/performance.md's table of this benchmark: a row per model, thread count and
#: run settings on each machine (``--write-docs``)
DOCS_TABLE_NAME = "bench_vs_llamacpp"
DOCS_COLUMNS = (
    "model", "threads", "run", "prompt tok/s: tensorplug / llama.cpp (ratio)",
    "generation tok/s: tensorplug / llama.cpp (ratio)",
    "launch to first token, s: tensorplug / llama.cpp (ratio)",
    "peak RSS, MB: tensorplug / llama.cpp (ratio)", "tensorplug's first run, s",
)  # fmt: skip


def docs_settings(a: argparse.Namespace) -> str:
    """The run's settings as the page's ``run`` column says them: rows measured with
    other settings are other rows."""
    words = [f"prompt {a.prompt}, gen {a.gen}, batch {a.batch}, {a.rounds} rounds"]
    if a.load:
        words.append(f"--load {a.load}")
    if a.as_avx2:
        words.append("--as-avx2")
    return ", ".join(words)


def _median_cell(runs: list[dict], key: str, digits: int) -> str:
    known = [r[key] for r in runs if r.get(key) is not None]
    if not known:
        return "-"
    return f"{_mark(runs, key)}{statistics.median(known):.{digits}f}"


def docs_row(
    model: str, threads: int, a: argparse.Namespace,
    ours: list[dict], theirs: list[dict], cold: list[dict],
) -> list[str]:  # fmt: skip
    """One row of the page's table: each engine's median over the rounds and the
    median of the rounds' ratios, marked as the printed tables mark bounds."""
    cells = [model, str(threads or "auto"), docs_settings(a)]
    for key, digits in (("prompt", 1), ("gen", 1), ("launch", 2), ("peak_rss_mb", 0)):
        cells.append(f"{_median_cell(ours, key, digits)} / {_median_cell(theirs, key, digits)}"
                     f" ({_ratio(ours, theirs, key)})")  # fmt: skip
    cells.append(_median_cell(cold, "launch", 1))
    return cells


def add_run_arguments(
    p: argparse.ArgumentParser, models: str, threads: str, gen: int
) -> argparse.ArgumentParser:
    """The options this benchmark shares with ``profile_memory.py`` (which loads the
    models as it does): models, threads, prompt, generation, batch, the llama.cpp
    interpreter, the model cache, and the hidden worker options."""
    p.add_argument("--models", default=models)
    p.add_argument("--threads", default=threads, help=f"thread counts to run ({threads})")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (128)")
    p.add_argument("--gen", type=int, default=gen, help=f"generated tokens ({gen})")
    p.add_argument("--batch", type=int, default=128, help="prompt batch, both engines (128)")
    p.add_argument("--llama-python", help="interpreter with llama-cpp-python")
    p.add_argument("--cache", type=Path, default=MODEL_CACHE)
    p.add_argument("--worker", choices=["tensorplug", "llamacpp"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(p, "100M:q4_0,100M:q8_0,100M:q4_k", "1,2", 32)
    p.add_argument("--repeats", type=int, default=2,
                   help="prompts again after the first, for steady throughput (2)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    p.add_argument(
        "--cold",
        type=int,
        default=1,
        help="tensorplug runs with numba's cache empty, per model and threads (1)",
    )
    p.add_argument("--load", type=int, default=0, help="busy processes during the run (0)")
    p.add_argument("--time-limit", type=float, default=0,
                   help="seconds after which a measurement process is ended (0: none)")  # fmt: skip
    p.add_argument("--as-avx2", action="store_true",
                   help="both engines as an AVX2 host runs them (on an AVX-512 machine: "
                   "tensorplug's AVX2 kernels, a llama.cpp built for AVX2)")  # fmt: skip
    perf_docs.add_argument(p)
    a = p.parse_args(argv)
    a.threads = parse_counts(a.threads, "--threads")
    for name in ("prompt", "gen", "batch", "repeats", "rounds"):
        if getattr(a, name) < 1:
            raise SystemExit(f"--{name} must be >= 1")
    if a.load < 0 or a.cold < 0 or not a.time_limit >= 0:
        raise SystemExit("--load, --cold and --time-limit must be >= 0")
    if a.worker:
        _run_worker(a)
        return 0
    specs = parse_models(a.models)
    table = perf_docs.Table(DOCS_TABLE_NAME, DOCS_COLUMNS, key_columns=3)
    write_docs = perf_docs.checked_writer(table, a.write_docs)
    llama_python = find_llama_python(a.llama_python)
    if llama_python is None:
        print(BUILD_HINT, file=sys.stderr)
        return 2
    info = llama_system_info(llama_python)
    if a.as_avx2 and any(flag in info for flag in _BEYOND_AVX2):
        print(AVX2_BUILD_HINT.format(exe=llama_python, info=info), file=sys.stderr)
        return 2
    paths = {s: model_path(s, a.cache) for s in specs}
    compile_bytecode(sys.executable, own_packages())
    compile_bytecode(llama_python, ["llama_cpp"])
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    try:
        print(f"{os.cpu_count()} cores, {a.load} busy processes; prompt {a.prompt} tokens in "
              f"batches of {a.batch} (first, then {a.repeats} more: 'again'), {a.gen} "
              f"generated; {a.rounds} interleaved rounds; tokens/s median (min-max), "
              "ratio: median of the rounds' ratios")  # fmt: skip
        kernels = "an AVX2 host's (--as-avx2)" if a.as_avx2 else "this host's"
        print(f"tensorplug: {kernels} kernels; llama.cpp: {info}")
        print(f"{'model':12} {'thr':>4}" + "".join(
            f" | {what + ' tensorplug':>24} {'llama.cpp':>24} {'ratio':>6}"
            for what in ("prompt", "again", "gen")))  # fmt: skip
        starts: list[str] = []
        doc_rows: list[list[str]] = []
        for spec in specs:
            # untimed: numba's disk cache filled with what this model uses, so that no
            # round's launch includes compiling (a first run is measured on its own); at
            # each thread count, which may take kernels another does not (a round on two
            # threads could otherwise compile for many seconds after a fill on one); not
            # ended at --time-limit: compiling takes what it takes
            for threads in a.threads:
                measure(sys.executable, "tensorplug", paths[spec], threads, a, limited=False)
            for threads in a.threads:
                ours: list[dict] = []
                theirs: list[dict] = []
                for _ in range(a.rounds):
                    ours.append(measure(sys.executable, "tensorplug", paths[spec], threads, a))
                    theirs.append(measure(llama_python, "llamacpp", paths[spec], threads, a))
                row = [f"{spec.name:12} {threads or 'auto':>4}"]
                row += [compared(ours, theirs, key) for key in ("prompt", "again", "gen")]
                print(" | ".join(row), flush=True)
                cold = [measure_cold(paths[spec], threads, a) for _ in range(a.cold)]
                starts.append(f"{spec.name:12} {threads or 'auto':>4} | "
                              + start_row(ours, theirs, cold))  # fmt: skip
                doc_rows.append(docs_row(spec.name, threads, a, ours, theirs, cold))
        print("\nlaunch to first token, s (warm caches; tensorplug's first run: numba's cache "
              "empty), and peak RSS, MB: median (min-max)")  # fmt: skip
        print(
            f"{'model':12} {'thr':>4} | {'tensorplug':>24} {'llama.cpp':>24} {'ratio':>6} "
            f"{'first run':>10} | {'RSS tensorplug':>24} {'llama.cpp':>24} {'ratio':>6}"
        )
        print("\n".join(starts))
        if write_docs is not None:
            print("\n" + write_docs(doc_rows))
    finally:
        for proc in busy:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
