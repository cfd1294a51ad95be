"""``edit_file``'s replacements: each ``old_text`` found once in the file's original
text (not in the text the earlier edits made), no two overlapping, applied together.

A model often writes ``old_text`` with typographic quotes or dashes, or without a
line's trailing blanks; when an ``old_text`` is not in the file as written, every line
is compared with those folded (:func:`fold`), and the lines no edit touches are
written back exactly as they were."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

__all__ = ["Edit", "EditError", "apply_edits", "fold"]

_FOLD = str.maketrans(
    {
        **dict.fromkeys(map(chr, range(0x2018, 0x201C)), "'"),  # single quotes
        **dict.fromkeys(map(chr, range(0x201C, 0x2020)), '"'),  # double quotes
        **dict.fromkeys(map(chr, range(0x2010, 0x2016)), "-"),  # dashes
        "\u2212": "-",  # minus sign
        "\u00a0": " ",  # no-break space
        **dict.fromkeys(map(chr, range(0x2002, 0x200B)), " "),  # en/em/thin... spaces
        "\u202f": " ",  # narrow no-break space
        "\u205f": " ",  # medium mathematical space
        "\u3000": " ",  # ideographic space
    }
)


class EditError(ValueError):
    """An edit that cannot be made: its message is the tool's ``error``."""


@dataclass
class Edit:
    old_text: str
    new_text: str


@dataclass
class _Match:
    index: int  # which edit
    start: int  # where in the text the matching was done on
    length: int
    new_text: str


def fold(text: str) -> str:
    """Each line without its trailing blanks and with typographic quotes, dashes and
    spaces made ASCII; the lines stay where they were."""
    return "\n".join(line.rstrip(" \t\r").translate(_FOLD) for line in text.split("\n"))


def _count(text: str, needle: str) -> int:
    """Occurrences that do not overlap."""
    return text.count(needle) if needle else 0


def apply_edits(original: str, edits: list[Edit], path: str) -> str:
    """The file's new text, or an :class:`EditError` saying why not."""
    fuzzy = False
    folded = fold(original)
    for i, e in enumerate(edits):
        if e.old_text in original:
            continue
        if fold(e.old_text) not in folded:
            raise EditError(
                f"could not find edits[{i}].old_text in {path}, it must match the file's "
                "current content exactly"
            )
        fuzzy = True
    base = folded if fuzzy else original
    matches: list[_Match] = []
    for i, e in enumerate(edits):
        needle = fold(e.old_text) if fuzzy else e.old_text
        # unique in the folded text: a copy differing only in blanks is a copy
        n = _count(folded, fold(e.old_text))
        if n > 1:
            raise EditError(
                f"found {n} occurrences of edits[{i}].old_text in {path}, it must be unique"
            )
        start = base.find(needle)
        if start < 0:
            raise EditError(
                f"could not find edits[{i}].old_text in {path}, it must match the file's "
                "current content exactly"
            )
        matches.append(_Match(i, start, len(needle), e.new_text))
    matches.sort(key=lambda m: m.start)
    for a, b in itertools.pairwise(matches):
        if a.start + a.length > b.start:
            raise EditError(
                f"edits[{a.index}] and edits[{b.index}] overlap in {path}; merge them into "
                "one edit or target disjoint regions"
            )
    if not fuzzy:
        return _replace(original, matches, 0)
    return _replace_keeping_lines(original, base, matches)


def _replace(text: str, matches: list[_Match], offset: int) -> str:
    """``matches`` (sorted, disjoint, at ``offset`` in the whole text) made in ``text``."""
    for m in reversed(matches):
        at = m.start - offset
        text = text[:at] + m.new_text + text[at + m.length :]
    return text


def _split_nl(text: str) -> list[str]:
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _replace_keeping_lines(original: str, base: str, matches: list[_Match]) -> str:
    """The replacements made in the folded text, line groups at a time; every line no
    replacement touches comes from the original."""
    original_lines = _split_nl(original)
    spans: list[tuple[int, int]] = []
    at = 0
    for text in _split_nl(base):
        spans.append((at, at + len(text)))
        at += len(text)
    groups: list[tuple[int, int, list[_Match]]] = []  # (first line, end line, matches)
    for m in matches:
        first = next(i for i, (s, e) in enumerate(spans) if s <= m.start < e)
        last = first
        while last < len(spans) - 1 and spans[last][1] < m.start + m.length:
            last += 1
        if groups and first < groups[-1][1]:
            g0, g1, reps = groups[-1]
            groups[-1] = (g0, max(g1, last + 1), [*reps, m])
        else:
            groups.append((first, last + 1, [m]))
    out: list[str] = []
    kept = 0  # the original lines up to here are written
    for first, end, reps in groups:
        out += original_lines[kept:first]
        lo, hi = spans[first][0], spans[end - 1][1]
        out.append(_replace(base[lo:hi], reps, lo))
        kept = end
    out += original_lines[kept:]
    return "".join(out)
