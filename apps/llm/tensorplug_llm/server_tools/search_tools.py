"""``file_glob_search`` and ``grep_search``: files (and folders) under a path by glob,
and the lines of files that match a regular expression, as llama-server's tools give
them: the model reads ``plain_text_response``; a client's folder picker reads
``entries`` and ``base`` (absolute, so it can join the relative entries)."""

from __future__ import annotations

import re
from typing import Any

from .globbing import path_glob_match
from .runtime import io_for
from .tool import (
    StreamSink,
    Tool,
    function_definition,
    opt_bool,
    opt_int,
    opt_str,
    required_str,
)
from .tool_io import ListKind

__all__ = ["FileGlobSearch", "GrepSearch"]

#: entries file_glob_search gives at most
GLOB_MAX_RESULTS = 100
#: matching lines grep_search gives at most
GREP_MAX_RESULTS = 100

_SKIPS = (
    "Automatically skips files ignored by .gitignore (when the directory is inside a git "
    "repo) and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
)


def _selected(rel: str, include: str, exclude: str) -> bool:
    return path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))


class FileGlobSearch(Tool):
    name, display_name, uses_cwd = "file_glob_search", "File search", True

    def definition(self) -> dict[str, Any]:
        return function_definition(
            self.name,
            "Recursively search for files matching a glob pattern under a directory. " + _SKIPS
            + "A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any "
            "depth. A pattern containing '/' matches the full relative path; unless already "
            "anchored with \"**/\" or a leading '/', it is automatically prefixed with "
            '"**/". Use type="dir" or "all" to also list directories; directory entries are '
            "suffixed with '/' in the output. Note: directory listings do not apply "
            ".gitignore filtering.",
            {
                "path": {"type": "string", "description": "Base directory to search in"},
                "include": {"type": "string", "description": "Glob pattern for files to "
                            'include (e.g. "*.cpp" or "src/**/*.cpp"). Default: **'},
                "exclude": {"type": "string", "description": "Glob pattern for files to exclude"},
                "type": {"type": "string", "description":
                         'Entry type to return: "file" (default), "dir" or "all"'},
                "max_depth": {"type": "integer", "description": "Maximum depth to descend into "
                              "subdirectories (default: 0 = unlimited; 1 = direct children only)"},
                "limit": {"type": "integer", "description": "Maximum number of results to "
                          f"return, capped at {GLOB_MAX_RESULTS} (default {GLOB_MAX_RESULTS})"},
            },
            ["path"],
        )  # fmt: skip

    def invoke(self, params: dict[str, Any], sink: StreamSink | None = None) -> dict[str, Any]:
        io = io_for(params)
        path = required_str(params, "path")
        base = io.resolve(path)
        include, exclude = opt_str(params, "include", "**"), opt_str(params, "exclude", "")
        kind_name = opt_str(params, "type", "file")
        max_depth = max(0, opt_int(params, "max_depth", 0))
        limit = opt_int(params, "limit", GLOB_MAX_RESULTS)
        if limit < 1:
            return {"error": f"invalid limit: {limit} (expected 1 or more)"}
        limit = min(limit, GLOB_MAX_RESULTS)
        try:
            kind = ListKind(kind_name)
        except ValueError:
            return {"error": f'invalid type: {kind_name} (expected "file", "dir" or "all")'}
        listing = io.list_entries(base, max_depth, kind)
        if listing.error:
            return {"error": f"{listing.error}: {path}"}
        matches = [e for e in listing.entries if _selected(e.rel, include, exclude)]
        shown = matches[:limit]
        text = "".join(f"{e.rel}{'/' if e.is_dir else ''}\n" for e in shown)
        text += f"\n---\nTotal matches: {len(matches)}\n"
        if len(matches) > len(shown):
            text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). "
                     "Refine the glob pattern to narrow the search.]\n")  # fmt: skip
        if listing.truncated:
            text += "[results truncated: time budget or unreadable directory]\n"
        entries = [{"path": e.rel, "type": "dir" if e.is_dir else "file"} for e in shown]
        return {"plain_text_response": text, "entries": entries, "base": base}


class GrepSearch(Tool):
    name, display_name, uses_cwd = "grep_search", "Grep search", True

    def definition(self) -> dict[str, Any]:
        return function_definition(
            self.name,
            "Search for a pattern in files under a path. Returns matching lines with file "
            "paths (and, unless searching a single file, paths relative to the given "
            "directory). " + _SKIPS + "include/exclude: a pattern with no '/' matches the "
            "basename at any depth; a pattern containing '/' matches the full relative path "
            '(auto-anchored with "**/" unless already anchored).',
            {
                "path": {"type": "string", "description": "File or directory to search in"},
                "pattern": {"type": "string", "description":
                            "Pattern to search for (regular expression unless literal is true)"},
                "include": {"type": "string",
                            "description": "Glob pattern to filter files (default: **)"},
                "exclude": {"type": "string", "description": "Glob pattern to exclude files"},
                "return_line_numbers": {"type": "boolean",
                                        "description": "If true, include line numbers in results"},
                "literal": {"type": "boolean", "description": "Treat pattern as a literal string "
                            "instead of a regular expression (default: false)"},
                "ignore_case": {"type": "boolean",
                                "description": "Case-insensitive search (default: false)"},
                "context_lines": {"type": "integer", "description": "Number of lines of context "
                                  "to show before and after each match (default: 0)"},
            },
            ["path", "pattern"],
        )  # fmt: skip

    def invoke(self, params: dict[str, Any], sink: StreamSink | None = None) -> dict[str, Any]:
        path, pattern = required_str(params, "path"), required_str(params, "pattern")
        include, exclude = opt_str(params, "include", "**"), opt_str(params, "exclude", "")
        numbers = opt_bool(params, "return_line_numbers", False)
        context = max(0, opt_int(params, "context_lines", 0))
        if opt_bool(params, "literal", False):
            pattern = re.escape(pattern)
        try:
            regex = re.compile(pattern, re.IGNORECASE if opt_bool(params, "ignore_case", False)
                               else 0)  # fmt: skip
        except re.error as e:
            return {"error": f"invalid regex: {e}"}
        io = io_for(params)
        where = io.resolve(path)
        files: list[tuple[str, str]] = []  # (absolute path, the path shown)
        if io.is_file(where):
            files.append((where, path))
        elif io.is_dir(where):
            listing = io.list_entries(where, 0, ListKind.FILES)
            if listing.error:
                return {"error": f"{listing.error}: {path}"}
            files += [(f"{where.rstrip('/')}/{e.rel}", e.rel) for e in listing.entries
                      if _selected(e.rel, include, exclude)]  # fmt: skip
        else:
            return {"error": f"path does not exist: {path}"}
        out: list[str] = []
        total, full = 0, False
        numbered = numbers or context > 0
        for absolute, shown in files:
            if full:
                break
            data = io.read(absolute)
            if data is None:
                continue
            lines = data.decode("utf-8", "replace").split("\n")
            if lines[-1] == "":
                lines.pop()
            for i, line in enumerate(lines):
                if total >= GREP_MAX_RESULTS:
                    full = True
                    break
                if not regex.search(line):
                    continue
                for j in range(max(0, i - context), min(len(lines) - 1, i + context) + 1):
                    mark = ":" if j == i else "-"
                    num = f"{j + 1}{mark}" if numbered else ""
                    out.append(f"{shown}{mark}{num}{lines[j]}\n")
                if context > 0:
                    out.append("--\n")
                total += 1
        text = "".join(out) + f"\n---\nTotal matches: {total}\n"
        if full:
            text += (f"[{GREP_MAX_RESULTS} matches limit reached. Narrow the "
                     "path/pattern/include to see more.]\n")  # fmt: skip
        return {"plain_text_response": text}
