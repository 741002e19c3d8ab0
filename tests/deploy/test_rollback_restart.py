"""``rollback --restart`` (issue 23 item 3): after a rollback the service is restarted and health-checked
like after ``push --restart``, and both are in the host's audit log; without --restart the result says
that a running service still has the patched code. Real sshd on loopback; the "service" is the host's
restart_command (it appends to a file) and a health endpoint on loopback."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from deploy_fixtures import builds, cli, fleet, light_site, needs_sshd, tree_hashes, wheel  # noqa: F401

pytestmark = needs_sshd


def audit(h) -> list[dict]:
    p = h.state_dir / "audit.log"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture
def health():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    srv.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()


def service(fleet, tmp_path, health_url, name="fake0"):  # noqa: F811
    marker = tmp_path / f"restarts-{name}"
    fleet.overrides[name].update(restart_command=f"echo restarted >> {marker}", health_url=health_url, health_timeout=5)
    fleet.rewrite_inventory()
    return marker


def test_rollback_restart_restarts_checks_health_and_audits(fleet, builds, cli, tmp_path, health):  # noqa: F811
    h = fleet.host("fake0")
    marker = service(fleet, tmp_path, health)
    before = tree_hashes(h.site)
    code, out, err = cli("push", "fake0", "--restart", "--build", builds["good"], "--inventory", fleet.inventory)
    assert code == 0, err
    assert marker.read_text().count("restarted") == 1
    code, out, err = cli("rollback", "fake0", "--restart", "--inventory", fleet.inventory, "--json")
    assert code == 0, err
    r = json.loads(out)["hosts"][0]
    assert r["status"] == "rolled-back" and "restarted, healthy" in r["message"] and r["data"]["restart"]["ok"]
    assert marker.read_text().count("restarted") == 2
    assert tree_hashes(h.site) == before
    lines = [(e["op"], e.get("after"), e.get("result")) for e in audit(h)]
    assert lines == [("push", None, "deployed"), ("restart", "push", "healthy"), ("rollback", None, lines[2][2]),
                     ("restart", "rollback", "healthy")], lines  # fmt: skip


def test_rollback_without_restart_says_the_service_still_runs_the_patched_code(fleet, builds, cli, tmp_path, health):  # noqa: F811
    marker = service(fleet, tmp_path, health)
    assert cli("push", "fake0", "--restart", "--build", builds["good"], "--inventory", fleet.inventory)[0] == 0
    code, out, err = cli("rollback", "fake0", "--inventory", fleet.inventory, "--json")
    assert code == 0, err
    msg = json.loads(out)["hosts"][0]["message"]
    assert "NOT restarted" in msg and "--restart" in msg
    assert marker.read_text().count("restarted") == 1  # only the push's


def test_rollback_restart_with_an_unhealthy_service_exits_12(fleet, builds, cli, tmp_path, health):  # noqa: F811
    h = fleet.host("fake0")
    marker = service(fleet, tmp_path, health)
    before = tree_hashes(h.site)
    assert cli("push", "fake0", "--restart", "--build", builds["good"], "--inventory", fleet.inventory)[0] == 0
    fleet.overrides["fake0"].update(health_url="http://127.0.0.1:19/", health_timeout=2)
    fleet.rewrite_inventory()
    code, out, err = cli("rollback", "fake0", "--restart", "--inventory", fleet.inventory, "--json")
    assert code == 12, err
    doc = json.loads(out)
    assert doc["error"] == "SmokeFailedError" and "not healthy" in doc["message"] and "fix:" in err
    assert tree_hashes(h.site) == before  # the files are restored all the same
    assert marker.read_text().count("restarted") == 2
    assert audit(h)[-1]["op"] == "restart" and audit(h)[-1]["result"].startswith("health check")


def test_rollback_restart_without_a_restart_command_is_refused_before_anything(fleet, builds, cli):  # noqa: F811
    h = fleet.host("fake0")
    assert cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory)[0] == 0
    after_push = tree_hashes(h.site)
    code, out, err = cli("rollback", "fake0", "--restart", "--inventory", fleet.inventory)
    assert code == 2 and "no restart_command" in err and "fix:" in err
    assert tree_hashes(h.site) == after_push and [e["op"] for e in audit(h)] == ["push"]


def test_rollback_help_says_a_running_service_keeps_the_patched_code(cli):  # noqa: F811
    from typer.testing import CliRunner

    from ddtree_deploy.cli import app

    text = " ".join(CliRunner().invoke(app, ["rollback", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "--restart" in text and "keeps the patched code" in text
