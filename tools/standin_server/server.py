#!/usr/bin/env python3
"""A STAND-IN for an SGLang server, for testing ``ddtree-deploy bench`` without a GPU.

This is NOT SGLang. It serves the offline reference engine (``ddtree_offline.engine.OfflineEngine``
over a tiny random-weight target model and the synthetic drafter, all on the CPU) behind the two
SGLang native endpoints the bench uses, with SGLang's field names:

* ``GET /health`` -> 200 once the model is built (the socket only opens then).
* ``POST /generate`` with ``{"text" | "input_ids", "sampling_params": {"max_new_tokens",
  "temperature", "sampling_seed"}}`` -> ``{"text", "output_ids", "meta_info"}``. ``meta_info`` has
  SGLang's ``id``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
  ``e2e_latency`` and, for the speculative methods, the fields of SGLang 0.5.23's
  ``TokenizerManager._calculate_spec_decoding_metrics``: ``spec_verify_ct``,
  ``spec_accept_length`` (= completion_tokens / spec_verify_ct), ``spec_accept_rate``,
  ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``, ``spec_correct_drafts_histogram``
  (index = accepted draft tokens per step). For ``--method ddtree`` it adds the per-step debug
  metrics the DDTree patch reports with ``--speculative-ddtree-debug-metrics`` (through SGLang's
  ``customized_info``): ``ddtree_accept_length`` (tau, bonus included),
  ``ddtree_predicted_accept_length`` (expected tau), ``ddtree_tree_size``, ``ddtree_tree_depth``
  (off with ``--no-debug-metrics``).
* ``GET /server_info`` -> a few SGLang ``server_info`` keys (``speculative_algorithm``,
  ``speculative_ddtree_budget``, ...) plus ``"standin": true``.

There is no tokenizer: ``text`` is encoded as its UTF-8 bytes modulo the vocabulary and output
text is the ids as ``<id>``. ``--plant-divergence`` corrupts one output token (position
``--plant-position``, optionally only for prompts whose first token is ``--plant-first-token``)
so that ``ddtree-deploy compare`` has something to catch.

It binds 127.0.0.1 only, and stops by itself: after ``--max-lifetime`` seconds, or as soon as
its parent process is gone.

    python tools/standin_server/server.py --port 30100 --method ddtree --budget 64 --drafter-quality 0.8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# ddtree_offline and ddtree_deploy are installed (pip install -e .) or on PYTHONPATH (tools/ and deploy/: the bench tests).
ALGORITHM = {"target": None, "dflash": "DFLASH", "ddtree": "DDTREE"}


class StandIn:
    """The engine plus what the HTTP layer needs; one request at a time through a lock."""

    def __init__(self, args: argparse.Namespace):
        import torch

        from ddtree_offline.engine import OfflineEngine
        from ddtree_offline.models import SyntheticDrafter, tiny_target

        torch.set_num_threads(max(1, args.threads))
        self.args = args
        self.target = tiny_target(seed=args.model_seed, vocab=args.vocab)
        quality = (
            [float(q) for q in args.drafter_quality.split(",")] if "," in args.drafter_quality else float(args.drafter_quality)
        )
        self.drafter = SyntheticDrafter(self.target, quality=quality, seed=args.drafter_seed)
        self.engine = OfflineEngine(self.target, self.drafter, block_size=args.block_size, device="cpu")
        self.vocab = int(args.vocab)
        self.lock = threading.Lock()
        # warm-up, so the first request's latency is not the import of the core
        self.engine.generate([1, 2, 3], method=args.method, budget=args.budget, topk_cap=args.topk_cap, max_new_tokens=2)

    def encode_text(self, text: str) -> list[int]:
        ids = [b % self.vocab for b in text.encode("utf-8")]
        return ids or [0]

    def generate(self, input_ids: list[int], sp: dict[str, Any]) -> dict[str, Any]:
        from ddtree_offline.engine import generated_tokens

        a = self.args
        max_new = int(sp.get("max_new_tokens", 128))
        temperature = float(sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0)
        seed = int(sp.get("sampling_seed") or 0)
        t0 = time.perf_counter()
        with self.lock:
            rec = self.engine.generate(
                input_ids,
                method=a.method,
                budget=a.budget,
                topk_cap=a.topk_cap,
                max_new_tokens=max_new,
                temperature=temperature,
                seed=seed,
            )
        out = generated_tokens(rec)
        if a.plant_divergence and len(out) > a.plant_position:
            if a.plant_first_token is None or (input_ids and input_ids[0] == a.plant_first_token):
                out[a.plant_position] = (out[a.plant_position] + 1) % self.vocab
        n = len(out)
        mi: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": max_new}
            if n >= max_new
            else {"type": "stop", "matched": out[-1] if out else None},
            "prompt_tokens": len(input_ids),
            "weight_version": "standin",
            "completion_tokens": n,
            "cached_tokens": 0,
        }
        als = [int(x) for x in rec.get("acceptance_lengths") or []]
        if a.method != "target" and als:
            verify_ct = len(als)
            num_draft_tokens = a.block_size if a.method == "dflash" else a.budget + 1
            correct = sum(x - 1 for x in als)
            proposed = verify_ct * (num_draft_tokens - 1)
            hist = [0] * (max(als))
            for x in als:
                hist[x - 1] += 1
            mi.update(
                spec_accept_rate=correct / proposed if proposed else 0.0,
                spec_accept_length=n / verify_ct,
                spec_num_correct_drafts=correct,
                spec_num_proposed_drafts=proposed,
                spec_verify_ct=verify_ct,
                spec_correct_drafts_histogram=hist,
            )
            if a.method == "ddtree" and a.debug_metrics:
                # The DDTree patch's per-step lists (customized_info -> meta_info), one entry per
                # verify step: tau (bonus included), expected tau, draft nodes, deepest node.
                mi["ddtree_accept_length"] = als
                mi["ddtree_predicted_accept_length"] = [round(float(p), 4) for p in rec.get("predicted_acceptance") or []]
                mi["ddtree_tree_size"] = [int(x) for x in rec.get("tree_sizes") or []]
                mi["ddtree_tree_depth"] = [int(x) for x in rec.get("tree_depths") or []]
        mi["e2e_latency"] = time.perf_counter() - t0
        return {"text": "".join(f"<{t}>" for t in out), "output_ids": out, "meta_info": mi}

    def server_info(self) -> dict[str, Any]:
        a = self.args
        spec = a.method != "target"
        return {
            "standin": True,
            "model_path": f"standin:tiny-random(vocab={a.vocab},seed={a.model_seed})",
            "speculative_algorithm": ALGORITHM[a.method],
            "speculative_draft_model_path": f"standin:synthetic(quality={a.drafter_quality})" if spec else None,
            "speculative_num_draft_tokens": (a.block_size if a.method == "dflash" else a.budget + 1) if spec else None,
            "speculative_num_steps": a.block_size - 1 if spec else None,
            "speculative_ddtree_budget": a.budget if a.method == "ddtree" else None,
            "speculative_ddtree_topk_cap": a.topk_cap if a.method == "ddtree" else None,
            "speculative_ddtree_debug_metrics": bool(a.debug_metrics) if a.method == "ddtree" else None,
            "page_size": 1,
            "tp_size": 1,
            "version": "standin",
        }


def make_handler(app: StandIn):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "ddtree-standin/1"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet unless --verbose
            if app.args.verbose:
                sys.stderr.write("standin: " + fmt % args + "\n")

        def _send(self, code: int, obj: Any | None = None) -> None:
            body = b"" if obj is None else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate", "/ready"):
                self._send(200)
            elif path in ("/server_info", "/get_server_info"):
                self._send(200, app.server_info())
            else:
                self._send(404, {"error": f"no such endpoint {path} (this is the ddtree stand-in, not SGLang)"})

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path != "/generate":
                self._send(404, {"error": f"no such endpoint {path} (this is the ddtree stand-in, not SGLang)"})
                return
            try:
                n = int(self.headers.get("Content-Length") or 0)
                if n > 16 * 1024 * 1024:
                    raise ValueError("request too large")
                req = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(req, dict):
                    raise ValueError("body must be a JSON object")
                if req.get("stream"):
                    raise ValueError("stream=true is not supported by the stand-in")
                sp = req.get("sampling_params") or {}
                if "input_ids" in req and req["input_ids"] is not None:
                    ids = req["input_ids"]
                elif isinstance(req.get("text"), (str, list)):
                    ids = (
                        [app.encode_text(t) for t in req["text"]]
                        if isinstance(req["text"], list)
                        else app.encode_text(req["text"])
                    )
                else:
                    raise ValueError("give text or input_ids")
                batch = bool(ids) and isinstance(ids[0], list)
                prompts = ids if batch else [ids]
                for p in prompts:
                    if not p or not all(isinstance(t, int) and 0 <= t < app.vocab for t in p):
                        raise ValueError(f"input_ids must be non-empty lists of ints in [0, {app.vocab})")
            except (ValueError, json.JSONDecodeError) as exc:
                self._send(400, {"error": str(exc)})
                return
            try:
                outs = [app.generate(p, sp) for p in prompts]
            except Exception as exc:  # report, keep serving
                self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
                return
            self._send(200, outs if batch else outs[0])

    return Handler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Stand-in for an SGLang server (offline DDTree engine, tiny random model, CPU).")
    ap.add_argument("--port", type=int, default=30100)  # not 30000: SGLang's default, usually production's
    ap.add_argument("--method", choices=("target", "baseline", "dflash", "ddtree"), default="ddtree")
    ap.add_argument(
        "--budget",
        type=lambda v: int(v) if v.strip() else 64,
        default=64,
        help="tree budget (ddtree); an empty value means the default, so one template serves all methods",
    )
    ap.add_argument("--topk-cap", type=int, default=None)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--drafter-quality", default="0.8", help="q, or a comma-separated per-depth list")
    ap.add_argument("--drafter-seed", type=int, default=0)
    ap.add_argument("--model-seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--no-debug-metrics", dest="debug_metrics", action="store_false")
    ap.add_argument("--plant-divergence", action="store_true", help="corrupt one output token per (matching) request")
    ap.add_argument("--plant-position", type=int, default=5)
    ap.add_argument("--plant-first-token", type=int, default=None, help="only prompts whose first token is this id")
    ap.add_argument("--max-lifetime", type=float, default=1800.0, help="seconds; then the server exits by itself")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.method == "baseline":
        a.method = "target"
    if a.budget < 1:
        ap.error("--budget must be >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parent = os.getppid()
    app = StandIn(args)
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(app))
    httpd.daemon_threads = True
    deadline = time.monotonic() + args.max_lifetime

    def watchdog() -> None:
        while True:
            time.sleep(0.5)
            if time.monotonic() > deadline or os.getppid() != parent:
                httpd.shutdown()
                return

    threading.Thread(target=watchdog, daemon=True).start()
    sys.stderr.write(
        f"standin (NOT SGLang): method={args.method} budget={args.budget} quality={args.drafter_quality} "
        f"listening on http://127.0.0.1:{httpd.server_address[1]}\n"
    )
    sys.stderr.flush()
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
