"""The glob patterns of the search tools' ``include`` and ``exclude``, as llama.cpp's
``glob_match``: ``*`` and ``?`` stop at ``/``, ``**`` crosses it, ``[a-z]`` and
``[!a-z]`` are classes (an unclosed ``[`` is itself). A pattern without ``/`` matches a
path's last part at any depth; one with ``/`` the whole relative path, anchored with
``**/`` unless it already begins with it or with ``/``."""

from __future__ import annotations

import functools
import re

__all__ = ["glob_match", "path_glob_match"]


@functools.lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and (end := _class_end(pattern, i)) > 0:
            out.append(_class(pattern[i + 1 : end]))
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def _class_end(pattern: str, start: int) -> int:
    """Where the class opened at ``start`` closes (-1: it does not, a literal ``[``);
    a ``]`` or ``-`` first in the class is one of its characters."""
    j = start + 1
    if j < len(pattern) and pattern[j] in "]-":
        j += 1
    end = pattern.find("]", j)
    return end


def _class(body: str) -> str:
    negated = body.startswith("!")
    if negated:
        body = body[1:]
    parts: list[str] = []
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            lo, hi = body[i], body[i + 2]
            parts.append(f"{re.escape(lo)}-{re.escape(hi)}" if lo <= hi else "")
            i += 3
        else:
            parts.append(re.escape(body[i]))
            i += 1
    inner = "".join(parts)
    if not inner:
        return "[^\\s\\S]" if not negated else "[\\s\\S]"
    return f"[{'^' if negated else ''}{inner}]"


def glob_match(pattern: str, text: str) -> bool:
    return _compile(pattern).fullmatch(text) is not None


def path_glob_match(pattern: str, rel: str) -> bool:
    """Whether ``rel`` (a '/'-separated relative path) is one ``pattern`` selects."""
    if "/" not in pattern:
        return glob_match(pattern, rel.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob_match(pattern, rel)
    return glob_match("**/" + pattern, rel)
