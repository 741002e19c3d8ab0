"""The patch series: the ``series`` file and the unified diffs it lists, parsed into plain data.

A series directory (``patches/sglang-<version>/``) holds a ``series`` file — one patch file
name per line, in the order they apply; blank lines and ``#`` comments are ignored — and the
patches themselves: unified diffs (``git diff`` style is fine) whose paths are package-relative
with ``a/`` and ``b/`` prefixes (``a/sglang/srt/...``, ``b/sglang/srt/...``; ``/dev/null`` for
created or deleted files). Text before the first diff header is the patch's description.

Parsing is done with ``unidiff``; on top of it we refuse, with a clear error, anything we never
apply: binary patches, renames and copies, symlinks, absolute paths, ``..``, and paths outside
the ``sglang/`` package. Lines are kept as bytes, with their exact line endings, so CRLF files
and missing final newlines round-trip byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchedFile, PatchSet

from ddtree_deploy.errors import EmptyPatchError, PatchParseError, PatchRefusedError, SeriesError
from ddtree_deploy.hashing import sha256_bytes

SERIES_FILE = "series"
DEV_NULL = "/dev/null"
_MODE_RE = re.compile(r"^(new file mode|deleted file mode|new mode|old mode) ([0-7]{6})\s*$")


@dataclass(frozen=True)
class HunkLine:
    op: str  # " " context, "-" removed, "+" added
    text: bytes  # exactly as in the file, line ending included (none on a last line without one)


@dataclass
class Hunk:
    index: int  # 1-based, within its file
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[HunkLine]

    @property
    def old_lines(self) -> list[bytes]:
        return [ln.text for ln in self.lines if ln.op != "+"]

    @property
    def new_lines(self) -> list[bytes]:
        return [ln.text for ln in self.lines if ln.op != "-"]


@dataclass
class FilePatch:
    path: str  # package-relative, e.g. "sglang/srt/speculative/spec_info.py"
    action: str  # "create" | "modify" | "delete"
    hunks: list[Hunk]
    new_mode: str | None = None  # octal file mode from "new file mode 100755" etc.


@dataclass
class Patch:
    name: str
    path: Path
    raw: bytes
    header: str
    files: list[FilePatch]

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.raw)


@dataclass
class Series:
    directory: Path
    patches: list[Patch] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)  # *.patch / *.diff files the series file omits

    @property
    def name(self) -> str:
        return self.directory.name

    @property
    def series_id(self) -> str:
        digest = sha256_bytes("".join(f"{p.name}:{p.sha256}\n" for p in self.patches).encode())
        return f"{self.name}+{digest[:12]}"

    def touched_paths(self) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.patches:
            for f in p.files:
                seen.setdefault(f.path, None)
        return list(seen)


def split_lines(data: bytes) -> list[bytes]:
    """Split on ``\\n`` only, keeping the ending (``\\r`` stays part of its line)."""
    if not data:
        return []
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def check_package_path(raw: str, prefix: str, *, patch: str, package: str = "sglang") -> str:
    """Turn ``a/sglang/x.py`` into ``sglang/x.py``, refusing anything that could escape the package."""
    if not raw.startswith(prefix):
        raise PatchRefusedError(
            f"{patch}: path {raw!r} must start with {prefix!r} (package-relative: {prefix}{package}/...)",
            hint="regenerate the patch with `ddtree-deploy patches refresh` (it writes a/ and b/ prefixes)",
        )
    rel = raw[len(prefix) :]
    if rel.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", rel):
        raise PatchRefusedError(f"{patch}: absolute path {raw!r} refused: patches may only touch {package}/")
    if "\\" in rel or "\x00" in rel:
        raise PatchRefusedError(f"{patch}: path {raw!r} refused: backslashes and NUL are not allowed")
    parts = rel.split("/")
    if ".." in parts:
        raise PatchRefusedError(f"{patch}: path {raw!r} refused: '..' could escape the {package}/ package")
    if any(p in ("", ".") for p in parts):
        raise PatchRefusedError(f"{patch}: path {raw!r} refused: not a normalized path")
    if parts[0] != package or len(parts) < 2:
        raise PatchRefusedError(f"{patch}: path {raw!r} refused: outside the {package}/ package")
    return str(PurePosixPath(*parts))


def _split_text_lines(text: str) -> list[str]:
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def parse_patch(path: Path, *, name: str | None = None, package: str = "sglang") -> Patch:
    """Parse one patch file. Raises :class:`PatchParseError` / :class:`PatchRefusedError`."""
    name = name or path.name
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SeriesError(f"cannot read patch {path}: {exc}") from exc
    return parse_patch_bytes(raw, name=name, path=path, package=package)


def parse_patch_bytes(raw: bytes, *, name: str, path: Path | None = None, package: str = "sglang") -> Patch:
    text = raw.decode("utf-8", errors="surrogateescape")
    lines = _split_text_lines(text)
    for i, ln in enumerate(lines, 1):
        if ln.startswith("GIT binary patch") or (ln.startswith("Binary files ") and ln.rstrip().endswith(" differ")):
            raise PatchRefusedError(f"{name}: line {i}: binary patches are refused (text diffs only)")
    try:
        ps = PatchSet(lines)
    except UnidiffParseError as exc:
        raise PatchParseError(f"{name}: not a well-formed unified diff: {exc}") from exc
    header_lines = []
    for ln in lines:
        if ln.startswith(("diff --git ", "--- ", "Index: ")):
            break
        header_lines.append(ln)
    files: list[FilePatch] = []
    seen: set[str] = set()
    for pf in ps:
        files.append(_file_patch(pf, name, package))
        if files[-1].path in seen:
            raise PatchRefusedError(f"{name}: touches {files[-1].path} twice; one diff per file and patch")
        seen.add(files[-1].path)
    if not files and raw.strip() and any(ln.startswith(("@@", "+++", "diff ")) for ln in lines):
        raise PatchParseError(f"{name}: looks like a diff but no file could be parsed from it")
    if not files:
        raise EmptyPatchError(
            f"{name}: holds no diff (no '--- a/...' / '+++ b/...' file header): an empty or description-only "
            "patch file changes nothing",
            hint="put the diff in it (ddtree-deploy patches refresh writes it), or remove it from the series file",
        )
    return Patch(name=name, path=path or Path(name), raw=raw, header="".join(header_lines), files=files)


def _file_patch(pf: PatchedFile, name: str, package: str) -> FilePatch:
    if pf.is_binary_file:
        raise PatchRefusedError(f"{name}: {pf.path}: binary patches are refused (text diffs only)")
    if getattr(pf, "is_rename", False):
        raise PatchRefusedError(f"{name}: {pf.path}: renames are refused; write a delete and a create")
    info = [str(x) for x in (pf.patch_info or [])]
    modes: dict[str, str] = {}
    for ln in info:
        if ln.startswith(("copy from", "copy to", "rename from", "rename to", "similarity index")):
            raise PatchRefusedError(f"{name}: {pf.path}: copies and renames are refused")
        m = _MODE_RE.match(ln.rstrip("\n"))
        if m:
            modes[m.group(1)] = m.group(2)
    for mode in modes.values():
        if mode.startswith("12") or mode.startswith("16"):
            raise PatchRefusedError(f"{name}: {pf.path}: symlinks and submodules are refused")
    src, dst = pf.source_file, pf.target_file
    if src == DEV_NULL and dst == DEV_NULL:
        raise PatchParseError(f"{name}: a file diff with /dev/null on both sides")
    if src == DEV_NULL:
        action, rel = "create", check_package_path(dst, "b/", patch=name, package=package)
    elif dst == DEV_NULL:
        action, rel = "delete", check_package_path(src, "a/", patch=name, package=package)
    else:
        action = "modify"
        rel = check_package_path(src, "a/", patch=name, package=package)
        rel_b = check_package_path(dst, "b/", patch=name, package=package)
        if rel != rel_b:
            raise PatchRefusedError(f"{name}: {src} -> {dst}: renames are refused; write a delete and a create")
    hunks: list[Hunk] = []
    for i, h in enumerate(pf, 1):
        hl: list[HunkLine] = []
        for line in h:
            t = line.line_type
            if t == "\\":  # "\ No newline at end of file": the previous line has no line ending
                if not hl or not hl[-1].text.endswith(b"\n"):
                    raise PatchParseError(f"{name}: {rel}: hunk #{i}: stray '\\ No newline at end of file'")
                prev = hl[-1]
                hl[-1] = HunkLine(prev.op, prev.text[:-1])
                continue
            if t not in (" ", "-", "+"):
                raise PatchParseError(f"{name}: {rel}: hunk #{i}: unexpected line type {t!r}")
            value = line.value
            if not value.endswith("\n"):
                value += "\n"  # the patch file's own last line lacked a newline
            hl.append(HunkLine(t, value.encode("utf-8", errors="surrogateescape")))
        hunks.append(Hunk(i, h.source_start, h.source_length, h.target_start, h.target_length, hl))
    if action == "create" and any(h.old_len for h in hunks):
        raise PatchParseError(f"{name}: {rel}: a created file cannot have old lines")
    new_mode = modes.get("new file mode") or modes.get("new mode")
    return FilePatch(rel, action, hunks, new_mode)


def read_series_file(directory: Path) -> list[str]:
    path = directory / SERIES_FILE
    if not directory.is_dir():
        raise SeriesError(f"series directory not found: {directory}")
    if not path.is_file():
        raise SeriesError(
            f"{directory} has no '{SERIES_FILE}' file",
            hint=f"create it (one patch file name per line, in order): touch {path}",
        )
    names: list[str] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        if len(entry.split()) > 1:
            raise SeriesError(f"{path}:{lineno}: one patch name per line, no options: {entry!r}")
        if "/" in entry or entry in (".", ".."):
            raise SeriesError(f"{path}:{lineno}: {entry!r} must be a file name inside {directory}")
        if entry in names:
            raise SeriesError(f"{path}:{lineno}: {entry!r} is listed twice")
        if not (directory / entry).is_file():
            raise SeriesError(f"{path}:{lineno}: patch {entry!r} does not exist in {directory}")
        names.append(entry)
    return names


def load_series(directory: Path, *, package: str = "sglang") -> Series:
    directory = Path(directory).absolute()  # "." names its directory (the series name is the dir name)
    if directory.name in ("", ".", ".."):
        directory = directory.resolve()
    names = read_series_file(directory)
    patches = [parse_patch(directory / n, name=n, package=package) for n in names]
    on_disk = sorted(p.name for p in directory.iterdir() if p.suffix in (".patch", ".diff"))
    unlisted = [n for n in on_disk if n not in names]
    return Series(directory, patches, unlisted)
