"""The symbols of a kernel's machine code, read from its ELF object's symbol tables.

What an object defines are the names LLVM's JIT finds in it (numba's engine keeps them
to look entry points up: :func:`.numba_private.unserialize`); what it uses without defining must be
found elsewhere before LLVM's loader is given it, which aborts the process on a symbol
it cannot resolve (:mod:`.kept_code`). Little-endian 64-bit ELF only: the objects numba
writes on Linux; anything else reads as None, and its kernels load numba's way.
"""

from __future__ import annotations

import struct

__all__ = ["defined_symbols", "symbols"]

_ELF64_LITTLE = b"\x7fELF\x02\x01"
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_SYMTAB = 2  # sh_type of the symbol table
_UNDEFINED = 0  # st_shndx of a symbol the object uses but does not define
_SECTION_OR_FILE = (3, 4)  # st_info's type of a section's or the source file's symbol


def _symbols(code: bytes) -> list[tuple[str, bool]] | None:
    """The named symbols of a little-endian 64-bit ELF object's symbol tables, each with
    whether the object defines it; None for anything else, or an object whose tables do
    not fit in it."""
    if not code.startswith(_ELF64_LITTLE):
        return None
    try:
        (table_at,) = struct.unpack_from("<Q", code, 0x28)
        entry, count = struct.unpack_from("<HH", code, 0x3A)
        sections = [_SECTION.unpack_from(code, table_at + i * entry) for i in range(count)]
        symbols: list[tuple[str, bool]] = []
        for _, kind, _, _, at, size, link, _, _, _ in sections:
            if kind != _SYMTAB:
                continue
            strings = sections[link][4]
            for sym in range(at + _SYMBOL.size, at + size, _SYMBOL.size):  # 0: the null one
                name, info, _, section, _, _ = _SYMBOL.unpack_from(code, sym)
                if name and info & 0xF not in _SECTION_OR_FILE:
                    start = strings + name
                    text = code[start : code.index(b"\0", start)].decode()
                    symbols.append((text, section != _UNDEFINED))
        return symbols
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None


def defined_symbols(code: bytes) -> set[str] | None:
    """The names of the functions and data a little-endian 64-bit ELF object defines;
    None for anything else, or an object whose tables do not fit in it."""
    found = symbols(code)
    return None if found is None else found[0]


def symbols(code: bytes) -> tuple[set[str], set[str]] | None:
    """The names a little-endian 64-bit ELF object defines, and those it uses without
    defining them (what a loader must find elsewhere); None as :func:`defined_symbols`."""
    table = _symbols(code)
    if table is None:
        return None
    return {n for n, defined in table if defined}, {n for n, defined in table if not defined}
