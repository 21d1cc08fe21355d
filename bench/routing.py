"""Section `routing`: how well each policy serves LLM traffic on a simulated fleet.

Four `vllm-sim` servers with a realistic profile (per-token prefill, inter-token latency,
slowdown under batch load, a finite KV/prefix cache, `--max-num-seqs`, LoRA slots) sit behind
each policy in turn: Envoy round-robin and least-request, wasm-epp with the default profile and
with the profile it ships for this traffic, and the routers a team would run instead (the SGLang
model gateway `sglang-router` and its fork `vllm-router`, from PyPI, see `bench/peers.py`).
Each workload is offered at stepped open-loop rates, from light load to past what the fleet
sustains (from the comparison step on, a policy stops at its first step beyond the SLO); the
simulators are restarted before each policy, so every policy starts with cold caches and sees
the same requests at the same rates: one seed, and each rate step continues the numbering of
the step before (same prefix groups and adapters, no prompt repeated). One
workload runs on a heterogeneous fleet (servers 1×, 1×, 2× and 4× slower).

Reported per step: TTFT and end-to-end p50/p90/p99 (the load generator, client side), output
tokens/s over the step's wall time (drain included), the prefix-cache hit rate and the
requests per server (the simulators' own counters). Per workload and policy, *goodput*: the
highest offered rate whose TTFT p90 stays within the workload's SLO, interpolated linearly
between the last step within it and the first beyond, and the output tokens/s at that rate.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass

from bench import common, peers, traces

KEY = "routing"
TITLE = ("Routing quality: round-robin, least-request, the SGLang and vLLM routers and "
         "wasm-epp on a simulated fleet")
SIMS = 4
ADAPTERS = [f"adapter-{i}" for i in range(8)]
# Each server: 8 sequences, 2 LoRA slots, 1,024 cache blocks of 16 tokens (64 KB of prompt
# text; 8 of the shared-prefix workload's system prompts), 0.1 ms prefill per uncached token,
# 25 ms per output token (+5 % per other running sequence). Prefill and decode share the
# device (`--prefill-stalls-decode`): prefills run one after another and hold up the running
# requests' next token, as on a GPU without disaggregation, so a prefix-cache miss costs the
# whole batch and not only its own request.
BATCH_LIMIT = 8
SIM_ARGS = ["--max-num-seqs", str(BATCH_LIMIT), "--ttft-base-ms", "10", "--prefill-ms-per-token", "0.1",
            "--itl-ms", "25", "--batch-slowdown", "0.05", "--num-gpu-blocks", "1024",
            "--lora-modules", ",".join(ADAPTERS), "--max-loras", "2", "--lora-load-ms", "100",
            "--prefill-stalls-decode"]
# Timeouts that every step's slowest request stays under, even past saturation.
REQUEST_TIMEOUT_S = 120
# The profile wasm-epp ships for mixed traffic on unequal servers: prefix-cache and LoRA
# affinity with the expected-delay scorer as its load signal (the file says why).
TUNED_CONFIG = (common.REPO / "examples" / "profiles" / "prefix-lora-delay.yaml").read_text()
# The same plus flow control: a concurrency detector at the servers' batch limit and a band
# ordered shortest job first (`bench/shortest_first.py` compares its ordering alone).
SJF_CONFIG = (common.REPO / "examples" / "profiles" / "prefix-lora-delay-sjf.yaml").read_text()


@dataclass(frozen=True)
class Policy:
    """One way of picking: a plain Envoy load balancer, wasm-epp with a profile, or a peer
    router with one of its policies."""

    key: str
    label: str
    lb_policy: str | None = None  # plain Envoy
    config: str | None = None  # wasm-epp EndpointPickerConfig (None: the default profile)
    peer: tuple[str, str] | None = None  # (key in peers.PEERS, the router's --policy)


POLICIES = (
    Policy("round_robin", "Envoy round-robin", lb_policy="ROUND_ROBIN"),
    Policy("least_request", "Envoy least-request", lb_policy="LEAST_REQUEST"),
    Policy("sglang_cache_aware", "sglang-router cache_aware", peer=("sglang", "cache_aware")),
    Policy("sglang_power_of_two", "sglang-router power_of_two",
           peer=("sglang", "power_of_two")),
    Policy("vllm_cache_aware", "vllm-router cache_aware", peer=("vllm", "cache_aware")),
    Policy("epp_default", "wasm-epp default"),
    Policy("epp_tuned", "wasm-epp + LoRA affinity + expected delay", config=TUNED_CONFIG),
    Policy("epp_sjf", "wasm-epp + LoRA affinity + expected delay + shortest job first",
           config=SJF_CONFIG),
)
QUICK_POLICIES = ("round_robin", "sglang_cache_aware", "epp_default")
# Peer policies, for "the best peer" of a workload.
PEER_POLICIES = tuple(p.key for p in POLICIES if p.peer)
# The wasm-epp profile the goodput ratios speak for (the first of these that ran).
EPP_FOR_GOODPUT = ("epp_sjf", "epp_tuned", "epp_default")


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
    # The TTFT p90 (ms) a step must stay within to count towards goodput.
    slo_ttft_p90_ms: float = 1000.0
    # Per server, how much slower than the profile it runs (`--time-scale`); equal by default.
    time_scales: tuple[float, ...] = (1.0,) * SIMS


WORKLOADS = (
    # 24 groups sharing an 8 KB system prompt (2,048 pseudo-tokens), 512 bytes of own text,
    # 32 output tokens: the shape of the upstream shared_prefix benchmark. The fleet caches
    # 32 system prompts in all, but each server only 8: round-robin makes every server see
    # every group.
    Workload("shared_prefix", "shared prefix (24 groups × 8 KB system prompt)",
             ("--shared-prefix-groups", "24", "--prefix-bytes", "8192", "--prompt-bytes", "512",
              "--max-tokens", "32"),
             rates=(8, 12, 16, 20, 24, 28), quick_rates=(12, 20, 28), compare_rate=20),
    # ShareGPT-like: unique prompts, heavy-tailed prompt (median 1 KB) and output (median 48
    # tokens) lengths.
    Workload("sharegpt", "mixed ShareGPT-like lengths",
             ("--length-dist", "sharegpt", "--prompt-bytes", "1024", "--max-tokens", "48"),
             rates=(6, 10, 12, 14, 18), quick_rates=(), compare_rate=12),
    # Eight adapters, two slots per server: a policy that spreads adapters pays adapter loads
    # and waits for a free slot.
    Workload("multi_lora", "multi-LoRA (8 adapters, 2 slots per server)",
             ("--lora", ",".join(ADAPTERS), "--prompt-bytes", "1024", "--max-tokens", "32"),
             rates=(6, 8, 10, 12, 16), quick_rates=(), compare_rate=10),
    # The ShareGPT-like traffic on a fleet of unequal servers (two of the profile's speed, one
    # twice and one four times slower, as mixed GPU generations or a noisy neighbour give):
    # an even split overloads the slowest long before the fleet is busy. The fleet's capacity
    # lies between 8 and 9 requests/s, so the comparison step is 8: at 9, per-request traces
    # (`wasm-epp-loadgen --trace`, read by `bench/traces.py --limit 8`; 20 s steps, this
    # workload's seed) showed every policy past it, all four servers at their batch limit
    # when 18–62 % of the requests arrived and 84–100 % of the requests at or above the TTFT
    # p90 arriving then (the shipped profile 5 runs, vllm-router 3), so the p90 there measured
    # which queue a request joined at a full fleet. At 8, of three runs' 480 requests, none of
    # the shipped profile's arrived at a full fleet, 4 of vllm-router's and 14 of
    # sglang-router's.
    Workload("heterogeneous", "heterogeneous fleet (servers 1×, 1×, 2×, 4× slower), "
             "ShareGPT-like",
             ("--length-dist", "sharegpt", "--prompt-bytes", "1024", "--max-tokens", "48"),
             rates=(4, 7, 8, 9, 11, 13), quick_rates=(), compare_rate=8,
             time_scales=(1.0, 1.0, 2.0, 4.0)),
)


def step_seconds(quick: bool) -> float:
    """How long each rate step offers load (its requests = rate × this)."""
    return 10.0 if quick else 20.0


def compare_repeats(quick: bool) -> int:
    """How often each policy runs its workload's comparison step. A 20 s step's TTFT p90 near
    saturation differed by up to 4.7× between consecutive runs on this 2-core VM; the step's
    quantiles are over every request of the runs together (`pooled_step`), so one burst
    decides no ratio."""
    return 1 if quick else 3


def _spread(requests: dict[str, int]) -> dict:
    """Per-server request counts and their coefficient of variation (0: perfectly even)."""
    counts = list(requests.values())
    total = sum(counts)
    mean = total / len(counts) if counts else 0.0
    cv = (math.sqrt(sum((c - mean) ** 2 for c in counts) / len(counts)) / mean) if mean else 0.0
    return {"requests": requests, "max_share": max(counts) / total if total else 0.0,
            "min_share": min(counts) / total if total else 0.0, "cv": cv}


def _start_policy(ctx: common.Ctx, procs: common.Procs, policy: Policy,
                  sims: list[common.Sim]) -> tuple[common.Envoy | peers.Router,
                                                   list[common.Proc]]:
    """The policy's proxy (Envoy and controller, or a peer router); returns it and the
    processes to stop after."""
    if policy.peer is not None:
        peer, peer_policy = policy.peer
        router = peers.start(ctx, procs, peers.PEERS[peer], peer_policy, sims,
                             name=f"router-{policy.key}")
        return router, [router.proc]
    if policy.lb_policy is not None:
        envoy = common.start_plain_envoy(ctx, procs, sims, policy.lb_policy,
                                         name=f"envoy-{policy.key}")
        return envoy, [envoy.proc]
    controller = common.start_controller(ctx, procs, sims, policy.config,
                                         name=f"controller-{policy.key}")
    envoy = common.start_epp_envoy(ctx, procs, controller, name=f"envoy-{policy.key}")
    return envoy, [envoy.proc, controller.proc]


def run_step(ctx: common.Ctx, procs: common.Procs,
             envoy: common.Envoy | peers.Router | list[common.Envoy], sims: list[common.Sim],
             workload: Workload, rate: float, label: str, first_index: int = 0) -> dict:
    """One open-loop step at `rate`; the load generator's report plus the simulators' view.
    Several Envoys (replicas) get the requests in turn; a peer router stands in for Envoy. A
    step that follows others on the same servers starts at `first_index`, the number of
    requests sent before it: it keeps their prefix groups (and adapters) but repeats none of
    their prompts, which the servers may still have cached."""
    requests = max(1, round(rate * step_seconds(ctx.quick)))
    before = common.sims_totals(sims)
    envoys = envoy if isinstance(envoy, list) else [envoy]
    report = common.run_loadgen(
        ctx, procs, [f"{e.url}/v1/completions" for e in envoys],
        ["--requests", requests, "--rate", rate, "--concurrency", 1024, "--stream",
         "--timeout", REQUEST_TIMEOUT_S, "--seed", 7, "--first-index", first_index, *workload.args],
        label, timeout=REQUEST_TIMEOUT_S + requests / rate + 60)
    delta = common.stats_delta(before, common.sims_totals(sims))
    crowded = traces.summary(traces.read(common.trace_path(procs, label)), BATCH_LIMIT)
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
        # Requests sent while every server had its batch limit in flight, of all and of those
        # at or above the TTFT p90 (`bench/traces.py`).
        "full_fleet": {"requests": crowded["at_full_fleet"], "tail": crowded["tail"],
                       "tail_at_full_fleet": crowded["tail_at_full_fleet"]},
    }


def measure(ctx: common.Ctx) -> dict:
    """Every workload × policy × rate; {workload: {policy: [step, ...]}}."""
    keys = QUICK_POLICIES if ctx.quick else tuple(p.key for p in POLICIES)
    policies = [p for p in POLICIES if p.key in keys]
    results: dict[str, dict[str, list[dict]]] = {}
    with common.Procs(ctx, KEY) as procs:
        sims: list[common.Sim] = []
        for workload in WORKLOADS:
            rates = workload.quick_rates if ctx.quick else workload.rates
            if not rates:
                continue
            results[workload.key] = {}
            for policy in policies:
                procs.stop(s.proc for s in sims)
                sims = common.start_sims(ctx, procs, SIMS, SIM_ARGS, _sim_scales(workload),
                                         prefix="server")
                envoy, started = _start_policy(ctx, procs, policy, sims)
                steps: list[dict] = []
                sent = 0
                for rate in rates:
                    if climb_done(workload, steps):
                        break
                    repeats, answered = [], []
                    while len(repeats) < runs_wanted(workload, rate, repeats, ctx.quick):
                        several = repeats or runs_wanted(workload, rate, [], ctx.quick) > 1
                        label = f"{workload.key}-{policy.key}-{rate:g}" + (
                            f"-{len(repeats) + 1}" if several else "")
                        repeats.append(run_step(ctx, procs, envoy, sims, workload, rate, label,
                                                sent))
                        sent += repeats[-1]["requests"]
                        answered.append(traces.read(common.trace_path(procs, label)))
                        print(f"  routing {label}: ttft p90 "
                              f"{common.fmt(_q(repeats[-1], 'ttft_ms', 'p90'))} ms, "
                              f"hit {repeats[-1]['prefix_hit_rate']:.0%}", flush=True)
                    steps.append(pooled_step(repeats, answered))
                results[workload.key][policy.key] = steps
                procs.stop(started)
    return results


def runs_wanted(workload: Workload, rate: float, runs: list[dict], quick: bool) -> int:
    """How many runs the step at `rate` gets, given its `runs` so far: `compare_repeats` at
    the comparison step and at a step past it whose first run missed the SLO, one otherwise.
    That step bounds the policy's goodput, which interpolates towards its TTFT p90, and past
    capacity one 20 s run's p90 says little on this VM (sglang-router's three runs of shared
    prefix at 24 requests/s at d5ea651: 1.87 / 1.05 / 3.31 s)."""
    # A first run that would end the policy's climb is the step that bounds its goodput.
    if rate == workload.compare_rate or (runs and climb_done(workload, runs[:1])):
        return compare_repeats(quick)
    return 1


def within_slo(step: dict, slo_ms: float) -> bool:
    """Whether every request of `step` was answered with its TTFT p90 within `slo_ms` (a NaN
    p90, no answers, is not)."""
    return step["ok"] == step["requests"] and _q(step, "ttft_ms", "p90") <= slo_ms


def climb_done(workload: Workload, steps: list[dict]) -> bool:
    """Whether a policy runs no more of `workload`'s rates after `steps`: its last step, at or
    past the comparison step, was beyond the SLO. Its goodput is then bounded (by that first
    step beyond) and every ratio's step has run; a higher rate would only overload it further,
    and draining those backlogs (up to a minute per step) took about 30 % of a full run."""
    if not steps:
        return False
    last = steps[-1]
    return (last["rate"] >= (workload.compare_rate or 0.0)
            and not within_slo(last, workload.slo_ttft_p90_ms))


def pooled_step(repeats: list[dict], answered: list[list[traces.Request]]) -> dict:
    """One step from its repeated runs: TTFT and end-to-end quantiles over every answered
    request of the runs together (`answered`, their traces, run by run), requests and answers
    summed, the rates and the hit rate their means, with every run's own TTFT p90 in
    `repeats_ttft_p90_ms` when there were several. A single run is kept as it is."""
    if len(repeats) == 1:
        return repeats[0]
    pooled = [r for run in answered for r in run]

    def mean(key: str) -> float:
        return sum(r[key] for r in repeats) / len(repeats)
    counts, errors = Counter(), Counter()  # update() keeps a server that got none
    for run in repeats:
        counts.update(run["spread"]["requests"])
        errors.update(run["errors"])
    ttft = quantiles([r.ttft_ms for r in pooled])
    # Which of the runs' requests met a full fleet, the tail now being the pooled one's.
    full = [traces.summary(run, BATCH_LIMIT, ttft.get("p90")) for run in answered]
    return {
        "rate": repeats[0]["rate"],
        "requests": sum(r["requests"] for r in repeats),
        "ok": sum(r["ok"] for r in repeats),
        "errors": dict(errors),
        "ttft_ms": ttft,
        "e2e_ms": quantiles([r.latency_ms for r in pooled]),
        "output_tokens_per_s": mean("output_tokens_per_s"),
        "wall_s": sum(r["wall_s"] for r in repeats),
        "prefix_hit_rate": mean("prefix_hit_rate"),
        "lora_loads": sum(r["lora_loads"] for r in repeats),
        "spread": _spread(dict(counts)),
        "full_fleet": {"requests": sum(f["at_full_fleet"] for f in full),
                       "tail": sum(f["tail"] for f in full),
                       "tail_at_full_fleet": sum(f["tail_at_full_fleet"] for f in full)},
        "repeats_ttft_p90_ms": [_q(r, "ttft_ms", "p90") for r in repeats],
    }


def quantiles(values: list[float]) -> dict[str, float]:
    """The p50, p90 and p99 of `values` as a step reports them (NaN without values)."""
    return {q: common.percentile(values, p) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))}


def _sim_scales(workload: Workload) -> list[list[str]]:
    """Each server's extra flags for `workload`: its `--time-scale`."""
    return [["--time-scale", f"{scale:g}"] for scale in workload.time_scales]


def goodput(steps: list[dict], slo_ms: float) -> dict:
    """The highest offered rate whose TTFT p90 is within `slo_ms` (every request answered),
    linear between the last step within and the first beyond, with the output tokens/s
    there. `bounded` is False when every step was within the SLO (the rate is then a lower
    bound); the rate is 0 when even the first step was beyond it."""
    within = None
    for step in sorted(steps, key=lambda s: s["rate"]):
        p90 = _q(step, "ttft_ms", "p90")
        answered = step["ok"] == step["requests"]
        if within_slo(step, slo_ms):
            within = step
            continue
        if within is None:
            break
        low = _q(within, "ttft_ms", "p90")
        # A step with failed requests is beyond at any latency, and a NaN p90 (no answers)
        # compares False: the rate stays at the last step within.
        share = min(max((slo_ms - low) / (p90 - low), 0.0), 1.0) if answered and p90 > low \
            else 0.0
        return {key: within[key] + share * (step[key] - within[key])
                for key in ("rate", "output_tokens_per_s")} | {"bounded": True}
    if within is None:
        return {"rate": 0.0, "output_tokens_per_s": 0.0, "bounded": True}
    return {"rate": within["rate"], "output_tokens_per_s": within["output_tokens_per_s"],
            "bounded": False}


def goodputs(results: dict) -> dict[str, dict[str, dict]]:
    """{workload: {policy: goodput}} for every workload and policy that ran."""
    slo = {w.key: w.slo_ttft_p90_ms for w in WORKLOADS}
    return {workload: {policy: goodput(steps, slo[workload]) for policy, steps in by.items()}
            for workload, by in results.items()}


def _epp_key(by_policy: dict) -> str | None:
    return next((k for k in EPP_FOR_GOODPUT if k in by_policy), None)


def _at(steps: list[dict], rate: float | None) -> dict | None:
    return next((s for s in steps if s["rate"] == rate), None)


def _q(step: dict | None, metric: str, q: str) -> float:
    if step is None or not step.get(metric):
        return math.nan
    return step[metric].get(q, math.nan)


def ratios(results: dict) -> dict[str, float]:
    """Headline ratios at the shared-prefix workload's comparison step; per workload
    least-request and the best peer against wasm-epp at its comparison step; goodput."""
    out: dict[str, float] = {}
    shared = results.get("shared_prefix", {})
    workload = next(w for w in WORKLOADS if w.key == "shared_prefix")
    rr = _at(shared.get("round_robin", []), workload.compare_rate)
    epp = _at(shared.get("epp_default", []), workload.compare_rate)
    sglang = _at(shared.get("sglang_cache_aware", []), workload.compare_rate)
    best_epp = _epp_key(shared)
    if sglang and best_epp:
        out["ttft_p90_sglang_over_epp"] = common.ratio(
            _q(sglang, "ttft_ms", "p90"),
            _q(_at(shared[best_epp], workload.compare_rate), "ttft_ms", "p90"))
    out.update(_goodput_ratios(results))
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


def _goodput_ratios(results: dict) -> dict[str, float]:
    """Goodput (rate within the SLO) of wasm-epp's shipped profile over round-robin and over
    the peers: on shared prefix as the headline names, and per workload against the best
    peer (by goodput; its TTFT p90 at the comparison step too)."""
    out: dict[str, float] = {}
    good = goodputs(results)
    for workload in WORKLOADS:
        by_policy = good.get(workload.key, {})
        epp_key = _epp_key(by_policy)
        if epp_key is None:
            continue
        mine = by_policy[epp_key]["rate"]
        prefix = "" if workload.key == "shared_prefix" else f"{workload.key}_"
        if "round_robin" in by_policy:
            out[f"{prefix}goodput_epp_over_roundrobin"] = common.ratio(
                mine, by_policy["round_robin"]["rate"])
        if "sglang_cache_aware" in by_policy:
            out[f"{prefix}goodput_epp_over_sglang"] = common.ratio(
                mine, by_policy["sglang_cache_aware"]["rate"])
        ran = [k for k in PEER_POLICIES if k in by_policy]
        if ran:
            best = max(ran, key=lambda k: by_policy[k]["rate"])
            out[f"{workload.key}_goodput_epp_over_best_peer"] = common.ratio(
                mine, by_policy[best]["rate"])
            steps = results[workload.key]
            out[f"{workload.key}_ttft_p90_best_peer_over_epp"] = common.ratio(
                _q(_at(steps[best], workload.compare_rate), "ttft_ms", "p90"),
                _q(_at(steps[epp_key], workload.compare_rate), "ttft_ms", "p90"))
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
                       good: dict[str, dict], figure: str) -> str:
    labels = {p.key: p.label for p in POLICIES}
    good_rows = [[labels[key], ("≥ " if not g["bounded"] else "") + f"{g['rate']:.1f}",
                  g["output_tokens_per_s"]] for key, g in good.items()]
    good_table = common.md_table(["policy", "goodput (req/s within the SLO)",
                                  "out tok/s at that rate"], good_rows)
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
                         f"{s['spread']['cv']:.2f}", _full_fleet(s)])
    table = common.md_table(
        ["policy", "req/s offered", "ok", "TTFT p50", "TTFT p90", "TTFT p99", "e2e p50",
         "e2e p90", "e2e p99", "out tok/s", "prefix hit", "LoRA loads", "busiest server",
         "spread CV", "sent to a full fleet: all / p90 tail"], rows)
    repeated = {f"{labels[key]} at {s['rate']:g}": s["repeats_ttft_p90_ms"]
                for key, steps in by_policy.items() for s in steps
                if s.get("repeats_ttft_p90_ms")}
    runs = max((len(p90s) for p90s in repeated.values()), default=0)
    repeats = ("At the comparison step, and at a step past it whose first run missed the SLO, "
               f"each policy ran {runs} times; the table's latency quantiles are over every "
               "request of those runs together, its request counts their sums and its rates "
               "their means. Each run's own TTFT p90 (ms): "
               + "; ".join(f"{label}: {' / '.join(common.fmt(p) for p in p90s)}"
                           for label, p90s in repeated.items()) + ".\n"
               if repeated else "")
    return f"""\
### {workload.label}

Load generator flags: `{' '.join(workload.args)}` (streaming completions, open loop);
servers' `--time-scale`: {', '.join(f"{t:g}" for t in workload.time_scales)}.
Latencies in ms; policies are compared at {workload.compare_rate:g} requests/s.

{table}

{repeats}
Goodput, SLO TTFT p90 ≤ {workload.slo_ttft_p90_ms:g} ms (≥: within it at every step offered):

{good_table}

![TTFT p90, {workload.label}]({figure})
"""


def _full_fleet(step: dict) -> str:
    """The step's requests sent while every server was at its batch limit, of all and of its
    TTFT p90 tail ("–" for a step measured before the traces were read)."""
    full = step.get("full_fleet")
    if full is None:
        return "–"
    return (f"{100 * full['requests'] / step['requests']:.0f} % / "
            f"{full['tail_at_full_fleet']} of {full['tail']}")


def _repeats_text(quick: bool) -> str:
    runs = compare_repeats(quick)
    if runs == 1:
        return "once each"
    return ("once each except the steps that decide the goodput ratios: the comparison "
            "step, and the first step past it whose first run misses the SLO (the goodput "
            f"interpolates towards its p90), run {runs} times in a row (their "
            "latency quantiles are over every request of the runs together; the n-th run gets "
            "the same requests under every policy, and no run repeats another's prompts, so "
            "runs differ in their mix of lengths as well as in this VM's noise)")


def markdown(results: dict, figures: dict[str, str], section_ratios: dict[str, float],
             quick: bool) -> str:
    """The section's text."""
    parts = [f"""\
{SIMS} simulators, each `{' '.join(SIM_ARGS)}` (plus a `--time-scale` per workload). Every
policy gets freshly started simulators (cold caches) and then the same requests at each offered
rate in turn, for {step_seconds(quick):g} s per rate, {_repeats_text(quick)}. From the
comparison step on, a policy stops at its first rate beyond the SLO: that step bounds its
goodput, and a higher rate would only overload it further.

The servers compute prefill and decode on one device (`--prefill-stalls-decode`): a prefill
waits for the prefills admitted before it and holds up every running request's next token, as
on a GPU without prefill/decode disaggregation, so a prefix-cache miss slows the whole server
down. (Runs before 2026-12-06 let prefills overlap for free; a miss then cost only its own
request and round-robin's shared-prefix goodput came within 10 % of the cache-aware
policies'.)

The peers are the routers a self-hosting team would pick instead, each from PyPI in its own
venv, serving the same simulators by URL: `sglang-router` {peers.PEERS["sglang"].version} (the
SGLang model gateway, Rust) and its fork `vllm-router` {peers.PEERS["vllm"].version}. Neither
reads the servers' `/metrics`: their load signal is their own count of requests in flight, plus
a `/get_load` poll every 30 s (the simulator answers it in SGLang's form). `cache_aware` keeps
an approximate radix tree of the prompt text it has sent to each server and sends a request to
the server with the longest match, unless the load is imbalanced, then to the least loaded;
`power_of_two` compares the load of two random servers. Each is a separate HTTP proxy hop, as
Envoy is for the other policies: measured here with 200 sequential requests it adds about
0.3-0.4 ms p50 over a direct request (sglang-router) and 1.1-1.7 ms for vllm-router's
`cache_aware`; Envoy with wasm-epp adds about 0.3 ms (see the overhead section).

wasm-epp runs three profiles: upstream's default; `examples/profiles/prefix-lora-delay.yaml`
(prefix-cache and LoRA affinity with the expected-delay scorer as its load signal); and
`examples/profiles/prefix-lora-delay-sjf.yaml`, the same plus flow control: a
`concurrency-detector` at the servers' batch limit ({BATCH_LIMIT}) holds the requests beyond
the fleet's batches in Envoy, and its band releases first the one that would finish first had
it started on arrival (arrival + `max_tokens` × the servers' measured time per token). The
goodput ratios speak for the last. The load generator sends each request's own output length
as `max_tokens` (on shared prefix and multi-LoRA every request has the same, so the order there
is first come, first served); the peers do not use it.

*busiest server* is the largest share of a step's requests that one server got (25 % is even);
*spread CV* the coefficient of variation of the requests per server. *out tok/s* divides by the step's wall time including the drain of requests still
running when the last one was sent, so a policy that builds a backlog shows less. *sent to a
full fleet* counts, from the load generator's per-request trace (`bench/traces.py`), the
requests sent while every server had its batch limit ({BATCH_LIMIT}) in flight, as the client
saw them: of all the step's requests, and of those at or above its TTFT p90. Where nearly all of
the tail was sent to a full fleet, the policies differ only in which queue such a request
joined; no router could have started it at once.
"""]
    good = goodputs(results)
    for workload in WORKLOADS:
        if workload.key in results:
            parts.append(_workload_markdown(workload, results[workload.key],
                                            good[workload.key], figures[workload.key]))
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
            "sjf_config": SJF_CONFIG,
            "workloads": {w.key: {"args": list(w.args), "slo_ttft_p90_ms": w.slo_ttft_p90_ms,
                                  "time_scales": list(w.time_scales)} for w in WORKLOADS},
            "results": results, "goodput": goodputs(results), "figures": figures}
    json.dumps(data)
    return common.Section(KEY, TITLE, data, section_ratios,
                          markdown(results, figures, section_ratios, ctx.quick))
