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
from rich.rule import Rule

# Off a terminal (a pipe, a CI log) the human console is this wide, so tables keep one row per line
# and ids (deploy ids, paths, hashes) are never folded; a terminal keeps its own width.
LOG_WIDTH = 10_000
RULE_WIDTH = 100  # a rule off a terminal (it would otherwise span LOG_WIDTH)

# The keys every ``--json`` document starts with, in this order (then the command's own data).
ENVELOPE_KEYS = ("ok", "exit_code", "error", "message", "hint")


class StdoutClosed(BaseException):
    """stdout was closed by its reader (``ddtree-deploy patches list | head``): the command ends
    quietly. A BaseException, so that no ``except Exception`` (or click's EPIPE handler, which exits
    1) turns it into something else on its way to ``cli.main``."""


def envelope(
    data: dict[str, Any] | None = None,
    *,
    exit_code: int = 0,
    error: str | None = None,
    message: str = "",
    hint: str | None = None,
) -> dict[str, Any]:
    """The one ``--json`` document shape: ``ok``, ``exit_code``, ``error`` (a stable id or null),
    ``message``, ``hint`` (or null), then the command's data (which may not reuse those keys)."""
    doc: dict[str, Any] = {"ok": exit_code == 0, "exit_code": int(exit_code), "error": error, "message": message, "hint": hint}
    for k, v in (data or {}).items():
        if k not in doc:
            doc[k] = v
    return doc


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
    quiet: bool = False

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
        """The console for humans (stderr): messages, progress, tables. Off a terminal it is
        ``LOG_WIDTH`` wide (nothing wraps in a log); ``-q`` makes it quiet (errors still print)."""
        return Console(
            file=self.stderr,
            highlight=False,
            no_color=not self.colors,
            force_terminal=True if self.stderr_isatty else None,
            width=None if self.stderr_isatty else LOG_WIDTH,
            quiet=self.quiet,
        )

    def set_quiet(self, quiet: bool = True) -> None:
        """``-q``: no progress, notes or tables on stderr; errors still print."""
        self.quiet = quiet
        if "err" in self.__dict__:
            self.err.quiet = quiet

    def rule(self, title: str) -> None:
        """A section rule on stderr (its terminal's width, or ``RULE_WIDTH`` off a terminal)."""
        self.err.print(Rule(title), width=None if self.stderr_isatty else RULE_WIDTH)

    def print_error(self, message: str, hint: str | None = None) -> None:
        """An error for humans on stderr: ``error: MESSAGE`` and, when known, ``fix: HINT`` (also with ``-q``).

        The message and hint are printed without rich markup (they may hold paths and brackets).
        """
        was, self.err.quiet = self.err.quiet, False
        try:
            self.err.print("[bold red]error:[/]", end=" ")
            self.err.print(message, markup=False, soft_wrap=True)
            if hint:
                self.err.print("[bold]fix:[/]", end=" ")
                self.err.print(hint, markup=False, soft_wrap=True)
        finally:
            self.err.quiet = was

    def _write_out(self, text: str) -> None:
        try:
            self.stdout.write(text)
            self.stdout.flush()
        except BrokenPipeError:
            raise StdoutClosed() from None
        except ValueError:  # a closed file object
            if getattr(self.stdout, "closed", False):
                raise StdoutClosed() from None
            raise

    def out_json(self, obj: Any) -> None:
        """Print one JSON document on stdout (machine-readable output for ``--json``); commands
        use :meth:`out_result`, which gives every document the same envelope."""
        self._write_out(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")

    def out_result(
        self,
        data: dict[str, Any] | None = None,
        *,
        message: str = "",
        exit_code: int = 0,
        error: str | None = None,
        hint: str | None = None,
    ) -> None:
        """The command's ``--json`` document: :func:`envelope` + ``data``."""
        self.out_json(envelope(data, exit_code=exit_code, error=error, message=message, hint=hint))

    def confirm(self, question: str) -> bool:
        """Ask a yes/no question on stderr and read the answer from stdin; anything but y/yes is no
        (so is end of input: Ctrl-D)."""
        self.stderr.write(f"{question} [y/N]: ")
        self.stderr.flush()
        return self.stdin.readline().strip().lower() in ("y", "yes")

    def out_line(self, text: str) -> None:
        """Print one line of data on stdout (not decorated, safe to pipe; a closed pipe ends quietly)."""
        self._write_out(text + "\n")


def env_of(ctx: typer.Context) -> Environment:
    """The invocation's Environment (``cli.main`` passes it as the context's ``obj``; the root
    callback makes one when the app is invoked some other way, e.g. typer's ``CliRunner``)."""
    root = ctx.find_root()
    if not isinstance(root.obj, Environment):
        root.obj = Environment()
    obj = ctx.find_object(Environment)
    return obj if obj is not None else root.obj
