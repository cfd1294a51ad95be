"""``tensorplug hello NAME [--times N] [--shout]``: imported only when the command runs."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="whom to greet")
    parser.add_argument("--times", type=int, default=1, help="how many greetings")
    parser.add_argument("--shout", action="store_true", help="in capitals")


def main(args: argparse.Namespace) -> int:
    text = f"Hello, {args.name}!"
    for i in range(args.times):
        print(f"{i + 1}: {text.upper() if args.shout else text}")
    return 0 if args.times > 0 else 3
