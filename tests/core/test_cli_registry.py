"""``tensorplug devices`` and ``tensorplug doctor`` against the installed test plugins."""

from __future__ import annotations

import re
import subprocess

import pytest
from plugin_dists import PluginEnv, on_a_terminal

from tensorplug import cli
from tensorplug.version import API_VERSION


def tp(env: PluginEnv, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return env.run(["-m", "tensorplug", *args], environ)


def test_devices_plain_table(plugin_env: PluginEnv) -> None:
    proc = tp(plugin_env, "devices")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "backend", "device", "type", "description", "memory", "free/total", "caps", "note",
    ]  # fmt: skip
    rows = {line.split()[1]: line for line in lines[1:]}
    assert list(rows) == ["REENTRANT0", "TEST0", "TEST1", "VARIANT0"]
    assert rows["TEST1"].split()[:3] == ["TEST", "TEST1", "igpu"]
    assert "1.0 / 2.0 GiB" in rows["TEST1"]
    assert rows["TEST1"].endswith("same device as VARIANT0")
    assert rows["TEST0"].endswith("extra memory: TEST_REPACK")  # its plugin's hook offers it
    assert "failed and were skipped" in proc.stderr  # the one warning, on stderr


def test_doctor_reports_every_plugin(plugin_env: PluginEnv) -> None:
    proc = tp(plugin_env, "doctor", "--plain")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "plugin API {}.{}".format(*API_VERSION) in out.splitlines()[0]
    assert re.search(r"^TENSORPLUG_BACKENDS +\(unset\)", out, re.M)
    plugins = out.split("Plugins (10 found)")[1].split("Failures")[0]
    rows = plugins.splitlines()
    row = next(line for line in rows if line.startswith("VARIANT ") and "basic" in line)
    assert row.split()[1:7] == ["tp-variant-basic", "0.1.0", "1.0", "5", "not", "selected"]
    row = next(line for line in rows if line.startswith("FOOGPU"))
    assert "unsupported" in row and "no FooGPU driver found (tp-unsupported)" in row
    row = next(line for line in rows if line.startswith("WRONGAPI"))
    assert "2.0" in row and "failed (api)" in row
    failures = out.split("Failures (5)")[1].split("Devices (4)")[0]
    assert "plugin 'BROKENINIT' from tp-broken-init 0.1.0" in failures
    assert 'tp_broken_init/__init__.py", line 8, in _init' in failures  # the traceback
    assert "did you mean 'tensorplug_extra_buffer_types'?" in failures
    devices = out.split("Devices (4)")[1]
    assert devices.count(" ok: ") == 4  # smoke test: allocate, write, compute, read back
    assert "failed and were skipped" not in proc.stderr  # doctor shows failures itself


def test_doctor_fails_only_for_a_requested_backend(plugin_env: PluginEnv) -> None:
    proc = tp(plugin_env, "doctor", TENSORPLUG_BACKENDS="TEST,BROKENINIT")
    assert proc.returncode == 1
    assert "tensorplug: error: TENSORPLUG_BACKENDS asks for 'BROKENINIT'" in proc.stderr
    assert "Devices (2)" in proc.stdout  # the other backends are still shown
    assert tp(plugin_env, "devices", TENSORPLUG_BACKENDS="TEST,BROKENINIT").returncode == 1


def test_rich_tables_on_a_terminal(plugin_env: PluginEnv) -> None:
    screen = on_a_terminal(
        plugin_env.command("-m", "tensorplug", "devices"),
        plugin_env.env({"COLUMNS": "160", "TERM": "xterm"}),
    )
    assert "┃" in screen or "│" in screen  # rich's box drawing
    assert "VARIANT0" in screen


#: doctor's device table as a new user's machine fills it: short columns and prose ones
_DEVICE_TABLE = (
    [*cli._DEVICE_HEADERS[:-1], "smoke test", "note"],
    [
        ["CPU", "CPU", "cpu", "AMD EPYC 7B13 64-Core Processor", "22.4 / 23.5 GiB",
         "from_host_ptr", "ok: computed (a+b)*a and mul_mat (23.0 ms; 29.4 ms in all)",
         "extra memory: CPU_REPACK"],
        ["OpenCL", "OpenCL0", "cpu", "pthread-AMD EPYC 7B13 64-Core Processor (Portable "
         "Computing Language)", "5.0 / 5.0 GiB", "async, events",
         "ok: computed (a+b)*a and mul_mat (234.4 ms; 376.4 ms in all)", ""],
    ],
)  # fmt: skip


@pytest.mark.parametrize("columns", [80, 120])
def test_a_terminal_table_keeps_every_column_readable(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("rich")
    monkeypatch.setenv("COLUMNS", str(columns))
    headers, rows = _DEVICE_TABLE
    cli.Output(plain=False).table(headers, rows)
    screen = capsys.readouterr().out
    assert max(len(line) for line in screen.splitlines()) <= columns
    text = re.sub(r"[\s│┃┏┓┗┛┡┩┢┪╇╈┳┻┣┫━─└┘┌┐├┤┴┬┼]+", " ", screen)
    for row in rows:
        for cell in row[:3] + row[4:5]:  # names and figures: whole, never cut or squeezed
            assert re.search(rf"(?<![\w/.]){re.escape(cell)}(?![\w/])", screen), cell
        for cell in row:  # prose: wrapped at spaces, every word whole
            for word in cell.split():
                assert f" {word} " in f" {text} ", (word, screen)
    for header in headers:
        for word in header.split():
            assert f" {word}" in f" {text}", header


def test_a_bad_option_is_the_commands_error_with_its_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["devices", "--nosuch", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tensorplug devices [-h] [--plain] [-v]")
    assert err.rstrip().endswith("tensorplug devices: error: unrecognized arguments: --nosuch x")


def test_verbose_logs_each_discovery_step(plugin_env: PluginEnv) -> None:
    proc = tp(plugin_env, "-v", "devices", "--plain")
    assert proc.returncode == 0
    assert "read 10 entry points of group 'tensorplug.backends'" in proc.stderr
    assert "registered device TEST1 (igpu) of backend TEST" in proc.stderr


def test_the_core_brings_five_commands() -> None:
    """The application's (run, chat, tokenize, demo) come through entry points:
    tests/core/test_commands.py."""
    assert [c.name for c in cli.COMMANDS] == ["devices", "doctor", "check", "bench", "cache"]


def test_doctor_smoke_test_computes_and_catches_a_broken_backend() -> None:
    from tensorplug import Graph, Status
    from tensorplug.cli import smoke_test
    from tensorplug.host import tensor_array
    from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice

    class Raises(ReferenceBackend):
        def _graph_compute(self, graph: Graph) -> Status:
            raise RuntimeError("not implemented yet")

    class Wrong(ReferenceBackend):
        def _graph_compute(self, graph: Graph) -> Status:
            status = super()._graph_compute(graph)
            tensor_array(graph.nodes[-1])[...] += 1
            return status

    def device(backend: type[ReferenceBackend]) -> ReferenceDevice:
        class Dev(ReferenceDevice):
            def _init_backend(self, params: str | None) -> ReferenceBackend:
                return backend(self)

        return Dev()

    ok, text = smoke_test(ReferenceDevice())
    assert ok and text.startswith("ok: computed (a+b)*a and mul_mat (")
    ok, text = smoke_test(device(Raises))
    assert not ok and text == "FAILED RuntimeError: not implemented yet"
    ok, text = smoke_test(device(Wrong))
    assert not ok and text.startswith("FAILED: mul_mat is wrong (off by up to 1")
