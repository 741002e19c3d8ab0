"""Where output goes: data to stdout, everything else (progress, messages) to stderr.

Commands take their consoles from here so tests and ``NO_COLOR`` behave the same everywhere.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

# Messages, progress, tables meant for humans: stderr.
err = Console(stderr=True, highlight=False)


def print_error(message: str, hint: str | None = None) -> None:
    """An error for humans on stderr: ``error: MESSAGE`` and, when known, ``fix: HINT``.

    The message and hint are printed without rich markup (they may hold paths and brackets).
    """
    err.print("[bold red]error:[/]", end=" ")
    err.print(message, markup=False, soft_wrap=True)
    if hint:
        err.print("[bold]fix:[/]", end=" ")
        err.print(hint, markup=False, soft_wrap=True)


def out_json(obj: Any) -> None:
    """Print one JSON document on stdout (machine-readable output for ``--json``)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def out_line(text: str) -> None:
    """Print one line of data on stdout (not decorated, safe to pipe)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
