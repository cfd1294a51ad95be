"""The plugin contract against hostile plugins: malformed ``api_version`` declarations
wherever they are made, and plugin code that never returns.

A stuck plugin here waits on an event that nothing sets until the test is over, and
its budget is tiny: the test never races a timer, since the plugin cannot finish in
time however fast or loaded the machine is.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tensorplug import cli, discovery, registry
from tensorplug.device import Device, Reg
from tensorplug.discovery import PluginRecord, PluginStatus, Source
from tensorplug.errors import ApiVersionFormatError, PluginError, PluginTimeoutError
from tensorplug.registration import Registration, check_api_version
from tensorplug.settings import PLUGIN_INIT_TIMEOUT, PLUGIN_TIMEOUT, Setting, SettingError

MALFORMED = ["1.3", None, (1,), (1, -1), (1, -5), True, (1, True), (1, 10**21), (1.0, 3), (1, 2, 3)]


@pytest.mark.parametrize("version", MALFORMED, ids=repr)
def test_a_malformed_api_version_is_refused_naming_the_plugin_and_the_fix(
    version: object,
) -> None:
    with pytest.raises(ApiVersionFormatError) as registration:
        Registration(name="FOO", api_version=version, init="a:b")  # type: ignore[arg-type]
    message = str(registration.value)
    assert message.startswith("Registration 'FOO': api_version must be a (major, minor) pair")
    assert "Fix: declare the plugin API the plugin was written against" in message
    assert len(message) < 400  # a huge version is not printed in full

    class BadReg(Reg):
        api_version = version  # type: ignore[assignment]

        @property
        def name(self) -> str:
            return "BADVERSION"

        def devices(self) -> Sequence[Device]:
            return []

    with pytest.raises(ApiVersionFormatError, match=r"^Reg 'BADVERSION' \(.*BadReg\): api_ver"):
        registry.register(BadReg())
    assert registry.reg_by_name("BADVERSION") is None
    with pytest.raises(ApiVersionFormatError, match="^tp-foo 1.0: api_version must be"):
        check_api_version(version, plugin="tp-foo 1.0", package="tp-foo")  # type: ignore[arg-type]
    assert isinstance(registration.value, (TypeError, PluginError))  # what callers catch


def test_a_list_is_a_pair_too() -> None:
    assert Registration(name="FOO", api_version=[1, 0], init="a:b").api_version == (1, 0)  # type: ignore[arg-type]


def test_a_duck_typed_registration_with_a_malformed_version_fails_at_the_api_stage(
    tmp_path: Path,
) -> None:
    plugin = tmp_path / "duck.py"
    plugin.write_text(
        "class registration:\n    name = 'DUCK'\n    api_version = '1.3'\n    init = 'a:b'\n"
    )
    record = PluginRecord(source=Source.FILE, spec=str(plugin))
    discovery.prepare(record)
    assert record.failed and record.stage == "api"
    assert isinstance(record.exception, ApiVersionFormatError)
    message = record.error_message()
    assert "Registration 'DUCK': api_version must be" in message and "'1.3' (a str)" in message
    assert "unpack" not in message and "reinstall" not in message


STUCK = """
import threading
from tensorplug.registration import Registration

GATE = threading.Event()  # set by the test when it is over, never by the plugin
if {at_import}:
    GATE.wait()

def _score():
    if {at_score}:
        GATE.wait()
    return 1

def _init():
    if {at_init}:
        GATE.wait()
    raise RuntimeError("init was meant never to return")

registration = Registration(name="{name}", api_version=(1, 0), init=_init, score=_score)
"""


def _stuck(folder: Path, name: str, stage: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{name.lower()}.py"
    flags = {f"at_{s}": s == stage for s in ("import", "score", "init")}
    path.write_text(STUCK.format(name=name, **flags))
    return path


@pytest.fixture
def release_stuck_plugins() -> Iterator[None]:
    """Lets the threads left behind finish once the test is over."""
    yield
    for name, module in list(sys.modules.items()):
        gate = getattr(module, "GATE", None)
        if name.startswith("tensorplug_plugin_") and isinstance(gate, threading.Event):
            gate.set()


@pytest.mark.parametrize("stage", ["import", "score"])
@pytest.mark.usefixtures("release_stuck_plugins")
def test_a_plugin_that_never_returns_is_skipped_and_recorded(tmp_path: Path, stage: str) -> None:
    path = _stuck(tmp_path, "STUCK", stage)
    record = PluginRecord(source=Source.FILE, spec=str(path))
    discovery.prepare(record, timeout=0.05)
    assert record.status is PluginStatus.FAILED and record.stage == stage
    assert record.timed_out and isinstance(record.exception, PluginTimeoutError)
    assert "did not return within 0.05 s (TENSORPLUG_PLUGIN_TIMEOUT)" in record.error_message()
    assert "where the plugin's thread was:" in record.traceback
    assert "GATE.wait()" in record.traceback  # the line it is stuck at
    assert cli._plugin_row(record)[4] == f"timed out ({stage})"  # how doctor shows it
    # asked again while its code still runs: refused at once, not started a second time
    again = PluginRecord(source=Source.FILE, spec=str(path))
    discovery.prepare(again, timeout=3600)
    assert again.timed_out and "an earlier attempt's" in str(again.exception)


@pytest.mark.usefixtures("release_stuck_plugins")
def test_an_init_that_never_returns_is_skipped_under_the_settings_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stuck(tmp_path / "plugins", "STUCKINIT", "init")
    monkeypatch.setenv(PLUGIN_INIT_TIMEOUT.env, "0.05")
    assert registry.load_all_from_path(tmp_path / "plugins") == []
    record = next(r for r in registry.plugin_records() if r.backend == "STUCKINIT")
    assert record.timed_out and record.stage == "init"
    assert "its init() did not return within 0.05 s (TENSORPLUG_PLUGIN_INIT_TIMEOUT)" in str(
        record.exception
    )
    assert registry.reg_by_name("STUCKINIT") is None


@pytest.mark.parametrize("setting", [PLUGIN_TIMEOUT, PLUGIN_INIT_TIMEOUT], ids=lambda s: s.env)
def test_the_budget_settings_are_checked(
    monkeypatch: pytest.MonkeyPatch, setting: Setting[float]
) -> None:
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv(setting.env, bad)
        with pytest.raises(SettingError, match=f"{setting.env}='{bad}'"):
            setting.get()
    monkeypatch.setenv(setting.env, "2.5")
    assert setting.get() == 2.5
