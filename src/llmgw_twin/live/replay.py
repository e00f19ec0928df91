"""Being built in this change (docs/live-twin.md)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def main(args: argparse.Namespace) -> int:
    del args
    print("error: not built yet", file=sys.stderr)
    return 2
