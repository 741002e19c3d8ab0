"""The pin file: which SGLang wheel the series is written against, and the pristine hashes.

``snapshot/sglang-<version>.toml`` is the single source of truth for "pristine". Format::

    [package]
    name = "sglang"
    version = "0.5.23"

    [[wheel]]                      # one table per verified wheel (one per Python ABI)
    filename = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
    sha256 = "00b3cd5b..."

    [files]                        # every file any patch touches, package-relative
    "sglang/srt/speculative/spec_info.py" = "<sha256 of the pristine file>"
    "sglang/srt/speculative/ddtree_utils.py" = "absent"   # created by the series

``ddtree-deploy snapshot pin`` rewrites ``[files]`` from the verified snapshot.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ddtree_deploy.errors import PinError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ABSENT = "absent"


@dataclass(frozen=True)
class WheelPin:
    filename: str
    sha256: str

    @property
    def python_tag(self) -> str:
        # name-version-pytag-abitag-platform.whl
        parts = self.filename[: -len(".whl")].split("-")
        return parts[2] if len(parts) >= 5 else ""


@dataclass
class Pin:
    name: str
    version: str
    wheels: list[WheelPin]
    files: dict[str, str] = field(default_factory=dict)
    path: Path | None = None

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    def wheel_named(self, filename: str) -> WheelPin | None:
        for w in self.wheels:
            if w.filename == filename:
                return w
        return None

    def pristine(self, rel_path: str) -> str | None:
        """The pristine sha256 of ``rel_path``; ``None`` if the file does not exist in the pin."""
        value = self.files.get(rel_path)
        if value is None:
            raise PinError(
                f"the pin {self.path or ''} does not record {rel_path}",
                hint="ddtree-deploy snapshot pin   # records every file the series touches",
            )
        return None if value == ABSENT else value

    def to_toml(self) -> str:
        lines = [
            "# The pin: the SGLang wheel the patch series is written against, and the pristine",
            "# sha256 of every file the series touches. Rewrite [files] with `ddtree-deploy snapshot pin`.",
            "",
            "[package]",
            f'name = "{self.name}"',
            f'version = "{self.version}"',
            "",
        ]
        for w in self.wheels:
            lines += ["[[wheel]]", f'filename = "{w.filename}"', f'sha256 = "{w.sha256}"', ""]
        lines.append("[files]")
        for rel in sorted(self.files):
            lines.append(f'"{rel}" = "{self.files[rel]}"')
        return "\n".join(lines) + "\n"

    def save(self, path: Path | None = None) -> Path:
        target = path or self.path
        if target is None:
            raise PinError("no path to save the pin to")
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(self.to_toml())
        tmp.replace(target)
        return target


def _is_hex64(s: object) -> bool:
    return isinstance(s, str) and len(s) == 64 and all(c in "0123456789abcdef" for c in s)


def load_pin(path: Path) -> Pin:
    if not path.is_file():
        raise PinError(f"pin file not found: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PinError(f"{path}: not valid TOML: {exc}") from exc
    pkg = data.get("package")
    if not isinstance(pkg, dict) or not isinstance(pkg.get("name"), str) or not isinstance(pkg.get("version"), str):
        raise PinError(f"{path}: needs a [package] table with name and version")
    wheels = []
    for i, w in enumerate(data.get("wheel", [])):
        if not isinstance(w, dict) or not isinstance(w.get("filename"), str) or not _is_hex64(w.get("sha256")):
            raise PinError(f"{path}: [[wheel]] #{i + 1} needs filename and a 64-hex sha256")
        wheels.append(WheelPin(w["filename"], w["sha256"]))
    if not wheels:
        raise PinError(f"{path}: records no [[wheel]]")
    files = data.get("files", {})
    if not isinstance(files, dict):
        raise PinError(f"{path}: [files] must be a table of path = sha256")
    for rel, digest in files.items():
        if not (digest == ABSENT or _is_hex64(digest)):
            raise PinError(f'{path}: [files] {rel!r} must be a 64-hex sha256 or "absent", got {digest!r}')
    return Pin(pkg["name"], pkg["version"], wheels, dict(files), path)
