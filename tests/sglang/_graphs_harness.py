"""Full DDTREE ServerArgs resolution on a mocked CUDA platform; print one JSON report.

argv: fixtures dir, then the compute capability "major.minor" (9.0 Hopper, 10.0, 12.0).
REAL: SGLang's prepare_server_args (every resolution pass, the speculative hooks and the
series' _handle_ddtree). STOOD IN: the CUDA device, which does not exist here:
torch.cuda.is_available / get_device_capability / get_device_name / device_count / mem_get_info and
torch.version.cuda, set before sglang is imported, so is_cuda() (srt/utils/common.py:158) and
the capability checks see an sm<major><minor> GPU; and ``sgl_kernel`` (SGLang's CUDA kernel
wheel, not installable here), which modules import by name once is_cuda() is true
(e.g. quantization/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:30): every
name and submodule imports, and calling any of them raises naming itself. Argument
resolution calls none, so the code under test is unchanged.
"""

from __future__ import annotations

import json
import sys

import torch


def _stand_in_sgl_kernel() -> None:
    import importlib.abc
    import importlib.machinery
    import types

    class _Stub:
        def __init__(self, name):
            self._name = name

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Stub(f"{self._name}.{name}")

        def __call__(self, *a, **k):
            raise RuntimeError(f"sgl_kernel stand-in: {self._name} was called")

    class _Mod(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Stub(f"{self.__name__}.{name}")

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path=None, target=None):
            if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            m = _Mod(spec.name)
            m.__path__ = []
            return m

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())


def mock_cuda_platform(cap) -> None:
    """The mocked CUDA platform the harnesses resolve ServerArgs on: the sgl_kernel stand-in and one
    CUDA device of compute capability ``cap`` (9: H200, 10: B200, 12: RTX PRO 6000), H200-sized."""
    _stand_in_sgl_kernel()
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.mem_get_info = lambda *a, **k: (140 << 30, 141 << 30)  # an H200-sized card
    torch.cuda.get_device_capability = lambda *a, **k: cap
    torch.cuda.get_device_name = lambda *a, **k: {9: "NVIDIA H200", 10: "NVIDIA B200",
                                                  12: "NVIDIA RTX PRO 6000"}[cap[0]]
    import torchvision  # noqa: F401 -- its CUDA-version check runs at import: import it first

    torch.version.cuda = "13.0"


def main() -> None:
    fx, cap = sys.argv[1], tuple(int(x) for x in sys.argv[2].split("."))
    mock_cuda_platform(cap)
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.server_args import prepare_server_args

    report = {}

    def case(name, extra, algo="DDTREE"):
        argv = ["--model-path", f"{fx}/target", "--device", "cuda",
                "--speculative-algorithm", algo,
                "--speculative-draft-model-path", f"{fx}/draft",
                "--speculative-dflash-block-size", "16"] + extra
        try:
            sa = prepare_server_args(argv)
            sa.resolve_once()  # the whole resolution pipeline, as the launchers run it
            cfg = resolved_view(sa)
            cg = cfg.cuda_graph_config
            from sglang.srt.mem_cache.allocation_sizing import (
                get_req_to_token_extra_context_len,
            )
            from sglang.srt.runtime_context import create_context, use_context

            with use_context(create_context(sa, role="harness")):
                extra = get_req_to_token_extra_context_len()
            report[name] = {"row_extra": extra, "block": cfg.speculative_dflash_block_size,
                            "num_draft_tokens": cfg.speculative_num_draft_tokens,
                            "decode": str(cg.decode.backend), "prefill": str(cg.prefill.backend),
                            "disable_cuda_graph": cfg.disable_cuda_graph,
                            "attention_backend": cfg.attention_backend}
        except Exception as e:  # noqa: BLE001
            import traceback

            report[name] = {"error": f"{type(e).__name__}: {e}", "where": traceback.format_exc()[-600:]}

    case("ddtree_flashinfer", ["--attention-backend", "flashinfer"])
    case("ddtree_triton", ["--attention-backend", "triton"])
    case("ddtree_flashinfer_eager", ["--attention-backend", "flashinfer", "--no-speculative-ddtree-cuda-graph"])
    case("ddtree_default", [])
    case("ddtree_disable_cuda_graph", ["--attention-backend", "triton", "--disable-cuda-graph"])
    case("dflash_default", [], algo="DFLASH")
    case("ddtree_b16_budget4", ["--attention-backend", "triton", "--speculative-ddtree-budget", "15"])
    print("REPORT " + json.dumps(report, default=str))


if __name__ == "__main__":
    main()
