"""``manifest.json``: what a build contains, the contract between ``build`` and the deploy commands.

See docs/contracts.md for the format. Hashes are sha256 hex; modes are octal strings ("0644").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddtree_deploy.errors import DDTreeDeployError, ExitCode
from ddtree_deploy.remote.protocol import ErrorKind

FORMAT = 1
MANIFEST_NAME = "manifest.json"


class ManifestError(DDTreeDeployError):
    exit_code = ExitCode.USAGE
    kind = ErrorKind.MANIFEST


@dataclass
class FileEntry:
    path: str
    action: str  # create | modify | delete
    pristine_sha256: str | None
    patched_sha256: str | None
    mode: str
    patches: list[str] = field(default_factory=list)


@dataclass
class PatchEntry:
    name: str
    sha256: str


@dataclass
class Manifest:
    package: str
    version: str
    series: str
    series_id: str
    patches: list[PatchEntry]
    files: list[FileEntry]
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "package": self.package,
            "version": self.version,
            "series": self.series,
            "series_id": self.series_id,
            "patches": [asdict(p) for p in self.patches],
            "files": [asdict(f) for f in self.files],
        }

    def save(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST_NAME
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path

    def file(self, rel: str) -> FileEntry | None:
        for f in self.files:
            if f.path == rel:
                return f
        return None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Manifest":
        try:
            if data.get("format") != FORMAT:
                raise ManifestError(f"manifest format {data.get('format')!r} is not {FORMAT}")
            return cls(
                package=data["package"],
                version=data["version"],
                series=data["series"],
                series_id=data["series_id"],
                patches=[PatchEntry(**p) for p in data["patches"]],
                files=[FileEntry(**f) for f in data["files"]],
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"malformed manifest: {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> "Manifest":
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_NAME
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ManifestError(f"cannot read manifest {path}: {exc}") from exc
        return cls.from_json(data)
