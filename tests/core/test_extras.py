"""tensorplug.extras: an optional package that is missing is named with its extra; one
that is installed but broken keeps its own error. (A whole core-only install, with
gguf and rich really missing, is tests/core/test_core_install.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorplug import MissingDependencyError, extras


def test_a_missing_package_is_named_with_the_extra_that_brings_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(extras.EXTRAS, "tp_absent_pkg", "absent")
    with pytest.raises(MissingDependencyError) as info:
        extras.require("tp_absent_pkg.sub", "frobnicating")
    assert str(info.value) == (
        "frobnicating needs the tp_absent_pkg package: pip install 'tensorplug[absent]'"
    )
    assert isinstance(info.value, ImportError)  # generic handlers keep working
    assert not extras.available("tp_absent_pkg")


def test_a_broken_installed_package_keeps_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tp_broken_pkg").mkdir()
    (tmp_path / "tp_broken_pkg" / "__init__.py").write_text("import tp_its_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert extras.available("tp_broken_pkg")  # found; importing it is another matter
    with pytest.raises(ModuleNotFoundError) as info:
        extras.require("tp_broken_pkg", "frobnicating")
    assert not isinstance(info.value, MissingDependencyError)
    assert info.value.name == "tp_its_missing_dependency"


def test_an_installed_package_is_returned() -> None:
    import json

    assert extras.require("json", "anything") is json
