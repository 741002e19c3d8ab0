"""The strict engine: exact apply, byte-exact results, and precise refusals.

Diffs come from the real ``git diff --no-index`` (see ``conftest.git_diff``), never from our
own generator, so the parser and applier are checked against what users' tools produce.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from testkit import git_diff

from ddtree_deploy.errors import CompileError, PatchApplyError, PatchParseError, PatchRefusedError
from ddtree_deploy.patches.engine import apply_series, compile_check
from ddtree_deploy.patches.series import load_series, parse_patch_bytes, split_lines

REL = "sglang/srt/x.py"

# Lines: short words so edits collide often; endings LF or CRLF; the last may lack one.
_word = st.text(alphabet="abcxyz =()#:", min_size=0, max_size=6)
_ending = st.sampled_from([b"\n", b"\r\n"])


@st.composite
def files(draw, min_lines=0):
    n = draw(st.integers(min_lines, 25))
    lines = [draw(_word).encode() + draw(_ending) for _ in range(n)]
    if lines and draw(st.booleans()):
        lines[-1] = lines[-1].rstrip(b"\r\n")  # no newline at end of file
    return b"".join(lines)


@st.composite
def edits(draw, base: bytes):
    lines = split_lines(base)
    out = list(lines)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["ins", "del", "rep", "eol"]))
        i = draw(st.integers(0, max(len(out) - 1, 0)))
        if op == "ins" or not out:
            out.insert(i, draw(_word).encode() + draw(_ending))
        elif op == "del":
            del out[i]
        elif op == "rep":
            out[i] = draw(_word).encode() + draw(_ending)
        else:  # toggle the final newline
            last = out[-1]
            out[-1] = last.rstrip(b"\r\n") if last.endswith(b"\n") else last + b"\n"
    # Only the last line may lack an ending.
    fixed = [ln if ln.endswith(b"\n") else ln + b"\n" for ln in out[:-1]] + out[-1:]
    return b"".join(fixed)


def _apply_one(base: bytes | None, patch: bytes) -> bytes | None:
    p = parse_patch_bytes(patch, name="t.patch")

    class S:  # a one-patch series
        patches = [p]

    res = apply_series(S, lambda rel: base)  # type: ignore[arg-type]
    return res.files[REL].result


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_edits_roundtrip_byte_exact(data):
    """Random file, random edits -> git diff -> our apply == the edited file, byte for byte."""
    base = data.draw(files())
    new = data.draw(edits(base))
    assume(new != base)
    with tempfile.TemporaryDirectory() as tmp:
        patch = git_diff(base, new, REL, Path(tmp))
    assert _apply_one(base, patch) == new


@settings(max_examples=40, deadline=None)
@given(new=files(min_lines=1))
def test_created_and_deleted_files(new):
    with tempfile.TemporaryDirectory() as tmp:
        create = git_diff(None, new, REL, Path(tmp))
        delete = git_diff(new, None, REL, Path(tmp))
    assert _apply_one(None, create) == new
    assert _apply_one(new, delete) is None
    with pytest.raises(PatchApplyError, match="already exists"):
        _apply_one(b"x\n", create)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_one_character_drift_is_refused_at_the_right_place(data):
    """Change one character of one context/removed line in the base: refused, naming file/hunk/line."""
    base = data.draw(files(min_lines=3))
    new = data.draw(edits(base))
    assume(new != base)
    with tempfile.TemporaryDirectory() as tmp:
        patch = git_diff(base, new, REL, Path(tmp))
    parsed = parse_patch_bytes(patch, name="t.patch")
    hunks = parsed.files[0].hunks
    # Every (hunk, base line number) that the patch checks.
    checked = []
    for h in hunks:
        n = h.old_start
        for ln in h.lines:
            if ln.op != "+":
                checked.append((h.index, n, ln.text))
                n += 1
    assume(checked)
    hunk_no, line_no, text = data.draw(st.sampled_from(checked))
    body = text.rstrip(b"\r\n")
    ending = text[len(body) :]
    col = data.draw(st.integers(0, len(body)))  # == len(body): insert a character at the end
    ch = data.draw(st.sampled_from([b"Q", b"-", b" "]))
    drifted_line = body[:col] + ch + body[col + 1 :] + ending if col < len(body) else body + ch + ending
    assume(drifted_line != text)
    lines = split_lines(base)
    lines[line_no - 1] = drifted_line
    drifted = b"".join(lines)
    with pytest.raises(PatchApplyError) as ei:
        _apply_one(drifted, patch)
    e = ei.value
    assert (e.patch, e.file, e.hunk, e.line) == ("t.patch", REL, hunk_no, line_no)
    assert e.expected == text.decode()
    assert e.actual == drifted_line.decode()
    assert "ddtree-deploy patches" in (e.hint or "")


def test_offset_is_drift_even_when_context_matches_elsewhere():
    """A hunk whose text exists two lines lower is refused (zero offset), not applied there."""
    base = b"a\nb\nc\nd\ne\nf\ng\nh\n"
    patch = git_diff(base, base.replace(b"e\n", b"E\n"), REL, Path(tempfile.mkdtemp()))
    shifted = b"0\n0\n" + base
    with pytest.raises(PatchApplyError) as ei:
        _apply_one(shifted, patch)
    assert ei.value.hunk == 1 and ei.value.line == 2


def test_crlf_vs_lf_is_named():
    base = b"a\r\nb\r\nc\r\n"
    patch = git_diff(base, b"a\r\nB\r\nc\r\n", REL, Path(tempfile.mkdtemp()))
    assert _apply_one(base, patch) == b"a\r\nB\r\nc\r\n"
    with pytest.raises(PatchApplyError, match="line endings differ"):
        _apply_one(base.replace(b"\r\n", b"\n"), patch)


def test_missing_final_newline_is_exact():
    patch = git_diff(b"a\nb", b"a\nc", REL, Path(tempfile.mkdtemp()))
    assert b"\\ No newline at end of file" in patch
    assert _apply_one(b"a\nb", patch) == b"a\nc"
    with pytest.raises(PatchApplyError):
        _apply_one(b"a\nb\n", patch)  # the base has the newline the patch says is missing


# --- refusals -------------------------------------------------------------------------------


def _diff_for(path_a: str, path_b: str) -> bytes:
    return (f"--- {path_a}\n+++ {path_b}\n@@ -1 +1 @@\n-a\n+b\n").encode()


@pytest.mark.parametrize(
    "a,b,match",
    [
        ("a//etc/passwd", "b//etc/passwd", "absolute path"),
        ("/etc/passwd", "/etc/passwd", "must start with"),
        ("a/sglang/../../x.py", "b/sglang/../../x.py", r"'\.\.'"),
        ("a/torch/x.py", "b/torch/x.py", "outside the sglang/ package"),
        ("a/sglang", "b/sglang", "outside the sglang/ package"),
        ("a/sglang/./x.py", "b/sglang/./x.py", "not a normalized path"),
        ("a/sglang/x.py", "b/sglang/y.py", "renames are refused"),
        ("sglang/x.py", "sglang/x.py", "must start with"),
    ],
)
def test_unsafe_paths_are_refused(a, b, match):
    with pytest.raises(PatchRefusedError, match=match):
        parse_patch_bytes(_diff_for(a, b), name="bad.patch")


def test_binary_patches_are_refused():
    git_binary = (
        b"diff --git a/sglang/x.bin b/sglang/x.bin\nnew file mode 100644\nindex 0000000..1111111\n"
        b"GIT binary patch\nliteral 3\nKcmZ?wYXATM00001\n\nliteral 0\nHcmV?d00001\n"
    )
    with pytest.raises(PatchRefusedError, match="binary"):
        parse_patch_bytes(git_binary, name="bin.patch")
    plain = b"diff --git a/sglang/x.bin b/sglang/x.bin\nBinary files a/sglang/x.bin and b/sglang/x.bin differ\n"
    with pytest.raises(PatchRefusedError, match="binary"):
        parse_patch_bytes(plain, name="bin.patch")


def test_symlinks_and_renames_in_git_headers_are_refused():
    link = (
        b"diff --git a/sglang/l b/sglang/l\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n"
        b"+++ b/sglang/l\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n"
    )
    with pytest.raises(PatchRefusedError, match="symlinks"):
        parse_patch_bytes(link, name="l.patch")
    ren = b"diff --git a/sglang/a.py b/sglang/b.py\nsimilarity index 100%\nrename from sglang/a.py\nrename to sglang/b.py\n"
    with pytest.raises(PatchRefusedError, match="renam"):
        parse_patch_bytes(ren, name="r.patch")


def test_malformed_hunk_is_a_parse_error():
    bad = b"--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n"
    with pytest.raises(PatchParseError, match="x.py|unified diff"):
        parse_patch_bytes(bad, name="m.patch")


def test_series_order_and_compile_error_names_the_culprit(make_series, tmp_path):
    base = b"def f():\n    return 1\n"
    v1 = b"def f():\n    return 2\n"
    v2 = b"def f():\n    return (2\n"  # syntax error
    v3 = b"def f():\n    return (2\n# more\n"
    p1 = git_diff(base, v1, REL, tmp_path / "d1")
    p2 = git_diff(v1, v2, REL, tmp_path / "d2")
    p3 = git_diff(v2, v3, REL, tmp_path / "d3")
    d = make_series({"0001-a.patch": p1, "0002-b.patch": p2, "0003-c.patch": p3})
    res = apply_series(load_series(d), lambda rel: base)
    assert res.files[REL].result == v3
    assert res.files[REL].patches == ["0001-a.patch", "0002-b.patch", "0003-c.patch"]
    with pytest.raises(CompileError) as ei:
        compile_check(res)
    assert ei.value.details["patch"] == "0002-b.patch"
    assert "0002-b.patch" in ei.value.message and REL in ei.value.message


# --- precise refusals and modes (found by the mutation run: each kills a survivor) ---------------


def test_new_file_mode_from_the_patch_is_kept_exactly():
    patch = (
        b"diff --git a/sglang/srt/x.py b/sglang/srt/x.py\nnew file mode 100755\n--- /dev/null\n"
        b"+++ b/sglang/srt/x.py\n@@ -0,0 +1 @@\n+X = 1\n"
    )
    p = parse_patch_bytes(patch, name="t.patch")

    class S:
        patches = [p]

    for base_mode in (0o644, 0o600):
        fr = apply_series(S, lambda rel: None, lambda rel: base_mode).files[REL]  # type: ignore[arg-type]
        assert fr.mode == 0o755 and fr.result == b"X = 1\n"
    plain = apply_series(
        type("S0", (), {"patches": [parse_patch_bytes(patch.split(b"new file mode 100755\n")[1], name="t.patch")]}),
        lambda rel: None,
    ).files[REL]
    assert plain.mode == 0o644  # no mode in the patch, no base: the default
    sticky = patch.replace(b"100755", b"104755")  # setuid bit: dropped, only rwx bits are kept
    fr = apply_series(type("S2", (), {"patches": [parse_patch_bytes(sticky, name="t.patch")]}), lambda rel: None).files[REL]  # type: ignore[arg-type]
    assert fr.mode == 0o755


def test_hunk_header_new_start_too_small_is_refused_too():
    base = b"".join(b"l%d\n" % i for i in range(30))
    new = base.replace(b"l3\n", b"l3\nadded\n").replace(b"l20\n", b"L20\n")
    patch = git_diff(base, new, REL, Path(tempfile.mkdtemp()))
    assert _apply_one(base, patch) == new
    heads = patch.split(b"\n@@ ")
    assert len(heads) == 3  # two hunks
    # hunk 2's header: "+21,7" -> "+20,7" (one line too small)
    import re

    m = list(re.finditer(rb"\+(\d+),(\d+) @@", patch))[1]
    bad = patch[: m.start(1)] + str(int(m.group(1)) - 1).encode() + patch[m.end(1) :]
    with pytest.raises(PatchApplyError, match="hunk header says new line") as ei:
        _apply_one(base, bad)
    assert ei.value.hunk == 2


def test_file_ending_before_the_hunk_names_the_missing_line():
    base = b"a\nb\nc\nd\n"
    patch = git_diff(base, b"a\nb\nc\nD\n", REL, Path(tempfile.mkdtemp()))
    with pytest.raises(PatchApplyError, match="the file ends before the hunk does") as ei:
        _apply_one(b"a\nb\nc\n", patch)
    assert (ei.value.hunk, ei.value.line, ei.value.expected) == (1, 4, "d\n")


def test_delete_that_leaves_lines_names_its_last_hunk():
    base = b"a\nb\nc\n"
    patch = git_diff(base, None, REL, Path(tempfile.mkdtemp()))
    assert _apply_one(base, patch) is None
    with pytest.raises(PatchApplyError, match="does not remove all of its lines") as ei:
        _apply_one(base + b"extra\nmore\n", patch)
    assert ei.value.hunk == 1 and ei.value.actual == "extra\n"  # the first line left behind


def test_crlf_vs_lf_is_named_on_longer_lines():
    base = b"alpha beta\r\nsecond line\r\nthird\r\n"
    patch = git_diff(base, base.replace(b"second line", b"SECOND"), REL, Path(tempfile.mkdtemp()))
    with pytest.raises(PatchApplyError, match="line endings differ"):
        _apply_one(base.replace(b"\r\n", b"\n"), patch)


def test_hunk_errors_for_missing_base_name_the_first_hunk():
    base = b"".join(b"l%d\n" % i for i in range(30))
    patch = git_diff(base, base.replace(b"l2\n", b"L2\n").replace(b"l25\n", b"L25\n"), REL, Path(tempfile.mkdtemp()))
    with pytest.raises(PatchApplyError, match="does not exist in the base") as ei:
        _apply_one(None, patch)
    assert (ei.value.hunk, ei.value.line) == (1, 0)
    create = git_diff(None, b"x\n", REL, Path(tempfile.mkdtemp()))
    with pytest.raises(PatchApplyError, match="already exists") as ei:
        _apply_one(b"y\n", create)
    assert (ei.value.hunk, ei.value.line) == (1, 0)


def test_compile_check_looks_past_non_python_files(make_series, tmp_path):
    d = make_series(
        {
            "0001-notes.patch": git_diff(None, b"notes\n", "sglang/srt/notes.txt", tmp_path / "a"),
            "0002-bad.patch": git_diff(None, b"def f(:\n", "sglang/srt/bad.py", tmp_path / "b"),
        }
    )
    res = apply_series(load_series(d), lambda rel: None)
    with pytest.raises(CompileError, match="sglang/srt/bad.py:1"):
        compile_check(res)


def test_compile_check_uses_the_files_own_future_flags_not_the_engines(make_series, tmp_path):
    """``x: (yield)`` is valid Python, but not under ``from __future__ import annotations`` (which the
    engine module itself uses): the check must compile each file on its own terms."""
    src = b"def f():\n    x: (yield) = 1\n"
    compile(src, "x.py", "exec", dont_inherit=True)
    d = make_series({"0001-gen.patch": git_diff(None, src, "sglang/srt/gen.py", tmp_path / "a")})
    assert compile_check(apply_series(load_series(d), lambda rel: None)) == ["sglang/srt/gen.py"]


def test_a_different_line_is_not_called_a_line_ending_difference():
    base = b"a\nm\nz\n"
    patch = git_diff(base, b"a\nM\nz\n", REL, Path(tempfile.mkdtemp()))
    for drifted in (b"a\nn\nz\n", b"a\nl\nz\n"):  # one sorts after "m", one before
        with pytest.raises(PatchApplyError) as ei:
            _apply_one(drifted, patch)
        assert ei.value.reason == "line differs"


def test_compile_check_skips_deleted_python_files(make_series, tmp_path, snapshot_root):
    rel = "sglang/srt/speculative/spec_info.py"
    d = make_series({"0001-del.patch": git_diff((snapshot_root / rel).read_bytes(), None, rel, tmp_path / "a")})
    res = apply_series(load_series(d), lambda r: (snapshot_root / r).read_bytes())
    assert res.files[rel].result is None and compile_check(res) == []


def test_compile_error_culprit_is_the_first_patch_that_broke_the_file(make_series, tmp_path):
    rel = "sglang/srt/y.py"
    good, broken, still = b"X = 1\n", b"def f(:\n", b"def f(:\n# still broken\n"
    d = make_series(
        {
            "0001-del.patch": git_diff(good, None, rel, tmp_path / "a"),
            "0002-new.patch": git_diff(None, broken, rel, tmp_path / "b"),
            "0003-more.patch": git_diff(broken, still, rel, tmp_path / "c"),
        }
    )
    res = apply_series(load_series(d), lambda r: good)
    with pytest.raises(CompileError, match="introduced by 0002-new.patch"):
        compile_check(res)


def test_each_patch_must_compile_on_its_own(make_series, tmp_path):
    """A syntax error one patch introduces and a later patch repairs is still an error of the
    first (the series is reviewed, bisected and cherry-picked patch by patch)."""
    base = b"def f():\n    return 1\n"
    broken = b"def f():\n    return (1\n"
    fixed = b"def f():\n    return (1)\n"
    d = make_series(
        {
            "0001-break.patch": git_diff(base, broken, REL, tmp_path / "d1"),
            "0002-repair.patch": git_diff(broken, fixed, REL, tmp_path / "d2"),
        }
    )
    res = apply_series(load_series(d), lambda rel: base)
    assert res.files[REL].result == fixed
    compile(fixed, REL, "exec")  # the final file is fine
    with pytest.raises(CompileError) as ei:
        compile_check(res)
    assert ei.value.details["patch"] == "0001-break.patch"
    assert "later patch repairs it" in ei.value.message
