"""``ddtree-deploy bench``: a tree-budget sweep against SGLang servers through the native API.

For each run (the reference runs ``baseline`` = autoregressive and ``dflash`` = linear DFlash,
then one ``ddtree_tb{B}`` per budget) the bench

1. gets a server: it runs the host's server command template (``{budget}``, ``{port}``,
   ``{method}``, ``{kind}``, ``{algorithm}`` filled in) and waits for ``GET /health`` (bounded);
   a command that keeps running is the server itself and is stopped after the run (its whole
   process group); a command that exits 0 is a restart command (``systemctl restart ...``) and the
   bench just waits for health. Without a command it uses the run's URL as is (one server per
   port: ``--base-url ddtree_tb64=http://127.0.0.1:30064``, or one URL for everything);
2. sends every prompt through ``POST /generate`` (``{"input_ids" | "text", "sampling_params":
   {"max_new_tokens", "temperature"}}``) with at most ``concurrency`` requests in flight;
3. records per request the output ids, SGLang's speculative stats from ``meta_info``
   (``spec_verify_ct``, ``spec_accept_length``, ``spec_correct_drafts_histogram``, ...) and our
   per-step debug metrics (``ddtree_accept_length``, ``ddtree_predicted_accept_length``,
   ``ddtree_tree_size``, ``ddtree_tree_depth``; see :func:`ddtree_debug`) as run records
   (``records.RunRecord``, the contract's JSONL).

It writes ``runs.jsonl``, ``summary.json``, ``sweep.png`` and one ``server-<method>.log`` per
launched server into the output directory, and prints a rich table on stderr.

TPOT here is measured by the client: request latency / output tokens (prefill and queueing
included); tokens/s is the output tokens of a (dataset, run) over its wall time.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ddtree_deploy.errors import HostRefusedError, RemoteError, UsageError
from ddtree_deploy.measure.datasets import ChatRenderer, Instance, load_prompts
from ddtree_deploy.measure.records import (
    METHOD_BASELINE,
    METHOD_DFLASH,
    RunRecord,
    ddtree_method,
    write_jsonl,
)

if TYPE_CHECKING:
    from rich.console import Console

KINDS = ("baseline", "dflash", "ddtree")
ALGORITHM = {"baseline": "", "dflash": "DFLASH", "ddtree": "DDTREE"}
# No default port: SGLang's own default (30000) is usually the production server's. A server command's
# {port} comes from the run's URL, which must name one.
EXAMPLE_PORT = 30100


class BenchServerError(RemoteError):
    """A benchmark server did not start, did not become healthy, or answered badly."""


@dataclass
class RunSpec:
    method: str
    kind: str
    budget: int | None

    @staticmethod
    def for_budget(b: int) -> "RunSpec":
        return RunSpec(ddtree_method(b), "ddtree", int(b))

    @staticmethod
    def reference(kind: str) -> "RunSpec":
        if kind not in (METHOD_BASELINE, METHOD_DFLASH):
            raise UsageError(f"--reference-runs: unknown run {kind!r} (baseline, dflash)")
        return RunSpec(kind, kind, None)


@dataclass
class BenchTarget:
    name: str
    base_url: str | None = None
    urls: dict[str, str] = field(default_factory=dict)  # key (method | budget | kind) -> URL
    commands: dict[str, str] = field(default_factory=dict)  # "" (generic) | kind -> template


@dataclass
class BenchConfig:
    budgets: list[int]
    datasets: list[str]
    out_dir: Path
    concurrency: int = 1
    num_prompts: int | None = 16
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int | None = None  # T > 0: sampling_seed = seed + prompt_index when set
    reference_runs: list[str] = field(default_factory=lambda: ["baseline", "dflash"])
    tokenizer: str | None = None
    health_timeout_s: float = 900.0
    request_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0
    use_running_server: bool = False  # measure servers bench did not start (never by default)


# --- inventory --------------------------------------------------------------------------------


def _read_inventory_raw(path: str | None) -> dict[str, Any]:
    """The hosts table of the inventory (``--inventory``, ``$DDTREE_DEPLOY_INVENTORY``, ``deploy/hosts.toml``)."""
    from ddtree_deploy.remote.inventory import load_inventory

    inv = load_inventory(path) if path else load_inventory()
    return {name: dict(h.raw) for name, h in inv.hosts.items()}


def resolve_target(host: str, inventory: str | None = None) -> BenchTarget:
    if re.match(r"^https?://", host):
        return BenchTarget(name=host, base_url=host.rstrip("/"))
    hosts = _read_inventory_raw(inventory)
    if host not in hosts:
        raise UsageError(f"unknown host {host!r} (inventory has: {', '.join(sorted(hosts)) or 'none'})")
    bench = (hosts[host] or {}).get("bench") or {}
    if not isinstance(bench, dict):
        raise UsageError(f"[hosts.{host}.bench] must be a table")
    t = BenchTarget(name=host, base_url=bench.get("base_url"))
    if bench.get("server_command"):
        t.commands[""] = str(bench["server_command"])
    for kind in KINDS:
        if bench.get(f"server_command_{kind}"):
            t.commands[kind] = str(bench[f"server_command_{kind}"])
    for k, v in (bench.get("urls") or {}).items():
        t.urls[str(k)] = str(v)
    if not t.base_url and not t.urls:  # never the host's health_url: that is its (production) service
        raise UsageError(
            f"host {host!r} has no [hosts.{host}.bench] base_url",
            hint=f'add base_url = "http://127.0.0.1:{EXAMPLE_PORT}" (a port no other server uses) under '
            f"[hosts.{host}.bench], or pass --base-url",
        )
    return t


def run_url(target: BenchTarget, spec: RunSpec) -> str:
    for key in (spec.method, str(spec.budget) if spec.budget is not None else None, spec.kind):
        if key is not None and key in target.urls:
            return target.urls[key].rstrip("/")
    if not target.base_url:
        raise UsageError(f"no URL for run {spec.method}: give --base-url URL or --base-url {spec.method}=URL")
    return _fill(target.base_url, spec, port=None).rstrip("/")


def _fill(template: str, spec: RunSpec, port: int | None) -> str:
    values = {
        "budget": "" if spec.budget is None else str(spec.budget),
        "method": spec.method,
        "kind": spec.kind,
        "algorithm": ALGORITHM[spec.kind],
        "port": "" if port is None else str(port),
    }

    def sub(m: re.Match[str]) -> str:
        k = m.group(1)
        if k not in values:
            raise UsageError(f"unknown placeholder {{{k}}} in {template!r} (use budget, port, method, kind, algorithm)")
        return values[k]

    return re.sub(r"\{(\w+)\}", sub, template)


def run_command(target: BenchTarget, spec: RunSpec, url: str) -> str | None:
    """The shell command that brings up this run's server, or ``None`` (use the URL as is)."""
    tpl = target.commands.get(spec.kind)
    if tpl is None:
        tpl = target.commands.get("")
        if tpl is None:
            return None
        if spec.kind != "ddtree" and not re.search(r"\{(method|kind|algorithm)\}", tpl):
            raise UsageError(
                f"the server command template has no {{method}}/{{kind}}/{{algorithm}} placeholder, "
                f"so it cannot start a {spec.kind} server",
                hint=f"add server_command_{spec.kind} (inventory) / --server-command-{spec.kind}, "
                "or drop it from --reference-runs",
            )
    port = urllib.parse.urlparse(url).port
    if port is None and "{port}" in tpl:
        raise UsageError(
            f"the run URL {url} names no port for the server command's {{port}} (there is no default: "
            "SGLang's own, 30000, is usually the production server's)",
            hint=f"give base_url / --base-url an explicit free port, e.g. http://127.0.0.1:{EXAMPLE_PORT}",
        )
    return _fill(tpl, spec, port=port)


def port_answers(url: str, timeout: float = 1.0) -> bool:
    """Whether something already accepts connections on the URL's host and port."""
    import socket

    u = urllib.parse.urlparse(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def refuse_if_port_answers(url: str, what: str) -> None:
    """Before starting a server: nothing may answer on its port yet (it could be production, and the
    bench would measure it, or restart it)."""
    if port_answers(url):
        raise HostRefusedError(
            f"refusing to start the {what} server: {url} already answers (a server bench did not start; "
            "production, or one left running); nothing was started or measured",
            hint=f"stop that server, or use a free port in base_url / --base-url (e.g. http://127.0.0.1:{EXAMPLE_PORT}); "
            "to measure a running server as it is, pass --use-running-server without a server command",
            details={"url": url},
        )


# --- servers ----------------------------------------------------------------------------------


def http_get(url: str, timeout: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method="GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() or b""


def http_post_json(url: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    data = json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        raise BenchServerError(f"POST {url}: HTTP {exc.code}: {(exc.read() or b'')[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        raise BenchServerError(f"POST {url}: {exc}") from None
    try:
        out = json.loads(body)
    except json.JSONDecodeError:
        raise BenchServerError(f"POST {url}: not JSON: {body[:200]!r}") from None
    if isinstance(out, list) and len(out) == 1:  # a batch answer to a single prompt
        out = out[0]
    if not isinstance(out, dict):
        raise BenchServerError(f"POST {url}: the answer is not a JSON object: {body[:200]!r}")
    return out


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None, log_path: Path | None = None) -> float:
    """Poll ``GET url/health`` until 200; bounded by ``timeout_s``. Returns seconds waited."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            if proc.returncode != 0:
                raise BenchServerError(
                    f"server command exited with {proc.returncode} before {url}/health answered" + _log_tail(log_path)
                )
            proc = None  # a restart command (exited 0): keep waiting for the service
        try:
            code, _ = http_get(url + "/health", timeout=min(5.0, max(0.5, deadline - time.monotonic())))
            if code == 200:
                return time.monotonic() - t0
            last = f"HTTP {code}"
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        time.sleep(0.25)
    raise BenchServerError(f"{url}/health did not answer 200 within {timeout_s:.0f}s (last: {last})" + _log_tail(log_path))


def _log_tail(path: Path | None, n: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    lines = path.read_text(errors="replace").splitlines()[-n:]
    return f"\n--- last lines of {path} ---\n" + "\n".join(lines)


class ManagedServer:
    """A server brought up by a shell command; stopped (whole process group) on exit. Refuses to start
    when its port already answers (:func:`refuse_if_port_answers`)."""

    def __init__(
        self,
        command: str,
        url: str,
        log_path: Path,
        health_timeout_s: float,
        stop_timeout_s: float = 30.0,
        what: str = "benchmark",
    ):
        self.command, self.url, self.log_path = command, url, log_path
        self.health_timeout_s, self.stop_timeout_s = health_timeout_s, stop_timeout_s
        self.what = what
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_wait_s: float | None = None

    def __enter__(self) -> "ManagedServer":
        refuse_if_port_answers(self.url, self.what)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                self.command, shell=True, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        try:
            self.health_wait_s = wait_healthy(self.url, self.health_timeout_s, self.proc, self.log_path)
        except BaseException as exc:
            self.stop(grace=INTERRUPT_STOP_S if isinstance(exc, KeyboardInterrupt) else None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop(grace=INTERRUPT_STOP_S if exc and exc[0] is not None and issubclass(exc[0], KeyboardInterrupt) else None)

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM to the server's process group, then SIGKILL after ``grace`` (default: ``stop_timeout_s``;
        after Ctrl-C a short one, so the bench exits within a second)."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            for sig, wait in ((signal.SIGTERM, self.stop_timeout_s if grace is None else grace), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # what is left of its process group (the leader is gone; a child may still hold the port)
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if grace is None:  # the next run starts its server on this port: wait (bounded) until it is free
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and port_answers(self.url, timeout=0.2):
                time.sleep(0.05)


INTERRUPT_STOP_S = 0.3  # after Ctrl-C: SIGTERM, this long, then SIGKILL


def server_info(url: str) -> dict[str, Any]:
    """A few fields of SGLang's ``GET /server_info`` (best effort; {} if unavailable)."""
    keys = (
        "model_path",
        "speculative_algorithm",
        "speculative_draft_model_path",
        "speculative_num_draft_tokens",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_ddtree_budget",
        "speculative_ddtree_topk_cap",
        "speculative_ddtree_debug_metrics",
        "page_size",
        "tp_size",
        "disable_cuda_graph",
        "attention_backend",
        "version",
    )
    try:
        code, body = http_get(url + "/server_info", timeout=10)
        if code != 200:
            return {}
        info = json.loads(body)
    except Exception:
        return {}
    return {k: info[k] for k in keys if isinstance(info, dict) and k in info}


# --- requests ---------------------------------------------------------------------------------


def ddtree_debug(mi: dict[str, Any]) -> dict[str, list[float] | None]:
    """Our per-step debug metrics from a ``meta_info`` (``--speculative-ddtree-debug-metrics``).

    The DDTree patch reports them through SGLang's ``customized_info`` as top-level per-step lists
    ``ddtree_accept_length``, ``ddtree_predicted_accept_length`` (expected tau, bonus included),
    ``ddtree_tree_size``, ``ddtree_tree_depth``; a nested ``meta_info["ddtree"]`` dict with
    ``acceptance_lengths`` / ``predicted_acceptance`` / ``tree_sizes`` / ``tree_depths`` is read too.
    """
    got = mi.get("ddtree")
    nested: dict[str, Any] = got if isinstance(got, dict) else {}

    def pick(top: str, sub: str) -> list[float] | None:
        v = mi.get(top)
        if v is None:
            v = nested.get(sub)
        return list(v) if isinstance(v, (list, tuple)) else None

    return {
        "acceptance_lengths": pick("ddtree_accept_length", "acceptance_lengths"),
        "predicted": pick("ddtree_predicted_accept_length", "predicted_acceptance"),
        "tree_sizes": pick("ddtree_tree_size", "tree_sizes"),
        "tree_depths": pick("ddtree_tree_depth", "tree_depths"),
    }


def record_from_response(resp: dict[str, Any], *, dataset: str, spec: RunSpec, prompt_index: int, latency_s: float) -> RunRecord:
    ids = resp.get("output_ids")
    if not isinstance(ids, list):
        raise BenchServerError(
            f"/generate answer for {dataset} prompt {prompt_index} has no output_ids list (keys: {sorted(resp)})"
        )
    mi = dict(resp.get("meta_info") or {})
    n_out = int(mi.get("completion_tokens", len(ids)))
    al = ddtree_debug(mi)["acceptance_lengths"]
    verify_ct = mi.get("spec_verify_ct")
    tau = mi.get("spec_accept_length")
    if tau is None and al:
        tau = sum(al) / len(al)
    if tau is None and spec.kind == "baseline":
        tau = 1.0
    return RunRecord(
        dataset=dataset,
        method=spec.method,
        budget=spec.budget,
        prompt_index=prompt_index,
        output_ids=[int(t) for t in ids],
        acceptance_lengths=None if al is None else [int(round(a)) for a in al],
        accept_length_mean=None if tau is None else float(tau),
        verify_ct=None if verify_ct is None else int(verify_ct),
        num_output_tokens=n_out,
        time_per_output_token=latency_s / n_out if n_out else None,
        latency_s=latency_s,
        meta_info=mi,
    )


def run_instance(url: str, inst: Instance, spec: RunSpec, cfg: BenchConfig, renderer: ChatRenderer | None) -> list[RunRecord]:
    out: list[RunRecord] = []
    messages: list[dict[str, str]] = []
    n_turns = inst.n_turns if (inst.input_ids is not None or renderer is not None) else 1
    for t in range(n_turns):
        sp: dict[str, Any] = {"max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature}
        if cfg.temperature > 0 and cfg.seed is not None:
            sp["sampling_seed"] = cfg.seed + inst.first_prompt_index + t
        if inst.input_ids is not None:
            payload: dict[str, Any] = {"input_ids": inst.input_ids}
        elif renderer is not None:
            messages.append({"role": "user", "content": inst.turns[t]})
            payload = {"input_ids": renderer.encode(messages)}
        else:
            payload = {"text": inst.turns[t]}
        payload["sampling_params"] = sp
        t0 = time.perf_counter()
        resp = http_post_json(url + "/generate", payload, timeout=cfg.request_timeout_s)
        lat = time.perf_counter() - t0
        rec = record_from_response(resp, dataset=inst.dataset, spec=spec, prompt_index=inst.first_prompt_index + t, latency_s=lat)
        out.append(rec)
        if renderer is not None and t + 1 < n_turns:
            text = resp.get("text")
            messages.append({"role": "assistant", "content": text if isinstance(text, str) else renderer.decode(rec.output_ids)})
    return out


def run_dataset(
    url: str,
    instances: list[Instance],
    spec: RunSpec,
    cfg: BenchConfig,
    renderer: ChatRenderer | None,
    on_done: Callable[[], None] | None = None,
) -> tuple[list[RunRecord], float]:
    """All instances of one dataset through one server, ``cfg.concurrency`` at a time.

    The requests run in daemon threads and this thread waits in short steps: Ctrl-C (or a failed
    request) ends the run at once; requests still in flight are abandoned (they end with the process)."""
    records: list[RunRecord] = []
    t0 = time.perf_counter()
    todo: queue.Queue[Instance] = queue.Queue()
    for inst in instances:
        todo.put(inst)
    done: queue.Queue[tuple[list[RunRecord] | None, BaseException | None]] = queue.Queue()
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            try:
                inst = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((run_instance(url, inst, spec, cfg, renderer), None))
            except BaseException as exc:  # noqa: BLE001 (handed to the waiting thread)
                done.put((None, exc))

    for _ in range(max(1, min(cfg.concurrency, len(instances)))):
        threading.Thread(target=worker, daemon=True, name="bench-request").start()
    try:
        for _ in range(len(instances)):
            while True:
                try:
                    recs, exc = done.get(timeout=0.1)
                    break
                except queue.Empty:
                    continue
            if exc is not None:
                raise exc
            assert recs is not None
            records.extend(recs)
            if on_done:
                on_done()
    finally:
        stop.set()
    wall = time.perf_counter() - t0
    records.sort(key=lambda r: r.prompt_index)
    return records, wall


# --- summary ----------------------------------------------------------------------------------


def summarize(records: list[RunRecord], walls: dict[tuple[str, str], float]) -> list[dict[str, Any]]:
    from ddtree_deploy.measure.compare import group_tau, group_tpot, mean

    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        groups.setdefault((r.dataset, r.method), []).append(r)
    base = {ds: {r.prompt_index: r for r in recs} for (ds, m), recs in groups.items() if m == METHOD_BASELINE}
    rows = []
    for (ds, method), recs in groups.items():
        toks = sum(r.num_output_tokens for r in recs)
        wall = walls.get((ds, method))
        tpot = group_tpot(recs)
        row: dict[str, Any] = {
            "dataset": ds,
            "method": method,
            "budget": recs[0].budget,
            "n": len(recs),
            "output_tokens": toks,
            "wall_s": wall,
            "tau": group_tau(recs),
            "tokens_per_s": toks / wall if wall else None,
            "tpot_mean_s": tpot,
            "predicted_tau": mean([p for p in map(_predicted_tau, recs) if p is not None]),
            "speedup_vs_baseline": None,
            "exact_match_vs_baseline": None,
        }
        if ds in base and method != METHOD_BASELINE:
            b = base[ds]
            btpot = group_tpot(list(b.values()))
            row["speedup_vs_baseline"] = (btpot / tpot) if (btpot and tpot) else None
            common = [r for r in recs if r.prompt_index in b]
            if common:
                row["exact_match_vs_baseline"] = sum(r.output_ids == b[r.prompt_index].output_ids for r in common) / len(common)
        rows.append(row)
    from ddtree_deploy.measure.compare import _method_order

    rows.sort(key=lambda r: (r["dataset"], _method_order(r["method"])))
    return rows


def _predicted_tau(r: RunRecord) -> float | None:
    """Mean expected tau (bonus included) the trees predicted for this request, if reported."""
    p = ddtree_debug(r.meta_info or {})["predicted"]
    if p:
        return sum(float(x) for x in p) / len(p)
    return None


def render_summary(rows: list[dict[str, Any]], console: Console, title: str) -> None:
    from rich.table import Table

    from ddtree_deploy.measure.compare import wide

    console = wide(console)

    def f(x: Any, fmt: str) -> str:
        return "-" if x is None else fmt.format(x)

    t = Table(title=title)
    for col in ("dataset", "method", "budget", "n", "tau", "pred tau", "tok/s", "TPOT ms", "speedup", "== baseline"):
        t.add_column(col, justify="left" if col in ("dataset", "method") else "right")
    for r in rows:
        em = r["exact_match_vs_baseline"]
        em_s = "-" if em is None else (f"[green]{em:.0%}[/]" if em == 1.0 else f"[red]{em:.0%}[/]")
        t.add_row(
            r["dataset"],
            r["method"],
            f(r["budget"], "{}"),
            str(r["n"]),
            f(r["tau"], "{:.2f}"),
            f(r["predicted_tau"], "{:.2f}"),
            f(r["tokens_per_s"], "{:.1f}"),
            f(None if r["tpot_mean_s"] is None else r["tpot_mean_s"] * 1e3, "{:.2f}"),
            f(r["speedup_vs_baseline"], "{:.2f}x"),
            em_s,
        )
    console.print(t)


# --- the whole sweep --------------------------------------------------------------------------


def plan_runs(cfg: BenchConfig) -> list[RunSpec]:
    specs = [RunSpec.reference(k) for k in cfg.reference_runs]
    specs += [RunSpec.for_budget(b) for b in cfg.budgets]
    seen: set[str] = set()
    out = []
    for s in specs:
        if s.method not in seen:
            seen.add(s.method)
            out.append(s)
    return out


def require_own_servers(plan: list[tuple[RunSpec, str, str | None]], cfg: BenchConfig, target: BenchTarget) -> None:
    """The bench measures only servers it starts (a server command per run), unless told to measure
    running ones (``--use-running-server``, which then takes no server command)."""
    if cfg.use_running_server:
        if target.commands:
            raise UsageError(
                "--use-running-server measures the servers at the run URLs as they are: it takes no server command",
                hint="drop --server-command (and the inventory's server_command*) or --use-running-server",
            )
        return
    bare = [s.method for s, _, cmd in plan if cmd is None]
    if bare:
        raise UsageError(
            f"no server command for {', '.join(bare)}: bench measures only servers it starts (so it can never measure, "
            "or restart, a production server by accident)",
            hint="give --server-command TEMPLATE (or server_command in [hosts.HOST.bench]); to measure a server that is "
            "already running, pass --use-running-server",
        )


def run_bench(
    target: BenchTarget, cfg: BenchConfig, console: Console, *, progress: bool = True, dry_run: bool = False
) -> dict[str, Any]:
    """Run the sweep; write ``runs.jsonl``, ``summary.json``, ``sweep.png``; return the summary.
    ``dry_run``: check the inputs and return the plan (runs, URLs, commands); start and write nothing."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ddtree_deploy.measure.plotting import plot_sweep

    if cfg.concurrency < 1:
        raise UsageError("--concurrency must be >= 1")
    if not cfg.datasets:
        raise UsageError("give at least one --dataset (a name or a .jsonl path)")
    for b in cfg.budgets:
        if b < 1:
            raise UsageError(f"--budgets: {b} is not a positive budget")
    renderer = ChatRenderer(cfg.tokenizer) if cfg.tokenizer else None
    prompts: dict[str, list[Instance]] = {}
    for spec_s in cfg.datasets:
        insts = load_prompts(spec_s, cfg.num_prompts)
        name = insts[0].dataset
        if name in prompts:
            raise UsageError(f"dataset {name!r} given twice")
        prompts[name] = insts
        if renderer is None and any(i.input_ids is None for i in insts):
            multi = sum(1 for i in insts if i.n_turns > 1)
            console.print(
                f"[yellow]warning:[/] {name}: text prompts are sent without a chat template"
                " (pass --tokenizer PATH to render them "
                f"like the reference)" + (f"; {multi} multi-turn rows use their first turn only" if multi else ""),
            )
    runs = plan_runs(cfg)
    plan = []
    for s in runs:
        u = run_url(target, s)
        try:
            plan.append((s, u, None if cfg.use_running_server else run_command(target, s, u)))
        except UsageError as exc:
            if s.kind == "ddtree":
                raise
            console.print(f"[yellow]warning:[/] skipping the {s.method} reference run: {exc.message} ({exc.hint})", markup=True)
    require_own_servers(plan, cfg, target)
    if not any(c for _, _, c in plan) and len({u for _, u, _ in plan}) == 1 and len(runs) > 1:
        console.print(
            "[yellow]warning:[/] every run goes to the same server and no server command is set: the budget is whatever that "
            "server was launched with (use --server-command or one --base-url METHOD=URL per run)"
        )
    if not plan:
        raise UsageError("nothing to run")
    if dry_run:
        return {
            "host": target.name,
            "out_dir": str(cfg.out_dir),
            "datasets": {name: len(insts) for name, insts in prompts.items()},
            "runs": [
                {"method": sp.method, "url": u, "command": c, "port_in_use": port_answers(u) if c else None} for sp, u, c in plan
            ],
        }
    for sp, u, c in plan:  # before anything is started or written (each server checks again when it starts)
        if c:
            refuse_if_port_answers(u, sp.method)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    all_records: list[RunRecord] = []
    walls: dict[tuple[str, str], float] = {}
    servers: dict[str, Any] = {}
    total = sum(len(v) for v in prompts.values()) * len(plan)
    started = time.time()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not progress,
        transient=False,
    ) as prog:
        overall = prog.add_task("sweep", total=total)
        for spec, url, cmd in plan:
            log_path = cfg.out_dir / f"server-{spec.method}.log"
            ctx = ManagedServer(cmd, url, log_path, cfg.health_timeout_s, cfg.stop_timeout_s, what=spec.method) if cmd else None
            task = prog.add_task(f"{spec.method}: starting" if cmd else spec.method, total=None)
            if ctx is not None:
                ctx.__enter__()
            try:
                if ctx is None:
                    wait_healthy(url, min(cfg.health_timeout_s, 60.0))
                info = server_info(url)
                if "speculative_algorithm" in info and (info["speculative_algorithm"] or "") != ALGORITHM[spec.kind]:
                    what = f"{url} runs --speculative-algorithm {info['speculative_algorithm'] or '(none)'}, "
                    f"not what {spec.method} needs"
                    if spec.kind != "ddtree":
                        console.print(f"[yellow]warning:[/] skipping the {spec.method} reference run: {what}")
                        prog.advance(overall, sum(len(v) for v in prompts.values()))
                        continue
                    raise BenchServerError(what, hint="point this run at a DDTREE server (--base-url / --server-command)")
                sb = info.get("speculative_ddtree_budget")
                if spec.budget is not None and sb is not None and int(sb) != spec.budget:
                    raise BenchServerError(
                        f"{url} runs --speculative-ddtree-budget {sb}, but this run is {spec.method}",
                        hint="use --server-command with {budget}, or map each budget to its own server with --base-url",
                    )
                servers[spec.method] = {
                    "url": url,
                    "command": cmd,
                    "server_info": info,
                    "health_wait_s": None if ctx is None else ctx.health_wait_s,
                }
                for ds, insts in prompts.items():
                    prog.update(task, description=f"{spec.method} / {ds}", total=len(insts), completed=0)

                    def tick() -> None:
                        prog.advance(task)
                        prog.advance(overall)

                    recs, wall = run_dataset(url, insts, spec, cfg, renderer, on_done=tick)
                    all_records.extend(recs)
                    walls[(ds, spec.method)] = wall
            finally:
                if ctx is not None:
                    ctx.__exit__(*sys.exc_info())
                prog.remove_task(task)
    runs_path = cfg.out_dir / "runs.jsonl"
    write_jsonl(runs_path, all_records)
    rows = summarize(all_records, walls)
    title = f"bench {target.name}: T={cfg.temperature}, max_new_tokens={cfg.max_new_tokens}, concurrency={cfg.concurrency}"
    png = plot_sweep(rows, cfg.out_dir / "sweep.png", title=title)
    summary = {
        "host": target.name,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": time.time() - started,
        "config": {
            "budgets": cfg.budgets,
            "datasets": list(prompts),
            "concurrency": cfg.concurrency,
            "num_prompts": cfg.num_prompts,
            "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "seed": cfg.seed,
            "reference_runs": cfg.reference_runs,
            "tokenizer": cfg.tokenizer,
        },
        "servers": servers,
        "rows": rows,
        "files": {"runs": str(runs_path), "plot": str(png), "summary": str(cfg.out_dir / "summary.json")},
    }
    (cfg.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    render_summary(rows, console, title)
    return summary
