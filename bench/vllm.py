"""Section `vllm`: routing over two real vLLM servers, with vLLM's own counters as ground truth.

Two real vLLM servers (CPU build, the tiny local model of `scripts/vllm-tools.sh`, one pinned
per core) take the same shared-prefix burst through Envoy round-robin and through wasm-epp
(default profile). Each server's prefix cache is reset before each policy's run, and each run
uses its own prompts. The prefix-cache hit rate and the TTFT come from the servers' own
`/metrics` (`vllm:prefix_cache_{hits,queries}_total`, `vllm:time_to_first_token_seconds`), the
client's TTFT from the load generator.

It also measures what the controller's scraping costs a server: the server's CPU (all its
processes) over an idle stretch with nobody scraping, with the controller scraping every 50 ms
(it asks for its metric families only), and with a client fetching the whole `/metrics` every
50 ms as a scraper without the filter does.

The section is skipped, with a line saying why, when vLLM cannot be installed on the machine.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench import common

KEY = "vllm"
TITLE = "Real vLLM: wasm-epp vs round-robin on two real servers, and what scraping costs them"
TOOLS = common.REPO / "scripts" / "vllm-tools.sh"
# A shared-prefix burst the two small CPU servers carry with some queueing.
WORKLOAD = ("--shared-prefix-groups", "8", "--prefix-bytes", "4000", "--prompt-bytes", "200",
            "--max-tokens", "16")
RATE = 6.0
SCRAPE_WINDOW_S = 10.0
# After the routing runs, before the idle measurement: the servers finish their last requests.
SETTLE_S = 5.0
POLICIES = {"roundrobin": "Envoy round-robin", "epp": "wasm-epp (default profile)"}


@dataclass
class Server:
    """A running vLLM server, named and addressed as the bench's simulators are."""

    name: str
    port: int

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"


def metric_samples(server: Server, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of the samples of each series name (labels dropped, `le` kept for buckets)."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        if name not in names:
            continue
        key = name
        if name.endswith("_bucket") and 'le="' in series:
            bound = series.split('le="', 1)[1].split('"', 1)[0]
            key = f"{name}|{bound}"
        out[key] = out.get(key, 0.0) + float(value)
    return out


COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
            "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count")


def counters(servers: list[Server]) -> dict[str, float]:
    """The ground-truth counters summed over both servers."""
    total: dict[str, float] = {}
    for server in servers:
        for key, value in metric_samples(server, COUNTERS).items():
            total[key] = total.get(key, 0.0) + value
    return total


def histogram_quantile(delta: dict[str, float], q: float) -> float | None:
    """The q-quantile (seconds) of the TTFT histogram increase, linear within a bucket."""
    prefix = "vllm:time_to_first_token_seconds_bucket|"
    buckets = sorted((float("inf") if k[len(prefix):] == "+Inf" else float(k[len(prefix):]), v)
                     for k, v in delta.items() if k.startswith(prefix))
    if not buckets or buckets[-1][1] <= 0:
        return None
    target = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= target:
            if bound == float("inf"):
                return lower
            share = (target - below) / (count - below) if count > below else 1.0
            return lower + (bound - lower) * share
        lower, below = bound, count
    return None


def run_policy(ctx: common.Ctx, procs: common.Procs, url: str, servers: list[Server],
               policy: str, seed: int) -> dict:
    """The burst through `url`; loadgen report plus the servers' counter deltas."""
    for server in servers:
        common.http_request(f"{server.url}/reset_prefix_cache", method="POST", body={})
    requests = 60 if ctx.quick else 160
    before = counters(servers)
    report = common.run_loadgen(
        ctx, procs, f"{url}/v1/completions",
        ["--model", "tiny", "--requests", requests, "--rate", RATE, "--concurrency", 256,
         "--stream", "--timeout", 120, "--seed", seed, *WORKLOAD],
        f"{KEY}-{policy}", timeout=120 + requests / RATE + 60)
    after = counters(servers)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    queries = delta.get("vllm:prefix_cache_queries_total", 0.0)
    hits = delta.get("vllm:prefix_cache_hits_total", 0.0)
    server_p90 = histogram_quantile(delta, 0.9)
    return {
        "requests": requests,
        "ok": report["ok"],
        "errors": report["errors"],
        "ttft_ms": report["ttft_ms"],
        "output_tokens_per_s": report["output_tokens_per_s"],
        "vllm_prefix_hit_rate": hits / queries if queries else 0.0,
        "vllm_prefix_hits": hits,
        "vllm_prefix_queries": queries,
        "vllm_ttft_p90_ms": None if server_p90 is None else server_p90 * 1000,
    }


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and all its descendants."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            total += common.cpu_seconds(current)
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        pending += [int(c) for c in children]
    return total


def server_cpu_percent(pid: int, seconds: float, during=None) -> float:
    """Percent of one core the server process tree used over `seconds` (with `during()` called
    every 50 ms when given)."""
    start_cpu, start = tree_cpu_seconds(pid), time.monotonic()
    tick = start
    while time.monotonic() - start < seconds:
        if during is not None:
            during()
        tick += 0.05
        time.sleep(max(0.0, tick - time.monotonic()))
    return 100.0 * (tree_cpu_seconds(pid) - start_cpu) / (time.monotonic() - start)


def scrape_cost(ctx: common.Ctx, procs: common.Procs, servers: list[Server],
                pids: list[int]) -> dict:
    """Server CPU idle, under the controller's filtered 50 ms scrape, and under a full one."""
    server, pid = servers[1], pids[1]
    time.sleep(SETTLE_S)
    quiet = server_cpu_percent(pid, SCRAPE_WINDOW_S)
    controller = common.start_controller(ctx, procs, [server], name="controller-scrape")
    time.sleep(1.0)
    filtered = server_cpu_percent(pid, SCRAPE_WINDOW_S)
    procs.stop([controller.proc])

    def fetch_all() -> None:
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as resp:
            resp.read()
    unfiltered = server_cpu_percent(pid, SCRAPE_WINDOW_S, fetch_all)
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as resp:
        full_bytes = len(resp.read())
    query = "&".join(f"name%5B%5D={n.replace(':', '%3A')}" for n in (
        "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info", "vllm:cache_config_info"))
    with urllib.request.urlopen(f"{server.url}/metrics/?{query}", timeout=5) as resp:
        filtered_bytes = len(resp.read())
    return {"idle_pct": quiet, "controller_filtered_pct": filtered,
            "full_metrics_every_50ms_pct": unfiltered, "full_bytes": full_bytes,
            "filtered_bytes": filtered_bytes}


def _complete(server: Server, prompt: str, max_tokens: int) -> tuple[float, dict]:
    """One completion to `server`; (seconds, usage)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    start = time.monotonic()
    status, raw = common.http_request(f"{server.url}/v1/completions", method="POST", body=body,
                                      timeout=120)
    elapsed = time.monotonic() - start
    if status != 200:
        raise RuntimeError(f"vLLM answered {status}: {raw[:300]!r}")
    return elapsed, json.loads(raw)["usage"]


def cost_model(servers: list[Server]) -> dict:
    """The real server's latency in the simulator's terms: time to first token against uncached
    prompt length, with a cached prefix, time per output token alone and with 7 others running.
    Fresh prompts each time (a random tag first); one server, nothing else running on it."""
    server = servers[0]
    words = (common.REPO / "README.md").read_text().split()
    tag = f"calibration {time.time_ns()}"

    def prompt(n_words: int, salt: str) -> str:
        return f"{tag} {salt} " + " ".join(words[i % len(words)] for i in range(n_words))

    ttft = []
    for n in (50, 500, 1000, 2000):
        seconds, usage = _complete(server, prompt(n, f"len{n}"), 1)
        ttft.append({"prompt_tokens": usage["prompt_tokens"], "ms": seconds * 1000})
    long_prompt = prompt(2000, "cached")
    cold, usage = _complete(server, long_prompt, 1)
    warm, _ = _complete(server, long_prompt + " again", 1)
    one, _ = _complete(server, prompt(20, "itl"), 1)
    many, _ = _complete(server, prompt(20, "itl-long"), 201)
    itl_ms = (many - one) / 200 * 1000
    with ThreadPoolExecutor(8) as pool:
        batch = list(pool.map(lambda i: _complete(server, prompt(20, f"batch{i}"), 201)[0],
                              range(8)))
    itl_batch_ms = (sum(batch) / len(batch) - one) / 200 * 1000
    return {"ttft_by_length": ttft,
            "cached_prefix": {"prompt_tokens": usage["prompt_tokens"], "cold_ms": cold * 1000,
                              "warm_ms": warm * 1000},
            "itl_ms": itl_ms, "itl_with_8_running_ms": itl_batch_ms}


def measure(ctx: common.Ctx) -> dict:
    """Both policies over the two servers, then the scrape cost; {"skipped": why} without vLLM."""
    install = subprocess.run(["bash", str(TOOLS)], capture_output=True, text=True)
    if install.returncode == 3:
        return {"skipped": install.stderr.strip().splitlines()[-1]}
    if install.returncode != 0:
        raise RuntimeError(f"scripts/vllm-tools.sh failed:\n{install.stderr[-2000:]}")
    with common.Procs(ctx, KEY) as procs:
        run_dir = procs.dir / "servers"
        started = subprocess.run(["bash", str(TOOLS), "start", str(run_dir)],
                                 capture_output=True, text=True)
        try:
            if started.returncode != 0:
                raise RuntimeError(f"vLLM servers did not start:\n{started.stderr[-2000:]}")
            servers = [Server(f"vllm-{i}", int(line.rsplit(":", 1)[1])) for i, line in
                       enumerate((run_dir / "addresses").read_text().split())]
            pids = [int(p) for p in (run_dir / "pids").read_text().split()]
            results: dict = {"policies": {}}
            rr = common.start_plain_envoy(ctx, procs, servers, name="envoy-roundrobin")
            results["policies"]["roundrobin"] = run_policy(ctx, procs, rr.url, servers,
                                                           "roundrobin", seed=11)
            procs.stop([rr.proc])
            controller = common.start_controller(ctx, procs, servers)
            epp = common.start_epp_envoy(ctx, procs, controller)
            results["policies"]["epp"] = run_policy(ctx, procs, epp.url, servers, "epp", seed=12)
            procs.stop([epp.proc, controller.proc])
            for key, step in results["policies"].items():
                print(f"  vllm {key}: hit {step['vllm_prefix_hit_rate']:.0%}, server TTFT p90 "
                      f"{common.fmt(step['vllm_ttft_p90_ms'])} ms", flush=True)
            results["cost_model"] = cost_model(servers)
            results["scrape"] = scrape_cost(ctx, procs, servers, pids)
            return results
        finally:
            subprocess.run(["bash", str(TOOLS), "stop", str(run_dir)], capture_output=True)


def run(ctx: common.Ctx) -> common.Section:
    """Runs the section."""
    results = measure(ctx)
    if "skipped" in results:
        markdown = f"Skipped in this run: {results['skipped']}\n"
        return common.Section(KEY, TITLE, results, {}, markdown)
    rr, epp = results["policies"]["roundrobin"], results["policies"]["epp"]
    section_ratios = {
        "vllm_prefix_hit_epp_minus_roundrobin":
            epp["vllm_prefix_hit_rate"] - rr["vllm_prefix_hit_rate"],
        "vllm_ttft_p90_roundrobin_over_epp":
            common.ratio(rr["vllm_ttft_p90_ms"], epp["vllm_ttft_p90_ms"]),
    }
    rows = [[POLICIES[k], f"{s['ok']}/{s['requests']}",
             f"{100 * s['vllm_prefix_hit_rate']:.1f} %", s["vllm_ttft_p90_ms"],
             (s["ttft_ms"] or {}).get("p50"), (s["ttft_ms"] or {}).get("p90"),
             s["output_tokens_per_s"]] for k, s in results["policies"].items()]
    table = common.md_table(["policy", "ok", "vLLM prefix hit", "vLLM TTFT p90 (ms)",
                             "client TTFT p50 (ms)", "client TTFT p90 (ms)", "out tok/s"], rows)
    scrape = results["scrape"]
    cost = results["cost_model"]
    cost_text = (
        "time to first token " + ", ".join(f"{c['ms']:.0f} ms at {c['prompt_tokens']} tokens"
                                           for c in cost["ttft_by_length"])
        + f"; a {cost['cached_prefix']['prompt_tokens']}-token prompt "
        f"{cost['cached_prefix']['cold_ms']:.0f} ms cold, "
        f"{cost['cached_prefix']['warm_ms']:.0f} ms with its prefix cached; "
        f"{cost['itl_ms']:.1f} ms per output token alone, {cost['itl_with_8_running_ms']:.1f} ms "
        "with 8 running.")
    listed = ", ".join(f"`{k}` {common.fmt(v, 2)}" for k, v in section_ratios.items())
    markdown = f"""\
Two real vLLM 0.32 servers (CPU, the tiny local model of `scripts/vllm-tools.sh`, 64 KV blocks
of 128 tokens, one pinned per core), the same shared-prefix burst (`{' '.join(WORKLOAD)}`,
{RATE:g} requests/s, streamed) through Envoy round-robin and through wasm-epp; each server's
prefix cache reset before each run, fresh prompts per run. Hit rate and server TTFT from vLLM's
own counters (the TTFT p90 interpolated in its histogram buckets); client TTFT from the load
generator.

{table}

Ratios: {listed}.

What scraping costs a server (one server, idle, {SCRAPE_WINDOW_S:g} s each, percent of one core,
all its processes): nobody scraping {scrape['idle_pct']:.1f} %; the controller scraping every
50 ms {scrape['controller_filtered_pct']:.1f} % (it asks `/metrics/?name[]=…` for its six
families: {scrape['filtered_bytes']} bytes); a client fetching the whole `/metrics`
({scrape['full_bytes']} bytes) every 50 ms {scrape['full_metrics_every_50ms_pct']:.1f} %.

The real server in the simulator's terms (one server, nothing else running; `vllm-sim`'s
for comparison, its defaults: 5 ms + 0.02 ms per uncached prompt token to the first token, 4 ms per
output token, +5 % per other running request): {cost_text}

What this does not show: a GPU server (the model here is tiny, so prefill is cheap and the hit
rate matters less for TTFT than it would), or more than two servers.
"""
    json.dumps(results)
    return common.Section(KEY, TITLE, results, section_ratios, markdown)
