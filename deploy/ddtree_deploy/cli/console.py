"""Where output goes: data to stdout, everything else (progress, messages, tables) to stderr.

The streams, whether each is a terminal, colour and verbosity live in one :class:`Environment`
(httpie's ``Environment`` is the model). ``cli.main`` makes one and hands it to every command as
the click context's ``obj``; a test builds one over ``io.StringIO`` streams and passes it to
``main(argv, env=...)`` instead of capturing globals. No command keeps a console of its own.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from functools import cached_property
from typing import IO, Any

import typer
from rich.console import Console


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real file
        return False


@dataclass
class Environment:
    """The I/O context of one CLI invocation.

    ``stdout`` carries data only (one JSON document with ``--json``, or plain lines); ``stderr``
    carries everything meant for a human. ``*_isatty`` default to what the streams say;
    ``colors`` defaults to on unless ``NO_COLOR`` is set (https://no-color.org); colour is only
    ever drawn on stderr, and only when it is a terminal. ``verbosity`` is the count of ``-v``.
    """

    stdin: IO[str] = field(default_factory=lambda: sys.stdin)
    stdout: IO[str] = field(default_factory=lambda: sys.stdout)
    stderr: IO[str] = field(default_factory=lambda: sys.stderr)
    stdin_isatty: bool | None = None
    stdout_isatty: bool | None = None
    stderr_isatty: bool | None = None
    colors: bool | None = None
    verbosity: int = 0

    def __post_init__(self) -> None:
        if self.stdin_isatty is None:
            self.stdin_isatty = _isatty(self.stdin)
        if self.stdout_isatty is None:
            self.stdout_isatty = _isatty(self.stdout)
        if self.stderr_isatty is None:
            self.stderr_isatty = _isatty(self.stderr)
        if self.colors is None:
            self.colors = os.environ.get("NO_COLOR", "") == ""

    @cached_property
    def err(self) -> Console:
        """The console for humans (stderr): messages, progress, tables."""
        return Console(
            file=self.stderr, highlight=False, no_color=not self.colors, force_terminal=True if self.stderr_isatty else None
        )

    def print_error(self, message: str, hint: str | None = None) -> None:
        """An error for humans on stderr: ``error: MESSAGE`` and, when known, ``fix: HINT``.

        The message and hint are printed without rich markup (they may hold paths and brackets).
        """
        self.err.print("[bold red]error:[/]", end=" ")
        self.err.print(message, markup=False, soft_wrap=True)
        if hint:
            self.err.print("[bold]fix:[/]", end=" ")
            self.err.print(hint, markup=False, soft_wrap=True)

    def out_json(self, obj: Any) -> None:
        """Print one JSON document on stdout (machine-readable output for ``--json``)."""
        self.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
        self.stdout.flush()

    def confirm(self, question: str) -> bool:
        """Ask a yes/no question on stderr and read the answer from stdin; anything but y/yes is no
        (so is end of input: Ctrl-D)."""
        self.stderr.write(f"{question} [y/N]: ")
        self.stderr.flush()
        return self.stdin.readline().strip().lower() in ("y", "yes")

    def out_line(self, text: str) -> None:
        """Print one line of data on stdout (not decorated, safe to pipe)."""
        self.stdout.write(text + "\n")
        self.stdout.flush()


def env_of(ctx: typer.Context) -> Environment:
    """The invocation's Environment (``cli.main`` passes it as the context's ``obj``; the root
    callback makes one when the app is invoked some other way, e.g. typer's ``CliRunner``)."""
    root = ctx.find_root()
    if not isinstance(root.obj, Environment):
        root.obj = Environment()
    obj = ctx.find_object(Environment)
    return obj if obj is not None else root.obj
