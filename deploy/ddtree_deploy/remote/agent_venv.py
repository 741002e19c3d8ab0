"""The host-side half of the side-by-side rollout, and the RECORD drift check (standard library only).

Sent to the host after ``agent.py`` (``connection.agent_source``), in the same namespace, and run by
the PRODUCTION interpreter of the host; it never writes into production's environment:

- ``record_check``: every file a distribution's ``RECORD`` lists (``.pyc`` caches aside) hashed
  against it. For an environment installed by pip this is the drift check: production's
  untouched SGLang matches its RECORD byte for byte.
- ``side_by_side`` (``probe`` | ``install`` | ``remove``): the side-by-side venv beside production.
  ``install`` makes a venv from production's base interpreter whose site-packages is searched first
  and then production's (a ``.pth`` adds it, with its own ``.pth`` files), so the venv sees exactly
  production's packages except the one installed into it: the wheel (sent over the channel,
  sha256-checked) through ``pip install --no-deps --no-index --require-hashes``; then its RECORD,
  where the venv imports it from, the compile + smoke checks with the venv's interpreter, and
  production's RECORD again, equal to what it was before. Any failure removes the venv it made.
  ``remove`` deletes a venv this tool made (its marker file says so), nothing else.
"""

import base64
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import BinaryIO, List, Optional, Tuple  # JsonObj is agent.py's (same namespace on the host)

if __name__ != "__ddtree_agent__":  # imported on the client (tests): the protocol and agent from their modules
    from ddtree_deploy.remote.agent import *  # noqa: F403
    from ddtree_deploy.remote.protocol import *  # noqa: F403

SBS_MARKER = "ddtree-side-by-side.json"  # in the venv: made by ddtree-deploy (only such a venv is replaced/removed)
SBS_PTH = "_ddtree_side_by_side.pth"  # in the venv's site-packages: production's site-packages after its own
PIP_TIMEOUT = 900


# --- RECORD ----------------------------------------------------------------------------------------


def _norm(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


def dist_infos(site: str, package: str) -> List[str]:
    try:
        names = sorted(os.listdir(site))
    except OSError:
        return []
    return [n for n in names if n.endswith(".dist-info") and _norm(n.split("-")[0]) == _norm(package)]


def _record_digest(path: str) -> str:
    # RECORD's form of agent.py's sha256_digest (the two files share one namespace on the host).
    return "sha256=" + base64.urlsafe_b64encode(sha256_digest(path)).rstrip(b"=").decode()


def record_check(site: str, package: str, limit: int = 200) -> JsonObj:
    """Hash every file ``package``'s RECORD lists (under ``site``) against it; ``.pyc`` caches and
    lines without a hash (RECORD itself) are skipped."""
    infos = dist_infos(site, package)
    out: JsonObj = {"site_packages": site, "package": package, "dist_info": None, "version": None, "files": 0, "matched": 0}
    out.update({"mismatched": [], "missing": [], "ok": False})
    if len(infos) != 1:
        out["note"] = "no %s dist-info in %s" % (package, site) if not infos else "several dist-infos: " + ", ".join(infos)
        return out
    info = infos[0]
    out["dist_info"] = info
    out["version"] = dist_version(site, package)
    try:
        with open(os.path.join(site, info, "RECORD"), newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        out["note"] = "cannot read RECORD: %s" % exc
        return out
    for row in rows:
        if len(row) < 2 or not row[1]:
            continue
        rel = row[0]
        if rel.endswith(".pyc") or "/__pycache__/" in "/" + rel:
            continue
        out["files"] += 1
        path = os.path.normpath(os.path.join(site, rel))
        try:
            got = _record_digest(path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            if len(out["missing"]) < limit:
                out["missing"].append(rel)
            else:
                out["truncated"] = True
            continue
        if got == row[1]:
            out["matched"] += 1
        elif len(out["mismatched"]) < limit:
            out["mismatched"].append({"path": rel, "record": row[1], "actual": got})
        else:
            out["truncated"] = True
    out["ok"] = out["files"] > 0 and out["matched"] == out["files"]
    return out


def _record_summary(rec: JsonObj) -> JsonObj:
    out = {k: rec.get(k) for k in ("dist_info", "version", "files", "matched", "ok")}
    out["mismatched"] = [m["path"] for m in rec.get("mismatched", [])]
    out["missing"] = list(rec.get("missing", []))
    return out


def op_record_check(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    return record_check(find_site(req), req.get("package", "sglang"))


# --- the side-by-side venv ---------------------------------------------------------------------------


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _venv_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def _read_marker(venv: str) -> Optional[JsonObj]:
    try:
        with open(os.path.join(venv, SBS_MARKER)) as fh:
            marker: JsonObj = json.load(fh)
            return marker
    except (OSError, ValueError):
        return None


def sbs_probe(req: JsonObj) -> JsonObj:
    """What a rollout would find (writes nothing): production's interpreter, site, version and
    RECORD; the venv's path and whether it is absent, ours or someone else's; pip; the lock."""
    pkg = req.get("package", "sglang")
    prod_site = find_site({"site_packages": req.get("production_site"), "package": pkg})
    venv = os.path.abspath(os.path.expanduser(req["venv"]))
    sd = state_dir(req)
    problems = []
    prod_prefix = sys.prefix
    if _inside(venv, prod_prefix) or _inside(venv, prod_site):
        problems.append("the side-by-side venv %s is inside production's environment %s" % (venv, prod_prefix))
    if _inside(prod_site, venv) or _inside(prod_prefix, venv):
        problems.append("the side-by-side venv %s contains production's environment %s" % (venv, prod_prefix))
    if _inside(sd, venv):
        problems.append("state_dir %s is inside the side-by-side venv %s" % (sd, venv))
    marker = _read_marker(venv) if os.path.lexists(venv) else None
    state = "absent" if not os.path.lexists(venv) else ("ours" if marker is not None else "foreign")
    parent = os.path.dirname(venv)
    anc = parent
    while not os.path.isdir(anc) and os.path.dirname(anc) != anc:
        anc = os.path.dirname(anc)
    import importlib.util

    try:
        free = shutil.disk_usage(anc).free
    except OSError:
        free = None
    return {
        "production_python": sys.executable,
        "base_python": getattr(sys, "_base_executable", None) or sys.executable,
        "production_prefix": prod_prefix,
        "production_site": prod_site,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "package_version": dist_version(prod_site, pkg),
        "record": record_check(prod_site, pkg),
        "venv": venv,
        "venv_state": state,
        "marker": marker,
        "venv_parent_writable": os.access(anc, os.W_OK | os.X_OK),
        "free_bytes": free,
        "pip": importlib.util.find_spec("pip") is not None,
        "ensurepip": importlib.util.find_spec("ensurepip") is not None,
        "state_dir": sd,
        "lock": lock_info(sd),
        "problems": problems,
    }


def _run(cmd: List[str], timeout: float, what: str) -> str:
    try:
        p = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, cwd="/"
        )
    except subprocess.TimeoutExpired:
        raise Fail(ErrorKind.REMOTE, "%s timed out after %ss" % (what, timeout))
    text = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        raise Fail(ErrorKind.REMOTE, "%s failed (exit %d): %s" % (what, p.returncode, text[-2000:]), output_tail=text[-4000:])
    return text


def _purelib(python: str) -> str:
    text = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 60, "asking the venv's site-packages"
    )
    return text.strip().splitlines()[-1]


def _make_venv(req: JsonObj, pr: JsonObj) -> str:
    """The venv from production's base interpreter, layered on production's site-packages."""
    venv = pr["venv"]
    event("venv", path=venv)
    _run([pr["base_python"], "-m", "venv", "--without-pip", venv], 300, "creating the venv")
    side = _purelib(_venv_python(venv))
    with open(os.path.join(side, SBS_PTH), "w") as fh:
        fh.write("import site; site.addsitedir(%r)\n" % pr["production_site"])
    marker = {
        "made_by": "ddtree-deploy",
        "host": req.get("host"),
        "side_by_side_of": req.get("side_by_side_of"),
        "production_site": pr["production_site"],
        "deploy_id": req.get("deploy_id"),
        "who": req.get("who"),
        "created": now(),
    }
    with open(os.path.join(venv, SBS_MARKER), "w") as fh:
        json.dump(marker, fh, indent=1, sort_keys=True)
    vpy = _venv_python(venv)
    has_pip = subprocess.run(
        [vpy, "-c", "import pip"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/"
    )
    if has_pip.returncode != 0:  # production has no pip: give the venv its own (production stays as it is)
        _run([vpy, "-m", "ensurepip", "--default-pip"], 300, "ensurepip in the venv")
    return side


def _pip_install(req: JsonObj, work: str, wheel_name: str, data: bytes) -> str:
    whl = os.path.join(work, wheel_name)
    with open(whl, "wb") as fh:
        fh.write(data)
    reqs = os.path.join(work, "requirements.txt")
    w = req["wheel"]
    with open(reqs, "w") as fh:
        fh.write("%s==%s --hash=sha256:%s\n" % (req.get("package", "sglang"), w["version"], w["sha256"]))
    cmd = [_venv_python(req["venv_path"]), "-m", "pip", "install", "--no-deps", "--no-index", "--find-links", work]
    cmd += ["--require-hashes", "--ignore-installed", "--no-compile", "--disable-pip-version-check", "--no-cache-dir"]
    cmd += ["--no-warn-script-location", "-r", reqs]
    event("pip install", wheel=wheel_name)
    return _run(cmd, PIP_TIMEOUT, "pip install of %s" % wheel_name)


def _verify_install(req: JsonObj, pr: JsonObj, side: str) -> Tuple[JsonObj, JsonObj]:
    pkg = req.get("package", "sglang")
    rec = record_check(side, pkg)
    want = req["wheel"]["version"]
    if not rec["ok"] or rec["version"] != want:
        raise Fail(
            ErrorKind.REMOTE,
            "the installed %s in %s does not match its RECORD (version %s, %d of %d files match; want %s)"
            % (pkg, side, rec["version"], rec["matched"], rec["files"], want),
            record=_record_summary(rec),
        )
    where = import_check(side, pkg, python=_venv_python(pr["venv"]))
    if not where["ok"]:
        raise Fail(
            ErrorKind.REMOTE,
            "the side-by-side interpreter imports %s from %s, not from %s"
            % (pkg, ", ".join(where["found"] or ["nowhere"]), side),
            import_check=where,
        )
    return rec, where


def _sbs_fail(sd: str, base: JsonObj, message: str) -> None:
    try:
        audit(sd, dict(base, result="failed: " + message[:2000]))
    except OSError:
        pass


def sbs_install(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    pkg = req.get("package", "sglang")
    w = req["wheel"]
    data = read_payload(
        stdin, {"files": [{"path": w["filename"], "action": "create", "size": w["size"], "sha256": w["sha256"]}]}
    )[w["filename"]]
    pr = sbs_probe(req)
    sd = state_dir(req)
    base = {"op": "rollout", "deploy_id": req["deploy_id"], "who": req.get("who"), "why": req.get("why")}
    base.update({"series_id": req.get("series_id"), "wheel": w["filename"], "venv": pr["venv"]})
    if pr["problems"]:
        raise Fail(ErrorKind.HOST_REFUSED, "; ".join(pr["problems"]))
    if pr["venv_state"] == "foreign":
        raise Fail(
            ErrorKind.HOST_REFUSED,
            "%s exists and was not made by ddtree-deploy (no %s in it): refusing to replace it" % (pr["venv"], SBS_MARKER),
            hint="choose another `venv` for this host in the inventory, or move that directory away",
        )
    acquire_lock(sd, req, "rollout")
    made = False
    work = None
    try:
        before = pr["record"]
        work = tempfile.mkdtemp(prefix="rollout-%s-" % req["deploy_id"], dir=sd)
        if pr["venv_state"] == "ours":
            event("replacing", path=pr["venv"])
            shutil.rmtree(pr["venv"])
        made = True
        side = _make_venv(req, pr)
        pip_out = _pip_install(dict(req, venv_path=pr["venv"]), work, w["filename"], data)
        rec, where = _verify_install(req, pr, side)
        s = req.get("smoke") or {}
        checks = run_checks(
            side,
            s.get("compile", []),
            s.get("modules", []),
            s.get("timeout", 300),
            s.get("run", ()),
            python=_venv_python(pr["venv"]),
        )
        if not checks.get("ok"):
            raise Fail(
                ErrorKind.SMOKE_FAILED,
                "%s failed in the side-by-side venv: %s" % (checks.get("failed_step"), checks.get("output_tail", "")[-1500:]),
                checks=checks,
            )
        after = record_check(pr["production_site"], pkg)
        if _record_summary(after) != _record_summary(before):
            raise Fail(
                ErrorKind.ROLLBACK_FAILED,
                "production's %s changed during the rollout (RECORD check before: %d/%d match, after: %d/%d): "
                "not by this tool (it writes only into %s); find out who did"
                % (pkg, before["matched"], before["files"], after["matched"], after["files"], pr["venv"]),
                record_before=_record_summary(before),
                record_after=_record_summary(after),
            )
        audit(sd, dict(base, result="installed", version=rec["version"]))
        return {
            "venv": pr["venv"],
            "python": _venv_python(pr["venv"]),
            "site_packages": side,
            "version": rec["version"],
            "record": _record_summary(rec),
            "import_check": where,
            "checks": checks,
            "pip_output_tail": pip_out[-2000:],
            "production": {
                "python": pr["production_python"],
                "site_packages": pr["production_site"],
                "record_before": _record_summary(before),
                "record_after": _record_summary(after),
            },
        }
    except BaseException as exc:
        message = getattr(exc, "message", None) or "%s: %s" % (type(exc).__name__, exc)
        if made and os.path.lexists(pr["venv"]) and _read_marker(pr["venv"]) is not None:
            shutil.rmtree(pr["venv"], ignore_errors=True)
        removed = made and not os.path.lexists(pr["venv"])
        _sbs_fail(sd, base, message)
        if isinstance(exc, Fail) and exc.kind in (ErrorKind.ROLLBACK_FAILED, ErrorKind.HOST_REFUSED, ErrorKind.LOCK_HELD):
            raise
        details = dict(getattr(exc, "details", {}) or {})
        details["venv_removed"] = removed
        raise Fail(
            ErrorKind.ROLLED_BACK,
            "side-by-side install failed: %s; %s; production untouched"
            % (message, "the side-by-side venv was removed" if removed else "nothing was created"),
            **details,
        )
    finally:
        if work:
            shutil.rmtree(work, ignore_errors=True)
        try:
            release_lock(sd, mine=True)
        except OSError:
            pass


def sbs_remove(req: JsonObj) -> JsonObj:
    pr = sbs_probe(req)
    sd = state_dir(req)
    if pr["venv_state"] == "absent":
        return {"removed": False, "venv": pr["venv"], "note": "no side-by-side venv at %s" % pr["venv"]}
    if pr["venv_state"] == "foreign":
        raise Fail(
            ErrorKind.HOST_REFUSED,
            "%s was not made by ddtree-deploy (no %s in it): refusing to remove it" % (pr["venv"], SBS_MARKER),
            hint="remove it by hand if it is yours",
        )
    if req.get("dry_run"):
        return {"removed": False, "would_remove": True, "venv": pr["venv"], "marker": pr["marker"]}
    acquire_lock(sd, req, "rollout-remove")
    try:
        event("removing", path=pr["venv"])
        shutil.rmtree(pr["venv"])
        audit(
            sd,
            {
                "op": "rollout-remove",
                "deploy_id": req.get("deploy_id"),
                "who": req.get("who"),
                "why": req.get("why"),
                "venv": pr["venv"],
                "result": "removed",
            },
        )
    finally:
        release_lock(sd, mine=True)
    return {"removed": True, "venv": pr["venv"], "production_record": _record_summary(pr["record"])}


def op_side_by_side(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    action = req.get("action")
    if action == "probe":
        return sbs_probe(req)
    if action == "install":
        return sbs_install(req, stdin)
    if action == "remove":
        return sbs_remove(req)
    raise Fail(ErrorKind.USAGE, "unknown side_by_side action %r" % action)


OPS["record_check"] = op_record_check
OPS["side_by_side"] = op_side_by_side
