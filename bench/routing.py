"""Section `routing`: how well each policy serves LLM traffic on a simulated fleet.

Four identical `vllm-sim` servers with a realistic profile (per-token prefill, inter-token
latency, slowdown under batch load, a finite KV/prefix cache, `--max-num-seqs`, LoRA slots)
sit behind four policies in the same run: Envoy round-robin, Envoy least-request, wasm-epp
with the default profile and wasm-epp tuned for prefix and LoRA affinity. Each workload is
offered at stepped open-loop rates, from light load to past what the fleet sustains; the
simulators are restarted before each policy, so every policy starts with cold caches and
sees the same requests at the same rates: one seed, and each rate step continues the numbering
of the step before (same prefix groups and adapters, no prompt repeated).

Reported per step: TTFT and end-to-end p50/p90/p99 (the load generator, client side), output
tokens/s over the step's wall time (drain included), the prefix-cache hit rate and the
requests per server (the simulators' own counters).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from bench import common

KEY = "routing"
TITLE = "Routing quality: round-robin, least-request and wasm-epp on a simulated fleet"
SIMS = 4
ADAPTERS = [f"adapter-{i}" for i in range(8)]
# Each server: 8 sequences, 2 LoRA slots, 1,024 cache blocks of 16 tokens (64 KB of prompt
# text; 8 of the shared-prefix workload's system prompts), 0.1 ms prefill per uncached token,
# 25 ms per output token (+5 % per other running sequence).
SIM_ARGS = ["--max-num-seqs", "8", "--ttft-base-ms", "10", "--prefill-ms-per-token", "0.1",
            "--itl-ms", "25", "--batch-slowdown", "0.05", "--num-gpu-blocks", "1024",
            "--lora-modules", ",".join(ADAPTERS), "--max-loras", "2", "--lora-load-ms", "100"]
# Timeouts that every step's slowest request stays under, even past saturation.
REQUEST_TIMEOUT_S = 120
# wasm-epp tuned for this traffic: the default profile plus LoRA affinity.
TUNED_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - { pluginRef: queue-scorer, weight: 2 }
  - { pluginRef: kv-cache-utilization-scorer, weight: 2 }
  - { pluginRef: prefix-cache-scorer, weight: 3 }
  - { pluginRef: lora-affinity-scorer, weight: 2 }
"""


@dataclass(frozen=True)
class Policy:
    """One way of picking: a plain Envoy load balancer or wasm-epp with a profile."""

    key: str
    label: str
    lb_policy: str | None = None  # plain Envoy
    config: str | None = None  # wasm-epp EndpointPickerConfig (None: the default profile)


POLICIES = (
    Policy("round_robin", "Envoy round-robin", lb_policy="ROUND_ROBIN"),
    Policy("least_request", "Envoy least-request", lb_policy="LEAST_REQUEST"),
    Policy("epp_default", "wasm-epp default"),
    Policy("epp_tuned", "wasm-epp + LoRA affinity", config=TUNED_CONFIG),
)
QUICK_POLICIES = ("round_robin", "epp_default")


@dataclass(frozen=True)
class Workload:
    """A traffic shape: load generator flags and the offered rates (requests/s)."""

    key: str
    label: str
    args: tuple[str, ...]
    rates: tuple[float, ...]
    quick_rates: tuple[float, ...]
    # The step the policies are compared at: near saturation, where they differ most before
    # every policy is overloaded (for shared prefix, the headline).
    compare_rate: float | None = None


WORKLOADS = (
    # 24 groups sharing an 8 KB system prompt (2,048 pseudo-tokens), 512 bytes of own text,
    # 32 output tokens: the shape of the upstream shared_prefix benchmark. The fleet caches
    # 32 system prompts in all, but each server only 8: round-robin makes every server see
    # every group.
    Workload("shared_prefix", "shared prefix (24 groups × 8 KB system prompt)",
             ("--shared-prefix-groups", "24", "--prefix-bytes", "8192", "--prompt-bytes", "512",
              "--max-tokens", "32"),
             rates=(8, 16, 24, 28, 32), quick_rates=(14, 28), compare_rate=28),
    # ShareGPT-like: unique prompts, heavy-tailed prompt (median 1 KB) and output (median 48
    # tokens) lengths.
    Workload("sharegpt", "mixed ShareGPT-like lengths",
             ("--length-dist", "sharegpt", "--prompt-bytes", "1024", "--max-tokens", "48"),
             rates=(6, 10, 14, 18), quick_rates=(), compare_rate=14),
    # Eight adapters, two slots per server: a policy that spreads adapters pays adapter loads
    # and waits for a free slot.
    Workload("multi_lora", "multi-LoRA (8 adapters, 2 slots per server)",
             ("--lora", ",".join(ADAPTERS), "--prompt-bytes", "1024", "--max-tokens", "32"),
             rates=(6, 10, 14, 20), quick_rates=(), compare_rate=14),
)


def step_seconds(quick: bool) -> float:
    """How long each rate step offers load (its requests = rate × this)."""
    return 10.0 if quick else 20.0


def _spread(requests: dict[str, int]) -> dict:
    """Per-server request counts and their coefficient of variation (0: perfectly even)."""
    counts = list(requests.values())
    total = sum(counts)
    mean = total / len(counts) if counts else 0.0
    cv = (math.sqrt(sum((c - mean) ** 2 for c in counts) / len(counts)) / mean) if mean else 0.0
    return {"requests": requests, "max_share": max(counts) / total if total else 0.0,
            "min_share": min(counts) / total if total else 0.0, "cv": cv}


def _start_policy(ctx: common.Ctx, procs: common.Procs, policy: Policy,
                  sims: list[common.Sim]) -> tuple[common.Envoy, list[common.Proc]]:
    """The policy's Envoy (and controller); returns it and the processes to stop after."""
    if policy.lb_policy is not None:
        envoy = common.start_plain_envoy(ctx, procs, sims, policy.lb_policy,
                                         name=f"envoy-{policy.key}")
        return envoy, [envoy.proc]
    controller = common.start_controller(ctx, procs, sims, policy.config,
                                         name=f"controller-{policy.key}")
    envoy = common.start_epp_envoy(ctx, procs, controller, name=f"envoy-{policy.key}")
    return envoy, [envoy.proc, controller.proc]


def run_step(ctx: common.Ctx, procs: common.Procs,
             envoy: common.Envoy | list[common.Envoy], sims: list[common.Sim],
             workload: Workload, rate: float, label: str, first_index: int = 0) -> dict:
    """One open-loop step at `rate`; the load generator's report plus the simulators' view.
    Several Envoys (replicas) get the requests in turn. A step that follows others on the same
    servers starts at `first_index`, the number of requests sent before it: it keeps their
    prefix groups (and adapters) but repeats none of their prompts, which the servers may
    still have cached."""
    requests = max(1, round(rate * step_seconds(ctx.quick)))
    before = common.sims_totals(sims)
    envoys = envoy if isinstance(envoy, list) else [envoy]
    report = common.run_loadgen(
        ctx, procs, [f"{e.url}/v1/completions" for e in envoys],
        ["--requests", requests, "--rate", rate, "--concurrency", 1024, "--stream",
         "--timeout", REQUEST_TIMEOUT_S, "--seed", 7, "--first-index", first_index, *workload.args],
        label, timeout=REQUEST_TIMEOUT_S + requests / rate + 60)
    delta = common.stats_delta(before, common.sims_totals(sims))
    ok = report["ok"]
    return {
        "rate": rate,
        "requests": requests,
        "ok": ok,
        "errors": report["errors"],
        "ttft_ms": report["ttft_ms"],
        "e2e_ms": report["latency_ms"],
        "output_tokens_per_s": report["output_tokens_per_s"],
        "wall_s": report["wall_s"],
        "prefix_hit_rate": common.prefix_hit_rate(delta),
        "lora_loads": sum(d.get("lora_loads_total", 0) for d in delta.values()),
        "spread": _spread({name: d.get("requests_total", 0) for name, d in delta.items()}),
    }


def measure(ctx: common.Ctx) -> dict:
    """Every workload × policy × rate; {workload: {policy: [step, ...]}}."""
    keys = QUICK_POLICIES if ctx.quick else tuple(p.key for p in POLICIES)
    policies = [p for p in POLICIES if p.key in keys]
    results: dict[str, dict[str, list[dict]]] = {}
    with common.Procs(ctx, KEY) as procs:
        sims = common.start_sims(ctx, procs, SIMS, SIM_ARGS, prefix="server")
        for workload in WORKLOADS:
            rates = workload.quick_rates if ctx.quick else workload.rates
            if not rates:
                continue
            results[workload.key] = {}
            for policy in policies:
                sims = common.restart_sims(ctx, procs, sims)
                envoy, started = _start_policy(ctx, procs, policy, sims)
                steps = []
                for rate in rates:
                    label = f"{workload.key}-{policy.key}-{rate:g}"
                    sent = sum(s["requests"] for s in steps)
                    steps.append(run_step(ctx, procs, envoy, sims, workload, rate, label, sent))
                    print(f"  routing {label}: ttft p90 "
                          f"{common.fmt((steps[-1]['ttft_ms'] or {}).get('p90'))} ms, "
                          f"hit {steps[-1]['prefix_hit_rate']:.0%}", flush=True)
                results[workload.key][policy.key] = steps
                procs.stop(started)
    return results


def _at(steps: list[dict], rate: float | None) -> dict | None:
    return next((s for s in steps if s["rate"] == rate), None)


def _q(step: dict | None, metric: str, q: str) -> float:
    if step is None or not step.get(metric):
        return math.nan
    return step[metric].get(q, math.nan)


def ratios(results: dict) -> dict[str, float]:
    """Headline ratios at the shared-prefix workload's comparison step, and per workload
    least-request against wasm-epp at its comparison step."""
    out: dict[str, float] = {}
    shared = results.get("shared_prefix", {})
    workload = next(w for w in WORKLOADS if w.key == "shared_prefix")
    rr = _at(shared.get("round_robin", []), workload.compare_rate)
    epp = _at(shared.get("epp_default", []), workload.compare_rate)
    if rr and epp:
        out["ttft_p90_roundrobin_over_epp"] = common.ratio(_q(rr, "ttft_ms", "p90"),
                                                           _q(epp, "ttft_ms", "p90"))
        out["throughput_epp_over_roundrobin"] = common.ratio(epp["output_tokens_per_s"],
                                                             rr["output_tokens_per_s"])
        out["e2e_p90_roundrobin_over_epp"] = common.ratio(_q(rr, "e2e_ms", "p90"),
                                                          _q(epp, "e2e_ms", "p90"))
        out["prefix_hit_epp_minus_roundrobin"] = epp["prefix_hit_rate"] - rr["prefix_hit_rate"]
    for workload in WORKLOADS:
        by_policy = results.get(workload.key, {})
        lr = _at(by_policy.get("least_request", []), workload.compare_rate)
        for name in ("epp_default", "epp_tuned"):
            mine = _at(by_policy.get(name, []), workload.compare_rate)
            if lr and mine:
                out[f"{workload.key}_ttft_p90_leastrequest_over_{name}"] = common.ratio(
                    _q(lr, "ttft_ms", "p90"), _q(mine, "ttft_ms", "p90"))
    return out


def plot(ctx: common.Ctx, results: dict) -> dict[str, str]:
    """TTFT p90 against offered rate, one plot per workload."""
    labels = {p.key: p.label for p in POLICIES}
    figures = {}
    for workload in WORKLOADS:
        by_policy = results.get(workload.key)
        if not by_policy:
            continue
        series = {labels[k]: [(s["rate"], _q(s, "ttft_ms", "p90")) for s in steps]
                  for k, steps in by_policy.items()}
        figures[workload.key] = common.plot_lines(
            ctx, f"routing-{workload.key}-ttft.png", f"TTFT p90 — {workload.label}",
            "offered load (requests/s)", "TTFT p90 (ms, log)", series, logy=True)
    return figures


def _workload_markdown(workload: Workload, by_policy: dict[str, list[dict]],
                       figure: str) -> str:
    labels = {p.key: p.label for p in POLICIES}
    rows = []
    for key, steps in by_policy.items():
        for s in steps:
            errors = sum(s["errors"].values())
            rows.append([labels[key], f"{s['rate']:g}", f"{s['ok']}/{s['requests']}"
                         + (f" ({errors} err)" if errors else ""),
                         _q(s, "ttft_ms", "p50"), _q(s, "ttft_ms", "p90"), _q(s, "ttft_ms", "p99"),
                         _q(s, "e2e_ms", "p50"), _q(s, "e2e_ms", "p90"), _q(s, "e2e_ms", "p99"),
                         s["output_tokens_per_s"], f"{100 * s['prefix_hit_rate']:.0f} %",
                         s["lora_loads"], f"{100 * s['spread']['max_share']:.0f} %",
                         f"{s['spread']['cv']:.2f}"])
    table = common.md_table(
        ["policy", "req/s offered", "ok", "TTFT p50", "TTFT p90", "TTFT p99", "e2e p50",
         "e2e p90", "e2e p99", "out tok/s", "prefix hit", "LoRA loads", "busiest server",
         "spread CV"], rows)
    return f"""\
### {workload.label}

Load generator flags: `{' '.join(workload.args)}` (streaming completions, open loop).
Latencies in ms; policies are compared at {workload.compare_rate:g} requests/s.

{table}

![TTFT p90, {workload.label}]({figure})
"""


def markdown(results: dict, figures: dict[str, str], section_ratios: dict[str, float],
             quick: bool) -> str:
    """The section's text."""
    parts = [f"""\
{SIMS} identical simulators, each `{' '.join(SIM_ARGS)}`. Every policy gets freshly started
simulators (cold caches) and then the same requests at each offered rate in turn, for
{step_seconds(quick):g} s per rate. *busiest server* is the largest share of a step's requests
that one server got (25 % is even); *spread CV* the coefficient of variation of the requests per
server. *out tok/s* divides by the step's wall time including the drain of requests still
running when the last one was sent, so a policy that builds a backlog shows less.
"""]
    for workload in WORKLOADS:
        if workload.key in results:
            parts.append(_workload_markdown(workload, results[workload.key],
                                            figures[workload.key]))
    listed = ", ".join(f"`{k}` {common.fmt(v, 2)}" for k, v in section_ratios.items())
    compared = ", ".join(f"{w.key} at {w.compare_rate:g} requests/s" for w in WORKLOADS
                         if w.key in results)
    parts.append(f"Ratios, each at its workload's comparison step ({compared}): {listed}.\n")
    return "\n".join(parts)


def run(ctx: common.Ctx) -> common.Section:
    """Runs the section."""
    results = measure(ctx)
    figures = plot(ctx, results)
    section_ratios = ratios(results)
    data = {"mode": "quick" if ctx.quick else "full", "simulators": SIMS, "sim_args": SIM_ARGS,
            "step_s": step_seconds(ctx.quick), "tuned_config": TUNED_CONFIG,
            "workloads": {w.key: {"args": list(w.args)} for w in WORKLOADS},
            "results": results, "figures": figures}
    json.dumps(data)
    return common.Section(KEY, TITLE, data, section_ratios,
                          markdown(results, figures, section_ratios, ctx.quick))
