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


def out_json(obj: Any) -> None:
    """Print one JSON document on stdout (machine-readable output for ``--json``)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def out_line(text: str) -> None:
    """Print one line of data on stdout (not decorated, safe to pipe)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
