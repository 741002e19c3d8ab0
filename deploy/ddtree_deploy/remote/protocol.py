"""The host protocol in one place, shared by the host-side agent and the client.

Standard library only, Python >= 3.8, no ``from __future__`` and no imports from ``ddtree_deploy``:
the client sends this file's source AHEAD of ``agent.py`` over the SSH channel (see
``connection.agent_source``), so on the host the agent sees these names as its own globals.

Wire format (stdin): ``<len>\\n<protocol + agent source>``, then requests, each ``<len>\\n<request
JSON>`` followed by its payload. Output (stdout), per request: zero or more ``DDTREE-EVENT {json}``
lines, then exactly one ``DDTREE-RESULT {json}``: ``{"ok": true, ...}`` or ``{"ok": false,
"error": <ErrorKind id>, "message": str, "hint": str|null, "details": {...}}``.
"""

AGENT_FORMAT = 1
EVENT_PREFIX = "DDTREE-EVENT"
RESULT_PREFIX = "DDTREE-RESULT"

# --- deploy record statuses (``deploys/<id>/record.json`` on the host) -----------------------------
DEPLOYED = "deployed"  # a push that finished: the live deploy
BACKING_UP = "backing-up"
STAGING = "staging"
WRITING = "writing"
WRITTEN = "written"
RESTORING = "restoring"
ROLLED_BACK = "rolled-back"  # a push that failed after writing and was restored
ABORTED = "aborted"  # a push that stopped before writing anything
UNDONE = "undone"  # a deployed push that a rollback undid
NEEDS_HUMAN = "needs-human"  # a restore failed: see ``status``
UNREADABLE = "unreadable"  # record.json could not be read

APPLIED = (DEPLOYED,)
INTERRUPTED = (BACKING_UP, STAGING, WRITING, WRITTEN, RESTORING)
RECORD_STATUSES = APPLIED + INTERRUPTED + (ROLLED_BACK, ABORTED, UNDONE, NEEDS_HUMAN, UNREADABLE)


class ErrorKind:
    """Stable error ids: the agent's ``"error"`` field, and the ``"error"`` code in every ``--json``.

    Each ``ddtree_deploy.errors`` class names its id in ``kind``; the ids are frozen strings (they
    happen to be the classes' original names), so renaming a class changes no output.
    """

    UNEXPECTED = "DDTreeDeployError"
    USAGE = "UsageError"
    INVENTORY = "InventoryError"
    SNAPSHOT = "SnapshotError"
    PIN = "PinError"
    FETCH = "FetchError"
    HASH_MISMATCH = "HashMismatchError"
    SNAPSHOT_MISSING = "SnapshotMissingError"
    PATCH = "PatchError"
    SERIES = "SeriesError"
    PATCH_PARSE = "PatchParseError"
    PATCH_REFUSED = "PatchRefusedError"
    PATCH_APPLY = "PatchApplyError"
    EMPTY_PATCH = "EmptyPatchError"
    COMPILE = "CompileError"
    MANIFEST = "ManifestError"
    REMOTE = "RemoteError"
    HOST_REFUSED = "HostRefusedError"
    HOST_KEY = "HostKeyError"
    DRIFT = "DriftError"
    HOST_EDITED = "HostEditedError"
    LOCK_HELD = "LockHeldError"
    ROLLED_BACK = "RolledBackError"
    ROLLBACK_FAILED = "RollbackFailedError"
    BROKEN_BACKUP = "BrokenBackupError"
    CONNECTION_LOST = "ConnectionLostError"
    SMOKE_FAILED = "SmokeFailedError"
    ATTENTION = "AttentionError"
    PARTIAL_FAILURE = "PartialFailureError"
    COMPARE_FAILED = "CompareFailedError"
    INTERRUPTED = "Interrupted"
    DEMO_STEP = "DemoStepFailed"  # a step of `ddtree-deploy demo` did not end as expected (exit 1)


ERROR_KINDS = frozenset(v for k, v in vars(ErrorKind).items() if k.isupper())
