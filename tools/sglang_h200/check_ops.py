"""Check every shimmed ``sgl_kernel`` op against an independent torch reference.

Runs on the H200 (``--device cuda``, bf16 and fp32, decode-like shapes) and on a CPU here
(tests/h200_harness). References are written differently from the shims on purpose
(``torch.nn.functional.rms_norm``, sigmoid/erf formulas, per-row numpy loops for the renorms), so a
wrong shim cannot agree with its reference by sharing its code. Exit 1 on any mismatch; one
``CHECK name dtype ok|FAIL maxerr`` line per check, then ``CHECKS <n> passed <m> failed``.
"""

from __future__ import annotations

import argparse
import sys

# The shims (`shims/`) come first on PYTHONPATH: h200.sh and tests/h200_harness put them there.
import numpy as np
import sgl_kernel
import torch
import torch.nn.functional as F
from sgl_kernel.utils import is_arch_support_pdl

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _ref_rms(x, w, eps, gemma=False):
    w = (1.0 + w.float()) if gemma else w.float()
    return F.rms_norm(x.double(), (x.shape[-1],), eps=eps).float() * w


def _close(name, dtype, got, want, results):
    got, want = got.float().cpu(), want.float().cpu()  # the references may live on either device
    err = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
    ok = err <= TOL[dtype]
    results.append(ok)
    print(f"CHECK {name} {str(dtype).replace('torch.', '')} {'ok' if ok else 'FAIL'} {err:.2e}", flush=True)


def check(device: str) -> int:
    g = torch.Generator(device="cpu").manual_seed(0)
    res: list[bool] = []
    dtypes = [torch.float32, torch.bfloat16] if device != "cpu" else [torch.float32, torch.bfloat16]
    for dtype in dtypes:
        for tokens, hidden in ((1, 4096), (33, 4096), (7, 128), (256, 64)):
            x = torch.randn(tokens, hidden, generator=g).to(device, dtype)
            r = torch.randn(tokens, hidden, generator=g).to(device, dtype)
            w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
            eps = 1e-6
            tag = f"[{tokens}x{hidden}]"
            _close("rmsnorm" + tag, dtype, sgl_kernel.rmsnorm(x, w, eps), _ref_rms(x, w, eps), res)
            out = torch.empty_like(x)
            sgl_kernel.rmsnorm(x, w, eps, out=out)
            _close("rmsnorm(out=)" + tag, dtype, out, _ref_rms(x, w, eps), res)
            _close("gemma_rmsnorm" + tag, dtype, sgl_kernel.gemma_rmsnorm(x, w, eps), _ref_rms(x, w, eps, gemma=True), res)
            for fn, gemma in (("fused_add_rmsnorm", False), ("gemma_fused_add_rmsnorm", True)):
                xi, ri = x.clone(), r.clone()
                getattr(sgl_kernel, fn)(xi, ri, w, eps)
                s = x.double() + r.double()
                _close(fn + "(residual)" + tag, dtype, ri, s, res)
                _close(fn + "(out)" + tag, dtype, xi, _ref_rms(s, w, eps, gemma=gemma), res)
            xx = torch.randn(tokens, 2 * hidden, generator=g).to(device, dtype)
            a, b = xx.double().chunk(2, dim=-1)
            _close("silu_and_mul" + tag, dtype, sgl_kernel.silu_and_mul(xx), a * torch.sigmoid(a) * b, res)
            o2 = torch.empty(tokens, hidden, device=device, dtype=dtype)
            sgl_kernel.silu_and_mul(xx, o2)
            _close("silu_and_mul(out)" + tag, dtype, o2, a * torch.sigmoid(a) * b, res)
            _close("gelu_and_mul" + tag, dtype, sgl_kernel.gelu_and_mul(xx), 0.5 * a * (1 + torch.erf(a / 2**0.5)) * b, res)
            _close(
                "gelu_tanh_and_mul" + tag,
                dtype,
                sgl_kernel.gelu_tanh_and_mul(xx),
                0.5 * a * (1 + torch.tanh((2 / np.pi) ** 0.5 * (a + 0.044715 * a**3))) * b,
                res,
            )
    # renorms (fp32 probabilities, as the sampler passes them)
    probs = torch.softmax(torch.randn(6, 50, generator=g) * 3, -1)
    ks = torch.tensor([1, 2, 5, 10, 50, 3])
    ps = torch.tensor([0.1, 0.5, 0.9, 1.0, 0.3, 0.75])
    want_k, want_p = np.zeros((6, 50)), np.zeros((6, 50))
    pn = probs.double().numpy()
    for i in range(6):
        order = np.argsort(-pn[i], kind="stable")
        keep = order[: int(ks[i])]
        want_k[i, keep] = pn[i, keep] / pn[i, keep].sum()
        csum, kept = 0.0, []
        for j in order:
            if csum >= float(ps[i]):
                break
            kept.append(j)
            csum += pn[i, j]
        want_p[i, kept] = pn[i, kept] / pn[i, kept].sum()
    _close(
        "top_k_renorm_prob",
        torch.float32,
        sgl_kernel.top_k_renorm_prob(probs.to(device), ks.to(device)),
        torch.from_numpy(want_k),
        res,
    )
    _close(
        "top_p_renorm_prob",
        torch.float32,
        sgl_kernel.top_p_renorm_prob(probs.to(device), ps.to(device)),
        torch.from_numpy(want_p),
        res,
    )
    if device != "cpu":  # the renorm redirect (sitecustomize): SGLang's own Triton renorm, compiled for real
        from sglang.kernels.ops.sampling import renorm

        _close(
            "renorm.top_k_renorm_prob(triton)",
            torch.float32,
            renorm.top_k_renorm_prob(probs.to(device), ks.to(device)),
            torch.from_numpy(want_k),
            res,
        )
        _close(
            "renorm.top_p_renorm_prob(triton)",
            torch.float32,
            renorm.top_p_renorm_prob(probs.to(device), ps.to(device)),
            torch.from_numpy(want_p),
            res,
        )
        # the shim's row chunks (4 rows of 6 at a time): the same result row for row
        _close(
            "renorm.top_k_renorm_prob(triton,4rows)",
            torch.float32,
            renorm.top_k_renorm_prob(probs.to(device), ks.to(device), rows=4),
            torch.from_numpy(want_k),
            res,
        )
        _close(
            "renorm.top_p_renorm_prob(triton,4rows)",
            torch.float32,
            renorm.top_p_renorm_prob(probs.to(device), ps.to(device), rows=4),
            torch.from_numpy(want_p),
            res,
        )
    t = torch.randn(4, device=device)
    ok = sgl_kernel.weak_ref_tensor(t).data_ptr() == t.data_ptr()
    res.append(ok)
    print(f"CHECK weak_ref_tensor aliases {'ok' if ok else 'FAIL'}")
    ok = is_arch_support_pdl() is False
    res.append(ok)
    print(f"CHECK utils.is_arch_support_pdl False {'ok' if ok else 'FAIL'}")
    try:
        sgl_kernel.some_op_nobody_shimmed(1)
        ok = False
    except NotImplementedError as exc:
        ok = "sgl_kernel.some_op_nobody_shimmed" in str(exc)
    res.append(ok)
    print(f"CHECK unknown name raises naming itself {'ok' if ok else 'FAIL'}")
    if device != "cpu":  # the shimmed ops are captured and replayed by CUDA graphs like any torch op
        x = torch.randn(8, 4096, device=device, dtype=torch.bfloat16)
        w = torch.ones(4096, device=device, dtype=torch.bfloat16)
        out = torch.empty_like(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            sgl_kernel.rmsnorm(x, w, 1e-6, out=out)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            sgl_kernel.rmsnorm(x, w, 1e-6, out=out)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        _close("rmsnorm(cuda graph replay)", torch.bfloat16, out, _ref_rms(x, w, 1e-6), res)
    failed = res.count(False)
    print(f"CHECKS {len(res)} passed {len(res) - failed} failed {failed}", flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return check(ap.parse_args(argv).device)


if __name__ == "__main__":
    sys.exit(main())
