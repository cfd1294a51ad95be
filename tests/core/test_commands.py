"""Subcommands added through the entry-point group ``tensorplug.commands``.

The application's (``apps/llm``, installed in the test environment) and two test
distributions' (``tests/plugins/tp-cmd-*``, pip-installed for real into a private
folder as the backend test plugins are): one that works, one whose commands cannot be
read, cannot be imported or take a core command's name.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from plugin_dists import PLUGINS, PluginEnv, listed

from tensorplug import cli, commands, installed
from tensorplug.commands import CommandRecord, CommandSpec, CommandStatus, discover
from tensorplug.installed import EntryPointInfo

BROKEN = "tp-cmd-broken 0.1.0"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> PluginEnv:
    which = [PLUGINS / "tp-cmd-hello", PLUGINS / "tp-cmd-broken", PLUGINS / "tp-good"]
    return PluginEnv.create(tmp_path_factory.mktemp("commands-env"), which)


def tp(env: PluginEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return env.run(["-m", "tensorplug", *args])


# -- the application ------------------------------------------------------------------------


def test_the_application_adds_its_commands_to_help() -> None:
    """`pip install -e apps/llm` (the README's set-up) adds run, chat, serve, tokenize, embed,
    demo."""
    proc = subprocess.run(
        [sys.executable, "-m", "tensorplug", "--help"], capture_output=True, text=True, check=True
    )
    got = listed(proc.stdout)
    assert list(got) == [
        "devices", "doctor", "check", "bench", "cache", "chat", "demo", "embed", "run", "serve",
        "tokenize",
    ]  # fmt: skip
    assert got["run"].startswith("run a GGUF model: prompt in, text out")
    assert got["tokenize"] == "show the tokens of a text (llama-tokenize)"
    assert got["chat"].startswith("chat with a GGUF model")
    assert "could not be added" not in proc.stdout and proc.stderr == ""


def test_the_application_is_found_through_its_entry_points() -> None:
    records = {r.name: r for r in discover(reserved=[c.name for c in cli.COMMANDS])}
    assert {"run", "chat", "serve", "tokenize", "embed", "demo"} <= set(records)
    run = records["run"]
    assert run.status is CommandStatus.ADDED and run.distribution == "tensorplug-llm"
    assert run.spec is not None
    assert run.spec == CommandSpec(run.name, run.spec.help, "tensorplug_llm.run_cli")
    assert records["tokenize"].spec.module == "tensorplug_llm.tokenizer.cli"  # type: ignore[union-attr]


def test_listing_commands_imports_none_of_their_modules() -> None:
    code = (
        "import sys; from tensorplug import cli; cli.build_parser(['--help']); "
        "print(sorted(m for m in sys.modules if m.startswith(('tensorplug_llm', 'jinja2', "
        "'regex', 'gguf'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['tensorplug_llm', 'tensorplug_llm.commands']"


# -- a third party's commands -------------------------------------------------------------


def test_a_third_party_command_is_listed_and_runs_with_its_arguments(env: PluginEnv) -> None:
    helped = tp(env, "--help")
    assert helped.returncode == 0
    got = listed(helped.stdout)
    assert got["hello"] == "greet someone (a test command)"
    assert got["devices"] == "list every device of every loaded backend"  # the core's

    proc = tp(env, "hello", "World", "--times", "2", "--shout")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["1: HELLO, WORLD!", "2: HELLO, WORLD!"]
    assert tp(env, "hello", "x", "--times", "0").returncode == 3  # its own exit status

    own = tp(env, "hello", "--help")
    assert "--times TIMES" in own.stdout and "whom to greet" in own.stdout

    bad = tp(env, "hello", "World", "--times", "two")
    assert bad.returncode == 2 and "argument --times: invalid int value: 'two'" in bad.stderr


def test_a_command_module_is_imported_only_when_it_runs(env: PluginEnv) -> None:
    out = env.run_py(
        """
import sys
from tensorplug import cli
cli.build_parser(["devices"])
listed = sorted(m for m in sys.modules if m.startswith("tp_cmd"))
cli.build_parser(["hello", "x"])
result = {"listed": listed, "chosen": sorted(m for m in sys.modules if m.startswith("tp_cmd"))}
"""
    )
    assert out["listed"] == ["tp_cmd_broken", "tp_cmd_hello"]  # the specs only
    assert out["chosen"] == ["tp_cmd_broken", "tp_cmd_hello", "tp_cmd_hello.hello_cli"]


def test_broken_commands_are_reported_and_the_others_keep_working(env: PluginEnv) -> None:
    devices = tp(env, "devices")
    assert devices.returncode == 0
    assert "TEST0" in devices.stdout and "a third party" not in devices.stdout
    assert (
        f"2 tensorplug command(s) could not be added: broken ({BROKEN}: failed), devices "
        f"({BROKEN}: refused). Run `tensorplug doctor` for the reasons."
    ) in devices.stderr

    helped = tp(env, "--help")
    got = listed(helped.stdout)
    assert got["broken"] == "(broken: ModuleNotFoundError; see doctor)"
    assert got["lazy-broken"] == "a command whose module cannot be imported"
    epilog = " ".join(helped.stdout.split("options:")[1].split())
    assert f"Commands that could not be added: broken from {BROKEN}: ModuleNotFoundError" in epilog
    assert f"devices from {BROKEN}: refused, 'tensorplug devices' is a command of" in epilog

    broken = tp(env, "broken")
    assert broken.returncode == 2 and broken.stdout == ""
    assert (
        f"tensorplug broken: error: command 'broken' from {BROKEN} (entry point "
        "tp_cmd_broken.missing:command) could not be read: ModuleNotFoundError: No module "
        "named 'tp_cmd_broken.missing'. Fix: reinstall or upgrade it (pip install -U "
        "tp-cmd-broken), or uninstall it."
    ) in broken.stderr

    lazy = tp(env, "lazy-broken")
    assert lazy.returncode == 2
    assert (
        "tensorplug lazy-broken: error: its module tp_cmd_broken.needs_missing (from "
        "tp-cmd-broken) could not be imported: ModuleNotFoundError: No module named "
        "'tp_no_such_dependency'. Fix: reinstall or upgrade tp-cmd-broken (pip install -U "
        "tp-cmd-broken), install what it is missing, or uninstall it."
    ) in lazy.stderr
    assert tp(env, "hello", "again").stdout == "1: Hello, again!\n"


def test_doctor_lists_every_command_and_why_one_is_missing(env: PluginEnv) -> None:
    proc = tp(env, "doctor", "--plain")
    assert proc.returncode == 0, proc.stderr
    assert "could not be added" not in proc.stderr  # doctor shows them itself
    section = proc.stdout.split("Commands (9)")[1]  # the core's 5, the test dists' 4
    table = section.splitlines()[3:12]
    rows = {ln.split()[0]: ln.split() for ln in table}
    assert rows["hello"][1:5] == ["tp-cmd-hello", "0.1.0", "tp_cmd_hello.hello_cli", "added"]
    assert rows["lazy-broken"][4] == "added"  # its module fails only when it runs
    assert rows["broken"][1:5] == ["tp-cmd-broken", "0.1.0", "tp_cmd_broken.missing:command",
                                   "failed"]  # fmt: skip
    devices = [ln for ln in table if ln.startswith("devices ")]
    assert len(devices) == 2 and "built in" in devices[0] and "refused" in devices[1]
    assert "No module named 'tp_cmd_broken.missing'" in section  # the message ...
    assert "Traceback (most recent call last)" in section  # ... and the traceback


# -- discovery rules, in process -------------------------------------------------------------


def _entry_points(monkeypatch: pytest.MonkeyPatch, *eps: tuple[str, str]) -> None:
    found = [EntryPointInfo(n, v, commands.ENTRY_POINT_GROUP) for n, v in eps]
    monkeypatch.setattr(installed, "entry_points", lambda group, fresh=False: found)


GOOD = CommandSpec("good", "a good command", "json")
OTHER = CommandSpec("good", "the same name again", "json.decoder")
MISNAMED = CommandSpec("other", "an entry point named otherwise", "json")
NOT_A_SPEC = 42


def _exits() -> None:
    raise SystemExit(3)


def test_clashes_go_to_the_first_by_name_and_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    me = "test_commands"
    _entry_points(
        monkeypatch,
        ("good", f"{me}:OTHER"),  # found first, but sorts after GOOD: refused
        ("good", f"{me}:GOOD"),
        ("check", f"{me}:NOT_A_SPEC"),  # a core command's name: refused, not even read
    )
    records = discover(reserved=["check"])
    assert [(r.name, r.value, r.status) for r in records] == [
        ("check", f"{me}:NOT_A_SPEC", CommandStatus.REFUSED),
        ("good", f"{me}:GOOD", CommandStatus.ADDED),
        ("good", f"{me}:OTHER", CommandStatus.REFUSED),
    ]
    assert records[0].spec is None and records[0].import_ms == 0.0
    assert records[2].detail == f"{me}:GOOD already adds a command 'good'"
    assert records[2].error_message() == (
        f"command 'good' from {me}:OTHER (entry point {me}:OTHER) was refused: "
        f"{me}:GOOD already adds a command 'good'"
    )


def test_a_kept_command_whose_module_is_gone_is_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kept entry-point list (tensorplug.installed) naming a module removed unseen is
    read again from importlib.metadata rather than reported as a broken command."""
    group, good = commands.ENTRY_POINT_GROUP, EntryPointInfo("good", "test_commands:GOOD", "g")
    lists = {"kept": [EntryPointInfo("gone", "tp_no_such_module:SPEC", group), good],
             "fresh": [good]}  # fmt: skip
    asked: list[bool] = []

    def entry_points(group: str, *, fresh: bool = False) -> list[EntryPointInfo]:
        asked.append(fresh)
        return lists["fresh" if fresh else "kept"]

    monkeypatch.setattr(installed, "entry_points", entry_points)
    assert [(r.name, r.status) for r in discover()] == [("good", CommandStatus.ADDED)]
    assert asked == [False, True]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("MISNAMED", "ValueError: the entry point is called 'x' but its CommandSpec 'other'"),
        ("NOT_A_SPEC", "TypeError: a tensorplug.commands entry point must name a"),
        ("no_such_attr", "AttributeError: module 'test_commands' has no attribute"),
    ],
)
def test_an_entry_point_that_is_no_command_fails_alone(
    monkeypatch: pytest.MonkeyPatch, value: str, error: str
) -> None:
    _entry_points(monkeypatch, ("x", f"test_commands:{value}"), ("good", "test_commands:GOOD"))
    bad, good = sorted(discover(), key=lambda r: r.name != "x")
    assert good.status is CommandStatus.ADDED
    assert bad.status is CommandStatus.FAILED and bad.spec is None
    assert f"could not be read: {error}" in bad.error_message()
    assert bad.error_message().endswith("Fix: fix or remove it.")  # no distribution to name


def test_a_spec_calling_sys_exit_is_recorded_not_obeyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CommandSpec, "coerce", classmethod(lambda cls, obj: _exits()))
    _entry_points(monkeypatch, ("x", "test_commands:GOOD"))
    (rec,) = discover()
    assert rec.status is CommandStatus.FAILED and isinstance(rec.exception, SystemExit)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Run"}, "CommandSpec.name must be a command name such as 'run'"),
        ({"name": "-x"}, "CommandSpec.name must be a command name"),
        ({"name": "kv-"}, "CommandSpec.name must be a command name"),
        ({"help": " "}, "CommandSpec 'ok': help must be a one-line description"),
        ({"module": "pkg:main"}, "module must be a dotted module name such as"),
        ({"module": "pkg..cli"}, "module must be a dotted module name such as"),
    ],
)
def test_a_spec_says_what_it_should_look_like(kwargs: dict[str, str], message: str) -> None:
    fields = {"name": "ok", "help": "fine", "module": "pkg.cli"} | kwargs
    with pytest.raises(ValueError, match=message):
        CommandSpec(**fields)
    assert CommandSpec("kv-dump", "h", "a.b_c").name == "kv-dump"


def test_a_spec_may_be_any_object_with_its_attributes() -> None:
    class Duck:
        name, help, module = "duck", "quack", "json"

    assert CommandSpec.coerce(Duck()) == CommandSpec("duck", "quack", "json")
    assert CommandSpec.coerce(GOOD) is GOOD


def test_a_core_command_whose_module_is_missing_reports_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cmd = cli.Command.from_spec(CommandSpec("ghost", "not built", "tensorplug.no_such_module"))
    assert cmd.lazy_arguments and cmd.add_arguments is not None
    cmd.add_arguments(argparse.ArgumentParser())  # nothing to add, no import error
    assert cmd.run(argparse.Namespace()) == 2
    assert capsys.readouterr().err == (
        "tensorplug ghost: error: its module tensorplug.no_such_module (from tensorplug) could "
        "not be imported: ModuleNotFoundError: No module named 'tensorplug.no_such_module'. "
        "Fix: reinstall or upgrade tensorplug (pip install -U tensorplug), install what it "
        "is missing.\n"
    )


def test_records_name_their_origin() -> None:
    rec = CommandRecord("x", "pkg.mod:spec")
    assert rec.origin == "pkg.mod:spec" and rec.distribution is None and rec.name == "x"
