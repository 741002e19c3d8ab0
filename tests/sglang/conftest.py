"""Fixtures for the SGLang integration tests (CPU, SGLang's real import dependencies).

The patched tree comes from ``ddtree_deploy.build.overlay.patched_site()`` (the pinned snapshot with
the repo's series applied by the project's own engine). While the pin does not yet record every
file the series touches (`ddtree-deploy snapshot pin` not re-run), the repo series is refused by
the pin-coverage check; the fixture then builds the same series from a copy of the series dir
(which only gets drift checks) and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SERIES = REPO / "patches" / "sglang-0.5.23"

pytestmark = pytest.mark.sglang_deps


def _sglang_deps_missing() -> str | None:
    for mod in ("torch", "torchvision", "transformers", "orjson", "msgspec", "pybase64", "zmq"):
        try:
            __import__(mod)
        except Exception as e:  # noqa: BLE001
            return f"{mod}: {e}"
    return None


@pytest.fixture(scope="session")
def patched_site(tmp_path_factory) -> Path:
    missing = _sglang_deps_missing()
    if missing:
        pytest.skip(f"SGLang import dependencies missing ({missing}); see docs/sglang-integration.md")
    from ddtree_deploy.build import overlay

    return overlay.patched_site()


@pytest.fixture(scope="session")
def model_fixtures(tmp_path_factory) -> Path:
    """config.json-only model dirs: a dense Qwen3 target, a hybrid Qwen3-Next target and a
    DFlash drafter with block_size 16 (no weights: argument resolution reads configs only)."""
    root = tmp_path_factory.mktemp("models")
    base = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0,
                torch_dtype="bfloat16", tie_word_embeddings=False)
    cfgs = {
        "target": dict(base, architectures=["Qwen3ForCausalLM"], model_type="qwen3"),
        "draft": dict(base, architectures=["DFlashDraftModel"], model_type="qwen3",
                      num_hidden_layers=1, block_size=16, num_target_layers=2,
                      dflash_config={"mask_token_id": 1000, "target_layer_ids": [0, 1]}),
        "hybrid": dict(base, architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next",
                       num_hidden_layers=4, full_attention_interval=4, linear_num_value_heads=4,
                       linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                       linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32,
                       decoder_sparse_step=1,
                       layer_types=["linear_attention"] * 3 + ["full_attention"]),
    }
    for name, cfg in cfgs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.fixture(scope="session")
def harness():
    return run_harness


def run_harness(site: Path, script: str, *args: str, timeout: int = 240) -> dict:
    """Run tests/sglang/<script> under PYTHONPATH=site (offline); return its REPORT json."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(site)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore",
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(site))
    for line in proc.stdout.splitlines():
        if line.startswith("REPORT "):
            return json.loads(line[len("REPORT "):])
    raise AssertionError(f"{script} gave no report (rc={proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
