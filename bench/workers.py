"""Section `workers`: does picking stay as good when Envoy runs several workers?

Each Envoy worker runs its own Wasm VM with its own prefix index and in-flight counts; after each
decision a worker pushes its new records and count changes to the other workers' inboxes
(proxy-wasm shared queues), so every worker learns from every other worker's decisions; an index
per worker that learnt only its own would send each group's requests to up to one server per
worker and lose prefix hits.
The same shared-prefix workload goes through wasm-epp with `--concurrency 1` and `--concurrency
4` (simulators restarted in between, so both start cold), and through round-robin for scale.
Reported: the simulators' prefix-cache hit rate, TTFT, how the picks spread over the servers,
and how many workers took connections.
"""

from __future__ import annotations

import json

from bench import common
from bench.routing import SIM_ARGS, SIMS, Workload, run_step, step_seconds

KEY = "workers"
TITLE = "Envoy workers: prefix hits and picks with --concurrency 1 vs 4"
CONCURRENCIES = (1, 4)
# The routing section's shared-prefix shape, at a rate well inside the fleet's capacity.
WORKLOAD = Workload("shared_prefix", "shared prefix (24 groups × 8 KB system prompt)",
                    ("--shared-prefix-groups", "24", "--prefix-bytes", "8192",
                     "--prompt-bytes", "512", "--max-tokens", "32"),
                    rates=(12,), quick_rates=(12,))


def measure(ctx: common.Ctx) -> dict[str, dict]:
    """One step per setup; {setup: step}."""
    rate = (WORKLOAD.quick_rates if ctx.quick else WORKLOAD.rates)[0]
    results: dict[str, dict] = {}
    with common.Procs(ctx, KEY) as procs:
        sims = common.start_sims(ctx, procs, SIMS, SIM_ARGS, prefix="server")
        setups = [(f"epp_{n}", n) for n in CONCURRENCIES] + [("round_robin", 1)]
        for name, concurrency in setups:
            sims = common.restart_sims(ctx, procs, sims)
            if name == "round_robin":
                envoy = common.start_plain_envoy(ctx, procs, sims, concurrency=concurrency,
                                                 name="envoy-rr")
                started = [envoy.proc]
            else:
                controller = common.start_controller(ctx, procs, sims, name=f"controller-{name}")
                envoy = common.start_epp_envoy(ctx, procs, controller, concurrency=concurrency,
                                               name=f"envoy-{name}")
                started = [envoy.proc, controller.proc]
            step = run_step(ctx, procs, envoy, sims, WORKLOAD, rate, f"{KEY}-{name}")
            step["concurrency"] = concurrency
            step["workers_with_connections"] = _busy_workers(envoy)
            results[name] = step
            print(f"  workers {name}: hit {step['prefix_hit_rate']:.0%}", flush=True)
            procs.stop(started)
    return results


def _busy_workers(envoy: common.Envoy) -> int:
    """Workers that served downstream connections (Envoy's per-worker listener stats)."""
    stats = common.envoy_stats(envoy, "downstream_cx_total")
    return sum(1 for name, value in stats.items() if ".worker_" in name and value > 0)


def run(ctx: common.Ctx) -> common.Section:
    """Runs the section."""
    results = measure(ctx)
    one, four = results["epp_1"], results["epp_4"]
    section_ratios = {
        "prefix_hit_4workers_over_1worker": common.ratio(four["prefix_hit_rate"],
                                                         one["prefix_hit_rate"]),
        "ttft_p90_4workers_over_1worker": common.ratio((four["ttft_ms"] or {}).get("p90"),
                                                       (one["ttft_ms"] or {}).get("p90")),
    }
    labels = {"epp_1": "wasm-epp, 1 worker", "epp_4": "wasm-epp, 4 workers",
              "round_robin": "round-robin, 1 worker"}
    rows = [[labels[k], s["workers_with_connections"], f"{s['ok']}/{s['requests']}",
             f"{100 * s['prefix_hit_rate']:.1f} %", (s["ttft_ms"] or {}).get("p50"),
             (s["ttft_ms"] or {}).get("p90"), s["output_tokens_per_s"],
             ", ".join(str(c) for c in s["spread"]["requests"].values())]
            for k, s in results.items()]
    table = common.md_table(["setup", "workers that took connections", "ok", "prefix hit",
                             "TTFT p50 (ms)", "TTFT p90 (ms)", "out tok/s",
                             "requests per server"], rows)
    listed = ", ".join(f"`{k}` {common.fmt(v, 2)}" for k, v in section_ratios.items())
    rate = (WORKLOAD.quick_rates if ctx.quick else WORKLOAD.rates)[0]
    markdown = f"""\
The routing section's simulators and shared-prefix workload (`{' '.join(WORKLOAD.args)}`) at
{rate:g} requests/s for {step_seconds(ctx.quick):g} s, through wasm-epp (default
profile) with 1 and with 4 Envoy workers, and through round-robin; the load generator opens
many connections, which Envoy spreads over its workers.

{table}

Ratios: {listed}. A ratio near 1 means the workers share what they learn: each pushes its prefix
records and in-flight changes to the others as it decides, so a fourth of the decisions per
worker does not mean a fourth of the knowledge. Compare TTFT at p50: with 24 groups, about one request in ten is the
first of its group and misses on every server, so the p90 sits on that boundary and jumps
between a hit's and a miss's TTFT from run to run.
"""
    data = {"workload": list(WORKLOAD.args), "rate": rate, "results": results}
    json.dumps(data)
    return common.Section(KEY, TITLE, data, section_ratios, markdown)
