"""Version numbers: the distribution's, and the plugin API's that plugins are checked against."""

from __future__ import annotations

__all__ = ["API_VERSION", "__version__"]

__version__ = "0.1.0"

#: The plugin API (major, minor). A plugin must have the same major and a minor that is
#: lower or equal: minors only add optional members with defaults.
API_VERSION: tuple[int, int] = (1, 4)
