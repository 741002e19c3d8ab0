"""SSH connections (Fabric 3 over paramiko) with host-key checking ON.

Fabric's ``Connection`` installs paramiko's ``AutoAddPolicy`` (it trusts any host key). We replace
it: the host's ``known_hosts`` file is loaded read-only, an unknown key is refused (``HostKeyError``)
unless ``--accept-new-host-key`` was given (then it is appended to that file, like OpenSSH's
``StrictHostKeyChecking=accept-new``), and a changed key is always refused.

``run_agent`` runs the host-side agent (``agent.py``) through one SSH exec channel: the agent's
source, the JSON request and the payload go over stdin, so no remote path is ever put on a shell
command line except the interpreter's, which is ``shlex.quote``d.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import select
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import paramiko
from fabric import Config, Connection

from ddtree_deploy.errors import (
    BrokenBackupError,
    ConnectionLostError,
    DDTreeDeployError,
    DriftError,
    HostEditedError,
    HostKeyError,
    HostRefusedError,
    Interrupted,
    LockHeldError,
    RemoteError,
    RollbackFailedError,
    RolledBackError,
    SmokeFailedError,
    UsageError,
)
from ddtree_deploy.remote import protocol
from ddtree_deploy.remote.inventory import HostConfig

AGENT_FILES = ("protocol.py", "agent.py", "agent_venv.py")


def agent_source() -> bytes:
    """What the host runs: the protocol module's source, the agent's, then its side-by-side half
    (one namespace there), and the call of the agent's main loop."""
    here = Path(__file__).parent
    parts = [(here / name).read_bytes() for name in AGENT_FILES]
    return b"\n\n".join(parts) + b"\n\nmain()\n"


_AGENT_SRC = agent_source()
_EVENT = protocol.EVENT_PREFIX.encode() + b" "
_RESULT = protocol.RESULT_PREFIX.encode() + b" "
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());"
    "exec(compile(b.read(n),'ddtree-deploy-agent','exec'),{'__name__':'__ddtree_agent__'})"
)
_known_hosts_lock = threading.Lock()


def _abort_on_cancel(client: paramiko.SSHClient, cancel: threading.Event, opened: threading.Event) -> None:
    """Close a connection still being made once ``cancel`` is set (paramiko then gives up within 0.1 s)."""
    while not opened.wait(0.05):
        if cancel.is_set():
            t = client.get_transport()
            if t is not None:
                t.close()
            return


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _host_id(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko ships no types
    """Reject unknown keys; with ``accept_new`` record a first-seen key in ``known_hosts``."""

    def __init__(self, host: HostConfig, accept_new: bool):
        self.host = host
        self.accept_new = accept_new
        self.offered: tuple[str, paramiko.PKey] | None = None
        self.accepted = False
        self.other_types: list[str] = []

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:  # noqa: D401 (paramiko API)
        self.offered = (hostname, key)
        if not self.accept_new:
            raise paramiko.SSHException(f"unknown host key for {hostname}")
        known = client.get_host_keys().lookup(hostname) or client._system_host_keys.lookup(hostname)
        if known:  # known under another key type: that is a changed key, never a new one
            self.other_types = sorted(known.keys())
            raise paramiko.SSHException(f"host {hostname} is known with other key types")
        path = self.host.known_hosts_path
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _known_hosts_lock:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.accepted = True


class HostConnection:
    """One host: a Fabric ``Connection`` with strict host keys, plus the agent runner."""

    def __init__(
        self,
        host: HostConfig,
        *,
        accept_new_host_key: bool = False,
        connect_timeout: float = 15.0,
        agent_python: str | None = None,
    ):
        self.host = host
        self.agent_python = agent_python or host.python  # a side-by-side rollout runs it under production's
        self.accept_new_host_key = accept_new_host_key
        self.connect_timeout = connect_timeout
        self.conn: Connection | None = None
        self.bytes_sent = 0
        self.new_host_key: str | None = None
        self._chan: paramiko.Channel | None = None
        self._out = bytearray()
        self._err = bytearray()

    # -- connect -------------------------------------------------------------------------------
    def open(self, cancel: threading.Event | None = None) -> "HostConnection":
        """Connect (host key checked); ``cancel`` (Ctrl-C) aborts a connection being made within 0.1 s."""
        h = self.host
        connect_kwargs: dict[str, Any] = {"banner_timeout": self.connect_timeout, "auth_timeout": self.connect_timeout}
        if h.identity_path:
            if not h.identity_path.exists():
                raise UsageError(
                    f"{h.name}: identity_file {h.identity_path} does not exist",
                    hint=f"fix identity_file in [hosts.{h.name}] of the inventory",
                )
            connect_kwargs.update(key_filename=[str(h.identity_path)], look_for_keys=False, allow_agent=False)
        try:
            conn = Connection(h.target, config=Config(), connect_timeout=int(self.connect_timeout), connect_kwargs=connect_kwargs)
        except ValueError as exc:
            raise UsageError(f"{h.name}: bad target {h.target!r}: {exc}", hint=f"fix target in [hosts.{h.name}]") from None
        client = conn.client
        kh = h.known_hosts_path
        if kh.exists():
            try:
                client.load_system_host_keys(str(kh))  # read-only: paramiko never writes these back
            except (OSError, paramiko.SSHException) as exc:
                raise HostKeyError(
                    f"{h.name}: cannot read known_hosts {kh}: {exc}", hint="fix known_hosts in the inventory"
                ) from None
        policy = _HostKeyPolicy(h, self.accept_new_host_key)
        client.set_missing_host_key_policy(policy)
        hid = _host_id(conn.host, conn.port)
        opened = threading.Event()
        if cancel is not None:
            threading.Thread(target=_abort_on_cancel, args=(client, cancel, opened), daemon=True).start()
        try:
            conn.open()
        except BaseException as exc:
            if cancel is not None and cancel.is_set():
                raise Interrupted(f"{h.name}: interrupted while connecting", details={"host": h.name}) from None
            t = client.get_transport()
            if isinstance(exc, paramiko.SSHException) and t is not None and not getattr(t, "remote_version", None):
                raise ConnectionLostError(
                    f"{h.name}: {hid} accepted the TCP connection but sent no SSH banner within "
                    f"{self.connect_timeout:g}s: it is not (or not yet) an SSH server",
                    hint=f"check target (host and port) in [hosts.{h.name}]; safe to retry",
                    details={"host": h.name, "connection_lost": True},
                ) from None
            raise self._connect_error(exc, policy, hid, kh) from None
        finally:
            opened.set()
        if policy.accepted:
            self.new_host_key = fingerprint(policy.offered[1])  # type: ignore[index]
        self.conn = conn
        return self

    def _connect_error(self, exc: BaseException, policy: _HostKeyPolicy, hid: str, kh: Path) -> BaseException:
        """The project's error for a failed connection (the exception itself when it is none of ours)."""
        h = self.host
        if isinstance(exc, paramiko.BadHostKeyException):
            return HostKeyError(
                f"{h.name}: the host key of {hid} has CHANGED (got {fingerprint(exc.key)}, known_hosts "
                f"{kh} has {fingerprint(exc.expected_key)}); refusing to connect (possible man-in-the-middle)",
                hint=f"if the change is expected, verify the new key out of band, "
                f"then: ssh-keygen -R '{hid}' -f {shlex.quote(str(kh))}",
                details={"host": h.name, "offered_fingerprint": fingerprint(exc.key)},
            )
        if isinstance(exc, paramiko.SSHException):
            if policy.other_types:
                fp = fingerprint(policy.offered[1])  # type: ignore[index]
                return HostKeyError(
                    f"{h.name}: {hid} offered a {policy.offered[1].get_name()} key ({fp}) but {kh} knows it only as "  # type: ignore[index]
                    f"{', '.join(policy.other_types)}; refusing (treated as a changed key)",
                    hint=f"verify out of band, then: ssh-keygen -R '{hid}' -f {shlex.quote(str(kh))}",
                    details={"host": h.name, "offered_fingerprint": fp},
                )
            if policy.offered is not None and not policy.accepted:
                fp = fingerprint(policy.offered[1])
                return HostKeyError(
                    f"{h.name}: unknown host key for {hid} ({policy.offered[1].get_name()} {fp}); not in {kh}",
                    hint="verify that fingerprint out of band, then rerun with --accept-new-host-key",
                    details={"host": h.name, "offered_fingerprint": fp},
                )
            if isinstance(exc, paramiko.AuthenticationException):
                return HostRefusedError(
                    f"{h.name}: SSH authentication to {hid} failed: {exc}", hint="check identity_file in the inventory"
                )
            return ConnectionLostError(
                f"{h.name}: SSH to {hid} failed: {exc}",
                hint="is the host up, the target right, and is it an SSH server? (safe to retry)",
                details={"host": h.name, "connection_lost": True},
            )
        if isinstance(exc, (OSError, socket.timeout, EOFError)):
            return ConnectionLostError(
                f"{h.name}: cannot connect to {hid}: {exc}",
                hint="is the host up and the target right? (safe to retry)",
                details={"host": h.name, "connection_lost": True},
            )
        return exc

    def close(self) -> None:
        self._end_session()
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None

    def __enter__(self) -> "HostConnection":
        return self if self.conn is not None else self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the agent -----------------------------------------------------------------------------
    def _session(self) -> paramiko.Channel:
        """The agent's channel: one exec per connection, reused by every request."""
        assert self.conn is not None and self.conn.transport is not None
        chan = self._chan
        if chan is not None and not chan.closed and not chan.exit_status_ready():
            return chan
        self._drop_session()
        h = self.host
        chan = None
        head = b"%d\n" % len(_AGENT_SRC) + _AGENT_SRC
        try:
            chan = self.conn.transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(f"{shlex.quote(self.agent_python)} -c {shlex.quote(BOOTSTRAP)}")
            chan.sendall(head)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            # A missing interpreter makes the shell exit 127 at once; the channel then closes while the
            # agent's source is still being sent. That is the host's python, not the connection.
            refused = self._interpreter_refused(chan, bytearray())
            if refused is not None:
                raise refused from None
            raise ConnectionLostError(
                f"{h.name}: cannot start the agent over SSH: {exc}", details={"host": h.name, "connection_lost": True}
            ) from None
        self.bytes_sent += len(head)
        self._chan = chan
        self._out = bytearray()
        self._err = bytearray()
        return chan

    def _interpreter_refused(self, chan: paramiko.Channel | None, errb: bytearray) -> HostRefusedError | None:
        """The error for a session whose shell could not run the host's python (exit 126/127), else None.

        Waits (at most 2 s) for the exit status of a channel that broke while we were writing to it."""
        if chan is None:
            return None
        deadline = time.monotonic() + 2.0
        try:
            while not chan.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.01)
            if not chan.exit_status_ready():
                return None
            status = chan.recv_exit_status()
            while chan.recv_stderr_ready():
                errb.extend(chan.recv_stderr(65536))
        except (paramiko.SSHException, OSError, EOFError):
            return None
        if status not in (126, 127):
            return None
        h = self.host
        tail = errb.decode("utf-8", "replace").strip()[-2000:]
        hint = "fix `python` for this host in the inventory"
        if h.is_side_by_side and self.agent_python == h.python:
            hint = f"is the side-by-side venv there? ddtree-deploy rollout {h.name}   (makes it)"
        return HostRefusedError(
            f"{h.name}: cannot run the host's python {self.agent_python!r} (exit {status})" + (f": {tail}" if tail else ""),
            hint=hint,
            details={"host": h.name},
        )

    def _drop_session(self) -> None:
        chan, self._chan = self._chan, None
        if chan is not None:
            try:
                chan.close()
            except Exception:
                pass

    def _end_session(self) -> None:
        chan = self._chan
        if chan is None:
            return
        try:
            chan.shutdown_write()  # EOF: the agent exits after its current request
            deadline = time.monotonic() + 2.0
            while not chan.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.005)
        except Exception:
            pass
        self._drop_session()

    def run_agent(
        self,
        request: dict[str, Any],
        payload: list[bytes] | None = None,
        *,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        on_sent: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
        timeout: float = 900.0,
        throttle: float = 0.0,
    ) -> dict[str, Any]:
        """Run one agent operation; return its result dict or raise the mapped error."""
        h = self.host
        chan = self._session()
        req = json.dumps(request).encode()
        head = b"%d\n" % len(req) + req
        deadline = time.monotonic() + timeout
        out, errb = self._out, self._err
        result: dict[str, Any] | None = None

        def pump() -> None:
            nonlocal result
            while chan.recv_ready():
                out.extend(chan.recv(65536))
            while chan.recv_stderr_ready():
                errb.extend(chan.recv_stderr(65536))
                del errb[:-20000]
            while result is None and b"\n" in out:
                i = out.index(b"\n")
                line = bytes(out[:i])
                del out[: i + 1]
                if line.startswith(_EVENT) and on_event:
                    try:
                        on_event(json.loads(line[len(_EVENT) :]))
                    except ValueError:
                        pass
                elif line.startswith(_RESULT):
                    result = json.loads(line[len(_RESULT) :])

        def check_cancel() -> None:
            if cancel is not None and cancel.is_set():
                self._drop_session()
                raise Interrupted(f"{h.name}: interrupted")
            if time.monotonic() > deadline:
                self._drop_session()
                raise ConnectionLostError(
                    f"{h.name}: the host did not answer within {timeout:.0f}s", details={"host": h.name, "connection_lost": True}
                )

        try:
            for blob in [head] + list(payload or []):
                view = memoryview(blob)
                step = 16384 if throttle else 1 << 18
                while view:
                    check_cancel()
                    n = chan.send(view[:step])
                    if n <= 0:
                        raise EOFError("channel closed")
                    view = view[n:]
                    self.bytes_sent += n
                    if on_sent and blob is not head:
                        on_sent(n)
                    pump()
                    if throttle:
                        time.sleep(throttle)
            while result is None:
                check_cancel()
                pump()
                if result is not None:  # set by pump() (nonlocal), which mypy does not see
                    break  # type: ignore[unreachable]
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not chan.recv_ready():
                    break
                select.select([chan], [], [], 0.05)  # wakes on stdout/stderr data or EOF
        except (paramiko.SSHException, OSError, EOFError) as exc:
            refused = self._interpreter_refused(chan, errb)
            self._drop_session()
            if refused is not None:
                raise refused from None
            raise ConnectionLostError(
                f"{h.name}: connection lost: {exc}", details={"host": h.name, "connection_lost": True}
            ) from None
        if result is None:
            status = chan.recv_exit_status() if chan.exit_status_ready() else -1
            refused = self._interpreter_refused(chan, errb) if status in (126, 127) else None
            self._drop_session()
            tail = errb.decode("utf-8", "replace").strip()[-2000:]
            if self.conn is None or self.conn.transport is None or not self.conn.transport.is_active():
                raise ConnectionLostError(
                    f"{h.name}: connection lost before the host answered", details={"host": h.name, "connection_lost": True}
                )
            if refused is not None:  # the shell could not run the interpreter: nothing ran
                raise refused
            raise RemoteError(
                f"{h.name}: the agent gave no result (exit {status}); is {h.python!r} a Python >= 3.8 on the host?"
                + (f"\n{tail}" if tail else ""),
                details={"host": h.name},
            )
        if result.get("ok"):
            answer: dict[str, Any] = result["result"]
            return answer
        raise agent_error(h.name, result)


# The agent's error ids (protocol.ErrorKind) -> the client's exception classes; an id the client
# does not know (a newer agent) becomes a RemoteError.
_KINDS: dict[str, type[DDTreeDeployError]] = {
    cls.kind: cls
    for cls in (
        HostRefusedError,
        DriftError,
        LockHeldError,
        RolledBackError,
        RollbackFailedError,
        BrokenBackupError,
        HostEditedError,
        SmokeFailedError,
        UsageError,
        RemoteError,
    )
}


def agent_error(host: str, result: dict[str, Any]) -> DDTreeDeployError:
    cls = _KINDS.get(result.get("error", ""), RemoteError)
    details = dict(result.get("details") or {})
    details["host"] = host
    hint = result.get("hint")
    if cls is LockHeldError and not hint:
        holder = details.get("holder") or {}
        if holder.get("alive") is False:
            hint = f"the holder is gone (an interrupted deploy): ddtree-deploy status {host}, then ddtree-deploy rollback {host}"
        else:
            hint = f"wait for it, or if you are sure it is dead: ddtree-deploy lock release {host}"
    if cls is BrokenBackupError and not hint:
        hint = (
            f"the host is untouched but cannot be rolled back from its backups: ddtree-deploy status {host}; "
            f"repair or restore the named backup files, then rerun ddtree-deploy rollback {host}"
        )
    if cls is RollbackFailedError and not hint:
        hint = f"the host needs a human: ddtree-deploy status {host}"
    return cls(f"{host}: {result.get('message')}", hint=hint, details=details)
