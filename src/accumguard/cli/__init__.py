"""The command line: thin front ends over the library (top layer; nothing imports it).

The parser and dispatch live in :mod:`.app`, not in a module named ``main``: a submodule
of that name would replace this package's ``main`` function once anything imported it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``accumguard`` command (imports the subcommands lazily)."""
    from accumguard.cli.app import main as _main

    return _main(argv)
