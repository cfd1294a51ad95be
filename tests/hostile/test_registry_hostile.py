"""Plugins that misbehave at discovery: the application and the registry survive them.

Each case runs in a fresh interpreter with one plugin file on TENSORPLUG_BACKEND_PATH,
because discovery happens once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN = """
import os, sys
from tensorplug.registration import Registration
from tensorplug.device import Reg

class EmptyReg(Reg):
    name = "Hostile"
    def devices(self):
        return []

def _score():
    {body}
    return 5, "fine"

registration = Registration(name="Hostile", api_version=(1, 0), init=EmptyReg, score=_score)
"""


def _run(tmp_path: Path, body: str, code: str) -> subprocess.CompletedProcess[str]:
    plugin = tmp_path / "hostile_plugin.py"
    plugin.write_text(PLUGIN.format(body=body))
    env = dict(os.environ, TENSORPLUG_BACKEND_PATH=str(plugin), FLAG=str(tmp_path / "flag"))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip


def test_a_score_calling_sys_exit_does_not_end_the_application(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        "sys.exit(3)",
        """
        import tensorplug as tp
        names = [d.name for d in tp.devices()]
        rec = next(r for r in tp.registry.plugin_records() if r.backend == "Hostile")
        print("alive", "CPU" in names, rec.status.value, type(rec.exception).__name__)
    """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["alive", "True", "failed", "SystemExit"]


def test_ctrl_c_in_a_score_leaves_the_registry_ready_to_load_again(tmp_path: Path) -> None:
    body = "if not os.path.exists(os.environ['FLAG']):\n        open(os.environ['FLAG'], 'w').close()\n        raise KeyboardInterrupt"  # noqa: E501
    done = _run(
        tmp_path,
        body,
        """
        import tensorplug as tp
        try:
            tp.load_all()
        except KeyboardInterrupt:
            print("interrupted")
        # the interrupted load left nothing half done: this loads everything again
        print(sorted({d.reg.name for d in tp.devices()} | {r.name for r in tp.registry.regs()}))
    """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "interrupted"
    assert "CPU" in lines[1] and "Hostile" in lines[1]
