"""One exception hierarchy for the whole core.

Every error the core raises on purpose is a :class:`DDTreeDeployError`. Each class carries the
process exit code the CLI turns it into (the CLI maps them in one place, ``cli/__init__.py``;
the README lists them). An error may also carry a ``hint``: the exact command that fixes it.

Exit codes (keep in sync with the README's table):

====  ==========================================================================
0     success
1     unexpected failure (a bug: please report it)
2     usage error (bad flag, unknown host, bad inventory or config; always with a hint)
3     snapshot or pin error (download failed, wheel or file hash differs from the pin)
4     patch error (parse error, refused path, does not apply exactly)
5     compile error (a patched ``.py`` file does not ``py_compile``)
6     host refused before anything was written (host key, version, drift, disk, perms)
7     deploy lock held by someone else
8     push failed after writing; the host was rolled back to its previous state
9     rollback failed or backup unusable: the host needs a human (see ``status``)
10    several hosts were asked and some of them failed (see the table / ``--json``)
11    comparison against a baseline failed its thresholds
12    smoke test or health check failed on a host (nothing was changed by ``smoke`` itself)
13    could not reach the host, or lost the connection to it (retry; for a push see ``status``)
14    ``status --strict``: a host is drifted, interrupted or needs a human
130   interrupted (Ctrl-C)
====  ==========================================================================
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Mapping, Protocol

from ddtree_deploy.remote.protocol import ErrorKind


class ExitCode(IntEnum):
    """Every exit code the CLI can produce (the README's table lists the same rows)."""

    OK = 0
    UNEXPECTED = 1
    USAGE = 2
    SNAPSHOT = 3
    PATCH = 4
    COMPILE = 5
    HOST_REFUSED = 6
    LOCK_HELD = 7
    ROLLED_BACK = 8
    NEEDS_HUMAN = 9
    PARTIAL = 10
    COMPARE_FAILED = 11
    SMOKE_FAILED = 12
    UNREACHABLE = 13
    ATTENTION = 14
    INTERRUPTED = 130


class DDTreeDeployError(Exception):
    """Base class. ``exit_code`` says how the CLI exits; ``hint`` says how to fix it."""

    kind = ErrorKind.UNEXPECTED

    exit_code = ExitCode.UNEXPECTED

    def __init__(self, message: str, *, hint: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details or {}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.details)  # never lets a detail hide the error's name or message
        out.update({"error": self.kind, "message": self.message})
        if self.hint:
            out["hint"] = self.hint
        return out


class UsageError(DDTreeDeployError):
    kind = ErrorKind.USAGE
    exit_code = ExitCode.USAGE


class InventoryError(UsageError):
    """The host inventory is missing, malformed, or names no such host."""

    kind = ErrorKind.INVENTORY


# --- snapshot / pin ---------------------------------------------------------------------------


class SnapshotError(DDTreeDeployError):
    kind = ErrorKind.SNAPSHOT
    exit_code = ExitCode.SNAPSHOT


class PinError(SnapshotError):
    """The pin file is missing, malformed, or does not cover what the series touches."""

    kind = ErrorKind.PIN


class FetchError(SnapshotError):
    """The pinned wheel could not be downloaded or unpacked."""

    kind = ErrorKind.FETCH


class HashMismatchError(SnapshotError):
    """A wheel or file does not have the sha256 the pin records."""

    kind = ErrorKind.HASH_MISMATCH

    def __init__(self, what: str, expected: str, actual: str, *, hint: str | None = None):
        super().__init__(
            f"{what}: sha256 {actual} does not match the pin's {expected}",
            hint=hint,
            details={"file": what, "expected_sha256": expected, "actual_sha256": actual},
        )
        self.what = what
        self.expected = expected
        self.actual = actual


class SnapshotMissingError(SnapshotError):
    """The pinned snapshot is not in the cache yet."""

    kind = ErrorKind.SNAPSHOT_MISSING


# --- patches ----------------------------------------------------------------------------------


class PatchError(DDTreeDeployError):
    kind = ErrorKind.PATCH
    exit_code = ExitCode.PATCH


class SeriesError(PatchError):
    """The series file is malformed or names a patch that does not exist."""

    kind = ErrorKind.SERIES


class PatchParseError(PatchError):
    """A patch is not a well-formed unified diff."""

    kind = ErrorKind.PATCH_PARSE


class PatchRefusedError(PatchError):
    """A patch is well formed but asks for something we never do (binary, unsafe path, ...)."""

    kind = ErrorKind.PATCH_REFUSED


class PatchApplyError(PatchError):
    """A hunk does not match the base exactly (zero fuzz, zero offset)."""

    kind = ErrorKind.PATCH_APPLY

    def __init__(
        self,
        *,
        patch: str,
        file: str,
        hunk: int,
        line: int,
        expected: str | None,
        actual: str | None,
        reason: str,
        hint: str | None = None,
    ):
        msg = f"{patch}: {file}: hunk #{hunk} does not apply at line {line}: {reason}"
        if expected is not None or actual is not None:
            msg += f"\n  expected: {expected!r}\n  actual:   {actual!r}"
        super().__init__(
            msg,
            hint=hint,
            details={
                "patch": patch,
                "file": file,
                "hunk": hunk,
                "line": line,
                "expected": expected,
                "actual": actual,
                "reason": reason,
            },
        )
        self.patch = patch
        self.file = file
        self.hunk = hunk
        self.line = line
        self.expected = expected
        self.actual = actual
        self.reason = reason


class CompileError(DDTreeDeployError):
    """A patched Python file does not compile; names the patch that broke it."""

    kind = ErrorKind.COMPILE

    exit_code = ExitCode.COMPILE


# --- remote -----------------------------------------------------------------------------------


class RemoteError(DDTreeDeployError):
    """Something went wrong talking to a host."""

    kind = ErrorKind.REMOTE

    exit_code = ExitCode.UNEXPECTED


class HostRefusedError(RemoteError):
    """Preflight refused the host before anything was written."""

    kind = ErrorKind.HOST_REFUSED

    exit_code = ExitCode.HOST_REFUSED


class HostKeyError(HostRefusedError):
    """The host's key is unknown (and not explicitly accepted) or has changed."""

    kind = ErrorKind.HOST_KEY


class DriftError(HostRefusedError):
    """A target file on the host is neither the pinned pristine file nor our patched file."""

    kind = ErrorKind.DRIFT


class LockHeldError(RemoteError):
    kind = ErrorKind.LOCK_HELD
    exit_code = ExitCode.LOCK_HELD


class RolledBackError(RemoteError):
    """The push failed after writing; the host was restored and verified."""

    kind = ErrorKind.ROLLED_BACK

    exit_code = ExitCode.ROLLED_BACK


class RollbackFailedError(RemoteError):
    """Restoring the host failed: it needs a human."""

    kind = ErrorKind.ROLLBACK_FAILED

    exit_code = ExitCode.NEEDS_HUMAN


class ConnectionLostError(RemoteError):
    """Could not reach the host, or the SSH connection dropped mid-operation: retry (a push that had
    sent its whole payload finishes or rolls back on the host by itself; ``status`` says which)."""

    kind = ErrorKind.CONNECTION_LOST

    exit_code = ExitCode.UNREACHABLE


class HostEditedError(HostRefusedError):
    """``rollback`` found a file edited on the host after the deploy (neither the deployed nor the
    earlier hash): refused before any write unless ``--force`` (which keeps a copy first)."""

    kind = ErrorKind.HOST_EDITED


class BrokenBackupError(RollbackFailedError):
    """A backup that ``rollback`` needs is missing or does not have its recorded hash: refused
    before any write (the host is untouched, but it needs a human)."""

    kind = ErrorKind.BROKEN_BACKUP


class AttentionError(DDTreeDeployError):
    """``status --strict``: some host is drifted, interrupted or needs a human."""

    kind = ErrorKind.ATTENTION

    exit_code = ExitCode.ATTENTION


class PartialFailureError(DDTreeDeployError):
    """Several hosts were asked and some failed."""

    kind = ErrorKind.PARTIAL_FAILURE

    exit_code = ExitCode.PARTIAL


class CompareFailedError(DDTreeDeployError):
    kind = ErrorKind.COMPARE_FAILED
    exit_code = ExitCode.COMPARE_FAILED


class SmokeFailedError(RemoteError):
    kind = ErrorKind.SMOKE_FAILED
    exit_code = ExitCode.SMOKE_FAILED


class Interrupted(DDTreeDeployError):
    """The user pressed Ctrl-C (exit 130): raised where a step noticed it, or by the CLI for a
    KeyboardInterrupt anywhere in a command."""

    kind = ErrorKind.INTERRUPTED

    exit_code = ExitCode.INTERRUPTED


class EmptyPatchError(PatchParseError):
    """A file in the series holds no diff at all: bad input, refused where it enters."""

    kind = ErrorKind.EMPTY_PATCH

    exit_code = ExitCode.USAGE


EXIT_UNEXPECTED = ExitCode.UNEXPECTED
EXIT_INTERRUPTED = ExitCode.INTERRUPTED


# --- the exit code of a run over several hosts ------------------------------------------------------


class _HostOutcome(Protocol):
    @property
    def exit_code(self) -> int: ...


class FleetOutcome(Protocol):
    """What :func:`fleet_exit_code` reads (``remote.fleet.FleetResult`` is one)."""

    @property
    def failed(self) -> Mapping[str, _HostOutcome]: ...

    def __len__(self) -> int: ...


def fleet_exit_code(fleet: FleetOutcome, *, ok_code: int = ExitCode.OK) -> ExitCode:
    """The one rule for a run over hosts: no host failed -> ``ok_code`` (``status --strict`` passes
    ATTENTION); a host interrupted -> INTERRUPTED; one host asked -> its own code; several -> PARTIAL."""
    failed = list(fleet.failed.values())
    if not failed:
        return ExitCode(ok_code)
    if any(r.exit_code == ExitCode.INTERRUPTED for r in failed):
        return ExitCode.INTERRUPTED
    if len(fleet) == 1:
        return ExitCode(failed[0].exit_code)
    return PartialFailureError.exit_code
