"""The strict patch engine: apply a whole series in memory, exactly, or not at all.

Against a pinned base any offset is drift, so every hunk must match at the exact line its
header names, with every context and removed line byte-identical (line endings included):
zero fuzz, zero offset. Patches apply in series order; a later patch sees the result of the
earlier ones. Nothing is ever written here: callers get an :class:`ApplyResult` and decide.

A failure raises :class:`~ddtree_deploy.errors.PatchApplyError` naming the patch, the file,
the hunk, the line, the expected and the actual text, and the command that fixes it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ddtree_deploy.errors import CompileError, PatchApplyError, PatchRefusedError
from ddtree_deploy.patches.series import FilePatch, Hunk, Series, split_lines

BaseReader = Callable[[str], "bytes | None"]

FIX_HINT = (
    "if the base drifted, restore the pinned files (ddtree-deploy snapshot verify); if the patch is "
    "stale, rebase it: ddtree-deploy patches edit, fix the commit, then ddtree-deploy patches refresh"
)


def _show(line: bytes | None) -> str | None:
    if line is None:
        return None
    return line.decode("utf-8", errors="replace")


@dataclass
class FileResult:
    path: str
    base: bytes | None  # content before the series (None: did not exist)
    result: bytes | None  # content after the series (None: deleted)
    patches: list[str] = field(default_factory=list)
    history: list[tuple[str, bytes | None]] = field(default_factory=list)  # (patch, content after it)
    mode: int = 0o644

    @property
    def action(self) -> str:
        if self.base is None:
            return "create"
        if self.result is None:
            return "delete"
        return "modify"


@dataclass
class ApplyResult:
    series: Series
    files: dict[str, FileResult]

    def changed(self) -> list[FileResult]:
        """Files whose content differs from the base (created-then-deleted files drop out)."""
        return [f for f in self.files.values() if f.base != f.result]


def tree_reader(root: Path) -> BaseReader:
    """Read package-relative files from ``root`` (a dir containing ``sglang/``), never outside it."""
    root = Path(root).resolve()

    def read(rel: str) -> bytes | None:
        path = root / rel
        try:
            resolved = path.resolve()
        except OSError:
            return None
        if root not in resolved.parents:
            raise PatchRefusedError(f"{rel} resolves outside the base tree {root} (symlink?)")
        if not resolved.is_file():
            return None
        return resolved.read_bytes()

    return read


def tree_mode(root: Path) -> Callable[[str], int | None]:
    def mode(rel: str) -> int | None:
        try:
            return stat.S_IMODE(os.stat(Path(root) / rel).st_mode)
        except OSError:
            return None

    return mode


def _fail(
    patch: str, fp: FilePatch, hunk: Hunk | None, line: int, expected: bytes | None, actual: bytes | None, reason: str
) -> PatchApplyError:
    return PatchApplyError(
        patch=patch,
        file=fp.path,
        hunk=hunk.index if hunk else 0,
        line=line,
        expected=_show(expected),
        actual=_show(actual),
        reason=reason,
        hint=FIX_HINT,
    )


def apply_file_patch(patch: str, fp: FilePatch, base: bytes | None) -> bytes | None:
    """Apply one file's hunks to ``base`` exactly. Returns the new content (None when deleted)."""
    if fp.action == "create" and base is not None:
        raise _fail(
            patch, fp, fp.hunks[0] if fp.hunks else None, 0, None, None, "the patch creates this file but it already exists"
        )
    if fp.action != "create" and base is None:
        raise _fail(patch, fp, fp.hunks[0] if fp.hunks else None, 0, None, None, "the file does not exist in the base")
    lines = split_lines(base or b"")
    out: list[bytes] = []
    pos = 0
    for h in fp.hunks:
        start = h.old_start - 1 if h.old_len > 0 else h.old_start
        if start < pos:
            raise _fail(patch, fp, h, h.old_start, None, None, "hunks overlap or are out of order")
        if start > len(lines):
            raise _fail(
                patch, fp, h, h.old_start, _first_old(h), None, f"the hunk starts past the end of the file ({len(lines)} lines)"
            )
        out.extend(lines[pos:start])
        expect_new = len(out) + 1 if h.new_len > 0 else len(out)
        if h.new_start != expect_new:
            raise _fail(
                patch,
                fp,
                h,
                h.old_start,
                None,
                None,
                f"hunk header says new line {h.new_start}, the exact position gives {expect_new} "
                "(an earlier hunk's counts are off, or the patch was edited by hand)",
            )
        i = start
        for ln in h.lines:
            if ln.op != "+":
                if i >= len(lines):
                    raise _fail(patch, fp, h, i + 1, ln.text, None, "the file ends before the hunk does")
                if lines[i] != ln.text:
                    why = "line differs"
                    if lines[i].rstrip(b"\r\n") == ln.text.rstrip(b"\r\n"):
                        why = "line endings differ (CRLF vs LF, or a missing final newline)"
                    raise _fail(patch, fp, h, i + 1, ln.text, lines[i], why)
                i += 1
            if ln.op != "-":
                out.append(ln.text)
        pos = i
    out.extend(lines[pos:])
    data = b"".join(out)
    if fp.action == "delete":
        if data:
            raise _fail(
                patch,
                fp,
                fp.hunks[-1] if fp.hunks else None,
                len(lines),
                None,
                out[0],
                "the patch deletes the file but does not remove all of its lines",
            )
        return None
    return data


def _first_old(h: Hunk) -> bytes | None:
    old = h.old_lines
    return old[0] if old else None


def apply_series(series: Series, read_base: BaseReader, base_mode: Callable[[str], int | None] | None = None) -> ApplyResult:
    """Apply every patch of ``series`` in order, in memory. Raises on the first failure."""
    files: dict[str, FileResult] = {}
    for patch in series.patches:
        for fp in patch.files:
            fr = files.get(fp.path)
            if fr is None:
                base = read_base(fp.path)
                mode = (base_mode(fp.path) if base_mode else None) or 0o644
                fr = files[fp.path] = FileResult(fp.path, base, base, mode=mode)
            fr.result = apply_file_patch(patch.name, fp, fr.result)
            fr.patches.append(patch.name)
            fr.history.append((patch.name, fr.result))
            if fp.new_mode:
                fr.mode = int(fp.new_mode, 8) & 0o777
    return ApplyResult(series, files)


def compile_check(result: ApplyResult) -> list[str]:
    """Compile every patched ``.py`` file in memory, as each patch leaves it; name the patch.

    Each patch must compile on its own: a file is compiled after every patch that touches it, in
    series order, so a syntax error one patch introduces and a later one repairs is still that
    patch's error (the series is reviewed, bisected and cherry-picked patch by patch). Uses the
    same compiler ``py_compile`` uses. Returns the list of checked paths (final state).
    """
    checked = []
    for fr in result.files.values():
        if not fr.path.endswith(".py"):
            continue
        for name, content in fr.history:
            exc = _compile_error(fr.path, content)
            if exc is None:
                continue
            lineno = getattr(exc, "lineno", None)
            msg = getattr(exc, "msg", str(exc))
            later = (
                ""
                if _compile_error(fr.path, fr.result)
                else ", though a later patch repairs it: each patch must compile on its own"
            )
            raise CompileError(
                f"{fr.path}:{lineno}: {msg} (introduced by {name}{later})",
                hint=f"fix {name}: ddtree-deploy patches edit, amend its commit, ddtree-deploy patches refresh",
                details={"file": fr.path, "line": lineno, "patch": name, "reason": msg},
            )
        if fr.result is not None:
            checked.append(fr.path)
    return checked


def _compile_error(path: str, content: bytes | None) -> SyntaxError | ValueError | None:
    """The error compiling ``content`` raises (``None`` when it compiles or the file is deleted)."""
    if content is None:
        return None
    try:
        compile(content, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return exc
    return None
