"""Section `shortest_first`: flow control's shortest-job-first ordering at the fleet's edge.

The routing section's ShareGPT-like workload (unique prompts, heavy-tailed prompt and output
lengths; each request's `max_tokens` is its output length) on the same four simulators, at the
rate where the fleet is briefly full in bursts (its comparison step). Three setups of the
profile wasm-epp ships (`examples/profiles/prefix-lora-delay.yaml`), each on fresh servers with
the same requests:

- *no flow control*: the profile as shipped; requests beyond a server's batch wait in its queue;
- *first come, first served*: plus `featureGates: [flowControl]` with a `concurrency-detector`
  (`maxConcurrency` 8, the servers' batch limit), so those requests wait in Envoy instead and
  leave oldest first;
- *shortest job first*: the same with the band ordered by `shortest-job-first-ordering-policy`
  (earliest arrival + `max_tokens` × the measured time per token first; a request that has
  waited `maxWait`, 30 s, goes first): the profile `examples/profiles/prefix-lora-delay-sjf.yaml`.

Each setup runs one step at a lighter rate (caches and the controller's measured means warm up)
and then the edge rate several times; the TTFT quantiles are over every request of those runs
together (from the load generator's per-request traces), so one burst decides less.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench import common, routing, traces

KEY = "shortest_first"
TITLE = "Shortest job first: flow control's ordering at the fleet's edge"
WORKLOAD = next(w for w in routing.WORKLOADS if w.key == "sharegpt")
WARM_RATE = 10.0
# Past the fleet's capacity (about 13 requests/s): one run, where every request waits.
OVERLOAD_RATE = 14.0
# The profile for bursty traffic: the shipped one plus flow control with the concurrency
# detector and a shortest-job-first band.
SJF_CONFIG = routing.SJF_CONFIG
SJF_BAND = "orderingPolicyRef: shortest-job-first-ordering-policy"
FCFS_BAND = "orderingPolicyRef: fcfs-ordering-policy"


@dataclass(frozen=True)
class Setup:
    """One way of serving the workload."""

    key: str
    label: str
    config: str


def first_come_first_served(config: str) -> str:
    """`config` with its shortest-job-first band ordered first come, first served instead."""
    if config.count(SJF_BAND) != 1:
        raise ValueError(f"the profile should name {SJF_BAND!r} once")
    return config.replace(SJF_BAND, FCFS_BAND)


SETUPS = (
    Setup("none", "no flow control", routing.TUNED_CONFIG),
    Setup("fcfs", "flow control, first come first served", first_come_first_served(SJF_CONFIG)),
    Setup("sjf", "flow control, shortest job first", SJF_CONFIG),
)


def runs(quick: bool) -> int:
    """How often each setup runs the edge rate."""
    return 1 if quick else 5


def measure(ctx: common.Ctx) -> dict[str, dict]:
    """{setup: {"steps": [step, ...], "ttft_ms": pooled quantiles}}."""
    rate = WORKLOAD.compare_rate or WARM_RATE
    results: dict[str, dict] = {}
    with common.Procs(ctx, KEY) as procs:
        sims = common.start_sims(ctx, procs, routing.SIMS, routing.SIM_ARGS, prefix="server")
        for setup in SETUPS:
            sims = common.restart_sims(ctx, procs, sims)
            controller = common.start_controller(ctx, procs, sims, setup.config,
                                                 name=f"controller-{setup.key}")
            envoy = common.start_epp_envoy(ctx, procs, controller, name=f"envoy-{setup.key}")
            warm = routing.run_step(ctx, procs, envoy, sims, WORKLOAD, WARM_RATE,
                                    f"{KEY}-{setup.key}-warm")
            sent = warm["requests"]
            steps, ttfts = [], []
            for attempt in range(runs(ctx.quick)):
                label = f"{KEY}-{setup.key}-{attempt + 1}"
                step = routing.run_step(ctx, procs, envoy, sims, WORKLOAD, rate, label, sent)
                sent += step["requests"]
                steps.append(step)
                ttfts += [r.ttft_ms for r in traces.read(common.trace_path(procs, label))]
            overload = routing.run_step(ctx, procs, envoy, sims, WORKLOAD, OVERLOAD_RATE,
                                        f"{KEY}-{setup.key}-overload", sent)
            results[setup.key] = {
                "rate": rate,
                "steps": steps,
                "answered": len(ttfts),
                "requests": sum(s["requests"] for s in steps),
                "ttft_ms": routing.quantiles(ttfts),
                "overload": overload,
            }
            pooled = results[setup.key]["ttft_ms"]
            print(f"  shortest first {setup.key}: TTFT p50 {common.fmt(pooled['p50'])} "
                  f"p90 {common.fmt(pooled['p90'])} p99 {common.fmt(pooled['p99'])} ms",
                  flush=True)
            procs.stop([envoy.proc, controller.proc])
    return results


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """First come first served (flow control on) over shortest job first, per quantile (> 1:
    shortest first is faster), and the p90 without flow control over shortest first."""
    def q(setup: str, quantile: str) -> float | None:
        return results.get(setup, {}).get("ttft_ms", {}).get(quantile)
    out = {f"shortest_first_ttft_{quantile}_fcfs_over_sjf": common.ratio(q("fcfs", quantile),
                                                                          q("sjf", quantile))
           for quantile in ("p50", "p90", "p99")}
    out["shortest_first_ttft_p90_none_over_sjf"] = common.ratio(q("none", "p90"), q("sjf", "p90"))

    def overload_p90(setup: str) -> float | None:
        step = results.get(setup, {}).get("overload") or {}
        return (step.get("ttft_ms") or {}).get("p90")
    out["shortest_first_overload_ttft_p90_fcfs_over_sjf"] = common.ratio(overload_p90("fcfs"),
                                                                         overload_p90("sjf"))
    return out


def run(ctx: common.Ctx) -> common.Section:
    """Runs the section."""
    results = measure(ctx)
    section_ratios = ratios(results)
    rows = []
    for setup in SETUPS:
        r = results[setup.key]
        per_run = ", ".join(common.fmt(s["ttft_ms"].get("p90") if s["ttft_ms"] else None, 0)
                            for s in r["steps"])
        overload = r["overload"]
        rows.append([setup.label, f"{r['answered']}/{r['requests']}", r["ttft_ms"]["p50"],
                     r["ttft_ms"]["p90"], r["ttft_ms"]["p99"], per_run,
                     (overload["ttft_ms"] or {}).get("p50"),
                     (overload["ttft_ms"] or {}).get("p90")])
    table = common.md_table(["setup", "answered", "TTFT p50 (ms)", "TTFT p90 (ms)",
                             "TTFT p99 (ms)", "each run's TTFT p90 (ms)",
                             f"at {OVERLOAD_RATE:g}/s: TTFT p50 (ms)",
                             f"at {OVERLOAD_RATE:g}/s: TTFT p90 (ms)"], rows)
    listed = ", ".join(f"`{k}` {common.fmt(v, 2)}" for k, v in section_ratios.items())
    n = runs(ctx.quick)
    markdown = f"""\
The routing section's ShareGPT-like workload on its four simulators at
{WORKLOAD.compare_rate:g} requests/s, {n} run(s) of {routing.step_seconds(ctx.quick):g} s per
setup after a {WARM_RATE:g} requests/s step, then one at {OVERLOAD_RATE:g} requests/s (past the
fleet's capacity); the shipped profile without flow control, with flow control
(`concurrency-detector`, `maxConcurrency: {routing.BATCH_LIMIT}`) first come first served, and
with the band ordered by `shortest-job-first-ordering-policy`
(`examples/profiles/prefix-lora-delay-sjf.yaml`). Quantiles over every request of the {n}
run(s) at {WORKLOAD.compare_rate:g} requests/s together.

{table}

Ratios: {listed}. Above 1: shortest job first gives the first token sooner. When a burst
outruns the fleet, the requests beyond its batches wait either way; releasing first the one
that would finish first had it started on arrival lets short requests overtake long ones (by
at most a decode of the long one), which frees batch slots sooner: most requests wait less and
the longest wait more, so the p99 is the price. Past the fleet's capacity
(`shortest_first_overload_ttft_p90_fcfs_over_sjf`, one run) the queue's age dominates and the
order approaches first come, first served. What this does not show: clients whose `max_tokens`
is a loose bound (they count as long), other workloads (with equal lengths the order is first
come, first served, and only the concurrency detector acts), and real engines.
"""
    data = {"rate": WORKLOAD.compare_rate, "warm_rate": WARM_RATE,
            "overload_rate": OVERLOAD_RATE, "runs": n,
            "results": results}
    return common.Section(KEY, TITLE, data, section_ratios, markdown)
