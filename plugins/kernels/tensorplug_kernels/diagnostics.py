"""Compiler messages mapped back to the kernels they are about.

Every compiler here (PoCL's clang, NVRTC, g++ on the Metal text) reports positions in
the names of the ``#line`` directives the renderer writes, so a message points at a
fragment and a line. This finds the kernel enclosing that line, or says the message is
about a prelude (then every kernel is affected).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .source import Source

__all__ = ["PRELUDE", "Diagnostic", "diagnostics", "enclosing_kernel"]

#: What :attr:`Diagnostic.kernel` says for a message inside a prelude.
PRELUDE = "<prelude>"

# file(line): error ... (NVRTC)  |  file:line[:col]: error ... (clang, g++)
_MESSAGE = re.compile(
    r"^(?P<file>[^\s:()]+?)(?:\((?P<l1>\d+)\)|:(?P<l2>\d+)(?::\d+)?):\s*"
    r"(?:fatal\s+)?(?P<kind>error|warning)\b[^:]*:?\s*(?P<text>.*)$"
)
# error: file:line:col: ... (PoCL's build log)
_MESSAGE_KIND_FIRST = re.compile(
    r"^(?P<kind>error|warning):\s*(?P<file>[^\s:()]+?):(?P<l2>\d+)(?::\d+)?:\s*(?P<text>.*)$"
)
_KERNEL_DEF = re.compile(r"^\s*TP_KERNEL\s+(?:TP_REQD_GROUP\([^)]*\)\s*)?(\w+)\s*\(", re.MULTILINE)


@dataclass(frozen=True)
class Diagnostic:
    kind: str  # "error" or "warning"
    where: str  # fragment:line
    kernel: str | None  # the enclosing kernel, PRELUDE, or None between kernels
    text: str


def enclosing_kernel(src: Source, line: int) -> str | None:
    """The kernel whose definition starts last at or before ``line`` of ``src``."""
    found = None
    for k in _KERNEL_DEF.finditer(src.text):
        if src.text.count("\n", 0, k.start()) + 1 <= line:
            found = k.group(1)
    # in a template instance the kernel is named by a macro parameter
    return dict(src.macros).get(found or "", found)


def diagnostics(log: str, sources: tuple[Source, ...]) -> list[Diagnostic]:
    """Every error and warning of a compiler log, each with the kernel it is in."""
    by_name = {s.name: s for s in sources}
    out = []
    for raw in log.splitlines():
        m = _MESSAGE.match(raw.strip()) or _MESSAGE_KIND_FIRST.match(raw.strip())
        if m is None:
            continue
        groups = m.groupdict()
        file, line = m.group("file"), int(groups.get("l1") or groups["l2"])
        if file.startswith("dialects/"):
            kernel: str | None = PRELUDE
        elif file in by_name:
            kernel = enclosing_kernel(by_name[file], line)
        else:
            kernel = None
        out.append(Diagnostic(m.group("kind"), f"{file}:{line}", kernel, m.group("text").strip()))
    return out
