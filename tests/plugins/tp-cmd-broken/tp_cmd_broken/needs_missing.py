"""A command module whose own dependency is not installed."""

import tp_no_such_dependency  # noqa: F401


def main(args: object) -> int:
    return 0
