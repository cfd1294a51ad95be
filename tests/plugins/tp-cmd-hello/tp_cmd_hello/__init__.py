"""The cheap part, read whenever `tensorplug` starts: the command's name, help and module."""

from tensorplug.commands import CommandSpec

hello = CommandSpec("hello", "greet someone (a test command)", "tp_cmd_hello.hello_cli")
