"""Shared fixtures. Other test modules may append their own below."""

from __future__ import annotations

import pytest
from plugin_dists import PluginEnv


@pytest.fixture(scope="session")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> PluginEnv:
    """The test plugin distributions (tests/plugins/*) pip-installed into a private folder.

    Use ``plugin_env.run_py(code, env)`` to run code in a fresh process that discovers
    exactly those plugins through their entry points.
    """
    return PluginEnv.create(tmp_path_factory.mktemp("plugin-env"))
