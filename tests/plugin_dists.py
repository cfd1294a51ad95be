"""Install the test plugin distributions in ``tests/plugins/`` for real and run code
against them.

Each folder under ``tests/plugins/`` is a small distribution with a ``pyproject.toml``
declaring ``tensorplug.backends`` entry points. :class:`PluginEnv` pip-installs them
into a private ``--target`` folder, and runs Python in a subprocess whose ``sys.path``
is that folder, ``core/`` and a copy of this interpreter's site-packages *without* any
installed tensorplug plugin's metadata. So discovery goes through pip-written
``.dist-info`` folders and ``importlib.metadata`` exactly as in production, sees only the test
plugins whatever the developer has installed, and every run is a fresh process (the
registry loads once per process).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
PLUGINS = TESTS / "plugins"
CORE = TESTS.parent / "core"
GROUP = "tensorplug.backends"
RESULT_MARK = "@@tensorplug-test-result@@"


def projects() -> list[Path]:
    return sorted(p for p in PLUGINS.iterdir() if (p / "pyproject.toml").is_file())


def _declares_plugins(dist_info: Path) -> bool:
    eps = dist_info / "entry_points.txt"
    return eps.is_file() and f"[{GROUP}]" in eps.read_text(errors="replace")


def mirror_site_packages(dest: Path) -> Path:
    """Symlink this interpreter's site-packages into ``dest``, leaving out the metadata of
    installed tensorplug plugins (and of tensorplug itself, which comes from ``core/``).

    Without its ``.dist-info`` a distribution has no entry points, so the developer's
    own plugins stay invisible while numpy, pluggy and rich remain importable.
    """
    dest.mkdir(parents=True, exist_ok=True)
    dirs = [Path(p) for p in [*site.getsitepackages(), site.getusersitepackages()]]
    for sp in dirs:
        if not sp.is_dir():
            continue
        for entry in sp.iterdir():
            is_meta = entry.suffix in (".dist-info", ".egg-info")
            if (
                (dest / entry.name).exists()
                or entry.suffix == ".pth"
                or entry.name.startswith("__editable__")
                or entry.name == "tensorplug"
                or (is_meta and (entry.name.startswith("tensorplug-") or _declares_plugins(entry)))
            ):
                continue
            (dest / entry.name).symlink_to(entry)
    return dest


@dataclass
class PluginEnv:
    """A folder with the test plugins pip-installed, and a way to run code against them."""

    target: Path
    site: Path

    @classmethod
    def create(cls, root: Path, which: Iterable[Path] | None = None) -> PluginEnv:
        target = root / "site-target"
        # pip builds each project with the environment's setuptools (the test extra pins a
        # version that builds wheels without network access) and installs it for real
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
        cmd += ["--no-build-isolation", "--no-compile", "--disable-pip-version-check"]
        cmd += ["--target", str(target)]
        subprocess.run([*cmd, *map(str, which or projects())], check=True)
        return cls(target=target, site=mirror_site_packages(root / "site-mirror"))

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORPLUG_", "TP_"))}
        env["PYTHONPATH"] = os.pathsep.join(map(str, (self.target, CORE, self.site)))
        env.setdefault("COLUMNS", "160")
        env.update(extra or {})
        return env

    def command(self, *args: str) -> list[str]:
        """``python -S ARGS``: -S keeps the real site-packages (and its plugins) off the path."""
        return [sys.executable, "-S", *args]

    def run(
        self, args: list[str], env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args),
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run_py(
        self, code: str, env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> dict[str, Any]:
        """Run ``code`` in a fresh process and return the JSON of the ``result`` it sets."""
        script = textwrap.dedent(code) + (
            f"\nimport json as _json\nprint({RESULT_MARK!r} + _json.dumps(result, default=str))\n"
        )
        proc = self.run(["-c", script], env, timeout)
        if proc.returncode != 0:
            raise AssertionError(
                f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK))
        out: dict[str, Any] = json.loads(line[len(RESULT_MARK) :])
        out["_stderr"] = proc.stderr
        return out
