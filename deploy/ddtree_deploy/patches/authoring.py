"""Authoring the series with git: ``patches edit`` and ``patches refresh``.

``edit`` materializes the pinned package plus the series into a work tree, a git repository:
the first commit is the pristine snapshot (subject ``pristine sglang <version>``), then one
commit per patch, in series order, whose subject is the patch's file name and whose body is the
patch's description, verbatim. Change a commit (``git rebase -i``, ``git commit --fixup``...), add
commits for new patches (subject = the new file name), then ``refresh`` writes every commit after
the pristine one back as a patch, in order, and the ``series`` file with it.

Patches are written as ``git diff --full-index`` with fixed options, so refreshing an unchanged
work tree reproduces the series byte for byte. Native ``.so`` files are not copied into the work
tree (text diffs only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ddtree_deploy.errors import DDTreeDeployError, ExitCode, PatchError, SeriesError, UsageError
from ddtree_deploy.hashing import sha256_file
from ddtree_deploy.patches.engine import apply_file_patch
from ddtree_deploy.patches.series import SERIES_FILE, Series, parse_patch_bytes, read_series_file
from ddtree_deploy.pin.pin import ABSENT, Pin

STATE_FILE = "ddtree-edit.json"  # inside the work tree's .git dir
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.(patch|diff)$")
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "ddtree-deploy",
    "GIT_AUTHOR_EMAIL": "ddtree-deploy@localhost",
    "GIT_COMMITTER_NAME": "ddtree-deploy",
    "GIT_COMMITTER_EMAIL": "ddtree-deploy@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
}
DIFF_ARGS = [
    "-c",
    "core.autocrlf=false",
    "-c",
    "core.quotepath=off",
    "-c",
    "diff.noprefix=false",
    "-c",
    "diff.mnemonicPrefix=false",
    "-c",
    "diff.relative=false",
    "diff",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--full-index",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "--unified=3",
    "--diff-algorithm=myers",
]


class GitError(DDTreeDeployError):
    exit_code = ExitCode.UNEXPECTED


def _git(work: Path, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
    env = {**os.environ, **_GIT_ENV, "HOME": os.environ.get("HOME", "/root")}
    try:
        proc = subprocess.run(["git", "-C", str(work), *args], input=input, capture_output=True, env=env)
    except FileNotFoundError as exc:
        raise GitError("git is not installed; patches edit/refresh need it") from exc
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args[:3])}... failed in {work}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def _commit(work: Path, message: bytes) -> None:
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "--allow-empty", "--no-verify", "--cleanup=verbatim", "-F", "-", input=message)


def _message(name: str, header: str) -> bytes:
    msg = name + "\n"
    if header:
        msg += "\n" + header
    return msg.encode("utf-8", errors="surrogateescape")


@dataclass
class EditResult:
    work_dir: Path
    base_commit: str
    patches: list[str]


def refuse_existing_work(work_dir: Path) -> None:
    """A work tree is made only where nothing is (or an empty directory): edits are never overwritten."""
    work_dir = Path(work_dir).resolve()
    if work_dir.is_dir() and not any(work_dir.iterdir()):
        return
    if work_dir.exists() and not work_dir.is_dir():
        raise UsageError(
            f"--work {work_dir} is a file, not a work tree; refusing to replace it",
            hint="pass --work with a new directory (or add --force to replace that file)",
        )
    if work_dir.exists():
        raise UsageError(
            f"{work_dir} already exists and is not empty; refusing to overwrite possible edits",
            hint=f"ddtree-deploy patches refresh --work {work_dir}   # to keep them; or pass --force",
        )


def edit(work_dir: Path, series: Series, base_dir: Path, version_label: str, *, force: bool = False) -> EditResult:
    """Create the git work tree for ``series`` on the pristine package in ``base_dir``."""
    work_dir = Path(work_dir).resolve()
    if not force:
        refuse_existing_work(work_dir)
    elif work_dir.is_dir():
        shutil.rmtree(work_dir)
    elif work_dir.exists():
        work_dir.unlink()
    work_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(Path(base_dir) / "sglang", work_dir / "sglang", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    _git(work_dir, "init", "-q")
    for k, v in (("core.autocrlf", "false"), ("core.safecrlf", "false"), ("commit.gpgsign", "false")):
        _git(work_dir, "config", k, v)
    _commit(work_dir, f"pristine {version_label}\n".encode())
    base = _git(work_dir, "rev-parse", "HEAD").decode().strip()
    for patch in series.patches:
        for fp in patch.files:
            target = work_dir / fp.path
            before = target.read_bytes() if target.is_file() else None
            after = apply_file_patch(patch.name, fp, before)
            if after is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(after)
                if fp.new_mode:
                    os.chmod(target, int(fp.new_mode, 8) & 0o777)
        _commit(work_dir, _message(patch.name, patch.header))
    state = {"series_dir": str(series.directory), "base_commit": base}
    (work_dir / ".git" / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    return EditResult(work_dir, base, [p.name for p in series.patches])


def work_state(work_dir: Path) -> dict[str, str]:
    path = Path(work_dir) / ".git" / STATE_FILE
    if not path.is_file():
        raise UsageError(
            f"{work_dir} is not a work tree made by `ddtree-deploy patches edit`", hint="ddtree-deploy patches edit --work DIR"
        )
    state: dict[str, str] = json.loads(path.read_text())  # written by edit() above: series_dir, base_commit
    return state


def _commit_message(work: Path, sha: str) -> bytes:
    raw = _git(work, "cat-file", "commit", sha)
    _, _, msg = raw.partition(b"\n\n")
    return msg


@dataclass
class RefreshResult:
    written: list[str]
    unchanged: list[str]
    removed: list[str]
    series_rewritten: bool


def render_patches(work_dir: Path) -> list[tuple[str, bytes]]:
    """Every commit after the pristine one as (patch file name, patch bytes), in order."""
    work_dir = Path(work_dir).resolve()
    state = work_state(work_dir)
    status = _git(work_dir, "status", "--porcelain", "--untracked-files=all").decode()
    if status.strip():
        raise UsageError(
            f"{work_dir} has uncommitted changes:\n{status.rstrip()}",
            hint=f"commit them into the patch they belong to: git -C {work_dir} commit -a --fixup=<commit> "
            f"(then git rebase -i --autosquash), or as a new patch whose subject is its file name",
        )
    base = state["base_commit"]
    shas = _git(work_dir, "rev-list", "--reverse", "--first-parent", f"{base}..HEAD").decode().split()
    out: list[tuple[str, bytes]] = []
    for sha in shas:
        msg = _commit_message(work_dir, sha)
        subject, _, rest = msg.partition(b"\n")
        name = subject.decode(errors="replace").strip()
        if not _NAME_RE.match(name):
            raise SeriesError(
                f"commit {sha[:12]}: subject {name!r} is not a patch file name (like 0003-what-it-does.patch)",
                hint=f"git -C {work_dir} rebase -i {base}   # reword it",
            )
        if any(n == name for n, _ in out):
            raise SeriesError(f"two commits are named {name}")
        header = rest[1:] if rest.startswith(b"\n") else rest
        diff = _git(work_dir, *DIFF_ARGS, f"{sha}~1", sha)
        patch = header + diff
        parsed = parse_patch_bytes(patch, name=name)  # refuses binaries / paths outside sglang/
        if not parsed.files:
            raise PatchError(f"commit {sha[:12]} ({name}) changes nothing", hint="drop it from the work tree")
        out.append((name, patch))
    return out


def refresh(work_dir: Path, series_dir: Path | None = None, *, dry_run: bool = False) -> RefreshResult:
    """Write the work tree's commits back as the series. Only rewrites files whose bytes change."""
    work_dir = Path(work_dir).resolve()
    state = work_state(work_dir)
    series_dir = Path(series_dir or state["series_dir"])
    rendered = render_patches(work_dir)
    old_names = read_series_file(series_dir) if (series_dir / SERIES_FILE).is_file() else []
    new_names = [n for n, _ in rendered]
    written, unchanged = [], []
    for name, data in rendered:
        target = series_dir / name
        if target.is_file() and target.read_bytes() == data:
            unchanged.append(name)
            continue
        written.append(name)
        if not dry_run:
            tmp = target.with_name(f".{name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
    removed = [n for n in old_names if n not in new_names]
    rewrite = old_names != new_names
    if not dry_run:
        for n in removed:
            (series_dir / n).unlink(missing_ok=True)
        if rewrite:
            path = series_dir / SERIES_FILE
            comments = []
            if path.is_file():
                for line in path.read_text().splitlines():
                    if line.strip() and not line.lstrip().startswith("#"):
                        break
                    comments.append(line)
            tmp = path.with_name(".series.tmp")
            tmp.write_text("\n".join(comments + new_names) + "\n")
            os.replace(tmp, path)
    return RefreshResult(written, unchanged, removed, rewrite)


def pin_files(pin: Pin, series: Series, base_dir: Path) -> dict[str, str]:
    """The ``[files]`` table the pin should hold for ``series``: pristine hashes from ``base_dir``."""
    files: dict[str, str] = {}
    for rel in series.touched_paths():
        path = Path(base_dir) / rel
        files[rel] = sha256_file(path) if path.is_file() else ABSENT
    return dict(sorted(files.items()))


def default_work_dir() -> Path:
    from ddtree_deploy.paths import repo_root

    return repo_root() / ".work" / "sglang"
