"""Ctrl-C, whenever it comes: one line on stderr, exit status 130, no traceback.

Every command gets this from ``tensorplug.cli.main``, which runs them all, so each phase
of ``run`` (importing its module, loading the plugins and the model, the prompt,
generation), ``tokenize --jsonl`` waiting on its input and a third party's command are
checked. The signal is sent to a subprocess when its output shows it has reached the
phase; a phase that happens to end before the signal lands leaves the next one
interrupted, which must end the same way.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tensorplug_llm.tiny import write_tiny_llama


def _default_sigint() -> None:
    # a test run started in the background (`pytest &`) ignores SIGINT, and an ignored
    # signal stays ignored across exec: give the child Python's usual Ctrl-C handling
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _untraced() -> dict[str, str]:
    """The environment without coverage's subprocess measurement: its tracer takes a lock
    of its own in Python code, which a Ctrl-C at a random bytecode can leave held, and the
    interrupted command then hangs inside coverage, not inside tensorplug."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_PROCESS_")}


class Cli:
    """``python -m tensorplug ARGS`` with its stdout and stderr read as they come."""

    def __init__(self, *args: str, stdin: int | None = subprocess.DEVNULL) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorplug", *args], stdin=stdin, env=_untraced(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint,
        )  # fmt: skip
        self.out, self.err = bytearray(), bytearray()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: object, into: bytearray) -> None:
        while chunk := os.read(stream.fileno(), 4096):  # type: ignore[attr-defined]
            into.extend(chunk)

    def wait_for(self, text: str, where: str = "err", timeout: float = 240) -> None:
        buf = self.err if where == "err" else self.out
        deadline = time.monotonic() + timeout
        while text.encode() not in buf:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never saw {text!r}; stderr:\n{self.err.decode()[-3000:]}")
            time.sleep(0.01)

    def interrupt(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout=120)
        for t in self._readers:
            t.join(timeout=10)
        return rc, self.err.decode()


def _assert_one_line(rc: int, err: str, command: str) -> None:
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1:] == [f"tensorplug {command}: interrupted"], err[-3000:]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Big enough that a prompt of 2000 tokens in chunks of 8 takes a while."""
    path = tmp_path_factory.mktemp("sigint") / "tiny.gguf"
    return write_tiny_llama(path, "f32", 0, n_ctx=4096, n_layer=4)


# generation that only the signal ends: a run that could finish on its own would race the
# test's polling on a busy machine, and a run that ended first would exit with 0
_ENDLESS = ("--ignore-eos", "--context-shift", "-n", "-1")


def _prompt(n: int) -> str:
    return ",".join(str(259 + i % 60) for i in range(n))


@pytest.mark.parametrize(
    ("phase", "marker", "where"),
    [
        ("import", "tensorplug.commands: read", "err"),  # -v: before the run module's import
        ("load", "tensorplug.registry", "err"),  # plugin discovery, then the model
        ("prompt", "prompt: 2000 tokens", "err"),
        ("generation", "prompt: 2 tokens", "err"),
    ],
)
def test_ctrl_c_in_run_ends_with_one_line_and_130(
    model: Path, phase: str, marker: str, where: str
) -> None:
    args = ["run", str(model), "--device", "CPU", "-c", "4096", "-b", "8", *_ENDLESS]
    if phase == "generation":
        args += ["--tokens", "1,300"]
    else:  # generation follows the prompt: a signal landing after the prompt still lands
        args += ["--tokens", _prompt(2000)]
    if phase in ("import", "load"):
        args.insert(0, "-v")
    cli = Cli(*args)
    cli.wait_for(marker, where)
    if phase == "generation":
        while not cli.out:  # the prompt's text, then
            time.sleep(0.01)
        n = len(cli.out)
        while len(cli.out) == n:  # a generated token: generating
            time.sleep(0.01)
    rc, err = cli.interrupt()
    _assert_one_line(rc, err, "run")


def test_ctrl_c_in_tokenize_jsonl_ends_with_one_line_and_130(model: Path) -> None:
    cli = Cli("tokenize", str(model), "--jsonl", stdin=subprocess.PIPE)
    assert cli.proc.stdin is not None
    cli.proc.stdin.write(b'"hello"\n')
    cli.proc.stdin.flush()
    cli.wait_for("]", "out")  # its answer: now it waits for the next line
    rc, err = cli.interrupt()
    cli.proc.stdin.close()
    _assert_one_line(rc, err, "tokenize")


def test_a_third_party_command_gets_the_same_ending(tmp_path: Path) -> None:
    """A command from the ``tensorplug.commands`` entry points, in a fresh interpreter
    (a KeyboardInterrupt escaping in this one would end the test session)."""
    (tmp_path / "tp_sigint_cmd.py").write_text("def main(args):\n    raise KeyboardInterrupt\n")
    code = (
        "import sys, tensorplug.cli as cli\n"
        "from tensorplug.commands import CommandRecord, CommandSpec\n"
        "rec = CommandRecord('slow', 'tp_sigint_cmd:slow')\n"
        "rec.spec = CommandSpec('slow', 'waits', 'tp_sigint_cmd')\n"
        "cli._discover = lambda: [rec]\n"
        "sys.exit(cli.main(['slow']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, preexec_fn=_default_sigint)  # fmt: skip
    _assert_one_line(done.returncode, done.stderr, "slow")


def test_ctrl_c_while_plugins_load_is_raised_once_they_have_loaded() -> None:
    """Native libraries break when interrupted mid-load (pyopencl's nanobind aborts the
    process): the registry holds a first Ctrl-C back until the load ends, and raises it
    then; a second one is raised at once."""
    from tensorplug.signals import deferred_ctrl_c

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # `pytest &` ignores it
    try:
        reached_end = False
        with pytest.raises(KeyboardInterrupt), deferred_ctrl_c():
            signal.raise_signal(signal.SIGINT)
            reached_end = True  # held back: the block goes on
        assert reached_end
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

        reached_end = False
        with pytest.raises(KeyboardInterrupt), deferred_ctrl_c():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # the second: raised here
            reached_end = True
        assert not reached_end
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

        with deferred_ctrl_c():  # no Ctrl-C: nothing raised, the handler unchanged
            pass
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_held_ctrl_c_is_raised_where_the_block_checks_for_it() -> None:
    """``run`` checks at each prompt chunk and token: the Ctrl-C comes out there, not
    where it landed, and not again once the block ends."""
    from tensorplug.signals import deferred_ctrl_c

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        steps: list[int] = []
        with pytest.raises(KeyboardInterrupt), deferred_ctrl_c() as ctrl_c:
            for step in range(5):
                ctrl_c.check()
                steps.append(step)
                if step == 2:
                    signal.raise_signal(signal.SIGINT)
        assert steps == [0, 1, 2]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

        with deferred_ctrl_c() as ctrl_c:  # no Ctrl-C: a check raises nothing
            ctrl_c.check()
    finally:
        signal.signal(signal.SIGINT, before)


def test_on_a_terminal_the_interrupted_line_is_ended_first(model: Path) -> None:
    """Generated text leaves the cursor mid-line; the message starts a line of its own."""
    import pty

    primary, secondary = pty.openpty()
    argv = ["run", str(model), "--device", "CPU", "--tokens", "1,300", *_ENDLESS]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorplug", *argv], stdin=subprocess.DEVNULL,
        stdout=secondary, stderr=secondary, preexec_fn=_default_sigint, env=_untraced(),
    )  # fmt: skip
    os.close(secondary)
    seen = bytearray()
    try:
        while b"prompt: 2 tokens" not in seen:
            seen += os.read(primary, 4096)
        n = len(seen)
        while len(seen) < n + 64:  # generated text, mid-line
            seen += os.read(primary, 4096)
        proc.send_signal(signal.SIGINT)
        # read on while it ends, as a terminal does: a full pty would block its last
        # writes (the one line among them) and it would never end
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not select.select([primary], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=10) == 130
    finally:
        os.close(primary)
        if proc.poll() is None:  # a failed check leaves no process behind
            proc.kill()
    text = seen.decode(errors="replace")
    assert "Traceback" not in text
    assert text.endswith("\r\ntensorplug run: interrupted\r\n"), text[-500:]
