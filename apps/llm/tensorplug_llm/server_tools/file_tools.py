"""``read_file``, ``write_file`` and ``edit_file``, with llama-server's parameters,
result fields and error texts (a client written for it reads ours alike)."""

from __future__ import annotations

import base64
from typing import Any

from .edit import Edit, EditError, apply_edits
from .runtime import io_for
from .tool import (
    ParamError,
    StreamSink,
    Tool,
    function_definition,
    opt_bool,
    opt_int,
    opt_str,
    required,
    required_str,
)

__all__ = ["EditFile", "ReadFile", "WriteFile"]

#: the most text read_file gives the model (a larger file: ask for a range of lines)
READ_MAX = 16 * 1024
#: the largest file read whole as base64 (``x-resp-type: base64``: for a client, not a model)
READ_MAX_BASE64 = 32 * 2**20


def _encode(text: str) -> bytes:
    """The text's UTF-8; bytes a file held that were not UTF-8 (read as lone
    surrogates) go back as they were, a lone surrogate from JSON becomes ``?``."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def _lines(text: str) -> list[str]:
    """The lines as C++'s getline gives them: a last newline ends a line, not one more."""
    parts = text.split("\n")
    return parts[:-1] if parts[-1] == "" else parts


class ReadFile(Tool):
    name, display_name, uses_cwd = "read_file", "Read file", True

    def definition(self) -> dict[str, Any]:
        return function_definition(
            self.name,
            "Read the contents of a file. Optionally specify a 1-based line range. If "
            'append_loc is true, each line is prefixed with its line number (e.g. "1\u2192...").',
            {
                "path": {"type": "string", "description": "Path to the file"},
                "start_line": {"type": "integer",
                               "description": "First line to read, 1-based (default: 1)"},
                "end_line": {"type": "integer", "description":
                             "Last line to read, 1-based inclusive (default: end of file)"},
                "append_loc": {"type": "boolean",
                               "description": "Prefix each line with its line number"},
            },
            ["path"],
        )  # fmt: skip

    def invoke(self, params: dict[str, Any], sink: StreamSink | None = None) -> dict[str, Any]:
        path = required_str(params, "path")
        start, end = opt_int(params, "start_line", 1), opt_int(params, "end_line", -1)
        append_loc = opt_bool(params, "append_loc", False)
        io = io_for(params)
        size = io.file_size(path)
        if size is None:
            return {"error": f"cannot stat file: {path}"}
        if opt_str(params, "resp_type", "") == "base64":  # x-resp-type: the client's, whole
            if size > READ_MAX_BASE64:
                return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
            data = io.read(path)
            if data is None:
                return {"error": f"failed to open file: {path}"}
            return {"base64": base64.b64encode(data).decode("ascii"), "size_bytes": len(data)}
        if size > READ_MAX and end == -1:
            return {"error": f"file too large ({size} bytes, max {READ_MAX}). Use "
                    "start_line/end_line to read a portion."}  # fmt: skip
        data = io.read(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        out: list[str] = []
        used = 0
        for n, line in enumerate(_lines(data.decode("utf-8", "replace")), 1):
            if n < start:
                continue
            if end != -1 and n > end:
                break
            piece = f"{n}\u2192{line}\n" if append_loc else f"{line}\n"
            size_of = len(piece.encode("utf-8"))
            if used + size_of > READ_MAX:
                out.append("[output truncated]")
                break
            out.append(piece)
            used += size_of
        return {"plain_text_response": "".join(out)}


class WriteFile(Tool):
    name, display_name, uses_cwd, write = "write_file", "Write file", True, True

    def definition(self) -> dict[str, Any]:
        return function_definition(
            self.name,
            "Write content to a file, creating it (including parent directories) if it does "
            "not exist. May use with edit_file for more complex edits.",
            {
                "path": {"type": "string", "description": "Path of the file to write"},
                "content": {"type": "string", "description": "Content to write"},
            },
            ["path", "content"],
        )

    def invoke(self, params: dict[str, Any], sink: StreamSink | None = None) -> dict[str, Any]:
        path, content = required_str(params, "path"), required_str(params, "content")
        data = _encode(content)
        if not io_for(params).write(path, data):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file written successfully", "path": path, "bytes": len(data)}


class EditFile(Tool):
    name, display_name, uses_cwd, write = "edit_file", "Edit file", True, True

    def definition(self) -> dict[str, Any]:
        edit = {
            "type": "object",
            "properties": {
                "old_text": {"type": "string", "description": "Exact text to find; must be "
                             "unique in the file and must not overlap with other edits"},
                "new_text": {"type": "string", "description": "Text to replace old_text with"},
            },
            "required": ["old_text", "new_text"],
        }  # fmt: skip
        return function_definition(
            self.name,
            "Edit a file using exact text replacement. Each edits[].old_text must be unique in "
            "the file and is matched against the original content, not incrementally. Merge "
            "nearby changes into one edit instead of overlapping edits. Use write_file to "
            "replace the whole file.",
            {
                "path": {"type": "string", "description": "Path to the file to edit"},
                "edits": {"type": "array", "items": edit,
                          "description": "One or more exact text replacements to apply"},
            },
            ["path", "edits"],
        )  # fmt: skip

    def invoke(self, params: dict[str, Any], sink: StreamSink | None = None) -> dict[str, Any]:
        path = required_str(params, "path")
        given = required(params, "edits")
        if not isinstance(given, list) or not given:
            return {"error": '"edits" must be a non-empty array'}
        edits: list[Edit] = []
        for i, e in enumerate(given):
            if not isinstance(e, dict):
                raise ParamError(f"params.edits[{i}] must be an object")
            try:
                edit = Edit(required_str(e, "old_text"), required_str(e, "new_text"))
            except ParamError as err:  # named where it is: params.edits[i].old_text
                raise ParamError(str(err).replace("params.", f"params.edits[{i}].")) from None
            if not edit.old_text:
                return {"error": f"edits[{i}].old_text must not be empty"}
            edits.append(edit)
        io = io_for(params)
        data = io.read(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        original = data.decode("utf-8", "surrogateescape")  # bytes that are not UTF-8 kept
        try:
            text = apply_edits(original, edits, path)
        except EditError as e:
            return {"error": str(e)}
        if text == original:
            return {"error": "no changes made: the replacement(s) produced identical content"}
        if not io.write(path, _encode(text)):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}
