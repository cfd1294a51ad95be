"""The cheap object a plugin's entry point names: what the registry needs before loading it.

Discovery imports every installed plugin's registration to learn its backend name,
API version and score, but initialises only the winners. So the module that defines
a registration must stay tiny: it may import this module and numpy, never the plugin's
kernels or a GPU library. The heavy part is named by ``init`` as a ``"module:attr"``
string and imported only when the plugin wins::

    # tensorplug_foo/__init__.py
    from tensorplug.registration import Registration

    def _score() -> tuple[int, str]:
        import shutil
        if shutil.which("foo-smi") is None:
            return 0, "no FOO driver found (foo-smi is not on PATH)"
        return 10, "FOO driver found"

    registration = Registration(
        name="FOO", api_version=(1, 3), init="tensorplug_foo.reg:create_reg", score=_score
    )

and in ``pyproject.toml``: ``[project.entry-points."tensorplug.backends"] foo =
"tensorplug_foo:registration"``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from .errors import ApiVersionError, ApiVersionFormatError, PluginError
from .version import API_VERSION, __version__

if TYPE_CHECKING:
    from .device import Reg

__all__ = [
    "Registration",
    "ScoreFn",
    "api_compatible",
    "api_version_of",
    "check_api_version",
    "resolve_object",
]

#: What ``score`` may be: a number, or a function returning a number or ``(number, reason)``.
ScoreFn = Union[int, Callable[[], Union[int, tuple[int, str]]]]  # noqa: UP007 (runtime alias)

#: Backend names appear in comma-separated environment variables and CLI tables.
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]*$")

#: Each part of an ``api_version`` is below this: a larger one is a mistake (a date, a
#: build number) that no release of tensorplug will match.
API_PART_LIMIT = 1000


@dataclass(frozen=True)
class Registration:
    """A backend plugin's registration: its name, API version, score and how to start it.

    ``name``: the backend (reg) name, e.g. ``"CPU"``; compared case-insensitively.
    ``api_version``: the ``(major, minor)`` plugin API the plugin was written against;
    the minor is also the op contract it implements (:mod:`tensorplug.contract`): its
    devices are never handed a node needing a later contract feature. It has no default
    on purpose: a default would always equal the running core's and make both the
    compatibility check and the contract meaningless.
    ``init``: ``"module:attr"`` naming a callable that returns the :class:`~tensorplug.Reg`
    (or the Reg itself), or that callable; a string keeps the heavy import lazy.
    ``score``: how well this variant fits this machine; higher wins among variants of
    one backend name, and 0 means "cannot run here". A function may return
    ``(score, reason)`` so that ``tensorplug doctor`` can say why.
    """

    name: str
    api_version: tuple[int, int]
    init: str | Callable[[], Reg]
    score: ScoreFn = 1
    description: str = ""

    def __post_init__(self) -> None:
        # Mistakes surface when the plugin's registration module is imported, which the
        # registry records against the plugin, rather than later at init time.
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(
                f"Registration.name must be a backend name such as 'CPU' or 'OpenCL' (a letter, "
                f"then letters, digits, '_', '.', '+' or '-'), got {self.name!r}"
            )
        version = api_version_of(self.api_version, plugin=f"Registration {self.name!r}")
        object.__setattr__(self, "api_version", version)  # a list from a duck type: a tuple
        if isinstance(self.init, str):
            if self.init.count(":") != 1 or not all(self.init.split(":")):
                raise ValueError(
                    f"Registration {self.name!r}: init must be 'module:attr' (for example "
                    f"'tensorplug_foo.reg:create_reg') or a callable, got {self.init!r}"
                )
        elif not callable(self.init):
            raise TypeError(
                f"Registration {self.name!r}: init must be a 'module:attr' string or a "
                f"callable returning a Reg, got {type(self.init).__name__}"
            )
        if not callable(self.score) and not _is_int(self.score):
            raise TypeError(
                f"Registration {self.name!r}: score must be an int or a callable returning "
                f"an int or (int, reason), got {type(self.score).__name__}"
            )

    @classmethod
    def coerce(cls, obj: Any) -> Registration:
        """Accept a :class:`Registration` or any object with the same attributes.

        Duck typing lets a plugin expose a module or a small class of its own as the
        entry point, as long as it carries ``name``, ``api_version`` and ``init``.
        """
        if isinstance(obj, cls):
            return obj
        missing = [a for a in ("name", "api_version", "init") if not hasattr(obj, a)]
        if missing:
            raise TypeError(
                f"a tensorplug entry point must name a tensorplug.registration.Registration "
                f"(or an object with name, api_version, init and optionally score), got "
                f"{type(obj).__name__} without {', '.join(missing)}"
            )
        return cls(
            name=obj.name,
            api_version=obj.api_version,  # checked, with the plugin's name, by __post_init__
            init=obj.init,
            score=getattr(obj, "score", 1),
            description=getattr(obj, "description", ""),
        )

    def evaluate_score(self) -> tuple[int, str]:
        """Run the score function and normalise its result to ``(score, reason)``."""
        raw: Any = self.score() if callable(self.score) else self.score
        reason = ""
        if isinstance(raw, tuple):
            if len(raw) != 2 or not isinstance(raw[1], str):
                raise TypeError(
                    f"{self.name}: score() must return an int or (int, reason: str), got {raw!r}"
                )
            raw, reason = raw
        if not _is_int(raw) or raw < 0:
            raise TypeError(f"{self.name}: score() must return an int >= 0, got {raw!r}")
        if not reason:
            reason = "cannot run on this machine" if raw == 0 else ""
        return int(raw), reason

    def create_reg(self) -> Reg:
        """Import the heavy part of the plugin and build its :class:`~tensorplug.Reg`."""
        from .device import Reg

        target: Any = resolve_object(self.init) if isinstance(self.init, str) else self.init
        reg = target if isinstance(target, Reg) else target()
        if not isinstance(reg, Reg):
            raise PluginError(
                f"{self.name}: init ({self.init!r}) returned {type(reg).__name__}, expected a "
                "tensorplug.Reg subclass instance"
            )
        return reg


def resolve_object(spec: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute (entry-point syntax)."""
    module_name, _, attr_path = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split(".") if attr_path else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"{spec!r}: module {module_name!r} has no {attr_path!r}") from None
    return obj


def api_version_of(value: object, *, plugin: str) -> tuple[int, int]:
    """``value`` as a ``(major, minor)`` pair of ints from 0 to ``API_PART_LIMIT - 1``
    (a tuple or a list), else :class:`ApiVersionFormatError` naming ``plugin`` and the
    fix. Every declaration passes here: a Registration's, a duck-typed one's, a Reg's."""
    parts = value if isinstance(value, (tuple, list)) else ()
    if len(parts) == 2 and all(_is_int(p) and 0 <= p < API_PART_LIMIT for p in parts):
        return (int(parts[0]), int(parts[1]))
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise ApiVersionFormatError(
        f"{plugin}: api_version must be a (major, minor) pair of whole numbers from 0 to "
        f"{API_PART_LIMIT - 1}, got {shown} (a {type(value).__name__}). Fix: declare the "
        f"plugin API the plugin was written against, e.g. api_version={API_VERSION} (what "
        f"tensorplug {__version__} provides) or an older ({API_VERSION[0]}, minor)"
    )


def api_compatible(found: tuple[int, int]) -> bool:
    """Same major as core's and a minor that is not newer (False for a malformed pair:
    :func:`check_api_version` says what is wrong with it)."""
    try:
        major, minor = api_version_of(found, plugin="")
    except ApiVersionFormatError:
        return False
    return major == API_VERSION[0] and minor <= API_VERSION[1]


def check_api_version(found: tuple[int, int], *, plugin: str, package: str | None) -> None:
    """Refuse a plugin whose API major differs from core's or whose minor is newer.

    Minors only add optional members with defaults, so a plugin written for an older
    minor runs on a newer core, never the other way round. ``plugin`` says which plugin
    this is in the message, ``package`` is the distribution to upgrade (if known).
    A malformed ``found`` is refused by :func:`api_version_of`.
    """
    found = api_version_of(found, plugin=plugin)
    if api_compatible(found):
        return
    major, minor = found
    core_major, core_minor = API_VERSION
    pkg = package or "the plugin"
    pkg_cmd = f"pip install -U {package}" if package else "upgrade the plugin"
    if major > core_major or (major == core_major and minor > core_minor):
        fix = (
            f"upgrade tensorplug (pip install -U tensorplug) to a release providing plugin "
            f"API {major}.{minor} or newer within {major}.x, or install an older {pkg} built "
            f"for API {core_major}.{core_minor}"
        )
    else:
        fix = (
            f"upgrade {pkg} ({pkg_cmd}) to a release built for plugin API {core_major}.x, "
            f"or install tensorplug<{major + 1}"
        )
    raise ApiVersionError(
        f"{plugin} was built for tensorplug plugin API {major}.{minor}, but tensorplug "
        f"{__version__} provides plugin API {core_major}.{core_minor} (the major must match "
        f"and the plugin's minor must not be newer). Fix: {fix}."
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
