"""TESTACCEL: a pretend accelerator for the scheduler tests (cheap registration only).

Two devices with private memory each; see :mod:`.device` for what they do and do not
support. ``init`` is a callable doing a relative import, so the package works both when
installed and when loaded from its folder with ``tensorplug.registry.load(path)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorplug.registration import Registration

if TYPE_CHECKING:
    from tensorplug.device import Reg


def _create_reg() -> Reg:
    from .device import TestAccelReg

    return TestAccelReg()


registration = Registration(
    name="TESTACCEL",
    api_version=(1, 0),
    init=_create_reg,
    score=1,
    description="fake accelerator with private memory, for scheduler tests",
)
