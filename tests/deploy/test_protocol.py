"""The host protocol lives in one module (``remote/protocol.py``, issue 13 item 2).

- The agent runs on a host from the source the client sends (protocol first, then the agent), by a
  Python that cannot import ``ddtree_deploy``: checked here with the real bootstrap in ``python -I``
  (no ssh needed for that part; the sshd suites run the same bytes through a real OpenSSH).
- Record statuses and error ids are defined there and nowhere else.
- Every ``"error"`` id is a stable string, not a class name: a renamed class keeps its id.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from ddtree_deploy import errors
from ddtree_deploy.remote import connection, protocol

REMOTE = Path(connection.__file__).parent
PKG = REMOTE.parent


def _request(req: dict) -> bytes:
    body = json.dumps(req).encode()
    return b"%d\n" % len(body) + body


def test_agent_runs_from_the_sent_source_alone(tmp_path):
    src = connection.agent_source()
    stdin = b"%d\n" % len(src) + src + _request({"op": "history", "state_dir": str(tmp_path), "limit": 5})
    stdin += _request({"op": "rollback", "state_dir": str(tmp_path), "deploy_id": "../x"})  # a Fail from the agent
    r = subprocess.run(
        [sys.executable, "-I", "-c", connection.BOOTSTRAP], input=stdin, capture_output=True, timeout=60, cwd=tmp_path
    )
    lines = [ln for ln in r.stdout.decode().splitlines() if ln.startswith(protocol.RESULT_PREFIX + " ")]
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    results = [json.loads(ln.split(" ", 1)[1]) for ln in lines]
    assert results[0]["ok"] is True and results[0]["agent_format"] == protocol.AGENT_FORMAT
    assert results[1]["ok"] is False and results[1]["error"] in protocol.ERROR_KINDS


def _assigned_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:  # module level
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_statuses_and_kinds_are_defined_only_in_the_protocol():
    shared = {"APPLIED", "INTERRUPTED", "AGENT_FORMAT", "RECORD_STATUSES", "ERROR_KINDS"}
    for path in sorted(PKG.rglob("*.py")):
        if path.name != "protocol.py":
            assert not shared & _assigned_names(path), f"{path} redefines {shared & _assigned_names(path)}"


def test_agent_fails_only_with_protocol_kinds_the_client_maps():
    tree = ast.parse((REMOTE / "agent.py").read_text())
    kinds = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Fail":
            arg = node.args[0]
            if isinstance(arg, ast.Name):  # a kind chosen above (``kind = ErrorKind.X``)
                continue
            assert isinstance(arg, ast.Attribute) and getattr(arg.value, "id", None) == "ErrorKind", (
                f"agent.py:{node.lineno}: Fail() with a literal kind; use protocol.ErrorKind"
            )
            kinds.append(getattr(protocol.ErrorKind, arg.attr))
    assert len(kinds) > 15
    for kind in kinds:
        cls = connection._KINDS.get(kind)
        assert cls is not None and cls.kind == kind, f"the client does not map the agent's {kind!r}"


def test_error_ids_are_stable_and_unique():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.DDTreeDeployError)]
    classes.append(connection.Interrupted)
    classes = list(dict.fromkeys(classes))  # connection.Interrupted is errors.Interrupted
    ids = [c.kind for c in classes]
    assert len(set(ids)) == len(ids), "two error classes share an id"
    assert set(ids) <= protocol.ERROR_KINDS

    class RenamedDrift(errors.DriftError):  # a class renamed (or subclassed) keeps the wire id
        pass

    out = RenamedDrift("x", details={"error": "spoof"}).to_json()
    assert out["error"] == "DriftError" and out["message"] == "x"
    # the ids --json scripts see: frozen strings (these rows are the contract, not computed)
    assert errors.HostKeyError("k").to_json()["error"] == "HostKeyError"
    assert errors.PartialFailureError("p").to_json()["error"] == "PartialFailureError"
