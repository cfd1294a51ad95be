"""The CPU plugin's environment settings, declared once with their help text.

Read when they are used (the first time the numba kernels are asked for), never when the
plugin is imported; a value a setting cannot read is refused with a
:class:`tensorplug.settings.SettingError` that names the values it takes.
"""

from __future__ import annotations

from tensorplug.settings import Setting, parse_flag

__all__ = ["JIT", "SETTINGS"]

JIT: Setting[bool] = Setting(
    "TENSORPLUG_CPU_JIT",
    True,
    parse_flag,
    "0 to compute with the numpy kernels alone in this process, never importing numba "
    "(the CPU_REPACK buffer type is then not offered either); a backend can also be made "
    "without them by init_backend('jit=0').",
    example="0",
)

#: every setting of the plugin
SETTINGS = (JIT,)
