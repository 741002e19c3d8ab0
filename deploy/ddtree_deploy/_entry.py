"""The console script's entry point: Ctrl-C exits 130 quietly even while the CLI is still importing.

Importing the CLI (typer, rich, paramiko...) takes a moment; a Ctrl-C in that moment would otherwise
end in a KeyboardInterrupt traceback. Until ``cli.main`` runs, SIGINT exits 130 at once; then the
default handler is back and ``cli.main`` maps Ctrl-C to 130 itself; once it has returned, a late
Ctrl-C is ignored (the process exits with the command's code).
"""

from __future__ import annotations

import os
import signal


def _quiet_exit(signum: int, frame: object) -> None:
    os.write(2, b"interrupted\n")
    os._exit(130)


def main() -> None:
    previous = signal.signal(signal.SIGINT, _quiet_exit)
    from ddtree_deploy.cli import main as cli_main

    signal.signal(signal.SIGINT, previous)
    try:
        cli_main()  # exits with the command's code
    finally:  # the command has ended: a Ctrl-C now must not turn its exit into a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
