"""The H200 harness's shims (tools/sglang_h200), checked on this CPU machine.

* every shimmed ``sgl_kernel`` op against its independent torch reference (tools/sglang_h200/check_ops.py,
  the same script the H200 run executes on the GPU);
* with a CUDA sm90 device reported to SGLang's platform checks (``H200_FAKE_CUDA=1``, the harness's
  sitecustomize; CPU only), every module a Qwen3 + DFlash/DDTree engine loads on CUDA imports from the
  REAL patched sglang tree with the shims, and the shim raises naming itself for what it lacks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tools" / "sglang_h200"


def _env(site: Path | None = None) -> dict:
    env = dict(os.environ)
    paths = [str(HARNESS / "shims"), str(HARNESS)] + ([str(site)] if site else [])
    env.update(PYTHONPATH=os.pathsep.join(paths), CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def test_shimmed_ops_match_torch_references():
    proc = subprocess.run([sys.executable, str(HARNESS / "check_ops.py"), "--device", "cpu"],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "failed 0" in proc.stdout
    names = {ln.split()[1].split("[")[0].split("(")[0] for ln in proc.stdout.splitlines() if ln.startswith("CHECK ")}
    # The shim sgl_kernel is imported in a child with the harness's PYTHONPATH, never into this
    # process: no sys.path edit here, and no shim left in sys.modules for a later `import sgl_kernel`.
    listed = subprocess.run(
        [sys.executable, "-c", "import json; from sgl_kernel._ops import SHIMMED; print(json.dumps(sorted(SHIMMED)))"],
        capture_output=True, text=True, timeout=120, env=_env())
    assert listed.returncode == 0, listed.stderr[-2000:]
    SHIMMED = json.loads(listed.stdout.strip().splitlines()[-1])
    assert SHIMMED, "the shim lists no ops"
    assert set(SHIMMED) <= names, f"shimmed ops without a check: {set(SHIMMED) - names}"


@pytest.fixture(scope="module")
def site():
    from ddtree_deploy.build.overlay import patched_site

    return patched_site()


def test_cuda_import_chain_with_shims(site, tmp_path):
    log = tmp_path / "shims.log"
    env = _env(site)
    env.update(H200_FAKE_CUDA="1", H200_SHIM_LOG=str(log))
    proc = subprocess.run([sys.executable, str(HARNESS / "import_chain.py")], capture_output=True,
                          text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ok   ") >= 14
    # the CUDA branches were taken and bound the shim's ops (import_chain.BINDINGS)
    assert proc.stdout.count("ok   binding ") >= 5, proc.stdout
    assert "absent sgl_kernel.scalar_type" in log.read_text()  # SGLang's own ImportError fallback ran


def test_unknown_names_raise_naming_themselves(tmp_path):
    code = ("import sgl_kernel\n"
            "from sgl_kernel import merge_state_v2\n"
            "from sgl_kernel.kvcacheio import transfer_kv_all_layer\n"
            "for f in (merge_state_v2, transfer_kv_all_layer):\n"
            "    try:\n        f(1)\n    except NotImplementedError as e:\n        print('RAISED', e)\n"
            "try:\n    import sgl_kernel.scalar_type\nexcept ImportError as e:\n    print('IMPORTERROR', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "RAISED sgl_kernel.merge_state_v2 is not shimmed" in proc.stdout
    assert "RAISED sgl_kernel.kvcacheio.transfer_kv_all_layer is not shimmed" in proc.stdout
    assert "IMPORTERROR" in proc.stdout


_EMBEDS_CODE = """
import json, torch
from types import SimpleNamespace
from sglang.srt.model_executor.model_runner import ModelRunner
mr = ModelRunner.__new__(ModelRunner)  # the real class; only the attributes the method reads
mr.support_pp, mr.is_generation = False, True
res = {}
for name in ("float32", "bfloat16"):
    dt = getattr(torch, name)
    mr.dtype = dt
    emb = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(dt)
    fb = SimpleNamespace(input_embeds=emb, replace_embeds=None, replace_positions=None)
    got = ModelRunner._extend_forward_kwargs(mr, fb, None)["input_embeds"]
    try:  # what the float32 drafter's first projection (srt/models/dflash.py:380) does with it
        torch.nn.functional.linear(got, torch.zeros(8, 8, dtype=dt))
        err = None
    except RuntimeError as e:
        err = str(e)
    res[name] = [str(got.dtype), bool(torch.equal(got.float(), emb.float())), err]
print("EMBEDS", json.dumps(res))
"""


def _embeds(site: Path, **extra) -> dict:
    env = _env(site)
    env.update(extra)
    proc = subprocess.run([sys.executable, "-c", _EMBEDS_CODE], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("EMBEDS ")][-1]
    return json.loads(line[len("EMBEDS "):])


def test_float32_runner_keeps_float32_input_embeds(site):
    """SGLang's eager extend casts input_embeds to bf16 (model_runner.py:1772): a float32 DFlash drafter
    fed the target's embeddings then dies at dflash.py:380 (bench/engine-h200, run 3). The harness's
    shim 4 passes embeds already in the runner's dtype through; a bf16 runner is unchanged."""
    got = _embeds(site)
    assert got["float32"] == ["torch.float32", True, None], got
    assert got["bfloat16"] == ["torch.bfloat16", True, None], got


def test_without_the_shim_sglang_casts_to_bf16(site):
    """The same call with the shim off (H200_KEEP_BF16_EMBEDS=1): SGLang's own behaviour, the H200 error."""
    got = _embeds(site, H200_KEEP_BF16_EMBEDS="1")
    dtype, _, err = got["float32"]
    assert dtype == "torch.bfloat16", got
    # CPU says "m1 and m2", CUDA "mat1 and mat2" (the H200 message)
    assert err and re.search(r"expected (m|mat)1 and (m|mat)2 to have the same dtype", err), got
    assert "BFloat16 != float" in err, got


def test_builder_timing_probe_wraps_the_ddtree_worker(site, tmp_path):
    """Shim 3 (H200_TIME_BUILDER): importing the patched worker wraps its tree build and decode step."""
    env = _env(site)
    env.update(H200_FAKE_CUDA="1", H200_TIME_BUILDER=str(tmp_path / "probe.txt"))
    code = ("from sglang.srt.speculative.ddtree_worker_v2 import DDTreeWorkerV2 as W\n"
            "print('WRAPPED', W._build_ddtree.__name__, W._forward_ddtree_decode.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "WRAPPED _build _decode" in proc.stdout, proc.stdout[-2000:]


_CHUNK_CHECK = r"""
import json, torch
from h200_shims.sampling_renorm import row_chunked, top_k_renorm_prob
calls = []
def ref_top_k(probs, k):  # a per-row torch top-k renorm: the rows are independent
    calls.append(probs.shape[0])
    k = k.reshape(-1).expand(probs.shape[0]) if isinstance(k, torch.Tensor) else torch.full((probs.shape[0],), k)
    out = torch.zeros_like(probs, dtype=torch.float32)
    for i in range(probs.shape[0]):
        v, ix = probs[i].float().topk(int(k[i]))
        out[i, ix] = v / v.sum()
    return out
g = torch.Generator().manual_seed(0)
probs = torch.softmax(torch.randn(10, 40, generator=g), -1)
ks = torch.randint(1, 40, (10,), generator=g)
res = {}
whole = ref_top_k(probs, ks)
calls.clear()
res["per_row"] = torch.equal(row_chunked(ref_top_k)(probs, ks, rows=3), whole)
res["per_row_calls"] = list(calls)
calls.clear()
res["scalar"] = torch.equal(row_chunked(ref_top_k)(probs, 5, rows=4), ref_top_k(probs, 5))
calls.clear()
try:  # a param of the wrong length reaches the op unchunked (its own error, not a silent slice)
    row_chunked(ref_top_k)(probs, ks[:7], rows=3)
    res["bad_len"] = "no error"
except RuntimeError as e:
    res["bad_len"] = "raised"
res["bad_len_calls"] = list(calls)
res["bound"] = getattr(top_k_renorm_prob, "__wrapped__").__name__
print("RES " + json.dumps(res))
"""


def test_renorm_shim_runs_row_chunks_with_per_row_params(site):
    """The renorm shim (h200_shims/sampling_renorm.py) applies SGLang's Triton renorm a bounded
    number of rows at a time (its whole-row sort ran out of memory in DDTREE's B 256 x 32 start-up
    rehearsal on the H200): the chunked result equals the whole-matrix result, each chunk gets its own
    rows' parameters, and a mismatched parameter reaches the op unchunked."""
    proc = subprocess.run([sys.executable, "-c", _CHUNK_CHECK], capture_output=True, text=True,
                          timeout=300, env=_env(site))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(proc.stdout.split("RES ", 1)[1])
    assert res["per_row"] is True and res["per_row_calls"] == [3, 3, 3, 1], res
    assert res["scalar"] is True, res
    assert res["bad_len"] == "raised" and res["bad_len_calls"] == [10], res
    assert res["bound"] == "top_k_renorm_probs_triton", res
