"""The host-side half of ddtree-deploy: one self-contained script, run by the host's own Python.

It is never imported on the host: the client sends this file's text over the SSH channel's stdin
and runs it with ``PYTHON -c BOOTSTRAP`` (see ``connection.BOOTSTRAP``), so nothing is installed on
the host and every remote path travels inside a JSON request, never through a shell.

Protocol (``protocol.py``, whose source is sent ahead of this file): stdin ``<len>\\n<source>``
(read by the bootstrap), then any number of requests,
each ``<len>\\n<request JSON>`` followed by its payload (the concatenated file contents named by an
``apply`` request). Output (stdout), per request: zero or more ``DDTREE-EVENT {json}`` lines, then
exactly one ``DDTREE-RESULT {json}``. One SSH exec (one remote shell + one Python start) serves a
whole push: the preflight probe and the apply.

Once the whole payload is in, an ``apply`` or ``rollback`` runs to its end even if the connection
drops (SIGHUP and broken pipes are ignored), and every step is journaled in the deploy record, so
a host is never left changed without a record saying what to undo.

Needs only the standard library (Python >= 3.8). State directory layout: see docs/deploy.md ("State directory on a host").
"""

import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Tuple

if __name__ != "__ddtree_agent__":  # imported on the client (tests): the protocol from its module
    from ddtree_deploy.remote.protocol import *  # noqa: F403  (on the host its source comes first)

# Annotations are evaluated on the host when each ``def`` runs (no ``from __future__ import
# annotations``: this file is not the first statement of the source the host compiles), so they use
# only what Python 3.8's ``typing`` has (``Dict``/``List``/``Optional``, never ``dict[...]`` or ``X | Y``).
JsonObj = Dict[str, Any]  # a JSON object: a request, a deploy record, a result
_OUT = sys.stdout
_stdout_ok = [True]


def emit(kind: str, obj: JsonObj) -> None:
    if not _stdout_ok[0]:
        return
    try:
        _OUT.write("%s %s\n" % (EVENT_PREFIX if kind == "EVENT" else RESULT_PREFIX, json.dumps(obj, sort_keys=True)))
        _OUT.flush()
    except (OSError, ValueError):
        _stdout_ok[0] = False  # the client went away: keep going, the record has the outcome


def event(phase: str, **kw: Any) -> None:
    kw["phase"] = phase
    emit("EVENT", kw)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def sha256_digest(path: str) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
    return h.digest()


def sha256_file(path: str) -> str:
    return sha256_digest(path).hex()


def file_sha(path: str) -> Optional[str]:
    """sha256 of a regular file, or None if it does not exist."""
    try:
        return sha256_file(path)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return "<directory>"


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Fail(Exception):
    """An error the client maps to an exception class (``kind``) of ddtree_deploy.errors."""

    def __init__(self, kind: str, message: str, hint: Optional[str] = None, **details: Any) -> None:
        Exception.__init__(self, message)
        self.kind = kind
        self.message = message
        self.hint = hint
        self.details = details


# --- where things are ---------------------------------------------------------------------------


def find_site(req: JsonObj) -> str:
    sp: Optional[str] = req.get("site_packages")
    if sp:
        return os.path.abspath(os.path.expanduser(sp))
    import importlib.util

    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    spec = importlib.util.find_spec(req.get("package", "sglang"))
    if spec is None or not spec.submodule_search_locations:
        raise Fail(ErrorKind.HOST_REFUSED, "%s is not importable by %s" % (req.get("package", "sglang"), sys.executable))
    return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))


def state_dir(req: JsonObj) -> str:
    sd: str = req["state_dir"]
    return os.path.abspath(os.path.expanduser(sd))


def safe_join(site: str, rel: str) -> str:
    if rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in rel.split("/")):
        raise Fail(ErrorKind.USAGE, "refused path %r" % rel)
    return os.path.join(site, *rel.split("/"))


def dist_version(site: str, package: str) -> Optional[str]:
    try:
        names = os.listdir(site)
    except OSError:
        return None
    norm = package.replace("-", "_").lower()
    for name in sorted(names):
        if name.endswith(".dist-info") and name.split("-")[0].replace("-", "_").lower() == norm:
            try:
                with open(os.path.join(site, name, "METADATA"), encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break
            except OSError:
                pass
            return name[len(name.split("-")[0]) + 1 : -len(".dist-info")]
    return None


# --- lock -----------------------------------------------------------------------------------------


def pid_start(pid: int) -> Optional[str]:
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_zombie(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def lock_info(sd: str) -> Optional[JsonObj]:
    lock = os.path.join(sd, "lock")
    if not os.path.isdir(lock):
        return None
    info = {}
    try:
        with open(os.path.join(lock, "info.json")) as fh:
            info = json.load(fh)
    except (OSError, ValueError):
        info = {"who": "unknown (lock being created or info unreadable)"}
    alive = None
    if info.get("hostname") == socket.gethostname() and info.get("pid"):
        try:
            os.kill(int(info["pid"]), 0)
            alive = pid_start(int(info["pid"])) == info.get("pid_start") and not pid_zombie(int(info["pid"]))
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
    elif not info.get("pid"):
        try:
            alive = time.time() - os.stat(lock).st_mtime < 60
        except OSError:
            alive = False
    info["alive"] = alive
    return info


def acquire_lock(sd: str, req: JsonObj, op: str) -> JsonObj:
    os.makedirs(sd, mode=0o700, exist_ok=True)
    lock = os.path.join(sd, "lock")
    try:
        os.mkdir(lock, 0o700)
    except FileExistsError:
        holder = lock_info(sd) or {}
        if req.get("break_stale_lock") and holder.get("alive") is False:
            event("lock", note="breaking stale lock of dead %s" % holder.get("deploy_id"))
            release_lock(sd)
            audit(
                sd,
                {
                    "op": "lock-break",
                    "deploy_id": req.get("deploy_id"),
                    "who": req.get("who"),
                    "result": "broke stale lock",
                    "holder": holder,
                },
            )
            os.mkdir(lock, 0o700)
        else:
            raise Fail(
                ErrorKind.LOCK_HELD,
                "deploy lock held by %s since %s (%s %s, deploy %s)%s"
                % (
                    holder.get("who"),
                    holder.get("when"),
                    holder.get("op"),
                    holder.get("why") or "",
                    holder.get("deploy_id"),
                    "" if holder.get("alive") is not False else "; its process is gone",
                ),
                holder=holder,
            )
    info = {
        "who": req.get("who"),
        "user": req.get("user"),
        "when": now(),
        "why": req.get("why"),
        "deploy_id": req.get("deploy_id"),
        "op": op,
        "pid": os.getpid(),
        "pid_start": pid_start(os.getpid()),
        "hostname": socket.gethostname(),
    }
    tmp = os.path.join(lock, "info.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(info, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, os.path.join(lock, "info.json"))
    return info


def release_lock(sd: str, mine: bool = False) -> None:
    """Remove the lock; with ``mine``, only if this process still holds it (someone may have
    released it by hand and another deploy taken it since)."""
    lock = os.path.join(sd, "lock")
    if mine:
        try:
            with open(os.path.join(lock, "info.json")) as fh:
                if json.load(fh).get("pid") != os.getpid():
                    return
        except (OSError, ValueError):
            return
    for name in ("info.json", "info.json.tmp"):
        try:
            os.unlink(os.path.join(lock, name))
        except FileNotFoundError:
            pass
    try:
        os.rmdir(lock)
    except FileNotFoundError:
        pass


# --- records and audit ----------------------------------------------------------------------------


def audit(sd: str, obj: JsonObj) -> None:
    obj = dict(obj)
    obj.setdefault("time", now())
    os.makedirs(sd, mode=0o700, exist_ok=True)
    line = json.dumps(obj, sort_keys=True) + "\n"
    fd = os.open(os.path.join(sd, "audit.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str, obj: JsonObj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path))


def record_dir(sd: str, deploy_id: str) -> str:
    if not deploy_id or "/" in deploy_id or deploy_id.startswith("."):
        raise Fail(ErrorKind.USAGE, "bad deploy id %r" % deploy_id)
    return os.path.join(sd, "deploys", deploy_id)


def load_records(sd: str) -> List[JsonObj]:
    base = os.path.join(sd, "deploys")
    out: List[JsonObj] = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(base, name, "record.json")) as fh:
                out.append(json.load(fh))
        except (OSError, ValueError):
            out.append({"deploy_id": name, "status": UNREADABLE})
    out.sort(key=lambda r: (r.get("seq", 0), r.get("deploy_id", "")))
    return out


def save_record(rec: JsonObj) -> None:
    rec["updated"] = now()
    write_json_atomic(os.path.join(rec["_dir"], "record.json"), {k: v for k, v in rec.items() if k != "_dir"})


# Space kept aside in the state dir for the last record update and the audit line: written before
# the first backup, given back just before the outcome is recorded, so that a state disk that fills
# up during a push still ends with an honest record ("aborted", "rolled-back") and an audit line.
RESERVE_MIN = 256 << 10


def reserve_space(rdir: str, rec: JsonObj) -> str:
    need = max(RESERVE_MIN, 4 * len(json.dumps({k: v for k, v in rec.items() if k != "_dir"})) + (64 << 10))
    path = os.path.join(rdir, "reserve")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        block = b"\0" * (64 << 10)
        left = need
        while left > 0:
            n = os.write(fd, block[:left])
            left -= n
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def release_reserve(path: Optional[str]) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


# --- file operations ------------------------------------------------------------------------------


def tmp_name(target: str, deploy_id: str) -> str:
    d, b = os.path.split(target)
    return os.path.join(d, ".%s.ddtree-%s.tmp" % (b, deploy_id))


def write_verified(path: str, data: bytes, sha: str, mode: int) -> None:
    """Write ``data`` to ``path`` (a temp name), fsync, chmod, re-read and check its sha256."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, mode)
    got = sha256_file(path)
    if got != sha:
        raise Fail(ErrorKind.REMOTE, "%s: wrote sha256 %s, expected %s" % (path, got, sha))


def drop_pycache(target: str) -> None:
    d, b = os.path.split(target)
    if not b.endswith(".py"):
        return
    cache = os.path.join(d, "__pycache__")
    stem = b[:-3] + "."
    try:
        for name in os.listdir(cache):
            if name.startswith(stem) and name.endswith(".pyc"):
                try:
                    os.unlink(os.path.join(cache, name))
                except OSError:
                    pass
    except OSError:
        pass


def restore_record(rec: JsonObj, site: str) -> List[str]:
    """Put every file of ``rec`` back to its 'before' state; verify; return the problems found."""
    problems = []
    for f in rec["files"]:
        target = safe_join(site, f["path"])
        tmp = tmp_name(target, rec["deploy_id"])
        try:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if f["before_sha256"] is None:
                if os.path.lexists(target):
                    os.unlink(target)
            elif file_sha(target) != f["before_sha256"]:
                backup = os.path.join(rec["_dir"], "backup", *f["path"].split("/"))
                if file_sha(backup) != f["before_sha256"]:
                    raise Fail(ErrorKind.ROLLBACK_FAILED, "backup of %s is missing or corrupt" % f["path"])
                with open(backup, "rb") as fh:
                    data = fh.read()
                write_verified(tmp, data, f["before_sha256"], int(f["before_mode"], 8))
                st = os.stat(backup)
                os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
                os.rename(tmp, target)
                fsync_dir(os.path.dirname(target))
            drop_pycache(target)
        except Fail as exc:
            problems.append(exc.message)
        except OSError as exc:
            problems.append("%s: %s" % (f["path"], exc))
    for d in reversed(rec.get("created_dirs", [])):
        try:
            os.rmdir(safe_join(site, d))
        except OSError:
            pass
    for f in rec["files"]:
        got = file_sha(safe_join(site, f["path"]))
        if got != f["before_sha256"]:
            problems.append("%s: sha256 %s after restore, expected %s" % (f["path"], got, f["before_sha256"]))
    return problems


# --- compile + smoke --------------------------------------------------------------------------------

SMOKE_SRC = r"""
import importlib, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
    print("imported " + m)
"""


def run_checks(
    site: str,
    paths: Sequence[str],
    modules: Sequence[str],
    timeout: float,
    run: Sequence[str] = (),
    python: Optional[str] = None,
) -> JsonObj:
    """py_compile every deployed .py, import the smoke modules in a fresh interpreter, then run
    each ``run`` module as ``python -m M`` (e.g. the DDTree probe); any non-zero exit fails.
    ``python``: the interpreter for the imports and runs (default: the agent's own)."""
    python = python or sys.executable
    pys = [safe_join(site, p) for p in paths if p.endswith(".py") and os.path.exists(safe_join(site, p))]
    out = {"compiled": len(pys), "modules": list(modules)}
    work = tempfile.mkdtemp(prefix="ddtree-smoke-")
    try:
        steps = []
        if pys:  # py_compile in this process (it is the host's interpreter); imports get a fresh one below
            import py_compile

            event("compile", count=len(pys))
            t0 = time.time()
            for i, f in enumerate(pys):
                try:
                    py_compile.compile(f, cfile=os.path.join(work, "%d.pyc" % i), doraise=True)
                except py_compile.PyCompileError as exc:
                    out["compile_seconds"] = round(time.time() - t0, 3)
                    out["failed_step"] = "compile"
                    out["output_tail"] = str(exc.msg)[-4000:]
                    out["ok"] = False
                    return out
            out["compile_seconds"] = round(time.time() - t0, 3)
        if modules:
            steps.append(("smoke", [python, "-c", SMOKE_SRC] + list(modules)))
        for mod in run:
            steps.append(("run " + mod, [python, "-m", mod]))
        out["run"] = list(run)
        for name, cmd in steps:
            event(name, count=len(cmd) - 3)
            t0 = time.time()
            try:
                p = subprocess.run(
                    cmd, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout
                )
                rc, text = p.returncode, p.stdout.decode("utf-8", "replace")
            except subprocess.TimeoutExpired as exc:
                rc, text = -1, ((exc.output or b"").decode("utf-8", "replace") + "\ntimed out after %ss" % timeout)
            out[name + "_seconds"] = round(time.time() - t0, 3)
            if rc != 0:
                out["failed_step"] = name
                out["output_tail"] = text[-4000:]
                out["ok"] = False
                return out
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["ok"] = True
    return out


# Where a fresh interpreter (the same one smoke and the service use, from a neutral cwd) would import
# the package from; ``find_spec`` of a top-level name finds it without running its ``__init__``.
WHERE_SRC = r"""
import importlib.util, json, sys
spec = importlib.util.find_spec(sys.argv[1])
locs = [] if spec is None else list(spec.submodule_search_locations or ([spec.origin] if spec.origin else []))
print(json.dumps(locs))
"""


def import_check(site: str, package: str, python: Optional[str] = None) -> JsonObj:
    """Prove the host interpreter (or ``python``) imports ``package`` from ``site`` (and from nowhere else)."""
    python = python or sys.executable
    want = os.path.realpath(os.path.join(site, package))
    work = tempfile.mkdtemp(prefix="ddtree-where-")
    try:
        p = subprocess.run(
            [python, "-c", WHERE_SRC, package],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=120,
        )
        try:
            locs = json.loads(p.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            locs = None
    except subprocess.TimeoutExpired:
        locs = None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found = None if locs is None else [os.path.realpath(x) for x in locs]
    return {"package": package, "expected": want, "found": found, "python": python, "ok": found == [want]}


def require_import_from_site(site: str, package: str) -> JsonObj:
    chk = import_check(site, package)
    if not chk["ok"]:
        where = (
            "does not import %s at all" % package
            if not chk["found"]
            else "imports %s from %s" % (package, ", ".join(chk["found"]))
        )
        raise Fail(
            ErrorKind.HOST_REFUSED,
            "%s %s, not from site_packages %s: a smoke test or deploy there would "
            "check the wrong copy" % (sys.executable, where, site),
            hint="make `site_packages` in the inventory the directory this `python` imports %s from "
            "(or drop it to ask the interpreter), or point `python` at the right interpreter" % package,
            import_check=chk,
        )
    return chk


# --- operations -------------------------------------------------------------------------------------


def op_probe(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    site = find_site(req)
    sd = state_dir(req)
    files = {}
    for f in req.get("files", []):
        target = safe_join(site, f["path"])
        d = os.path.dirname(target)
        # nearest existing ancestor decides whether we can create the file (and its directories)
        anc = d
        while not os.path.isdir(anc) and os.path.dirname(anc) != anc:
            anc = os.path.dirname(anc)
        info: JsonObj = {
            "exists": os.path.lexists(target),
            "sha256": file_sha(target),
            "dir_exists": os.path.isdir(d),
            "dir_writable": os.access(anc, os.W_OK | os.X_OK),
        }
        try:
            info["free"] = shutil.disk_usage(anc).free
        except OSError:
            info["free"] = None
        if info["exists"]:
            st = os.lstat(target)
            info["mode"] = "%04o" % (st.st_mode & 0o7777)
            info["size"] = st.st_size
            info["writable"] = os.access(target, os.W_OK) and not os.path.islink(target)
            info["is_symlink"] = os.path.islink(target)
            if f.get("want_content") and info["size"] < 4 << 20:
                with open(target, "rb") as fh:
                    info["content_hex"] = fh.read().hex()
        files[f["path"]] = info
    free: Dict[str, Optional[int]] = {}
    for key, path in (("site", site), ("state", sd)):
        p = path
        while not os.path.isdir(p) and os.path.dirname(p) != p:
            p = os.path.dirname(p)
        try:
            free[key] = shutil.disk_usage(p).free
        except OSError:
            free[key] = None
    sd_anc = sd
    while not os.path.isdir(sd_anc) and os.path.dirname(sd_anc) != sd_anc:
        sd_anc = os.path.dirname(sd_anc)
    state_writable = os.access(sd_anc, os.W_OK | os.X_OK)
    real_site = os.path.realpath(site)
    real_sd = os.path.realpath(sd)
    state_inside_site = real_sd == real_site or real_sd.startswith(real_site + os.sep)
    recs = load_records(sd)
    for r in recs:
        r.pop("_dir", None)
    where = import_check(site, req.get("package", "sglang")) if req.get("check_import") else None
    return {
        "import_check": where,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "python_executable": sys.executable,
        "site_packages": site,
        "state_dir": sd,
        "package_version": dist_version(site, req.get("package", "sglang")),
        "files": files,
        "free_bytes": free,
        "state_writable": state_writable,
        "state_inside_site": state_inside_site,
        "lock": lock_info(sd),
        "records": recs,
        "hostname": socket.gethostname(),
        "user": _user(),
    }


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except Exception:
        return str(os.getuid())


def read_payload(stdin: BinaryIO, req: JsonObj) -> Dict[str, bytes]:
    """Read and verify every blob before anything is written; a short read means the client went away."""
    blobs = {}
    for f in req["files"]:
        if f["action"] == "delete":
            continue
        n = int(f["size"])
        chunks = []
        got = 0
        while got < n:
            c = stdin.read(min(n - got, 1 << 20))
            if not c:
                raise Fail(
                    ErrorKind.REMOTE,
                    "upload incomplete: got %d of %d bytes of %s (connection lost?)" % (got, n, f["path"]),
                    interrupted=True,
                )
            chunks.append(c)
            got += len(c)
        data = b"".join(chunks)
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise Fail(ErrorKind.REMOTE, "upload of %s arrived corrupted (sha256 mismatch)" % f["path"])
        blobs[f["path"]] = data
    return blobs


def hook(req: JsonObj, name: str) -> None:
    t = (req.get("test_hooks") or {}).get(name)
    if t:
        event("test-hook", hook=name, sleep=t)
        time.sleep(float(t))


def op_apply(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    """One push, as journaled steps: receive, lock, re-check, record, back up, stage, commit, smoke,
    record the outcome. Any failure once the record exists restores the host from the backup."""
    site = find_site(req)
    sd = state_dir(req)
    base = apply_audit_entry(req)
    event("receiving")
    blobs = receive_payload(sd, req, stdin, base)
    hook(req, "after_receive")
    acquire_lock(sd, req, "push")
    rec = None  # the deploy record, once it is on disk: from then on a failure restores the host
    reserve = None
    try:
        recheck_under_lock(req, site)
        rec, reserve = write_draft_record(sd, req, site)
        back_up_files(rec, site)
        stage_files(rec, req, site, blobs)
        hook(req, "before_commit")
        commit_files(rec, req, site)
        verify_in_place(req, site)
        smoke_in_place(rec, req, site)
        release_reserve(reserve)
        reserve = None
        record_deployed(rec, sd, base)
        return {k: v for k, v in rec.items() if k != "_dir"}
    except BaseException as exc:
        raise apply_failed(exc, rec, reserve, sd, site, base)
    finally:
        try:
            release_lock(sd, mine=True)
        except OSError:
            pass


def apply_audit_entry(req: JsonObj) -> JsonObj:
    """The audit-log fields every outcome of this push shares."""
    return {
        "op": "push",
        "deploy_id": req["deploy_id"],
        "who": req.get("who"),
        "why": req.get("why"),
        "series_id": req.get("series_id"),
        "files": [f["path"] for f in req["files"]],
    }


def receive_payload(sd: str, req: JsonObj, stdin: BinaryIO, base: JsonObj) -> Dict[str, bytes]:
    """The whole payload, verified, before the lock and before any write; a failed upload is audited."""
    try:
        return read_payload(stdin, req)
    except Fail as exc:
        try:
            audit(sd, dict(base, result="aborted before any write: " + exc.message))
        except OSError:
            pass
        raise


def recheck_under_lock(req: JsonObj, site: str) -> None:
    """Nothing may have changed since preflight: every target still has a hash the client allowed."""
    for f in req["files"]:
        got = file_sha(safe_join(site, f["path"]))
        if got not in f["allowed_current"]:
            raise Fail(ErrorKind.DRIFT, "%s changed since preflight (sha256 %s)" % (f["path"], got), file=f["path"])


def draft_record(sd: str, req: JsonObj, site: str) -> JsonObj:
    """The deploy record before the first backup: what each file is now, and what it will be."""
    deploy_id = req["deploy_id"]
    rdir = record_dir(sd, deploy_id)
    seq = max([r.get("seq", 0) for r in load_records(sd)] + [0]) + 1
    draft = {
        "deploy_id": deploy_id,
        "seq": seq,
        "op": "push",
        "status": BACKING_UP,
        "who": req.get("who"),
        "user": req.get("user"),
        "why": req.get("why"),
        "series_id": req.get("series_id"),
        "version": req.get("version"),
        "site_packages": site,
        "started": now(),
        "files": [],
        "created_dirs": [],
        "_dir": rdir,
    }
    for f in req["files"]:
        target = safe_join(site, f["path"])
        before = file_sha(target)
        mode = "%04o" % (os.stat(target).st_mode & 0o7777) if before else None
        draft["files"].append(
            {
                "path": f["path"],
                "action": f["action"],
                "before_sha256": before,
                "before_mode": mode,
                "after_sha256": f.get("sha256"),
                "after_mode": f.get("mode"),
            }
        )
    return draft


def write_draft_record(sd: str, req: JsonObj, site: str) -> Tuple[JsonObj, str]:
    """Put the draft record and the space reserve on disk: nothing is written to site-packages until
    the outcome is sure to fit in the state dir. Returns (record, reserve path)."""
    draft = draft_record(sd, req, site)
    rdir = draft["_dir"]
    try:
        os.makedirs(os.path.join(rdir, "backup"), mode=0o700)
        reserve = reserve_space(rdir, draft)
        save_record(draft)
    except OSError as exc:
        shutil.rmtree(rdir, ignore_errors=True)
        raise Fail(
            ErrorKind.HOST_REFUSED,
            "cannot write the deploy record in the state dir %s (%s); nothing was written to site-packages" % (sd, exc),
            hint="free some space in the state dir on the host",
        )
    return draft, reserve


def back_up_files(rec: JsonObj, site: str) -> None:
    """Copy every existing target into the record's backup/, verified against its hash and fsynced."""
    event("backup")
    for f in rec["files"]:
        if f["before_sha256"] is None:
            continue
        dst = backup_path(rec, f["path"])
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(safe_join(site, f["path"]), dst)
        if sha256_file(dst) != f["before_sha256"]:
            raise Fail(ErrorKind.REMOTE, "backup of %s does not verify" % f["path"])
        fd = os.open(dst, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def stage_files(rec: JsonObj, req: JsonObj, site: str, blobs: Dict[str, bytes]) -> None:
    """Write each new file beside its target under a temp name (verified), creating missing dirs
    (each one recorded, so a rollback removes it)."""
    rec["status"] = STAGING
    save_record(rec)
    event("staging")
    for f in req["files"]:
        if f["action"] == "delete":
            continue
        target = safe_join(site, f["path"])
        make_parent_dirs(rec, site, os.path.dirname(target))
        write_verified(tmp_name(target, req["deploy_id"]), blobs[f["path"]], f["sha256"], int(f["mode"], 8))


def make_parent_dirs(rec: JsonObj, site: str, d: str) -> None:
    if os.path.isdir(d):
        return
    missing = []
    p = d
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for m in reversed(missing):
        os.mkdir(m, 0o755)
        rec["created_dirs"].append(os.path.relpath(m, site).replace(os.sep, "/"))
    save_record(rec)


def commit_files(rec: JsonObj, req: JsonObj, site: str) -> None:
    """Rename each staged file over its target (or delete it), journaled as writing -> written."""
    rec["status"] = WRITING
    save_record(rec)
    event("commit")
    for f in req["files"]:
        target = safe_join(site, f["path"])
        if f["action"] == "delete":
            os.unlink(target)
        else:
            os.rename(tmp_name(target, req["deploy_id"]), target)
        fsync_dir(os.path.dirname(target))
        drop_pycache(target)
        hook(req, "between_renames")
    rec["status"] = WRITTEN
    save_record(rec)


def verify_in_place(req: JsonObj, site: str) -> None:
    for f in req["files"]:
        got = file_sha(safe_join(site, f["path"]))
        if got != f.get("sha256"):
            raise Fail(ErrorKind.REMOTE, "%s: sha256 %s in place, expected %s" % (f["path"], got, f.get("sha256")))


def smoke_in_place(rec: JsonObj, req: JsonObj, site: str) -> None:
    """py_compile + the smoke imports (and runs) on the files now in place; kept in the record."""
    smoke = req["smoke"]
    checks = run_checks(site, smoke["compile"], smoke["modules"], smoke["timeout"], smoke.get("run", ()))
    rec["checks"] = checks
    if not checks["ok"]:
        raise Fail(ErrorKind.SMOKE_FAILED, "%s failed on the host" % checks["failed_step"], checks=checks)


def record_deployed(rec: JsonObj, sd: str, base: JsonObj) -> None:
    rec["status"] = DEPLOYED
    rec["finished"] = now()
    save_record(rec)
    checks = rec["checks"]
    audit(sd, dict(base, result="deployed", checks={k: v for k, v in checks.items() if k != "output_tail"}))


def apply_failed(exc: BaseException, rec: Optional[JsonObj], reserve: Optional[str], sd: str, site: str, base: JsonObj) -> Fail:
    """The failure path of a push; returns the Fail to raise. Before the record exists only the
    audit log hears of it; after, the host is restored from the backup and the outcome recorded,
    and the message says exactly what the state dir could not record."""
    fail = exc if isinstance(exc, Fail) else Fail(ErrorKind.REMOTE, "%s: %s" % (type(exc).__name__, exc))
    if rec is None:
        return refused_before_record(fail, sd, base)
    release_reserve(reserve)  # the space kept for this moment: the outcome must be recorded
    prev, problems, unsaved = restore_after_failure(rec, site, fail)
    kind, msg = settle_failed_record(rec, fail, prev, problems)
    unsaved = save_failed_outcome(rec, sd, base, fail, unsaved)
    if unsaved:  # say exactly what the state dir does not know
        msg += "; NOT RECORDED on the host (state dir): " + "; ".join(unsaved)
    details = dict(fail.details)
    details["unrecorded"] = unsaved
    details["cause"] = fail.kind
    details["record_status"] = rec["status"]
    return Fail(kind, msg, **details)


def refused_before_record(fail: Fail, sd: str, base: JsonObj) -> Fail:
    try:
        audit(sd, dict(base, result="refused: " + fail.message))
    except OSError as exc:
        fail.message += "; NOT RECORDED in the audit log: %s" % exc
    return fail


def restore_after_failure(rec: JsonObj, site: str, fail: Fail) -> Tuple[str, List[str], List[str]]:
    """Restore every file the push touched (nothing to do while it was only backing up).
    Returns (the status it failed in, restore problems, what could not be recorded so far)."""
    prev = rec["status"]
    if prev == BACKING_UP:
        return prev, [], []
    unsaved = []
    event("restore")
    rec["status"] = RESTORING
    rec["failure"] = fail.message
    try:
        save_record(rec)
    except OSError as exc:
        unsaved.append("record (status restoring): %s" % exc)
    return prev, restore_record(rec, site), unsaved


def settle_failed_record(rec: JsonObj, fail: Fail, prev: str, problems: List[str]) -> Tuple[str, str]:
    """The record's final status after a failed push, and the error (kind, message) to report."""
    rec["failure"] = fail.message
    rec["finished"] = now()
    if problems:
        rec["status"] = NEEDS_HUMAN
        rec["restore_problems"] = problems
        return ErrorKind.ROLLBACK_FAILED, "%s; restoring the host FAILED: %s" % (fail.message, "; ".join(problems))
    rec["status"] = ROLLED_BACK if prev in (WRITING, WRITTEN) else ABORTED
    return ErrorKind.ROLLED_BACK, "%s; the host was restored to its previous state (verified)" % fail.message


def save_failed_outcome(rec: JsonObj, sd: str, base: JsonObj, fail: Fail, unsaved: List[str]) -> List[str]:
    """Save the final record and the audit line; returns what could not be recorded."""
    try:
        save_record(rec)
        unsaved = []  # the final record supersedes an earlier unsaved one
    except OSError as exc:
        unsaved = unsaved + ["record (status %s): %s" % (rec["status"], exc)]
    try:
        audit(sd, dict(base, result=rec["status"] + ": " + fail.message))
    except OSError as exc:
        unsaved = unsaved + ["audit line: %s" % exc]
    return unsaved


def backup_path(rec: JsonObj, rel: str) -> str:
    return os.path.join(rec["_dir"], "backup", *rel.split("/"))


def plan_rollback(todo: List[JsonObj], site: str) -> Tuple[List[JsonObj], List[JsonObj], List[JsonObj]]:
    """Check, before anything is written, that every record of ``todo`` (newest first) can be
    restored: each backup a restore will need is present with its recorded hash, and each
    current file is what our deploy left there. Returns (steps, broken, edited): ``steps`` per
    record the files to restore; ``broken`` and ``edited`` name each bad file and what was found."""
    now_sha: Dict[str, Optional[str]] = {}  # path -> hash the file will have when this record's turn comes (after newer undos)
    steps, broken, edited = [], [], []
    for r in todo:
        status = r.get("status")
        files = []
        for f in r.get("files", []):
            rel = f["path"]
            target = safe_join(site, rel)
            cur = now_sha[rel] if rel in now_sha else file_sha(target)
            before, after = f.get("before_sha256"), f.get("after_sha256")
            # deployed: each file is what we put there (or already back to what was there before);
            # interrupted / needs-human records may be mixed, file by file, but only between those two
            if cur not in (after, before):
                edited.append(
                    {
                        "deploy_id": r["deploy_id"],
                        "path": rel,
                        "found_sha256": cur,
                        "deployed_sha256": after,
                        "before_sha256": before,
                    }
                )
            need_write = cur != before
            if need_write and before is not None:
                got = file_sha(backup_path(r, rel))
                if got != before:
                    broken.append(
                        {
                            "deploy_id": r["deploy_id"],
                            "path": rel,
                            "found": "missing" if got is None else "sha256 %s" % got,
                            "expected_sha256": before,
                        }
                    )
            files.append({"path": rel, "current_sha256": cur, "restore_to": before, "write": need_write})
            now_sha[rel] = before
        steps.append({"deploy_id": r["deploy_id"], "was": status, "files": files})
    return steps, broken, edited


def keep_edited(sd: str, rollback_id: str, edited: List[JsonObj], site: str) -> List[str]:
    """--force: copy each host-edited file into STATE/edited/<rollback id>/ (verified) before any write."""
    kept = []
    base = os.path.join(sd, "edited", rollback_id)
    for e in edited:
        src = safe_join(site, e["path"])
        if e["found_sha256"] is None or not os.path.isfile(src):
            continue
        dst = os.path.join(base, *e["path"].split("/"))
        os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
        shutil.copy2(src, dst)
        if sha256_file(dst) != e["found_sha256"]:
            raise Fail(ErrorKind.ROLLBACK_FAILED, "the kept copy of %s does not verify" % e["path"])
        fd = os.open(dst, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        kept.append(dst)
    fsync_dir(base)
    return kept


def _describe_edited(edited: List[JsonObj]) -> str:
    return "; ".join(
        "%s: sha256 %s is neither what deploy %s put there (%s) nor what was there before (%s)"
        % (
            e["path"],
            e["found_sha256"] or "(missing)",
            e["deploy_id"],
            e["deployed_sha256"] or "(absent)",
            e["before_sha256"] or "(absent)",
        )
        for e in edited
    )


def _describe_broken(broken: List[JsonObj]) -> str:
    return "; ".join(
        "backup of %s (deploy %s) is %s, expected sha256 %s"
        % (b["path"], b["deploy_id"], "missing" if b["found"] == "missing" else "corrupt: " + b["found"], b["expected_sha256"])
        for b in broken
    )


def select_rollback(recs: List[JsonObj], target_id: Optional[str], expect: Optional[str]) -> List[JsonObj]:
    live = [r for r in recs if r.get("status") in APPLIED + INTERRUPTED + (NEEDS_HUMAN,)]
    if target_id in (None, ""):
        todo = live[-1:]
    elif target_id == "pristine":
        todo = list(reversed(live))
    else:
        ids = [r["deploy_id"] for r in recs]
        if target_id not in ids:
            raise Fail(ErrorKind.USAGE, "no deploy %s on this host (known: %s)" % (target_id, ", ".join(ids) or "none"))
        known = [r for r in recs if r["deploy_id"] == target_id][0]
        if known.get("status") not in APPLIED:
            raise Fail(
                ErrorKind.USAGE, "deploy %s is %s, not deployed: cannot roll back to it" % (target_id, known.get("status"))
            )
        todo = list(reversed([r for r in live if r.get("seq", 0) > known.get("seq", 0)]))
    if expect and (not todo or todo[0]["deploy_id"] != expect):
        raise Fail(
            ErrorKind.USAGE,
            "the latest deploy on the host is %s, not %s: not rolling back" % (todo[0]["deploy_id"] if todo else "none", expect),
        )
    return todo


def op_rollback(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    site = find_site(req)
    sd = state_dir(req)
    dry = bool(req.get("dry_run"))
    if dry:  # nothing is written: no lock, no audit line
        recs = load_records(sd)
        for r in recs:
            r["_dir"] = record_dir(sd, r["deploy_id"])
        todo = select_rollback(recs, req.get("to"), req.get("expect_latest"))
        steps, broken, edited = plan_rollback(todo, site)
        return {
            "dry_run": True,
            "undone": [],
            "would_undo": steps,
            "broken_backups": broken,
            "edited": edited,
            "note": "nothing to roll back" if not todo else "dry run: wrote nothing",
        }
    acquire_lock(sd, dict(req, break_stale_lock=True), "rollback")
    try:
        recs = load_records(sd)
        for r in recs:
            r["_dir"] = record_dir(sd, r["deploy_id"])
        todo = select_rollback(recs, req.get("to"), req.get("expect_latest"))
        base = {"op": "rollback", "deploy_id": req.get("deploy_id"), "who": req.get("who"), "why": req.get("why")}
        if not todo:
            audit(sd, dict(base, result="nothing to roll back"))
            return {"undone": [], "note": "nothing to roll back"}
        # every check before the first write: a refusal leaves the host exactly as it is
        steps, broken, edited = plan_rollback(todo, site)
        if broken:
            msg = "refused before any write, the host is untouched: " + _describe_broken(broken)
            audit(sd, dict(base, undo=[r["deploy_id"] for r in todo], result="refused: " + msg))
            raise Fail(ErrorKind.BROKEN_BACKUP, msg, broken_backups=broken, edited=edited)
        kept = []
        if edited:
            if not req.get("force"):
                msg = (
                    "refused before any write, the host is untouched: %d file(s) were edited on the host after "
                    "the deploy: %s" % (len(edited), _describe_edited(edited))
                )
                audit(sd, dict(base, undo=[r["deploy_id"] for r in todo], result="refused: " + msg))
                raise Fail(
                    ErrorKind.HOST_EDITED,
                    msg,
                    edited=edited,
                    hint="keep the edits first, or rerun with --force (a copy of each edited file is kept "
                    "in the state dir under edited/)",
                )
            kept = keep_edited(sd, req.get("deploy_id") or "rollback", edited, site)
            audit(sd, dict(base, undo=[r["deploy_id"] for r in todo], result="--force: kept host-edited files", kept=kept))
        undone: List[JsonObj] = []
        for r in todo:
            event("restore", deploy_id=r["deploy_id"])
            prev = r.get("status")
            problems = restore_record(r, site)
            if problems:
                r["status"] = NEEDS_HUMAN
                r["restore_problems"] = problems
                save_record(r)
                audit(sd, dict(base, undo=r["deploy_id"], result="FAILED: " + "; ".join(problems)))
                raise Fail(
                    ErrorKind.ROLLBACK_FAILED,
                    "rolling back %s failed: %s" % (r["deploy_id"], "; ".join(problems)),
                    undone=undone,
                    kept=kept,
                )
            r["status"] = UNDONE if prev in APPLIED else ROLLED_BACK
            r["undone_by"] = req.get("deploy_id")
            r["undone_at"] = now()
            save_record(r)
            undone.append(
                {
                    "deploy_id": r["deploy_id"],
                    "was": prev,
                    "files": [{"path": f["path"], "sha256": f["before_sha256"]} for f in r["files"]],
                }
            )
            audit(
                sd,
                dict(
                    base,
                    undo=r["deploy_id"],
                    series_id=r.get("series_id"),
                    files=[f["path"] for f in r["files"]],
                    result="restored (verified)",
                ),
            )
        return {"undone": undone, "kept": kept}
    finally:
        release_lock(sd, mine=True)


def op_smoke(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    site = find_site(req)
    where = require_import_from_site(site, req.get("package", "sglang"))
    event("import-check", found=where["found"])
    checks = run_checks(site, req["compile"], req["modules"], req["timeout"], req.get("run", ()))
    return {"checks": checks, "site_packages": site, "import_check": where}


def op_history(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    sd = state_dir(req)
    lines = []
    try:
        with open(os.path.join(sd, "audit.log"), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    lines.append({"unparsed": line.rstrip("\n")})
    except FileNotFoundError:
        pass
    limit = req.get("limit")
    if limit:
        lines = lines[-int(limit) :]
    return {"entries": lines}


def op_lock_release(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    sd = state_dir(req)
    holder = lock_info(sd)
    if holder is None:
        return {"released": False, "note": "no lock held"}
    if req.get("dry_run"):
        return {"released": False, "would_release": True, "holder": holder, "dry_run": True}
    release_lock(sd)
    audit(sd, {"op": "lock-release", "who": req.get("who"), "holder": holder, "result": "released"})
    return {"released": True, "holder": holder}


def op_lock_status(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    return {"lock": lock_info(state_dir(req))}


AUDITED_BY_CLIENT = ("restart",)  # steps the client runs itself (restart_command + health check), audited here


def op_audit(req: JsonObj, stdin: BinaryIO) -> JsonObj:
    """One audit line for a step the client ran over SSH: the restart and health check after a push,
    a rollback or a rollout."""
    if req.get("entry_op") not in AUDITED_BY_CLIENT:
        raise Fail(ErrorKind.USAGE, "not an auditable step: %r" % req.get("entry_op"))
    entry = {"op": req["entry_op"]}
    for key in ("after", "deploy_id", "who", "why", "result", "health_url"):
        entry[key] = req.get(key)
    audit(state_dir(req), entry)
    return {"audited": True}


OPS = {
    "probe": op_probe,
    "apply": op_apply,
    "rollback": op_rollback,
    "smoke": op_smoke,
    "history": op_history,
    "lock_release": op_lock_release,
    "lock_status": op_lock_status,
    "audit": op_audit,
}


def main() -> None:
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    os.umask(0o022)
    stdin = sys.stdin.buffer
    # one request after another on the same channel, until the client closes stdin
    for _ in range(1000):
        line = stdin.readline()
        if not line.strip():
            return
        try:
            n = int(line)
            req = json.loads(stdin.read(n).decode("utf-8"))
            fn = OPS[req["op"]]
            result = fn(req, stdin)
            emit("RESULT", {"ok": True, "agent_format": AGENT_FORMAT, "result": result})
        except Fail as exc:
            emit("RESULT", {"ok": False, "error": exc.kind, "message": exc.message, "hint": exc.hint, "details": exc.details})
            if exc.details.get("interrupted"):
                return
        except OSError as exc:
            kind = (
                ErrorKind.HOST_REFUSED
                if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC)
                else ErrorKind.REMOTE
            )
            emit("RESULT", {"ok": False, "error": kind, "message": "%s: %s" % (type(exc).__name__, exc)})
        except Exception as exc:  # a bug in the agent
            import traceback

            emit(
                "RESULT",
                {
                    "ok": False,
                    "error": ErrorKind.REMOTE,
                    "message": "agent error: %s: %s" % (type(exc).__name__, exc),
                    "details": {"traceback": traceback.format_exc()[-3000:]},
                },
            )
        if not _stdout_ok[0]:
            return


# On the host, ``connection.agent_source`` sends agent_venv.py after this file and then calls main().
if __name__ == "__main__":
    main()
