"""Throwaway OpenSSH servers on loopback, for the tests, the demo and the benchmark.

``FakeHost.create(root, index)`` makes a directory standing in for one GPU host: generated ed25519
host and client keys, an ``sshd`` on ``127.0.0.<index+2>`` on a free port, a Python venv whose
site-packages will hold SGLang, a ``known_hosts`` file (empty until you call ``trust()``) and an
inventory table for it. ``stop()`` ends the sshd (and its session processes) by pid. Every wait is
bounded. Needs ``/usr/sbin/sshd`` (Debian/Ubuntu: ``apt-get install openssh-server``); as root it
creates ``/run/sshd`` (the privilege-separation directory) when missing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SSHD = os.environ.get("DDTREE_DEPLOY_SSHD", "/usr/sbin/sshd")


def sshd_available() -> str | None:
    """None if a throwaway sshd can run here, else the reason it cannot."""
    if not Path(SSHD).exists():
        return f"{SSHD} not found (apt-get install openssh-server)"
    if not shutil.which("ssh-keygen"):
        return "ssh-keygen not found (apt-get install openssh-client)"
    if not Path("/run/sshd").is_dir():
        if os.geteuid() != 0:
            return "/run/sshd is missing and we are not root"
    return None


def free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        port: int = s.getsockname()[1]
        return port


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def wait_banner(addr: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=1.0) as s:
                s.settimeout(1.0)
                if s.recv(64).startswith(b"SSH-2.0"):
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.02)
    raise RuntimeError(f"sshd on {addr}:{port} did not answer within {timeout}s ({last})")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    todo: list[int] = [pid]
    seen: list[int] = []
    while todo and len(seen) < 10000:
        p = todo.pop()
        for c in _children(p):
            if c not in seen:
                seen.append(c)
                todo.append(c)
    return seen


def make_venv(venv: Path, extra_site: list[str] | None = None, base_python: str | None = None) -> Path:
    """A venv (no pip) whose site-packages is ours; ``extra_site`` dirs are appended through a .pth."""
    base = base_python or getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, stdin=subprocess.DEVNULL)
    site = site_packages_of(venv)
    if extra_site:
        (site / "zz-ddtree-host-deps.pth").write_text("".join(p + "\n" for p in extra_site))
    return site


def site_packages_of(venv: Path) -> Path:
    libs = sorted((venv / "lib").glob("python3*/site-packages"))
    if not libs:
        raise RuntimeError(f"no site-packages in {venv}")
    return libs[0]


def unpack_wheel(wheel: Path, dest: Path, members: list[str] | None = None) -> None:
    """Unpack a wheel's package files (and its dist-info) into ``dest``, like pip --no-deps --target."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        if members is not None:
            want = set(members)
            names = [n for n in names if n in want or ".dist-info/" in n]
        for n in names:
            if n.endswith("/") or ".data/" in n.split("/", 1)[0]:
                continue
            target = dest / n
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(n) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(target, 0o644)


@dataclass
class FakeHost:
    name: str
    root: Path
    addr: str
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    venv: Path | None = None
    site: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    data_root: Path | None = None  # where the venv and the state dir live (default: root)

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def host_key(self) -> Path:
        return self.keys / "host_ed25519"

    @property
    def client_key(self) -> Path:
        return self.keys / "client_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def state_dir(self) -> Path:
        return (self.data_root or self.root) / "state"

    @property
    def python(self) -> Path:
        assert self.venv is not None
        return self.venv / "bin" / "python"

    @classmethod
    def create(
        cls,
        root: Path,
        index: int,
        name: str | None = None,
        *,
        extra_site: list[str] | None = None,
        venv_name: str = "venv",
        data_root: Path | None = None,
    ) -> "FakeHost":
        """Keys + venv; call ``start()`` to run its sshd. ``index`` picks ``127.0.0.<index+2>``."""
        root = Path(root)
        (root / "keys").mkdir(parents=True, exist_ok=True)
        h = cls(name=name or f"fake{index}", root=root, addr=f"127.0.0.{2 + index}", data_root=data_root)
        _keygen(h.host_key, f"{h.name}-host")
        _keygen(h.client_key, f"{h.name}-client")
        (h.keys / "authorized_keys").write_bytes(h.client_key.with_suffix(".pub").read_bytes())
        h.venv = (data_root or root) / venv_name
        h.site = make_venv(h.venv, extra_site)
        h.known_hosts.touch()
        return h

    def regenerate_host_key(self) -> None:
        for p in (self.host_key, self.host_key.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        _keygen(self.host_key, f"{self.name}-host-new")

    def trust(self) -> None:
        """Record this host's current key in its known_hosts (what an operator does once, out of band)."""
        pub = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"[{self.addr}]:{self.port} {pub[0]} {pub[1]}\n")

    def start(self, port: int | None = None, clean_shell: bool | None = None) -> "FakeHost":
        if Path("/run/sshd").is_dir() is False:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.port = port or free_port(self.addr)
        log = self.root / "sshd.log"
        cmd = [
            SSHD,
            "-D",
            "-e",
            "-f",
            "/dev/null",
            "-o",
            f"Port={self.port}",
            "-o",
            f"ListenAddress={self.addr}",
            "-o",
            f"HostKey={self.host_key}",
            "-o",
            f"AuthorizedKeysFile={self.keys / 'authorized_keys'}",
            "-o",
            f"PidFile={self.root / 'sshd.pid'}",
            "-o",
            "StrictModes=no",
            "-o",
            "UsePAM=no",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "KbdInteractiveAuthentication=no",
            "-o",
            "PermitRootLogin=prohibit-password",
            "-o",
            "MaxStartups=100",
            "-o",
            "MaxSessions=50",
            "-o",
            "UseDNS=no",
            "-o",
            "Subsystem=sftp internal-sftp",
            "-o",
            "LogLevel=ERROR",
        ]
        if clean_shell is None:
            clean_shell = os.environ.get("DDTREE_DEPLOY_FAKEHOST_CLEAN_SHELL", "1") != "0"
        rc = Path.home() / ".bashrc"
        if clean_shell and os.geteuid() == 0 and shutil.which("unshare") and rc.exists():
            # A private mount namespace in which the login user's ~/.bashrc is empty: bash sources it for
            # every SSH exec, and on a dev box it may run slow tools (pyenv init...). Nothing outside changes.
            # (Mounts made outside after this do not show inside: tests that mount pass clean_shell=False.)
            ns = [
                "unshare",
                "-m",
                "--propagation",
                "slave",
                "sh",
                "-c",
                'mount --bind /dev/null "$0" && exec "$@"',
                str(rc),
                *cmd,
            ]
            if self._spawn(ns, log, timeout=5.0):
                return self
        if not self._spawn(cmd, log, timeout=10.0):
            self.stop()
            raise RuntimeError(f"sshd for {self.name} did not start: {log.read_text(errors='replace')[-2000:]}")
        return self

    def _spawn(self, cmd: list[str], log: Path, timeout: float) -> bool:
        with open(log, "ab") as fh:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:  # died (e.g. no permission for a mount namespace)
                self.proc = None
                return False
            try:
                wait_banner(self.addr, self.port, timeout=0.5)
                return True
            except RuntimeError:
                pass
        self.stop()
        return False

    def kill_sessions(self) -> None:
        """Cut every open SSH connection (the per-connection sshd processes), as a network failure would;
        the listener and the commands the sessions started keep running."""
        if self.proc is None:
            return
        for pid in descendants(self.proc.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    def stop(self, kill_descendants: bool = True) -> None:
        """Stop the sshd by pid; with ``kill_descendants`` also its sessions and what they run."""
        if self.proc is None:
            return
        victims = descendants(self.proc.pid) if kill_descendants else []
        try:
            self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None

    def inventory_table(self, **overrides: Any) -> dict[str, Any]:
        t: dict[str, Any] = {
            "target": f"root@{self.addr}:{self.port}",
            "identity_file": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "python": str(self.python),
            "state_dir": str(self.state_dir),
        }
        t.update(overrides)
        return t


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(type(v))


def write_inventory(path: Path, tables: dict[str, dict[str, Any]]) -> Path:
    lines = ["# generated by ddtree_deploy.testing_sshd\n"]
    for name, t in tables.items():
        lines.append(f"\n[hosts.{name}]\n")
        for k, v in t.items():
            if v is not None:
                lines.append(f"{k} = {toml_value(v)}\n")
    path.write_text("".join(lines))
    return path


# --- a stand-in server for a side-by-side venv on a fake host ----------------------------------------

# NOT SGLang: a few lines of HTTP that answer /health and /server_info with the sglang version the
# interpreter running it imports (so a test or the demo can see which environment a server runs in).
# It binds 127.0.0.1 and stops by itself after its lifetime.
STANDIN_SERVER_SRC = r"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib import metadata

port, lifetime = int(sys.argv[1]), float(sys.argv[2])
info = {"standin": True, "sglang_version": metadata.version("sglang"), "python": sys.executable}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path in ("/health", "/server_info")
        body = json.dumps(info).encode() if ok else b"{}"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", port), Handler)
threading.Timer(lifetime, server.shutdown).start()
server.serve_forever()
"""


@dataclass(frozen=True)
class StandinServer:
    """Shell commands that start / stop the stand-in server with a given interpreter on a fake host."""

    script: Path
    port: int
    pidfile: Path
    log: Path

    def restart_command(self, python: str, lifetime: float = 900.0) -> str:
        return (
            f"{self.stop_command()}; setsid nohup {shlex.quote(python)} {shlex.quote(str(self.script))} {self.port} "
            f"{lifetime:g} > {shlex.quote(str(self.log))} 2>&1 < /dev/null & echo $! > {shlex.quote(str(self.pidfile))}"
        )

    def stop_command(self) -> str:
        pid = shlex.quote(str(self.pidfile))
        return f"if [ -f {pid} ]; then kill $(cat {pid}) 2>/dev/null; rm -f {pid}; fi; true"

    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/health"

    def kill(self) -> None:
        """Stop it from here (test teardown), by the pid it recorded."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def standin_server(directory: Path, port: int | None = None) -> StandinServer:
    """Write the stand-in server's script into ``directory`` (on the fake host) and pick a free port."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "standin_server.py"
    script.write_text(STANDIN_SERVER_SRC)
    return StandinServer(script, port or free_port("127.0.0.1"), directory / "standin.pid", directory / "standin.log")
