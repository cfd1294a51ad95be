"""The gates every kernel passes in every dialect, on a machine without a GPU.

* ``opencl``: the program is built by every OpenCL device pyopencl finds (PoCL in CI),
  as shipped and with ``-DTP_PORTABLE`` (every primitive from its portable fallback).
  The numbers are checked elsewhere: ``tensorplug check --backend OpenCL0`` and the
  test suite run these kernels against the CPU backend.
* ``cuda``: NVRTC (through cupy; no GPU or driver needed) compiles the program for each
  architecture in :data:`CUDA_ARCHS`, and once more with ``-DTP_PORTABLE``; any error or
  warning fails. Registers and spills per kernel are reported from ptxas.
* ``msl``: a host C++ compiler type-checks the Metal text against ``mslshim/``, a stub
  of the Metal standard library (see its header for what that does and does not prove).

Each gate returns one :class:`Result` per kernel; the command line
(``python -m tensorplug_kernels check``) prints them and exits non-zero on any failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources

from .abi import parse
from .diagnostics import PRELUDE, Diagnostic, diagnostics
from .source import Dialect, Source, body_sources, render

__all__ = ["CUDA_ARCHS", "GATES", "Result", "check_cuda", "check_msl", "check_opencl"]

#: GPU architectures the CUDA text must compile for: Volta, Ampere (A100, RTX 30),
#: Ada (RTX 40, L4), Hopper (H100/H200); those the installed NVRTC no longer supports
#: (CUDA 13 dropped Volta) are named and skipped.
CUDA_ARCHS = ("sm_70", "sm_80", "sm_86", "sm_89", "sm_90")

#: The work-group size the gates compile with (a multiple of 32, as CUDA and Metal need).
GATE_WG = 128


@dataclass
class Result:
    """One kernel in one dialect: passed, failed (with the messages), or skipped (the
    gate could not run here, with the reason)."""

    dialect: Dialect
    kernel: str
    status: str  # "ok", "FAIL" or "skip"
    detail: str = ""
    messages: list[Diagnostic] = field(default_factory=list)


def _kernels(sources: tuple[Source, ...]) -> list[str]:
    return list(parse(sources))


def _results(
    dialect: Dialect,
    sources: tuple[Source, ...],
    failures: list[tuple[str, str, list[Diagnostic]]],
    details: dict[str, str] | None = None,
) -> list[Result]:
    """Per kernel: failed where a build's messages point into it (or into a prelude,
    or nowhere we can place), else ok with its details."""
    details = details or {}
    out = []
    for kernel in _kernels(sources):
        mine: list[Diagnostic] = []
        builds = []
        for build, log_tail, diags in failures:
            hits = [d for d in diags if d.kernel in (kernel, PRELUDE)]
            unplaced = not any(d.kernel for d in diags)
            if hits or unplaced:
                mine += hits
                builds.append(build if hits else f"{build} (failed elsewhere: {log_tail})")
        if builds:
            out.append(Result(dialect, kernel, "FAIL", "; ".join(builds), mine))
        else:
            out.append(Result(dialect, kernel, "ok", details.get(kernel, "")))
    return out


# -- OpenCL ---------------------------------------------------------------------------------


def check_opencl(sources: tuple[Source, ...] | None = None) -> list[Result]:
    sources = body_sources() if sources is None else sources
    try:
        import pyopencl as cl

        from .opencl_devices import opencl_devices

        devices = opencl_devices()  # the plugin's: the host CPU once, through the newest PoCL
    except Exception as e:  # no pyopencl, or no driver at all
        return [Result("opencl", k, "skip", f"no OpenCL device ({e})") for k in _kernels(sources)]
    if not devices:
        return [Result("opencl", k, "skip", "no OpenCL device") for k in _kernels(sources)]
    text = render("opencl", sources).text
    failures: list[tuple[str, str, list[Diagnostic]]] = []
    built: list[str] = []
    for dev in devices:
        ctx = cl.Context([dev])
        for extra in ([], ["-DTP_PORTABLE"]):
            name = f"{dev.name.strip()}{' portable' if extra else ''}"
            try:
                prg = cl.Program(ctx, text).build(options=[f"-DWG={GATE_WG}", *extra])
                names = set(prg.get_info(cl.program_info.KERNEL_NAMES).split(";"))
                missing = sorted(set(_kernels(sources)) - names)
                if missing:
                    failures.append((name, f"kernels missing: {missing}", []))
                built.append(name)
            except cl.Error as e:
                log = str(e)
                failures.append((name, log[-300:], diagnostics(log, sources)))
    return _results("opencl", sources, failures, dict.fromkeys(_kernels(sources), ", ".join(built)))


# -- CUDA -------------------------------------------------------------------------------------

#: NVRTC 12.9 notes that sm_70 is deprecated: a fact about the toolchain, not a
#: warning about our kernels, so it is the one warning line the gate lets through.
_TOOLCHAIN_NOTICES = ("Architectures prior to",)

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\w+)")
_SPILL = re.compile(r"(\d+) bytes spill stores")
_REGS = re.compile(r"Used (\d+) registers")


def _nvrtc(text: str, arch: str, extra: list[str]) -> tuple[bool, str]:
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(text, "tensorplug_kernels.cu", [], [])
    try:
        options = [f"--gpu-architecture={arch}", "--std=c++17", f"-DWG={GATE_WG}",
                   "--ptxas-options=-v", *extra]  # fmt: skip
        try:
            nvrtc.compileProgram(prog, options)
            ok = True
        except nvrtc.NVRTCError:
            ok = False
        return ok, nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def _ptxas_usage(log: str) -> dict[str, tuple[int, int]]:
    """kernel -> (registers, spill-store bytes) from ptxas's verbose output."""
    regs: dict[str, int] = {}
    spills: dict[str, int] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
        elif m := _PROPS.search(line):
            props = m.group(1)
        elif (m := _REGS.search(line)) and entry:
            regs[entry] = int(m.group(1))
        elif (m := _SPILL.search(line)) and props:
            spills[props] = int(m.group(1))
    return {k: (r, spills.get(k, 0)) for k, r in regs.items()}


def _supported(
    archs: tuple[str, ...], nvrtc_archs: tuple[int, ...]
) -> tuple[tuple[str, ...], list[str]]:
    """The architectures of ``archs`` this NVRTC compiles for, and those it dropped.

    Each CUDA major release drops the oldest ones (CUDA 13: everything before Turing,
    sm_75, Volta's sm_70 among them), and no option brings them back: the gate checks the
    text for the rest and names what it could not build, rather than failing every kernel
    on a toolchain fact.
    """
    known = {f"sm_{a}" for a in nvrtc_archs}
    return tuple(a for a in archs if a in known), [a for a in archs if a not in known]


def check_cuda(
    sources: tuple[Source, ...] | None = None, archs: tuple[str, ...] = CUDA_ARCHS
) -> list[Result]:
    sources = body_sources() if sources is None else sources
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # cupy or the NVRTC library missing
        reason = (f"NVRTC is not available ({type(e).__name__}: {e}); "
                  'pip install -e "plugins/kernels[check]"')  # fmt: skip
        return [Result("cuda", k, "skip", reason) for k in _kernels(sources)]
    archs, dropped = _supported(archs, nvrtc.getSupportedArchs())
    if not archs:
        reason = (f"NVRTC {'.'.join(map(str, nvrtc.getVersion()))} compiles none of "
                  f"{', '.join(dropped)}")  # fmt: skip
        return [Result("cuda", k, "FAIL", reason) for k in _kernels(sources)]
    text = render("cuda", sources).text
    builds: list[tuple[str, list[str]]] = [(arch, []) for arch in archs]
    builds.append((archs[-1], ["-DTP_PORTABLE"]))
    workers = max(1, min(len(builds), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:  # NVRTC releases the GIL
        logs = list(pool.map(lambda b: _nvrtc(text, b[0], b[1]), builds))
    failures: list[tuple[str, str, list[Diagnostic]]] = []
    usage: dict[str, list[str]] = {}
    for (arch, extra), (ok, log) in zip(builds, logs, strict=True):
        name = f"{arch}{' portable' if extra else ''}"
        diags = diagnostics(log, sources)
        warned = [ln for ln in log.splitlines()
                  if "warning" in ln and not any(n in ln for n in _TOOLCHAIN_NOTICES)]  # fmt: skip
        if not ok or warned:
            failures.append((name, log.strip()[-300:], diags))
        if not extra:
            for k, (r, s) in _ptxas_usage(log).items():
                usage.setdefault(k, []).append(
                    f"{arch} {r} regs" + (f" {s} B spilled" if s else "")
                )
    not_built = f" (this NVRTC dropped {', '.join(dropped)})" if dropped else ""
    details = {k: f"{', '.join(archs)} + portable{not_built}; " + "; ".join(v[:1] + v[-1:])
               for k, v in usage.items()}  # fmt: skip
    return _results("cuda", sources, failures, details)


# -- Metal ------------------------------------------------------------------------------------


def _cxx() -> str | None:
    for candidate in (os.environ.get("CXX"), "clang++", "g++", "c++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def check_msl(sources: tuple[Source, ...] | None = None) -> list[Result]:
    sources = body_sources() if sources is None else sources
    cxx = _cxx()
    if cxx is None:
        reason = "no C++ compiler (set CXX, or install g++ or clang++)"
        return [Result("msl", k, "skip", reason) for k in _kernels(sources)]
    shim = resources.files(__package__).joinpath("mslshim")
    text = render("msl", sources).text
    failures: list[tuple[str, str, list[Diagnostic]]] = []
    with tempfile.TemporaryDirectory() as tmp, resources.as_file(shim) as shim_dir:
        path = os.path.join(tmp, "tensorplug_kernels.metal")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        for extra in ([], ["-DTP_PORTABLE"]):
            cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                   "-Wno-unknown-pragmas", "-Wno-attributes", "-Wno-unused-parameter",
                   "-D__METAL_VERSION__=300", f"-DWG={GATE_WG}", *extra,
                   "-I", str(shim_dir), "-x", "c++", path]  # fmt: skip
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                name = f"{os.path.basename(cxx)}{' portable' if extra else ''}"
                failures.append((name, r.stderr.strip()[-300:], diagnostics(r.stderr, sources)))
    detail = f"{os.path.basename(cxx)} -fsyntax-only against mslshim, as shipped and portable"
    return _results("msl", sources, failures, dict.fromkeys(_kernels(sources), detail))


#: The gates by dialect.
GATES: dict[Dialect, Callable[..., list[Result]]] = {
    "opencl": check_opencl,
    "cuda": check_cuda,
    "msl": check_msl,
}
