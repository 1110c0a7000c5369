"""The command line: thin front ends over the library (top layer; nothing imports it)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``accumguard`` command (imports the subcommands lazily)."""
    from accumguard.cli.main import main as _main

    return _main(argv)
