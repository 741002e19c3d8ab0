"""``build --wheel``: the pinned wheel with the build's patched files, as a locally versioned wheel.

The result is ``sglang-<version>+ddtree.<series hash>-<tags>.whl``: every member of the pinned wheel,
byte for byte, except the files the build's manifest creates, modifies or deletes; the dist-info
renamed to the local version (PEP 440 ``+local``), ``METADATA``'s ``Version:`` line set to it, and a
``RECORD`` rewritten from the members actually written (sha256, urlsafe base64 without padding, and
size, as the wheel spec says). Installing it is a plain ``pip install`` with a hash, and pip's
``RECORD`` of the installed files is then the drift check of that environment.

The wheel is reproducible: members keep the pinned wheel's timestamps and order, so the same build
and the same pinned wheel give the same sha256. Next to it, ``requirements.txt`` pins it by hash::

    pip install --no-deps --no-index --find-links DIR --require-hashes -r DIR/requirements.txt
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ddtree_deploy.build.manifest import Manifest
from ddtree_deploy.errors import HashMismatchError, UsageError
from ddtree_deploy.hashing import sha256_bytes, sha256_file

LOCAL_PREFIX = "ddtree"
REQUIREMENTS = "requirements.txt"
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # members the pinned wheel does not have (files the series creates)
COMPRESSLEVEL = 1  # deflate level: 123 MB of members in a few seconds (level 6 takes 4x as long for 15% less)


@dataclass(frozen=True)
class WheelInfo:
    path: Path
    filename: str
    sha256: str
    version: str  # the local version, e.g. 0.5.23+ddtree.1a2b3c4d5e6f
    base_wheel: str  # the pinned wheel it was made from
    requirement: str  # the hash-pinned requirement line

    def to_json(self) -> dict[str, str]:
        return {
            "filename": self.filename,
            "sha256": self.sha256,
            "version": self.version,
            "base_wheel": self.base_wheel,
            "requirement": self.requirement,
        }


def local_version(manifest: Manifest) -> str:
    """``<pinned version>+ddtree.<series hash>``: the series id's part after ``+`` as the local label."""
    _, sep, tail = manifest.series_id.rpartition("+")
    label = tail.lower() if sep else ""
    if not re.fullmatch(r"[a-z0-9]+(?:\.[a-z0-9]+)*", label):
        raise UsageError(
            f"series id {manifest.series_id!r} has no usable local version label after '+'",
            hint="build the wheel from a build of a series (its id is <name>-<version>+<hash>)",
        )
    return f"{manifest.version}+{LOCAL_PREFIX}.{label}"


def record_hash(data: bytes) -> str:
    """The wheel spec's RECORD hash: ``sha256=`` + urlsafe base64 of the digest, without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel_name_parts(filename: str) -> tuple[str, str, str]:
    """(distribution, version, tags) of ``name-version-py-abi-plat.whl``."""
    stem = filename[: -len(".whl")]
    parts = stem.split("-")
    if len(parts) < 5:
        raise UsageError(f"{filename}: not a wheel file name (name-version-python-abi-platform.whl)")
    return parts[0], parts[1], "-".join(parts[-3:])


def _metadata(data: bytes, version: str) -> bytes:
    text = data.decode("utf-8")
    head, sep, body = text.partition("\n\n")
    lines = head.split("\n")
    hits = [i for i, ln in enumerate(lines) if ln.startswith("Version:")]
    if len(hits) != 1:
        raise UsageError("the pinned wheel's METADATA has no single Version: line")
    lines[hits[0]] = f"Version: {version}"
    return ("\n".join(lines) + sep + body).encode("utf-8")


def make_wheel(build_dir: Path, pinned_wheel: Path, out_dir: Path) -> WheelInfo:
    """Write the locally versioned wheel (and ``requirements.txt``) for the build in ``build_dir`` into
    ``out_dir``; the files come from the build directory, checked against its manifest first."""
    manifest = Manifest.load(Path(build_dir))
    version = local_version(manifest)
    dist, base_version, tags = _wheel_name_parts(pinned_wheel.name)
    if base_version != manifest.version:
        raise UsageError(f"{pinned_wheel.name} is version {base_version}, the build is for {manifest.version}")
    by_path = {f.path: f for f in manifest.files}
    new_data: dict[str, bytes] = {}
    for f in manifest.files:
        if f.action == "delete":
            continue
        data = (Path(build_dir) / f.path).read_bytes()
        if sha256_bytes(data) != f.patched_sha256:
            raise UsageError(
                f"{build_dir}: {f.path} does not match its manifest hash (the build dir was modified)",
                hint="rebuild: ddtree-deploy build --wheel --out DIR",
            )
        new_data[f.path] = data
    old_info = f"{dist}-{base_version}.dist-info/"
    new_info = f"{dist}-{version}.dist-info/"
    old_data_dir = f"{dist}-{base_version}.data/"
    new_data_dir = f"{dist}-{version}.data/"
    filename = f"{dist}-{version}-{tags}.whl"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, str]] = []
    fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=f".{filename}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with (
            zipfile.ZipFile(pinned_wheel) as src,
            zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=COMPRESSLEVEL) as dst,
        ):
            seen: set[str] = set()

            def put(name: str, data: bytes, like: zipfile.ZipInfo | None, mode: int | None = None) -> None:
                zi = zipfile.ZipInfo(name, date_time=like.date_time if like is not None else _FIXED_TIME)
                zi.compress_type = zipfile.ZIP_DEFLATED
                if mode is not None or like is None:
                    zi.external_attr = (0o100000 | (mode or 0o644)) << 16
                else:
                    zi.external_attr = like.external_attr
                dst.writestr(zi, data, compresslevel=COMPRESSLEVEL)
                if not name.endswith("/"):
                    rows.append((name, record_hash(data), str(len(data))))

            record_info: zipfile.ZipInfo | None = None
            for info in src.infolist():
                name = info.filename
                if name.startswith(old_info):
                    new_name = new_info + name[len(old_info) :]
                elif name.startswith(old_data_dir):
                    new_name = new_data_dir + name[len(old_data_dir) :]
                else:
                    new_name = name
                if name == old_info + "RECORD":
                    record_info = info
                    continue
                if name.endswith("/"):
                    zi = zipfile.ZipInfo(new_name, date_time=info.date_time)
                    zi.external_attr = info.external_attr
                    dst.writestr(zi, b"")
                    continue
                data = src.read(info)
                entry = by_path.get(name)
                if entry is not None:
                    seen.add(name)
                    if entry.pristine_sha256 is not None and sha256_bytes(data) != entry.pristine_sha256:
                        raise HashMismatchError(
                            f"{pinned_wheel.name}: {name}",
                            entry.pristine_sha256,
                            sha256_bytes(data),
                            hint="the wheel is not the pinned one: ddtree-deploy snapshot fetch",
                        )
                    if entry.action == "delete":
                        continue
                    put(name, new_data[name], info, int(entry.mode, 8))
                    continue
                if name == old_info + "METADATA":
                    data = _metadata(data, version)
                put(new_name, data, info)
            for f in manifest.files:  # the files the series creates
                if f.path not in seen and f.action != "delete":
                    if f.action != "create":
                        raise HashMismatchError(
                            f"{pinned_wheel.name}: {f.path}", f.pristine_sha256 or "absent", "missing from the wheel"
                        )
                    put(f.path, new_data[f.path], None, int(f.mode, 8))
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            for row in rows:
                w.writerow(row)
            w.writerow((new_info + "RECORD", "", ""))
            put_record = zipfile.ZipInfo(new_info + "RECORD", date_time=record_info.date_time if record_info else _FIXED_TIME)
            put_record.compress_type = zipfile.ZIP_DEFLATED
            put_record.external_attr = record_info.external_attr if record_info else (0o100644 << 16)
            dst.writestr(put_record, buf.getvalue().encode("utf-8"), compresslevel=COMPRESSLEVEL)
        final = out_dir / filename
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    digest = sha256_file(final)
    requirement = f"{dist}=={version} --hash=sha256:{digest}"
    (out_dir / REQUIREMENTS).write_text(
        "# the DDTree build of the pinned SGLang, pinned by hash (made by `ddtree-deploy build --wheel`):\n"
        f"#   pip install --no-deps --no-index --find-links DIR --require-hashes -r DIR/{REQUIREMENTS}\n"
        f"{requirement}\n"
    )
    return WheelInfo(final, filename, digest, version, pinned_wheel.name, requirement)


def read_wheel_info(build_dir: Path) -> WheelInfo:
    """The locally versioned wheel a ``build --wheel`` left in ``build_dir``, checked: its name is the
    build's local version, and every file the manifest names has its patched hash in it (deleted ones
    are absent); raises ``UsageError`` (exit 2) with the command that remakes it otherwise."""
    build_dir = Path(build_dir)
    manifest = Manifest.load(build_dir)
    version = local_version(manifest)
    found = sorted(build_dir.glob(f"{manifest.package}-{version}-*.whl"))
    fix = f"ddtree-deploy build --wheel --out {build_dir}"
    if len(found) != 1:
        raise UsageError(
            f"{build_dir} holds {'no' if not found else 'several'} {manifest.package}-{version} wheel(s)"
            + ("" if not found else ": " + ", ".join(p.name for p in found)),
            hint=fix,
        )
    return verify_wheel_file(found[0], manifest)


def verify_wheel_file(path: Path, manifest: Manifest) -> WheelInfo:
    """``path`` is the build's wheel: named for its local version, holding every file the manifest
    names with its patched hash (deleted ones absent); else ``UsageError`` with the command that remakes it."""
    version = local_version(manifest)
    fix = f"ddtree-deploy build --wheel --out {path.parent}"
    if not path.name.startswith(f"{manifest.package}-{version}-"):
        raise UsageError(f"{path.name} is not the wheel of this build ({manifest.package}-{version})", hint=fix)
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            for f in manifest.files:
                if f.action == "delete":
                    if f.path in names:
                        raise UsageError(f"{path.name}: {f.path} should be deleted but is in the wheel", hint=fix)
                    continue
                if f.path not in names or sha256_bytes(z.read(f.path)) != f.patched_sha256:
                    raise UsageError(f"{path.name}: {f.path} is not the build's file (the wheel was modified)", hint=fix)
    except zipfile.BadZipFile:
        raise UsageError(f"{path} is not a valid wheel (zip)", hint=fix) from None
    digest = sha256_file(path)
    return WheelInfo(path, path.name, digest, version, "", f"{manifest.package}=={version} --hash=sha256:{digest}")
