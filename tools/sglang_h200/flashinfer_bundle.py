"""Carry a trimmed FlashInfer 0.7.2 to the H200 (``--attention-backend flashinfer``, its sampling kernels).

The pinned SGLang needs ``flashinfer_python==0.7.2``, a JIT library: its 65 MB wheel is mostly sources
and headers (``flashinfer/data``: csrc, include, cutlass, cccl, spdlog) plus Python for kernels the Qwen3 +
DFlash/DDTree engine never touches (fused MoE, experimental, CuTe-DSL...). This keeps what these need:

* ``import flashinfer`` and the modules SGLang imports with FlashInfer present (attention backend:
  ``BatchPrefillWith{Paged,Ragged}KVCacheWrapper``, ``BatchDecodeWithPagedKVCacheWrapper``,
  ``fast_decode_plan``, ``cascade.merge_state``; sampler: ``flashinfer.sampling``; ``flashinfer.comm``,
  ``flashinfer.norm``, ``flashinfer.jit.core``, ``compilation_context`` imported at load);
* the files the JIT builds of those read on an sm90 machine: batch prefill FA2 (paged / ragged, custom
  mask, the equal- and independent-stride variants), batch prefill FA3 (sm90, ragged without a mask under
  ``backend="auto"``), batch decode, cascade, sampling, page, top-k, spdlog; and the FlashInfer headers of
  SGLang's own JIT kernel ``tree_speculative_sampling_target_only`` (``kernels/jit/utils/deps.py``).

Method (deterministic, standard library + pip only; the wheel is read as a zip, nothing is installed):

1. Python: the static import closure of ``PY_SEEDS`` over ``flashinfer/**.py``: every ``import`` /
   ``from ... import`` anywhere in a kept module (module level, guarded, or inside functions) and every
   string constant naming a flashinfer module (lazy ``importlib.import_module`` tables) adds that module
   and its parent packages. Non-``.py`` files that sit next to a kept module are kept.
2. C++: ``CSRC_SEEDS`` / ``HEADER_SEEDS`` / ``READ_FILES`` plus the transitive ``#include`` /
   ``__has_include`` closure resolved the way nvcc does for FlashInfer's JIT command line (quoted includes
   next to the includer first, then ``INCLUDE_DIRS`` in order). Every branch of every ``#if`` is followed,
   so the set is a superset of what nvcc reads (checked against ``nvcc -M`` of all those modules for
   sm_90a: 1705 files, all kept). Includes that resolve nowhere in the wheel (CUDA toolkit, libstdc++,
   tvm_ffi, Python) are listed in the manifest, not carried.
3. Everything else is dropped, with counts and sizes per area in the manifest.

Writes ``--carry DIR``: ``flashinfer.tar.xz`` (site-packages layout: ``flashinfer/`` and the
``flashinfer_python-0.7.2.dist-info`` with a RECORD of the kept files; install with
``tar -xJf DIR/flashinfer.tar.xz -C /tmp/site``) or, with ``--format wheel``, a trimmed wheel
(``pip install --no-deps --target /tmp/site``); ``flashinfer-manifest.json``; and with ``--dep SPEC``
dependency wheels under ``DIR/wheels`` (pip download, cp312 manylinux x86_64). None is needed for the
H200 image: FlashInfer's eager third-party imports there are torch, numpy, packaging, requests, tqdm,
jinja2, filelock, pynvml (nvidia-ml-py), cuda.bindings and tvm_ffi (apache-tvm-ffi, already carried).

On the device, ``--prebuild`` (no wheel work; imports the installed flashinfer) compiles the JIT modules
SGLang would build at engine start, in one parallel ninja run: ``FLASHINFER_JIT_PREBUILD_MAX_JOBS=16``.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from collections import defaultdict
from pathlib import Path, PurePosixPath

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VERSION = "0.7.2"
SPEC = f"flashinfer_python=={VERSION}"
WHEEL_NAME = f"flashinfer_python-{VERSION}-py3-none-any.whl"
DIST_INFO = f"flashinfer_python-{VERSION}.dist-info"
PKG = "flashinfer"
DATA = "flashinfer/data"
MTIME = 1577836800  # 2020-01-01: fixed, so the archive is byte-for-byte reproducible

# Modules SGLang imports from flashinfer on the Qwen3 + DFlash/DDTree engine path with FlashInfer present
# (srt/layers/attention/flashinfer_backend.py, srt/layers/sampler.py, kernels/ops/sampling/renorm.py,
# srt/layers/flashinfer_comm_fusion.py, srt/layers/layernorm.py, srt/utils/common.py, kernels/jit/utils/arch.py).
PY_SEEDS = [
    "flashinfer",
    "flashinfer.prefill",
    "flashinfer.decode",
    "flashinfer.cascade",
    "flashinfer.page",
    "flashinfer.sampling",
    "flashinfer.topk",
    "flashinfer.norm",
    "flashinfer.comm",
    "flashinfer.rope",
    "flashinfer.jit",
    "flashinfer.jit.core",
    "flashinfer.jit.env",
    "flashinfer.compilation_context",
]

# JIT sources (flashinfer/data/csrc) of the modules above: jit/attention/modules.py
# (gen_customize_batch_prefill_module fa2 + sm90, gen_customize_batch_decode_module), jit/cascade.py,
# jit/sampling.py, jit/page.py, jit/topk.py, jit/spdlog.py.
CSRC_SEEDS = [
    "batch_prefill.cu",
    "batch_prefill_jit_binding.cu",
    "batch_prefill_paged.cu",
    "batch_prefill_paged.cuh",
    "batch_prefill_paged_jit_binding.cu",
    "batch_prefill_customize_config.jinja",
    "batch_prefill_paged_kernel_inst.jinja",
    "batch_prefill_ragged_kernel_inst.jinja",
    "batch_prefill_sm90.cu",
    "batch_prefill_sm90_jit_binding.cu",
    "batch_prefill_sm90_customize_config.jinja",
    "batch_prefill_paged_sm90_kernel_inst.jinja",
    "batch_prefill_ragged_sm90_kernel_inst.jinja",
    "batch_decode.cu",
    "batch_decode_jit_binding.cu",
    "batch_decode_customize_config.jinja",
    "batch_decode_kernel_inst.jinja",
    "cascade.cu",
    "flashinfer_cascade_binding.cu",
    "sampling.cu",
    "renorm.cu",
    "flashinfer_sampling_binding.cu",
    "page.cu",
    "flashinfer_page_binding.cu",
    "topk.cu",
    "cub_topk.cu",
    "flashinfer_topk_binding.cu",
    "flashinfer_fast_topk_clusters_binding.cu",
    "logging.cc",
    # segment_packbits: the flashinfer backend packs the verify's custom mask at plan time (prefill.py ->
    # quantization/packbits.py); missing from the first carry, DDTREE/DFLASH verify died at graph capture
    "quantization.cu",
    "flashinfer_quantization_binding.cu",
]
# Headers named only in Python strings (variant_decl in jit/attention/modules.py) or by SGLang's JIT
# kernel (kernels/jit/csrc/speculative/sampling.cuh: <flashinfer/sampling.cuh>).
HEADER_SEEDS = [
    "flashinfer/attention/variants.cuh",
    "flashinfer/attention/hopper/variants.cuh",
    "flashinfer/sampling.cuh",
]
# Files read by Python at run time (compilation_context.cutlass_supports_sm107).
READ_FILES = ["flashinfer/data/cutlass/include/cutlass/arch/arch.h"]
# The include path of FlashInfer's JIT command line (jit/cpp_ext.py build_common_cflags: the vendored CCCL
# with -I, then -isystem ... include, csrc, cutlass, spdlog); SGLang's deps.py checks the last five exist.
INCLUDE_DIRS = [
    "flashinfer/data/cccl/cub",
    "flashinfer/data/cccl/libcudacxx/include",
    "flashinfer/data/cccl/thrust",
    "flashinfer/data/include",
    "flashinfer/data/csrc",
    "flashinfer/data/cutlass/include",
    "flashinfer/data/cutlass/tools/util/include",
    "flashinfer/data/spdlog/include",
]
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
HAS_INCLUDE_RE = re.compile(r'__has_include[ \t]*\([ \t]*([<"])([^>"\n]+)[>"]')
MACRO_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include[ \t]+([A-Za-z_]\w*)(?:[ \t]*\([ \t]*(\w+)[ \t]*\))?", re.M)
# `#define CUDA_STD_HEADER(header) <cuda/std/header>` (cutlass/cutlass.h): a function-like macro that names a header
INCLUDE_MACRO_DEF_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\([ \t]*(\w+)[ \t]*\)[ \t]*<([^>\n]+)>", re.M)
MODULE_STR_RE = re.compile(r"^(flashinfer(\.\w+)+|\.\w+(\.\w+)*)$")
CPP_SUFFIXES = {".h", ".hpp", ".cuh", ".cu", ".cc", ".cpp", ".inc", ".inl", ".jinja", ".hxx", ".ipp", ""}

# ----------------------------------------------------------------------------------------------- wheel


def fetch_wheel(wheel: Path | None, cache: Path) -> Path:
    """The wheel given, or ``cache/WHEEL_NAME``, downloaded with pip if absent."""
    if wheel is not None:
        if not wheel.is_file():
            raise SystemExit(f"error: no wheel at {wheel}")
        return wheel
    path = cache / WHEEL_NAME
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(cache), SPEC]
        if subprocess.run(cmd, timeout=1800).returncode != 0 or not path.is_file():
            raise SystemExit(f"error: `{' '.join(cmd)}` did not produce {path}\nfix: pass --wheel PATH")
    return path


def read_wheel(path: Path) -> dict[str, bytes]:
    """Every file of the wheel, by its posix path."""
    with zipfile.ZipFile(path) as zf:
        files = {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}
    if f"{PKG}/__init__.py" not in files or f"{DIST_INFO}/METADATA" not in files:
        raise SystemExit(f"error: {path} is not the flashinfer_python {VERSION} wheel")
    return files


# ------------------------------------------------------------------------------------------- Python


def module_file(files: dict[str, bytes], mod: str) -> str | None:
    base = mod.replace(".", "/")
    for cand in (f"{base}/__init__.py", f"{base}.py"):
        if cand in files:
            return cand
    return None


def is_package(files: dict[str, bytes], mod: str, dirs: set[str]) -> bool:
    return f"{mod.replace('.', '/')}/__init__.py" in files or mod.replace(".", "/") in dirs


def resolve_relative(pkg: str, level: int, name: str | None) -> str:
    parts = pkg.split(".")
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def referenced_modules(src: bytes, mod: str, package: str) -> set[str]:
    """Every flashinfer module name an import statement or a module-name string in ``src`` refers to."""
    tree = ast.parse(src, filename=mod)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = resolve_relative(package, node.level, node.module) if node.level else (node.module or "")
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names if a.name != "*")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STR_RE.match(node.value):
            val = node.value
            out.add(resolve_relative(package, 1, val.lstrip(".")) if val.startswith(".") else val)
    return {m for m in out if m.split(".")[0] == PKG}


def with_parents(mod: str) -> list[str]:
    parts = mod.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def python_closure(files: dict[str, bytes]) -> set[str]:
    """Paths of the kept ``.py`` files: the static import closure of PY_SEEDS."""
    dirs = {str(PurePosixPath(p).parent) for p in files}
    seen: set[str] = set()
    todo = [m for s in PY_SEEDS for m in with_parents(s)]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = module_file(files, mod)
        if path is None:
            continue
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        for ref in referenced_modules(files[path], mod, package):
            for m in with_parents(ref):
                if m not in seen and (module_file(files, m) or is_package(files, m, dirs)):
                    todo.append(m)
    missing = [s for s in PY_SEEDS if module_file(files, s) is None]
    if missing:
        raise SystemExit(f"error: seed modules absent from the wheel: {missing}")
    return {p for m in seen if (p := module_file(files, m))}


def package_siblings(files: dict[str, bytes], py: set[str]) -> set[str]:
    """Non-.py files directly in a folder that holds a kept module (py.typed, small JSON tables)."""
    folders = {str(PurePosixPath(p).parent) for p in py}
    return {
        p
        for p in files
        if not p.startswith(DATA + "/") and not p.endswith((".py", ".pyc")) and str(PurePosixPath(p).parent) in folders
    }


# ---------------------------------------------------------------------------------------------- C++


def resolve_include(files: dict[str, bytes], includer: str, kind: str, name: str) -> str | None:
    cands = [str(PurePosixPath(includer).parent / name)] if kind == '"' else []
    cands += [f"{d}/{name}" for d in INCLUDE_DIRS]
    for cand in cands:
        norm = str(PurePosixPath(*_normalize(cand)))
        if norm in files:
            return norm
    return None


def _normalize(path: str) -> list[str]:
    out: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if out:
                out.pop()
        elif part not in ("", "."):
            out.append(part)
    return out


def include_macros(files: dict[str, bytes]) -> dict[str, tuple[str, str]]:
    """Function-like macros defined as ``<path>`` in the include dirs: name -> (parameter, template)."""
    out: dict[str, tuple[str, str]] = {}
    for path in sorted(files):
        if path.startswith(tuple(d + "/" for d in INCLUDE_DIRS)) and PurePosixPath(path).suffix in CPP_SUFFIXES:
            for name, param, templ in INCLUDE_MACRO_DEF_RE.findall(files[path].decode("utf-8", "replace")):
                out.setdefault(name, (param, templ))
    return out


def expand_macro_include(macros: dict[str, tuple[str, str]], name: str, arg: str) -> str | None:
    if not arg or name not in macros:
        return None
    param, templ = macros[name]
    return re.sub(rf"\b{param}\b", arg, templ).strip()


def include_closure(files: dict[str, bytes]) -> tuple[set[str], dict[str, int], dict[str, list[str]]]:
    """Kept data files, the external includes (name -> count) and the computed includes left unresolved."""
    macros = include_macros(files)
    seeds = [f"{DATA}/csrc/{s}" for s in CSRC_SEEDS] + READ_FILES
    seeds += [r for h in HEADER_SEEDS if (r := resolve_include(files, "", "<", h))]
    absent = [s for s in seeds if s not in files]
    if absent or len(seeds) != len(CSRC_SEEDS) + len(READ_FILES) + len(HEADER_SEEDS):
        raise SystemExit(f"error: JIT seed files absent from the wheel: {absent or HEADER_SEEDS}")
    seen: set[str] = set()
    external: dict[str, int] = defaultdict(int)
    macro: dict[str, list[str]] = defaultdict(list)
    todo = list(seeds)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if PurePosixPath(path).suffix not in CPP_SUFFIXES:
            continue
        text = files[path].decode("utf-8", "replace")
        for kind, name in INCLUDE_RE.findall(text) + HAS_INCLUDE_RE.findall(text):
            hit = resolve_include(files, path, kind, name.strip())
            if hit is None:
                external[name.strip()] += 1
            elif hit not in seen:
                todo.append(hit)
        for name, arg in MACRO_INCLUDE_RE.findall(text):
            target = expand_macro_include(macros, name, arg)
            hit = resolve_include(files, path, "<", target) if target else None
            if hit is None:
                macro[f"{name}({arg})" if arg else name].append(path)
            elif hit not in seen:
                todo.append(hit)
    return seen, dict(external), dict(macro)


# ------------------------------------------------------------------------------------------- output


def area(path: str) -> str:
    """The manifest bucket of a wheel path."""
    parts = path.split("/")
    if parts[0] == DIST_INFO:
        return DIST_INFO
    if parts[:2] == [PKG, "data"]:
        return "/".join(parts[:4]) if len(parts) > 4 else "/".join(parts[:3])
    if parts[0] == PKG:
        return "/".join(parts[:2]) if len(parts) > 2 else "flashinfer/*.py"
    return parts[0]


def why_dropped(path: str) -> str:
    if path.startswith(DATA + "/"):
        return "not read by the kept JIT builds (no #include path reaches it from the seeds)"
    if path.startswith(PKG + "/"):
        return "not reachable by any import from the seed modules"
    return "outside the flashinfer package (build helpers / other top-level packages)"


def record(files: dict[str, bytes], keep: list[str]) -> bytes:
    lines = []
    for p in keep:
        digest = base64.urlsafe_b64encode(hashlib.sha256(files[p]).digest()).rstrip(b"=").decode()
        lines.append(f"{p},sha256={digest},{len(files[p])}")
    lines.append(f"{DIST_INFO}/RECORD,,")
    return ("\n".join(lines) + "\n").encode()


# The JIT generators SGLang's Qwen3 + DFlash/DDTree path builds (attention prefill/decode, cascade, sampling,
# packbits for the verify's custom mask; prebuild_specs below): every csrc file they name, directly or via
# helpers in the same file, must be a seed, or that build dies on the device.
GENERATORS = {
    "flashinfer/jit/attention/modules.py": [
        "gen_batch_prefill_module",
        "_gen_batch_prefill_primary_module",
        "gen_batch_decode_module",
        "_gen_batch_prefill_independent_paged_module",
    ],
    "flashinfer/jit/cascade.py": ["gen_cascade_module"],
    "flashinfer/jit/sampling.py": ["gen_sampling_module"],
    "flashinfer/jit/quantization.py": ["gen_quantization_module"],
}
CSRC_NAME_SUFFIXES = (".cu", ".cc", ".cuh", ".jinja")
# Named by those generators, deliberately not carried: the fp8 FA3 prefill (fp8 q/kv only; the harness
# runs bf16 / fp32 with no --kv-cache-dtype fp8).
NOT_CARRIED = {
    "batch_prefill_fp8_sm90.cu",
    "batch_prefill_fp8_paged_sm90_kernel_inst.jinja",
    "batch_prefill_fp8_ragged_sm90_kernel_inst.jinja",
}


def unseeded_sources(files: dict[str, bytes]) -> dict[str, list[str]]:
    """Generator -> the csrc files (string constants naming a file of csrc/) it, or a same-file helper it
    calls, names that CSRC_SEEDS lacks."""
    seeds = set(CSRC_SEEDS) | NOT_CARRIED
    out = {}
    for path, roots in GENERATORS.items():
        src = files[path].decode()
        funcs = {n.name: n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)}
        todo, seen = list(roots), set()
        while todo:
            name = todo.pop()
            if name in seen or name not in funcs:
                continue
            seen.add(name)
            node = funcs[name]
            todo += [c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]
            named = {
                c.value
                for c in ast.walk(node)
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.endswith(CSRC_NAME_SUFFIXES)
            }
            missing = sorted(n for n in named if n not in seeds and f"{DATA}/csrc/{n}" in files)
            if missing:
                out[f"{path}:{name}"] = missing
    return out


def select(files: dict[str, bytes]) -> tuple[list[str], dict]:
    missing = unseeded_sources(files)
    if missing:
        raise SystemExit(
            f"error: JIT sources named by the kept generators but not in CSRC_SEEDS: {missing}; "
            "add them to CSRC_SEEDS (tools/sglang_h200/flashinfer_bundle.py) or say why not"
        )
    py = python_closure(files)
    siblings = package_siblings(files, py)
    data, external, macro = include_closure(files)
    dist = {p for p in files if p.startswith(DIST_INFO + "/") and not p.endswith("/RECORD")}
    dist.discard(f"{DIST_INFO}/entry_points.txt")  # the `flashinfer` CLI is not carried (its script is not installed)
    keep = sorted(py | siblings | data | dist)
    info = {
        "external_includes": dict(sorted(external.items())),
        "macro_includes": {k: sorted(set(v)) for k, v in sorted(macro.items())},
        "python_modules": len(py),
        "data_files": len(data),
    }
    return keep, info


def summarize(files: dict[str, bytes], keep: list[str]) -> dict:
    kept = set(keep)
    areas: dict[str, dict] = defaultdict(
        lambda: {"kept_files": 0, "kept_bytes": 0, "dropped_files": 0, "dropped_bytes": 0, "dropped_because": ""}
    )
    for p, b in files.items():
        a = areas[area(p)]
        if p in kept:
            a["kept_files"] += 1
            a["kept_bytes"] += len(b)
        else:
            a["dropped_files"] += 1
            a["dropped_bytes"] += len(b)
            a["dropped_because"] = why_dropped(p)
    for a in areas.values():
        if not a["dropped_files"]:
            del a["dropped_because"]
    return dict(sorted(areas.items()))


def write_tar(files: dict[str, bytes], keep: list[str], rec: bytes, dest: Path) -> None:
    import lzma

    def add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), MTIME, 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tf.addfile(info, io.BytesIO(data))

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for p in keep:
            add(tf, p, files[p])
        add(tf, f"{DIST_INFO}/RECORD", rec)
    dest.write_bytes(lzma.compress(raw.getvalue(), preset=9 | lzma.PRESET_EXTREME))


def write_wheel(files: dict[str, bytes], keep: list[str], rec: bytes, dest: Path) -> None:
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for p in keep + [f"{DIST_INFO}/RECORD"]:
            info = zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, rec if p.endswith("/RECORD") else files[p], compresslevel=9)


def download_deps(specs: list[str], dest: Path) -> list[Path]:
    if not specs:
        return []
    from make_bundle import pip_download  # a sibling script: the harness carry's own pip download

    pip_download(specs, dest)
    return sorted(dest.glob("*.whl"))


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def bundle(args: argparse.Namespace) -> int:
    wheel = fetch_wheel(args.wheel, args.wheel_cache)
    files = read_wheel(wheel)
    keep, info = select(files)
    rec = record(files, keep)
    args.carry.mkdir(parents=True, exist_ok=True)
    dest = args.carry / ("flashinfer.tar.xz" if args.format == "tar.xz" else WHEEL_NAME)
    (write_tar if args.format == "tar.xz" else write_wheel)(files, keep, rec, dest)
    deps = download_deps(args.dep, args.carry / "wheels")
    kept_bytes = sum(len(files[p]) for p in keep)
    manifest = {
        "wheel": {
            "path": str(wheel),
            "bytes": wheel.stat().st_size,
            "files": len(files),
            "uncompressed_bytes": sum(len(b) for b in files.values()),
        },
        "output": {"path": dest.name, "bytes": dest.stat().st_size, "files": len(keep) + 1, "uncompressed_bytes": kept_bytes},
        "dep_wheels": {p.name: p.stat().st_size for p in deps},
        "seeds": {
            "python": PY_SEEDS,
            "csrc": CSRC_SEEDS,
            "headers": HEADER_SEEDS,
            "read": READ_FILES,
            "include_dirs": INCLUDE_DIRS,
        },
        **info,
        "areas": summarize(files, keep),
        "kept": keep,
    }
    (args.carry / "flashinfer-manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    unpacked = mib(manifest["wheel"]["uncompressed_bytes"])
    print(f"wheel    {wheel.name}: {mib(wheel.stat().st_size)} ({len(files)} files, {unpacked} unpacked)")
    print(
        f"kept     {len(keep)} files, {mib(kept_bytes)} unpacked ({info['python_modules']} Python modules, "
        f"{info['data_files']} JIT sources/headers)"
    )
    print(f"carry    {dest}: {mib(dest.stat().st_size)}")
    for p in deps:
        print(f"dep      {p}: {mib(p.stat().st_size)}")
    print(f"manifest {args.carry / 'flashinfer-manifest.json'}")
    return 0


# ------------------------------------------------------------------------------ prebuild (on the device)


def prebuild_specs(dtypes: list[str], head_dims: list[int], extra: bool) -> list:
    """The JitSpecs SGLang's flashinfer backend / sampler build for these q/kv dtypes and head dims."""
    import torch
    from flashinfer.jit.attention.modules import (
        _gen_batch_prefill_independent_paged_module,
        _gen_batch_prefill_primary_module,
        gen_batch_decode_module,
        gen_batch_prefill_module,
    )
    from flashinfer.jit.cascade import gen_cascade_module
    from flashinfer.jit.quantization import gen_quantization_module
    from flashinfer.jit.sampling import gen_sampling_module

    specs = []
    for name in dtypes:
        dt = getattr(torch, name)
        for hd in head_dims:
            args = (dt, dt, dt, torch.int32, hd, hd, 0, False, False, False)
            # fa2: paged prefill / verify / tensor-core decode; fa3 (sm90): ragged extend without a custom mask
            # CUDA-core decode: built when the GQA group is < 4 (the trained pair's 4/2)
            specs += [
                _gen_batch_prefill_primary_module("fa2", *args),
                gen_batch_prefill_module("fa3", *args),
                gen_batch_decode_module(*args[:-1]),
            ]
            if extra:  # the lazily built independent-stride paged variant
                specs += [_gen_batch_prefill_independent_paged_module("fa2", *args)]
    # packbits (the verify's custom mask), cascade, sampling
    return specs + [gen_quantization_module(), gen_cascade_module(), gen_sampling_module()]


def prebuild(args: argparse.Namespace) -> int:
    import time

    from flashinfer.jit import build_jit_specs
    from flashinfer.jit import env as jit_env

    specs = prebuild_specs(args.dtype, args.head_dim, args.extra)
    print(f"prebuild {len(specs)} modules into {jit_env.FLASHINFER_JIT_DIR}", flush=True)
    t0 = time.time()
    build_jit_specs(specs, verbose=args.verbose)
    print(f"prebuilt {len(specs)} modules in {time.time() - t0:.0f} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--wheel", type=Path, help=f"the {WHEEL_NAME} to trim (default: --wheel-cache, pip download if absent)")
    ap.add_argument("--wheel-cache", type=Path, default=REPO / ".work" / "flashinfer-wheel")
    ap.add_argument("--carry", type=Path, default=REPO / ".work" / "flashinfer-bundle", help="output folder")
    ap.add_argument("--format", choices=["tar.xz", "wheel"], default="tar.xz")
    ap.add_argument(
        "--dep",
        action="append",
        default=[],
        metavar="SPEC",
        help="also pip download this dependency wheel (cp312 manylinux x86_64) into CARRY/wheels",
    )
    ap.add_argument(
        "--prebuild",
        action="store_true",
        help="on the device: JIT-compile the modules SGLang builds at engine start (imports flashinfer)",
    )
    ap.add_argument(
        "--dtype",
        nargs="+",
        default=["bfloat16"],
        choices=["bfloat16", "float16"],
        help="--prebuild: q/kv dtypes (FlashInfer has no float32 attention)",
    )
    ap.add_argument("--head-dim", nargs="+", type=int, default=[128], help="--prebuild: head dims")
    ap.add_argument("--extra", action="store_true", help="--prebuild: also the independent-stride paged prefill")
    ap.add_argument("--verbose", action="store_true", help="--prebuild: show ninja's output")
    args = ap.parse_args(argv)
    return prebuild(args) if args.prebuild else bundle(args)


if __name__ == "__main__":
    sys.exit(main())
