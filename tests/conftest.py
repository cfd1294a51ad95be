"""Shared fixtures. Other test modules may append their own below."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# The shared helpers (plugin_dists, tiny_server, fake_cupy, test_cpu_helpers...) live
# beside this file and the tests, one folder down by subject, import them by module name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugin_dists import PluginEnv


def missing_in_ci(environ: dict[str, str] | os._Environ[str], opencl_score: tuple[int, str]) -> str:
    """Why this CI run cannot count (CI=true but no OpenCL device), or "" when it can.

    Off CI a missing driver only skips the OpenCL tests, each saying why. In CI the same
    skips would hide a broken install step behind a green run: 40% of the suite.
    """
    if environ.get("CI", "").lower() not in ("1", "true", "yes") or opencl_score[0] > 0:
        return ""
    return (
        f"CI=true but OpenCL cannot run here ({opencl_score[1]}); the OpenCL tests would all "
        "be skipped. Install the README's test command (it installs pocl-binary-distribution)."
    )


#: the cache folders this run made (device lists, the core's), removed when it ends
_OWN_CACHE_FOLDERS: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """The GPU plugins' kept device lists go to a folder of this run's own, unless one
    was named: tests run processes with other driver variables (a list's key holds
    them), whose lists, written to ``~/.cache/tensorplug/devices``, made the developer's
    next ``tensorplug run`` start every GPU driver again (+0.3 s, +60 MB, once)."""
    if "TENSORPLUG_DEVICE_CACHE" not in os.environ:
        folder = tempfile.mkdtemp(prefix="tensorplug-devices-")
        _OWN_CACHE_FOLDERS.append(folder)
        os.environ["TENSORPLUG_DEVICE_CACHE"] = folder
    # the same for what the core keeps (tensorplug.installed, the GGUF headers): the tests'
    # environments and files, each a key of its own, would push the developer's out
    if "TENSORPLUG_CACHE" not in os.environ:
        folder = tempfile.mkdtemp(prefix="tensorplug-cache-")
        _OWN_CACHE_FOLDERS.append(folder)
        os.environ["TENSORPLUG_CACHE"] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _OWN_CACHE_FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)
        for name in ("TENSORPLUG_DEVICE_CACHE", "TENSORPLUG_CACHE"):
            if os.environ.get(name) == folder:
                del os.environ[name]
    _OWN_CACHE_FOLDERS.clear()


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        from tensorplug_opencl import score
    except ImportError as e:
        why = missing_in_ci(os.environ, (0, f"tensorplug_opencl cannot be imported: {e}"))
    else:
        why = missing_in_ci(os.environ, score()) if os.environ.get("CI") else ""
    if why:
        raise pytest.UsageError(why)


@pytest.fixture(scope="session")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> PluginEnv:
    """The test plugin distributions (tests/plugins/*) pip-installed into a private folder.

    Use ``plugin_env.run_py(code, env)`` to run code in a fresh process that discovers
    exactly those plugins through their entry points.
    """
    return PluginEnv.create(tmp_path_factory.mktemp("plugin-env"))
