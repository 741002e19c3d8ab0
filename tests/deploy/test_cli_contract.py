"""The CLI contract, everywhere (issue 23 item 5): one --json envelope for every command, -v/-q anywhere,
bad input exits 2 with error:/fix:, no traceback without -v (paramiko's logging included), Ctrl-C
exits 130 within a second in every phase, a closed stdout ends quietly, tables that do not fold ids,
a message when the pinned wheel is downloaded. SSH cases run against real sshd on loopback."""

from __future__ import annotations

import http.server
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import typer
from deploy_fixtures import builds, cli, cli_subprocess, fleet, light_site, needs_sshd, wheel  # noqa: F401

from ddtree_deploy.cli import app, main
from ddtree_deploy.cli.console import ENVELOPE_KEYS, Environment
from ddtree_deploy.remote.protocol import ERROR_KINDS
from ddtree_deploy.testing_sshd import write_inventory

REPO = Path(__file__).resolve().parents[2]


def leaves(cmd=None, path=()):
    cmd = cmd or typer.main.get_command(app)
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from leaves(sub, path + (name,))
    else:
        yield " ".join(path)


def io_env(**kw) -> Environment:
    return Environment(stdin=io.StringIO(), stdout=io.StringIO(), stderr=io.StringIO(), **kw)


def run(argv, **kw):
    env = io_env(**kw)
    code = main([str(a) for a in argv], env=env)
    return code, env.stdout.getvalue(), env.stderr.getvalue(), env


# --- one --json envelope, every command ------------------------------------------------------------------


def argv_for_every_command(fleet, builds, tmp_path) -> dict[str, list]:  # noqa: F811
    """One cheap invocation per command (success or refusal: both must use the envelope)."""
    inv = fleet.inventory
    good = builds["good"]
    jsonl = tmp_path / "runs.jsonl"
    rec = {"dataset": "d", "method": "baseline", "budget": None, "prompt_index": 0, "output_ids": [1, 2],
           "acceptance_lengths": None, "accept_length_mean": 1.0, "verify_ct": 2, "num_output_tokens": 2,
           "time_per_output_token": 0.01, "latency_s": 0.02, "meta_info": {}}  # fmt: skip
    jsonl.write_text(json.dumps(rec) + "\n")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": [1, 2]}) + "\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("x\n")
    return {
        "snapshot fetch": ["snapshot", "fetch", "--dry-run"],
        "snapshot verify": ["snapshot", "verify"],
        "snapshot path": ["snapshot", "path"],
        "snapshot pin": ["snapshot", "pin", "--pin", a_file],  # refused: not a pin
        "check": ["check", "--series", tmp_path],  # refused: not a series dir
        "build": ["build", "--out", a_file],  # refused: a file
        "patches list": ["patches", "list"],
        "patches edit": ["patches", "edit", "--work", a_file, "--dry-run"],  # refused: a file
        "patches refresh": ["patches", "refresh", "--work", tmp_path / "nowork", "--dry-run"],  # refused: no work tree
        "push": ["push", "fake0", "--build", good, "--dry-run", "-i", inv],
        "smoke": ["smoke", "fake0", "-i", inv],  # after a push (below)
        "rollback": ["rollback", "fake0", "--dry-run", "-i", inv],
        "status": ["status", "fake0", "fake1", "-i", inv],
        "history": ["history", "fake0", "-i", inv],
        "lock status": ["lock", "status", "--all", "-i", inv],
        "lock release": ["lock", "release", "fake0", "--dry-run", "-i", inv],
        "rollout": ["rollout", "fake0", "--dry-run", "-i", inv],  # refused: not a side-by-side host
        "demo": ["demo", "--build", tmp_path],  # refused: not a build dir
        "bench": ["bench", "http://127.0.0.1:9", "--dataset", prompts, "--budgets", "8", "--reference-runs", "", "--dry-run",
                  "--out", tmp_path / "bench"],  # refused: no server command and no --use-running-server
        "compare": ["compare", jsonl, jsonl],
    }  # fmt: skip


SSHD, NO_SSHD_SKIP = needs_sshd


@SSHD
@NO_SSHD_SKIP
def test_one_json_envelope_for_every_command(fleet, builds, tmp_path):  # noqa: F811
    cases = argv_for_every_command(fleet, builds, tmp_path)
    assert set(cases) == set(leaves()), "every command needs a case here (and only real commands)"
    assert run(["push", "fake0", "--build", builds["good"], "-i", fleet.inventory])[0] == 0
    for name, argv in cases.items():
        code, out, err, _env = run([*argv, "--json"])
        try:
            doc = json.loads(out)
        except ValueError:
            pytest.fail(f"{name}: stdout is not one JSON document: {out!r} / {err[-500:]}")
        assert list(doc)[: len(ENVELOPE_KEYS)] == list(ENVELOPE_KEYS), (name, list(doc))
        assert doc["ok"] is (code == 0) and doc["exit_code"] == code, (name, code, doc)
        assert isinstance(doc["message"], str) and doc["message"], name
        assert doc["hint"] is None or isinstance(doc["hint"], str), name
        if code == 0:
            assert doc["error"] is None, name
        else:
            assert doc["error"] in ERROR_KINDS, (name, doc["error"])
            assert "error: " in err and (code != 2 or "\nfix: " in err), (name, err)
        assert "Traceback" not in err, name


# --- -v and -q anywhere ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(leaves()))
def test_verbose_and_quiet_are_accepted_before_and_after_every_subcommand(command, capsys):
    words = command.split()
    for argv in (["-v", "-q", *words, "--help"], [*words, "-v", "-q", "--help"], [words[0], "-vv", *words[1:], "--help"]):
        code, out, err, _ = run(argv)
        assert code == 0, (argv, err)
        shown = capsys.readouterr().out  # typer draws --help itself
        assert "--verbose" in shown and "--quiet" in shown, shown


def test_verbose_counts_and_quiet_silences_all_but_errors(tmp_path):
    code, out, err, env = run(["-v", "patches", "list", "-v", "-q"])
    assert code == 0 and env.verbosity == 2 and env.quiet
    assert out.count("\t") > 10 and err == ""  # the data, no message
    code, out, err, env = run(["status", "-q", "--inventory", tmp_path / "nope.toml"])
    assert code == 2 and err.startswith("error: inventory") and "fix:" in err  # errors still print


# --- bad input: exit 2, error: + fix:, never a traceback ---------------------------------------------------


def test_unusable_inventories_exit_2_with_a_fix(tmp_path):
    binary = tmp_path / "bin.toml"
    binary.write_bytes(bytes(range(256)) * 4)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[hosts.x]\ntarget = "caf\xe9"\n')
    sock_path = tmp_path / "inv.sock"  # open() fails with ENXIO: unreadable, even for root
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    try:
        cases = [
            (binary, "is a binary file"),
            (latin, "is not UTF-8 text"),
            (tmp_path, "is a directory, not a file"),
            (sock_path, "cannot be read"),
            (tmp_path / "nope.toml", "not found"),
        ]
        if os.geteuid() != 0:
            locked = tmp_path / "locked.toml"
            locked.write_text("[hosts]\n")
            locked.chmod(0)
            cases.append((locked, "not readable"))
        for path, want in cases:
            for command in (["status", "x"], ["push", "x"], ["rollout", "x"], ["bench", "x", "--dataset", "d"]):
                code, out, err, _ = run([*command, "--inventory", path])
                assert code == 2, (path, command, err)
                assert err.startswith("error: ") and want in err and "\nfix: " in err and "Traceback" not in err, (path, err)
    finally:
        s.close()


@pytest.mark.parametrize(
    "argv",
    [
        ["push", "gpu1", "--no-rollback"],  # errors raised without a hint of their own
        ["bench", "http://127.0.0.1:9", "--budgets", "a,b", "--dataset", "d"],
        ["build", "--python-version", "3.12"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_every_exit_2_has_a_fix_line(argv, tmp_path):
    inv = write_inventory(tmp_path / "hosts.toml", {"gpu1": {"target": "root@127.0.0.1:9", "python": "python3"}})
    code, out, err, _ = run([*argv, "--inventory", inv] if argv[0] == "push" else argv)
    assert code == 2, err
    assert err.startswith("error: ") and "\nfix: " in err, err  # at least the command's --help
    assert f"ddtree-deploy {argv[0]} --help" in err or "fix: " in err


@pytest.mark.parametrize("command", ["status", "smoke", "rollback", "push", "lock status", "rollout"])
def test_a_command_without_a_host_names_itself_in_the_fix(command, tmp_path):
    inv = write_inventory(tmp_path / "hosts.toml", {"gpu1": {"target": "root@127.0.0.1:9", "python": "python3"}})
    code, out, err, _ = run([*command.split(), "--inventory", inv])
    assert code == 2, err
    fix = err.split("\nfix: ", 1)[1]
    assert fix.startswith(f"ddtree-deploy {command} HOST") and "gpu1" in fix, err


# --- SSH: a host that accepts TCP but says nothing; Ctrl-C while connecting --------------------------------


class SilentServer:
    """Accepts TCP connections on loopback and never sends a byte (not an SSH server); stops by itself."""

    def __init__(self, lifetime: float = 120.0):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.conns: list[socket.socket] = []
        self.stop_at = time.monotonic() + lifetime
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while time.monotonic() < self.stop_at:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(c)
            self.accepted.set()
        self.close()

    def close(self) -> None:
        self.stop_at = 0
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def silent(tmp_path):
    srv = SilentServer()
    key = tmp_path / "id"
    key.write_text("not used: the connection never gets that far\n")
    inv = write_inventory(
        tmp_path / "hosts.toml",
        {"mute": {"target": f"root@127.0.0.1:{srv.port}", "python": "python3", "identity_file": str(key),
                  "known_hosts": str(tmp_path / "kh"), "connect_timeout": 2, "state_dir": str(tmp_path / "st")}},
    )  # fmt: skip
    yield srv, inv
    srv.close()


def test_a_host_that_sends_no_ssh_banner_is_a_clean_error(silent):
    """The real process (no test logging in the way): paramiko's transport thread logs the banner
    failure with a traceback; without -v none of it reaches stderr."""
    srv, inv = silent
    t0 = time.monotonic()
    p = cli_subprocess(["status", "mute", "--inventory", str(inv), "--json"])
    out, err = (x.decode() for x in p.communicate(timeout=120))
    assert p.returncode == 13 and time.monotonic() - t0 < 30, err
    doc = json.loads(out)
    assert doc["error"] == "ConnectionLostError" and "sent no SSH banner" in doc["message"] and doc["hint"]
    assert err.startswith("error: mute: ") and "\nfix: " in err
    for bad in ("Traceback", "paramiko", "Exception (client)", "Error reading SSH protocol banner"):
        assert bad not in err, err
    # -vv shows the SSH library's own log, on stderr
    p = cli_subprocess(["status", "mute", "--inventory", str(inv), "-vv"])
    out, err = (x.decode() for x in p.communicate(timeout=120))
    assert p.returncode == 13 and "[paramiko" in err, err


def sigint_after(p: subprocess.Popen, ready, timeout: float = 60.0) -> float:
    """Wait until ``ready()``, send SIGINT, return the seconds until the process exited."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "never got ready"
        assert p.poll() is None, p.communicate()
        time.sleep(0.02)
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=30)
    finally:
        p.kill()
    return time.monotonic() - t0


# Python's interpreter start and exit are not the CLI's; on a loaded CI machine leave them a little room.
WITHIN = 1.0


def test_ctrl_c_while_connecting_exits_130_within_a_second(silent):
    srv, inv = silent
    text = Path(inv).read_text().replace("connect_timeout = 2", "connect_timeout = 60")
    Path(inv).write_text(text)
    p = cli_subprocess(["status", "mute", "--inventory", str(inv)])
    took = sigint_after(p, srv.accepted.is_set)
    err = p.stderr.read().decode()
    assert p.returncode == 130, err
    assert took < WITHIN, f"exit took {took:.2f}s after Ctrl-C"
    assert "Traceback" not in err and "interrupted" in err


# No "while starting" case: its SIGINT (0.35 s after the spawn) passed without the entry point's early
# handler, so it guarded nothing, and in a fresh clone on 2 busy cores it landed in Python's own start-up,
# before any code of ours (exit -2, 2026-12-06). The import window has no deterministic test yet.
def test_ctrl_c_while_building_exits_130_within_a_second(tmp_path):
    p = cli_subprocess(["build", "--wheel", "--out", str(tmp_path / "b"), "-v"])  # the wheel takes 10 s or more
    t0 = time.monotonic()
    took = sigint_after(p, lambda: time.monotonic() - t0 > 2.0, 60)
    err = p.stderr.read().decode()
    assert p.returncode == 130 and took < WITHIN, (took, err[-2000:])
    assert not (tmp_path / "b").exists() and "Traceback" not in err


@SSHD
@NO_SSHD_SKIP
def test_ctrl_c_while_uploading_exits_130_within_a_second(fleet, builds):  # noqa: F811
    p = cli_subprocess(
        ["push", "fake0", "--build", str(builds["big"]), "--inventory", str(fleet.inventory)],
        {"DDTREE_DEPLOY_TEST_HOOKS": json.dumps({"throttle": 0.02})},
    )
    os.set_blocking(p.stderr.fileno(), False)
    seen = bytearray()

    def uploading() -> bool:
        seen.extend(p.stderr.read() or b"")
        return b"uploading" in seen

    took = sigint_after(p, uploading)
    assert p.returncode == 130 and took < WITHIN, took


class HangingSglang(http.server.ThreadingHTTPServer):
    """/health answers; /generate never does (a request in flight when Ctrl-C comes)."""

    daemon_threads = True

    def __init__(self):
        self.got_generate = threading.Event()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b"{}"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                outer.got_generate.set()
                time.sleep(60)

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), H)


def test_ctrl_c_while_a_bench_request_is_in_flight_exits_130_within_a_second(tmp_path):
    srv = HangingSglang()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": [1, 2]}) + "\n")
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        p = cli_subprocess(["bench", url, "--budgets", "8", "--reference-runs", "", "--dataset", str(prompts),
                            "--out", str(tmp_path / "o"), "--no-progress", "--use-running-server"])  # fmt: skip
        took = sigint_after(p, srv.got_generate.is_set)
        err = p.stderr.read().decode()
        assert p.returncode == 130 and took < WITHIN, (took, err[-2000:])
    finally:
        srv.shutdown()


def test_ctrl_c_while_bench_waits_for_its_server_stops_it_and_exits_within_a_second(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": [1, 2]}) + "\n")
    pidfile = tmp_path / "server.pid"
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    p = cli_subprocess(["bench", f"http://127.0.0.1:{free}", "--budgets", "8", "--reference-runs", "", "--dataset", str(prompts),
                        "--out", str(tmp_path / "o"), "--no-progress",
                        "--server-command", f"echo $$ > {pidfile}; exec sleep 120 # --port {{port}}"])  # fmt: skip
    took = sigint_after(p, pidfile.exists)
    assert p.returncode == 130 and took < WITHIN, took
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the server bench started was left running"


# --- a closed stdout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["patches", "list"], ["patches", "list", "--json"], ["snapshot", "path"]])
def test_a_closed_stdout_ends_the_command_quietly(argv):
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write: every write is EPIPE
    env = dict(os.environ, PYTHONPATH=str(REPO / "deploy"))
    p = subprocess.run([sys.executable, "-m", "ddtree_deploy", *argv], stdout=w, stderr=subprocess.PIPE, env=env, timeout=120)
    os.close(w)
    assert p.returncode == 0, p.stderr.decode()
    assert b"Traceback" not in p.stderr and b"BrokenPipe" not in p.stderr and b"Exception ignored" not in p.stderr
    assert b"error" not in p.stderr


def test_head_of_patches_list_is_clean(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "deploy"))
    p = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{sys.executable} -m ddtree_deploy patches list -q | head -1"],
        env=env, cwd=tmp_path, timeout=120, capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.count("\t") == 2


# --- tables do not fold ids -----------------------------------------------------------------------------


@SSHD
@NO_SSHD_SKIP
def test_result_tables_keep_every_id_whole(fleet, builds):  # noqa: F811
    """Off a terminal (a log) a table row is one line, whatever its length; on an 80-column terminal the
    message column folds, the id columns never do."""
    import re

    long_name = "a-host-with-a-rather-long-inventory-name-" + "x" * 30
    text = fleet.inventory.read_text().replace("[hosts.fake0]", f"[hosts.{long_name}]")
    fleet.inventory.write_text(text)
    for name, kw in ((long_name, {}), ("fake1", {"stderr_isatty": True})):
        code, out, err, _ = run(["push", name, "--build", builds["good"], "--inventory", fleet.inventory], **kw)
        assert code == 0, err
        code, out, err, _ = run(["rollback", name, "--inventory", fleet.inventory], **kw)
        assert code == 0, err
        rows = [ln for ln in err.splitlines() if "│" in ln and name in ln]
        assert len(rows) == 1, err  # the host's row: one line, the host name whole
        (deploy_id,) = re.findall(r"\d{8}T\d{9}Z-[0-9a-f]{6}", rows[0])  # and the deploy id whole
        if not kw:  # a log: the message is one line too
            assert f"\n{name}: undid {deploy_id}: 3 file(s) restored and verified\n" in err, err
        else:
            assert f"{name}: undid {deploy_id}" in err


# --- the wheel download is announced ---------------------------------------------------------------------


@pytest.fixture
def loopback_index(tmp_path, wheel):  # noqa: F811
    """A PEP 503 index on loopback serving the cached pinned wheel (pip downloads it from here)."""
    import hashlib

    root = tmp_path / "index"
    (root / "simple" / "sglang").mkdir(parents=True)
    (root / wheel.name).write_bytes(wheel.read_bytes())
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (root / "simple" / "sglang" / "index.html").write_text(f'<a href="../../{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/simple/"
    srv.shutdown()


def test_the_wheel_download_is_announced(loopback_index, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "deploy"), DDTREE_DEPLOY_CACHE=str(tmp_path / "cache"),
               PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=loopback_index, PIP_NO_CACHE_DIR="1")  # fmt: skip
    env.pop("PIP_FIND_LINKS", None)
    p = subprocess.run([sys.executable, "-m", "ddtree_deploy", "snapshot", "fetch"], capture_output=True, text=True, env=env,
                       timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "downloading the pinned sglang==0.5.23 wheel" in p.stderr and "downloaded sglang-0.5.23-" in p.stderr
    assert p.stdout.strip().startswith(str(tmp_path / "cache"))  # stdout: the data only


def test_the_wheel_download_shows_pip_progress_on_a_terminal(loopback_index, tmp_path):
    import pty

    env = dict(os.environ, PYTHONPATH=str(REPO / "deploy"), DDTREE_DEPLOY_CACHE=str(tmp_path / "cache"),
               PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=loopback_index, PIP_NO_CACHE_DIR="1", COLUMNS="100")  # fmt: skip
    leader, follower = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "ddtree_deploy", "snapshot", "fetch"], stdout=subprocess.PIPE,
                         stderr=follower, env=env)  # fmt: skip
    os.close(follower)
    seen = bytearray()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen.extend(chunk)
    p.wait(timeout=60)
    os.close(leader)
    text = seen.decode("utf-8", "replace")
    assert p.returncode == 0, text[-3000:]
    assert "downloading the pinned sglang==0.5.23 wheel" in text
    assert "MB" in text and ("━" in text or "%" in text), text[-3000:]  # pip's own progress bar
