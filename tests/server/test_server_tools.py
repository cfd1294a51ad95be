"""The built-in server tools (``tensorplug_llm.server_tools``) as llama-server's: their
results and error texts, paths against the request's working directory, and the
runtimes. The container and ssh runtimes run through stand-in ``docker`` and ``ssh``
commands put first on PATH, which run what they are given on this machine: what is
checked is the command line each runtime builds and that the tools work through it.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorplug_llm.server_tools import ParamError, ToolBox, ToolRuntimeError, UnknownTool
from tensorplug_llm.server_tools.edit import Edit, EditError, apply_edits, fold
from tensorplug_llm.server_tools.globbing import glob_match, path_glob_match
from tensorplug_llm.server_tools.runtime import SpawnedContainer, make_io, tools_runtime
from tensorplug_llm.server_tools.toolbox import builtin_tools

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell tools")


@pytest.fixture(scope="module")
def box() -> ToolBox:
    return ToolBox(builtin_tools(["all"]))


def call(box: ToolBox, name: str, params: dict[str, Any], **headers: str) -> dict[str, Any]:
    hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
    return box.find(name).invoke(box.call_params(params, hdrs))


def test_tools_are_chosen_by_name_in_llama_servers_order() -> None:
    assert [t.name for t in builtin_tools(["all"])] == [
        "read_file", "file_glob_search", "grep_search", "exec_shell_command", "write_file",
        "edit_file", "get_info",
    ]  # fmt: skip
    assert [t.name for t in builtin_tools(["edit_file", "read_file"])] == [
        "read_file", "edit_file"
    ]  # fmt: skip
    with pytest.raises(ValueError, match='unknown tool "nope". available tools: read_file'):
        builtin_tools(["nope"])


def test_listing_has_llama_servers_fields(box: ToolBox) -> None:
    by_name = {t["tool"]: t for t in box.listing()}
    exec_ = by_name["exec_shell_command"]
    assert exec_["display_name"] == "Execute shell command"
    assert exec_["type"] == "server" and exec_["permissions"] == {"write": True}
    assert exec_["uses_cwd"] is True
    fn = exec_["definition"]["function"]
    assert exec_["definition"]["type"] == "function" and fn["name"] == "exec_shell_command"
    assert fn["parameters"]["required"] == ["command"]
    assert by_name["read_file"]["permissions"] == {"write": False}
    assert by_name["get_info"]["definition"]["function"]["parameters"] == {
        "type": "object", "properties": {}
    }  # fmt: skip


def test_write_read_edit_round_trip(box: ToolBox, tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "test.log")
    got = call(box, "write_file", {"path": path, "content": "line1\nline2\nline3\n"})
    assert got == {"result": "file written successfully", "path": path, "bytes": 18}
    assert call(box, "read_file", {"path": path}) == {
        "plain_text_response": "line1\nline2\nline3\n"
    }
    edits = [{"old_text": "line2", "new_text": "line2-edited"},
             {"old_text": "line3\n", "new_text": "line3\nline4\n"}]  # fmt: skip
    assert call(box, "edit_file", {"path": path, "edits": edits}) == {
        "result": "file edited successfully", "path": path, "edits_applied": 2
    }  # fmt: skip
    assert Path(path).read_text() == "line1\nline2-edited\nline3\nline4\n"
    got = call(box, "read_file", {"path": path, "start_line": 2, "end_line": 3,
                                  "append_loc": True})  # fmt: skip
    assert got == {"plain_text_response": "2\u2192line2-edited\n3\u2192line3\n"}


def test_read_file_limits_and_base64(box: ToolBox, tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("x" * 100 + "\n" + ("y" * 1000 + "\n") * 20)
    got = call(box, "read_file", {"path": str(big)})
    assert got == {"error": f"file too large ({big.stat().st_size} bytes, max 16384). Use "
                   "start_line/end_line to read a portion."}  # fmt: skip
    ranged = call(box, "read_file", {"path": str(big), "start_line": 1, "end_line": 100})
    assert ranged["plain_text_response"].endswith("[output truncated]")
    assert len(ranged["plain_text_response"].encode()) <= 16384 + len("[output truncated]")
    raw = tmp_path / "raw.bin"
    raw.write_bytes(b"\x00\xff\x10")
    got = call(box, "read_file", {"path": str(raw)}, x_resp_type="base64")
    assert got == {"base64": base64.b64encode(b"\x00\xff\x10").decode(), "size_bytes": 3}
    assert call(box, "read_file", {"path": "a\x00b"}) == {"error": "cannot stat file: a\x00b"}
    assert call(box, "write_file", {"path": "a\x00b", "content": ""}) == {
        "error": "failed to write file: a\x00b"
    }
    missing = str(tmp_path / "missing")
    assert call(box, "read_file", {"path": missing}) == {"error": f"cannot stat file: {missing}"}
    with pytest.raises(ParamError, match="params.path is required"):
        call(box, "read_file", {})
    with pytest.raises(ParamError, match="params.path must be a string"):
        call(box, "read_file", {"path": 3})


@pytest.mark.parametrize(
    ("content", "edits", "error"),
    [
        ("dup\ndup\n", [("dup", "x")], "found 2 occurrences of edits[0].old_text in {p}, it "
         "must be unique"),
        ("line1\nline2\n", [("line1\nline2", "a"), ("line2", "b")],
         "edits[0] and edits[1] overlap in {p}; merge them into one edit or target disjoint "
         "regions"),
        ("abc\n", [("zzz", "x")], "could not find edits[0].old_text in {p}, it must match the "
         "file's current content exactly"),
        ("abc\n", [("abc", "abc")], "no changes made: the replacement(s) produced identical "
         "content"),
        ("abc\n", [("", "x")], "edits[0].old_text must not be empty"),
    ],
)  # fmt: skip
def test_edit_file_refusals(
    box: ToolBox, tmp_path: Path, content: str, edits: list[tuple[str, str]], error: str
) -> None:
    path = tmp_path / "f.txt"
    path.write_text(content)
    body = [{"old_text": o, "new_text": n} for o, n in edits]
    got = call(box, "edit_file", {"path": str(path), "edits": body})
    assert got == {"error": error.format(p=path)}
    assert path.read_text() == content
    assert call(box, "edit_file", {"path": str(path), "edits": []}) == {
        "error": '"edits" must be a non-empty array'
    }


def test_edit_forgives_typography_and_keeps_the_lines_it_does_not_touch() -> None:
    original = "keep \u201cthis\u201d  \nsay \u2018hi\u2019\u2014now \nend\n"
    got = apply_edits(original, [Edit("say 'hi'-now", "say bye")], "f")
    assert got == "keep \u201cthis\u201d  \nsay bye\nend\n"
    assert fold("a\u00a0b\u2003c \t\r\nx\u2212y") == "a b c\nx-y"
    with pytest.raises(EditError, match="found 2 occurrences"):  # copies up to blanks
        apply_edits("a \na\n", [Edit("a\n", "b\n")], "f")


def test_file_glob_search_kinds_depth_limit_and_junk(box: ToolBox, tmp_path: Path) -> None:
    (tmp_path / "project-alpha" / "src").mkdir(parents=True)
    (tmp_path / "project-alpha" / "README.md").write_text("alpha")
    (tmp_path / "project-alpha" / "src" / "main.cpp").write_text("int main() {}")
    (tmp_path / "build" / "nested").mkdir(parents=True)
    (tmp_path / "build" / "artifact.txt").write_text("built")
    (tmp_path / "top.txt").write_text("top")
    base = str(tmp_path)

    def paths(**params: Any) -> list[str]:
        got = call(box, "file_glob_search", {"path": base, **params})
        assert got["base"] == Path(base).as_posix()
        return sorted(e["path"] + ("/" if e["type"] == "dir" else "") for e in got["entries"])

    assert paths() == ["project-alpha/README.md", "project-alpha/src/main.cpp", "top.txt"]
    assert paths(type="dir") == ["build/", "project-alpha/", "project-alpha/src/"]
    assert paths(type="all", include="*proj*") == ["project-alpha/"]
    assert paths(max_depth=1) == ["top.txt"]
    assert paths(include="src/*.cpp") == ["project-alpha/src/main.cpp"]
    assert paths(exclude="*.md") == ["project-alpha/src/main.cpp", "top.txt"]
    one = call(box, "file_glob_search", {"path": base, "limit": 1})
    assert len(one["entries"]) == 1
    assert one["plain_text_response"].endswith(
        "\n---\nTotal matches: 3\n[1 results limit reached (3 total matches). Refine the glob "
        "pattern to narrow the search.]\n"
    )
    assert call(box, "file_glob_search", {"path": base, "type": "bogus"}) == {
        "error": 'invalid type: bogus (expected "file", "dir" or "all")'
    }
    assert call(box, "file_glob_search", {"path": base, "limit": 0}) == {
        "error": "invalid limit: 0 (expected 1 or more)"
    }
    assert call(box, "file_glob_search", {"path": base + "/nope"}) == {
        "error": f"path does not exist or is not a directory: {base}/nope"
    }


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_file_search_in_a_git_repository_honours_gitignore(box: ToolBox, tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("ignored.txt\n")
    (tmp_path / "ignored.txt").write_text("no")
    (tmp_path / "kept.txt").write_text("needle")
    got = call(box, "file_glob_search", {"path": str(tmp_path), "include": "*.txt"})
    assert [e["path"] for e in got["entries"]] == ["kept.txt"]
    text = call(box, "grep_search", {"path": str(tmp_path), "pattern": "needle|^no$"})
    assert text["plain_text_response"] == "kept.txt:needle\n\n---\nTotal matches: 1\n"


def test_grep_search(box: ToolBox, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("one\nTwo (2)\nthree\n")
    (tmp_path / "b.txt").write_text("two\n")
    base = str(tmp_path)

    def grep(**params: Any) -> str:
        got = call(box, "grep_search", {"path": base, **params})
        return str(got["plain_text_response"])

    assert grep(pattern="two", include="*.py") == "\n---\nTotal matches: 0\n"
    assert grep(pattern="two", include="*.py", ignore_case=True) == (
        "a.py:Two (2)\n\n---\nTotal matches: 1\n"
    )
    assert grep(pattern="(2)", literal=True, context_lines=1) == (
        "a.py-1-one\na.py:2:Two (2)\na.py-3-three\n--\n\n---\nTotal matches: 1\n"
    )
    assert grep(pattern="^t", return_line_numbers=True, exclude="*.py") == (
        "b.txt:1:two\n\n---\nTotal matches: 1\n"
    )
    single = call(box, "grep_search", {"path": base + "/b.txt", "pattern": "w"})
    assert single["plain_text_response"] == f"{base}/b.txt:two\n\n---\nTotal matches: 1\n"
    assert call(box, "grep_search", {"path": base, "pattern": "("})["error"].startswith(
        "invalid regex: "
    )
    assert call(box, "grep_search", {"path": base + "/x", "pattern": "a"}) == {
        "error": f"path does not exist: {base}/x"
    }


def test_exec_shell_command(box: ToolBox, tmp_path: Path) -> None:
    got = call(box, "exec_shell_command", {"command": "echo hi; echo err >&2; exit 3"})
    assert got == {"plain_text_response": "hi\nerr\n\n[exit code: 3]"}
    cut = call(box, "exec_shell_command", {"command": "printf 0123456789",
                                           "max_output_size": 4})  # fmt: skip
    assert cut == {"plain_text_response": "0123\n[output truncated]\n[exit code: 0]"}
    slow = call(box, "exec_shell_command", {"command": "sleep 30", "timeout": 1})
    assert slow["plain_text_response"].endswith("] [exit due to timed out]")
    here = call(box, "exec_shell_command", {"command": "pwd"}, x_tool_cwd=str(tmp_path))
    assert here["plain_text_response"] == f"{os.path.realpath(tmp_path)}\n\n[exit code: 0]"


def test_exec_streams_until_the_client_is_gone(box: ToolBox) -> None:
    chunks: list[str] = []

    def client(chunk: str, stays: bool = True) -> bool:
        chunks.append(chunk)
        return stays

    tool = box.find("exec_shell_command", stream=True)
    assert tool.invoke({"command": "echo hello"}, client) == {}
    assert "".join(chunks) == "hello\n\n[exit code: 0]"
    chunks.clear()  # a client gone at the first chunk: the command is stopped, no tail
    tool.invoke({"command": "echo a; sleep 30; echo b"}, lambda c: client(c, stays=False))
    assert chunks == ["a\n"]
    with pytest.raises(UnknownTool, match='tool "read_file" does not support stream = true'):
        box.find("read_file", stream=True)
    with pytest.raises(UnknownTool, match='unknown tool "nope"'):
        box.find("nope")


def test_the_cwd_header_wins_and_relative_paths_follow_it(box: ToolBox, tmp_path: Path) -> None:
    (tmp_path / "marker.txt").write_text("marker")
    got = call(box, "read_file", {"path": "marker.txt", "cwd": "/definitely/not/real"},
               x_tool_cwd=str(tmp_path))  # fmt: skip
    assert got == {"plain_text_response": "marker\n"}
    call(box, "write_file", {"path": "sub/../out.txt", "content": "w"}, x_tool_cwd=str(tmp_path))
    assert (tmp_path / "out.txt").read_text() == "w"
    info = call(box, "get_info", {}, x_tool_cwd=str(tmp_path))
    assert info["cwd"] == str(tmp_path) and info["os"] != "unknown"
    assert call(box, "get_info", {})["cwd"] == os.getcwd()


@pytest.mark.parametrize(
    ("runtime", "error"),
    [
        ("fake:does-not-exist", "unknown tool runtime: fake:does-not-exist"),
        ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target: -oProxyCommand=touch"),
        ("ssh:a b", "invalid ssh target: a b"),
        ("docker-container:--privileged", "invalid container id: --privileged"),
        ("podman-container:", "invalid container id: "),
        ("docker:busybox", "tool runtime must name a running container: docker:busybox"),
    ],
)
def test_runtimes_that_are_refused(box: ToolBox, runtime: str, error: str) -> None:
    with pytest.raises(ToolRuntimeError, match=error.replace("(", r"\(")):
        call(box, "exec_shell_command", {"command": "echo hi"}, x_tool_runtime=runtime)
    with pytest.raises(ToolRuntimeError):
        make_io("", runtime)


def test_globs_as_llama_cpps() -> None:
    assert glob_match("*.cpp", "main.cpp") and not glob_match("*.cpp", "src/main.cpp")
    assert glob_match("**/*.cpp", "a/b/main.cpp") and glob_match("**", "a/b")
    assert glob_match("fil?.[ch]", "file.c") and not glob_match("fil?.[!ch]", "file.c")
    assert glob_match("[a-c]x", "bx") and glob_match("[]]", "]") and glob_match("a[", "a[")
    assert path_glob_match("*.txt", "deep/down/x.txt")
    assert path_glob_match("down/x.txt", "deep/down/x.txt")
    assert path_glob_match("/x.txt", "/x.txt") and not path_glob_match("**/y", "x/z")


#: a stand-in docker: ``exec [-i] ID CMD...`` runs CMD here; ``run ... --cidfile F IMAGE
#: sh`` writes an id to F and waits on its stdin, as the container's shell would
FAKE_DOCKER = """#!/bin/sh
if [ "$1" = exec ]; then
    shift; [ "$1" = -i ] && shift; shift; exec "$@"
fi
if [ "$1" = run ]; then
    while [ "$1" != --cidfile ]; do shift; done
    echo fakecontainer123 > "$2"; exec cat > /dev/null
fi
exit 64
"""
#: a stand-in ssh: the last argument is the remote command line, run by a shell here
FAKE_SSH = """#!/bin/sh
for a in "$@"; do last="$a"; done
exec sh -c "$last"
"""


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("ssh", FAKE_SSH)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


@pytest.mark.parametrize("runtime", ["docker-container:abc123", "ssh:user@host.example"])
def test_tools_work_through_an_isolate(
    box: ToolBox, fake_bin: Path, tmp_path: Path, runtime: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "node_modules").mkdir()
    (work / "node_modules" / "dep.js").write_text("x")
    hdr = {"x_tool_runtime": runtime, "x_tool_cwd": str(work)}
    written = call(box, "write_file", {"path": "d/test.log", "content": 'it\'s "here"\n'}, **hdr)
    assert written["result"] == "file written successfully"
    assert (work / "d" / "test.log").read_text() == 'it\'s "here"\n'
    assert call(box, "read_file", {"path": "d/test.log"}, **hdr) == {
        "plain_text_response": 'it\'s "here"\n'
    }
    got = call(box, "exec_shell_command", {"command": "cat d/test.log"}, **hdr)
    assert got == {"plain_text_response": 'it\'s "here"\n\n[exit code: 0]'}
    listed = call(box, "file_glob_search", {"path": ".", "type": "all"}, **hdr)
    assert sorted(e["path"] for e in listed["entries"]) == ["d", "d/test.log", "node_modules"]
    files = call(box, "file_glob_search", {"path": ".", "max_depth": 1}, **hdr)
    assert files["entries"] == []
    grep = call(box, "grep_search", {"path": ".", "pattern": "here"}, **hdr)
    assert grep["plain_text_response"] == 'd/test.log:it\'s "here"\n\n---\nTotal matches: 1\n'
    edited = call(box, "edit_file", {"path": "d/test.log",
                                     "edits": [{"old_text": "here", "new_text": "there"}]},
                  **hdr)  # fmt: skip
    assert edited["edits_applied"] == 1
    assert call(box, "get_info", {}, x_tool_runtime=runtime)["cwd"] == os.getcwd()
    assert call(box, "read_file", {"path": "nope"}, **hdr) == {"error": "cannot stat file: nope"}


def test_a_spawned_container_is_the_runtime_of_every_call(fake_bin: Path) -> None:
    runtime = tools_runtime("docker:busybox")
    assert isinstance(runtime, SpawnedContainer)
    try:
        box = ToolBox(builtin_tools(["exec_shell_command"]), runtime=runtime)
        assert box.call_params({}, {}) == {"runtime": "docker-container:fakecontainer123"}
        # a request's own runtime wins
        assert box.call_params({}, {"x-tool-runtime": "ssh:h"}) == {"runtime": "ssh:h"}
        assert box.call_params({}, {}, in_runtime=False) == {}  # an MCP server's tool
        got = call(box, "exec_shell_command", {"command": "echo in"})
        assert got == {"plain_text_response": "in\n\n[exit code: 0]"}
        assert runtime.proc is not None
        runtime.proc.kill()  # it died: the next call starts another
        runtime.proc.wait()
        assert runtime.spec() == "docker-container:fakecontainer123"
        assert runtime.proc.poll() is None
    finally:
        box.close()
    assert runtime.proc is None  # stopped with the server
    with pytest.raises(ToolRuntimeError, match="requires an image name"):
        tools_runtime("docker:")
    with pytest.raises(ToolRuntimeError, match="unknown tool runtime: nope"):
        tools_runtime("nope")
    assert tools_runtime("ssh:host").spec() == "ssh:host"
