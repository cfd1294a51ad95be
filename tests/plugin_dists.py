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
import pty
import site
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
PLUGINS = TESTS / "plugins"
CORE = TESTS.parent / "core"
GROUP = "tensorplug.backends"
COMMANDS_GROUP = "tensorplug.commands"
RESULT_MARK = "@@tensorplug-test-result@@"

#: Settings the test processes keep: where the run keeps what it learns (conftest.py)
KEPT_SETTINGS = ("TENSORPLUG_CACHE",)


#: In a test distribution's pyproject.toml: installed only by the tests about it, in an
#: environment of their own, so that the registry tests' plugin set stays as they expect.
OWN_ENV = "shared-env = false"


def projects(group: str = GROUP) -> list[Path]:
    """The test distributions declaring entry points of ``group``: by default the
    backends, which the shared ``plugin_env`` installs; the command distributions
    (``tensorplug.commands``) are installed only by the tests about commands, and those
    marked :data:`OWN_ENV` only by the tests about them."""
    found = (p / "pyproject.toml" for p in PLUGINS.iterdir())
    return sorted(
        t.parent
        for t in found
        if t.is_file() and f'."{group}"]' in (text := t.read_text()) and OWN_ENV not in text
    )


def _declares_plugins(dist_info: Path) -> bool:
    eps = dist_info / "entry_points.txt"
    text = eps.read_text(errors="replace") if eps.is_file() else ""
    return f"[{GROUP}]" in text or f"[{COMMANDS_GROUP}]" in text


def mirror_site_packages(dest: Path) -> Path:
    """Symlink this interpreter's site-packages into ``dest``, leaving out the metadata of
    installed tensorplug plugins and command distributions such as tensorplug-llm (and
    of tensorplug itself, which comes from ``core/``).

    Without its ``.dist-info`` a distribution has no entry points, so the developer's
    own plugins and commands stay invisible while numpy, pluggy and rich remain importable.
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
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TENSORPLUG_", "TP_")) or k in KEPT_SETTINGS}  # fmt: skip
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


def listed(help_text: str) -> dict[str, str]:
    """The subcommands ``tensorplug --help`` lists, in its order, each with its help line
    (argparse indents them by four spaces; a help line's continuation by more)."""
    section = help_text.split("positional arguments:")[1].split("options:")[0]
    found: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        if line.startswith("     ") and name:  # the help line goes on
            found[name] = f"{found[name]} {line.strip()}".strip()
        elif line.startswith("    "):
            name, _, text = line.strip().partition(" ")
            found[name] = text.strip()
    return found


def link_distributions(dest: Path, names: Iterable[str]) -> Path:
    """Symlink the installed files of the distributions ``names`` (their top-level
    packages, modules and ``.dist-info``) from this interpreter into ``dest``.

    A folder made so and named in a ``.pth`` file gives a fresh environment exactly those
    distributions, installed as far as pip and ``importlib.metadata`` can tell, without
    a network or an index: the offline way to satisfy a project's requirements.
    """
    from importlib import metadata

    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        dist = metadata.distribution(name)
        tops = {f.parts[0] for f in dist.files or () if f.parts and f.parts[0] != ".."}
        for top in sorted(tops):
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (dest / top).exists() and source.suffix != ".pth":
                (dest / top).symlink_to(source)
    return dest


@dataclass
class Venv:
    """A fresh virtual environment, without the system's site-packages, for checking
    what a pip install brings. Its only third-party packages are those pip installs
    and those given to :meth:`create`; pip reads no configuration and no index."""

    root: Path

    @classmethod
    def create(cls, root: Path, provided: Iterable[str] = ()) -> Venv:
        """``provided``: distributions linked in from this interpreter (numpy...). pip is
        always one of them: the venv gets no pip (nor, before Python 3.12, setuptools) of
        its own, so it runs this interpreter's pip and builds with the setuptools given."""
        cmd = [sys.executable, "-m", "venv", "--without-pip", str(root)]
        subprocess.run(cmd, check=True, timeout=300)
        venv = cls(root)
        shelf = link_distributions(root / "provided", ["pip", *provided])
        (venv.site_packages / "_tensorplug_test_provided.pth").write_text(f"{shelf}\n")
        return venv

    @property
    def bin(self) -> Path:
        return self.root / ("Scripts" if os.name == "nt" else "bin")

    @property
    def python(self) -> Path:
        return self.bin / ("python.exe" if os.name == "nt" else "python")

    @property
    def site_packages(self) -> Path:
        code = "import sysconfig; print(sysconfig.get_path('purelib'))"
        out = subprocess.run([self.python, "-c", code], capture_output=True, text=True, check=True)
        return Path(out.stdout.strip())

    def env(self) -> dict[str, str]:
        """Hermetic: no pip settings or configuration files (an index or find-links of the
        developer's would hide a missing requirement), no PYTHONPATH, no tensorplug settings."""
        skip = ("PIP_", "PYTHON", "TENSORPLUG_", "TP_", "VIRTUAL_ENV")
        env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", COLUMNS="160")
        return env

    def run(self, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``args[0]`` is a program of the environment (``python``, ``tensorplug``)."""
        cmd = [str(self.bin / args[0]), *map(str, args[1:])]
        return subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout)

    def pip_install(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        """``pip install`` with no index: requirements must already be satisfied here."""
        flags = ("--no-index", "--no-build-isolation", "--no-compile", "--quiet")
        return self.run("python", "-m", "pip", "install", *flags, *args, timeout=300)


def on_a_terminal(cmd: Sequence[str], env: Mapping[str, str]) -> str:
    """What ``cmd`` writes to stdout when stdout is a terminal (a pty), for output that
    depends on one (rich's tables, line endings); it must exit 0."""
    main, sub = pty.openpty()
    proc = subprocess.Popen(list(cmd), stdout=sub, stderr=subprocess.DEVNULL, env=dict(env))
    os.close(sub)
    chunks = []
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=60) == 0
    os.close(main)
    return b"".join(chunks).decode().replace("\r\n", "\n")
