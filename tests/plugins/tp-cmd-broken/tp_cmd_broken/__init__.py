"""Command specs that look fine; see pyproject.toml for what is wrong with each."""

from tensorplug.commands import CommandSpec

lazy_broken = CommandSpec(
    "lazy-broken", "a command whose module cannot be imported", "tp_cmd_broken.needs_missing"
)

#: Must never be imported: the core's `devices` wins before the entry point is loaded.
devices = CommandSpec("devices", "a third party's devices (refused)", "tp_cmd_broken.missing")
