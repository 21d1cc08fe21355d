"""Section `replicas`: do several Envoy replicas route as well as one?

Each Envoy replica keeps its own prefix index; its poller uploads the records its workers make
to the controller and long-polls the other replicas' records, which its workers learn (see the
README's replica model). Without that, a client that spreads requests over N replicas sends the
requests of one shared prompt to up to N servers and loses prefix hits.
The routing section's simulators and shared-prefix workload go through one Envoy, then through
three Envoy replicas against one controller that the client takes in turn (request i to
replica i mod 3), with the replicas sharing their records and with sharing turned off
(`sharePrefixRecords: false`); the simulators are restarted in between, so every setup starts
cold. The replicas are started as `make run EPP_REPLICAS=3` starts them: the shipped
`envoy/envoy.yaml`, each with its own ports, all polling the one controller.
"""

from __future__ import annotations

import json
import time

from bench import common
from bench.routing import SIM_ARGS, SIMS, Workload, run_step, step_seconds

KEY = "replicas"
TITLE = "Envoy replicas: prefix hits with 1 Envoy vs 3 replicas, sharing on and off"
REPLICAS = 3
# The routing section's shared-prefix shape, at a rate well inside the fleet's capacity.
WORKLOAD = Workload("shared_prefix", "shared prefix (24 groups × 8 KB system prompt)",
                    ("--shared-prefix-groups", "24", "--prefix-bytes", "8192",
                     "--prompt-bytes", "512", "--max-tokens", "32"),
                    rates=(12,), quick_rates=(12,))
SETUPS = {"one": "1 Envoy", "shared": f"{REPLICAS} replicas, sharing",
          "unshared": f"{REPLICAS} replicas, not sharing"}


def measure(ctx: common.Ctx) -> dict[str, dict]:
    """One step per setup; {setup: step}."""
    rate = (WORKLOAD.quick_rates if ctx.quick else WORKLOAD.rates)[0]
    results: dict[str, dict] = {}
    with common.Procs(ctx, KEY) as procs:
        sims = common.start_sims(ctx, procs, SIMS, SIM_ARGS, prefix="server")
        for name in SETUPS:
            sims = common.restart_sims(ctx, procs, sims)
            controller = common.start_controller(ctx, procs, sims, name=f"controller-{name}")
            count = 1 if name == "one" else REPLICAS
            envoys = [common.start_epp_envoy(ctx, procs, controller, name=f"envoy-{name}-{i}",
                                             share_records=name != "unshared")
                      for i in range(count)]
            if name == "shared":
                _wait_sharing(envoys)
            step = run_step(ctx, procs, envoys, sims, WORKLOAD, rate, f"{KEY}-{name}")
            step["replicas"] = count
            step["sharing"] = [_sharing(e) for e in envoys]
            results[name] = step
            print(f"  replicas {name}: hit {step['prefix_hit_rate']:.0%}", flush=True)
            procs.stop([e.proc for e in envoys] + [controller.proc])
    return results


def _sharing(envoy: common.Envoy) -> int:
    """The replica's `wasm_epp_replicas_sharing` gauge (1 while it shares its records)."""
    stats = common.envoy_stats(envoy, "wasm_epp_replicas_sharing")
    return max(stats.values(), default=0)


def _wait_sharing(envoys: list[common.Envoy], timeout: float = 15.0) -> None:
    """Waits until every replica shares, then a worker heartbeat (1 s) for its workers."""
    deadline = time.monotonic() + timeout
    while not all(_sharing(e) == 1 for e in envoys):
        if time.monotonic() > deadline:
            raise RuntimeError("the replicas did not start sharing their prefix records")
        time.sleep(0.1)
    time.sleep(1.2)


def run(ctx: common.Ctx) -> common.Section:
    """Runs the section."""
    results = measure(ctx)
    one, shared, unshared = results["one"], results["shared"], results["unshared"]
    p90 = lambda s: (s["ttft_ms"] or {}).get("p90")  # noqa: E731
    section_ratios = {
        "prefix_hit_3replicas_over_1replica": common.ratio(shared["prefix_hit_rate"],
                                                           one["prefix_hit_rate"]),
        "ttft_p90_unshared_over_shared_3replicas": common.ratio(p90(unshared), p90(shared)),
        "prefix_hit_unshared_over_shared_3replicas": common.ratio(unshared["prefix_hit_rate"],
                                                                  shared["prefix_hit_rate"]),
    }
    rows = [[SETUPS[k], f"{s['ok']}/{s['requests']}", f"{100 * s['prefix_hit_rate']:.1f} %",
             (s["ttft_ms"] or {}).get("p50"), p90(s), s["output_tokens_per_s"],
             ", ".join(str(c) for c in s["spread"]["requests"].values())]
            for k, s in results.items()]
    table = common.md_table(["setup", "ok", "prefix hit", "TTFT p50 (ms)", "TTFT p90 (ms)",
                             "out tok/s", "requests per server"], rows)
    listed = ", ".join(f"`{k}` {common.fmt(v, 2)}" for k, v in section_ratios.items())
    rate = (WORKLOAD.quick_rates if ctx.quick else WORKLOAD.rates)[0]
    markdown = f"""\
The routing section's simulators and shared-prefix workload (`{' '.join(WORKLOAD.args)}`) at
{rate:g} requests/s for {step_seconds(ctx.quick):g} s, through one Envoy with wasm-epp (default
profile), then through {REPLICAS} Envoy replicas against one controller, the client sending
request i to replica i mod {REPLICAS}: with the replicas sharing their prefix records through the
controller, and with sharing off. Simulators restarted before each setup.

{table}

Ratios: {listed}. With sharing, each replica learns within about one round trip to the controller
which server the others sent each prompt block to, so a shared prompt keeps landing on the server
that cached it whichever replica routes it; without sharing, each replica sends a group's first
request through it wherever its own load view says, and the group's cache is split. What this
does not show: replicas on separate machines (here the controller is one local hop away), or
several controllers exchanging records with each other.
"""
    data = {"workload": list(WORKLOAD.args), "rate": rate, "replicas": REPLICAS,
            "results": results}
    json.dumps(data)
    return common.Section(KEY, TITLE, data, section_ratios, markdown)
