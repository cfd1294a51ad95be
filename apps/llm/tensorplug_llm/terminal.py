"""Text from a model file made safe to print on a terminal.

A model file is untrusted input, and much of what the commands print comes from it:
generated text (byte tokens can spell any bytes), token texts, chat template error
messages, metadata quoted in errors. Written raw, an escape sequence in any of them can
retitle the window, recolour the terminal or write the clipboard (OSC 52). Everything
printed from a model file goes through :func:`printable` first.
"""

from __future__ import annotations

import unicodedata

__all__ = ["printable"]


def printable(s: str) -> str:
    """Control characters other than newline and tab escaped: a model's byte tokens can
    spell terminal escape sequences."""
    return "".join(
        f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" and c not in "\n\t" else c for c in s
    )
