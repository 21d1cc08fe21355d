"""Section `flow_control`: the same overload burst with and without flow control.

Two simulators (the routing section's server profile) get more than they can serve for a
burst: a standard stream (no objective, priority 0) at about twice the fleet's capacity and a
critical stream (InferenceObjective `critical`, priority 10) at a tenth of it, both open loop and
streamed. The same wasm-epp profile runs twice, once with `featureGates: [flowControl]` and once
without (the gate off: requests go straight to the servers' queues). With flow control the
requests wait in Envoy while the pool is saturated (utilization detector, queue threshold 2)
and the critical band is released first; waits past `defaultRequestTTL` are answered 429.

Reported: TTFT p50/p90 per stream, how many requests each stream got answered and how many
were turned away (429) or timed out.
"""

from __future__ import annotations

import threading

from bench import common
from bench.routing import SIM_ARGS

KEY = "flow_control"
TITLE = "Flow control: an overload burst with and without queueing in Envoy"
SIMS = 2
# Each server runs 8 sequences of about 1 s (32 tokens × 25 ms plus prefill): the fleet serves
# about 16 requests/s. The standard stream offers twice that.
STANDARD_RATE = 30.0
CRITICAL_RATE = 3.0
TTL_S = 10
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
MANIFESTS = """\
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: critical, namespace: bench}
spec: {priority: 10, poolRef: {name: pool}}
"""
CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl={gate}]
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: utilization-detector
  parameters: {{queueDepthThreshold: 2}}
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: queue-scorer, weight: 2}}
  - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
  - {{pluginRef: prefix-cache-scorer, weight: 3}}
flowControl:
  defaultRequestTTL: {ttl}s
  saturationDetector: {{pluginRef: utilization-detector}}
"""
LOAD_ARGS = ("--prompt-bytes", "1024", "--max-tokens", "32", "--stream", "--concurrency",
             "1024", "--timeout", "120")


def burst_seconds(quick: bool) -> float:
    """How long the burst offers load."""
    return 8.0 if quick else 20.0


def _burst(ctx: common.Ctx, procs: common.Procs, envoy: common.Envoy, label: str) -> dict:
    """Both streams at once; {stream: loadgen report}."""
    seconds = burst_seconds(ctx.quick)
    streams = {
        "standard": (STANDARD_RATE, ()),
        "critical": (CRITICAL_RATE, ("--header", f"{OBJECTIVE_HEADER}: critical")),
    }
    reports: dict[str, dict] = {}
    failures: list[BaseException] = []

    def run(name: str, rate: float, extra: tuple[str, ...], seed: int) -> None:
        try:
            reports[name] = common.run_loadgen(
                ctx, procs, f"{envoy.url}/v1/completions",
                ["--requests", round(rate * seconds), "--rate", rate, "--seed", seed,
                 *LOAD_ARGS, *extra],
                f"{label}-{name}", timeout=seconds + 200)
        except BaseException as e:  # reported after both streams stop
            failures.append(e)

    threads = [threading.Thread(target=run, args=(name, rate, extra, 11 + i))
               for i, (name, (rate, extra)) in enumerate(streams.items())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return reports


def measure(ctx: common.Ctx) -> dict[str, dict]:
    """{setup: {stream: summary}} for flow control off and on."""
    results: dict[str, dict] = {}
    with common.Procs(ctx, KEY) as procs:
        sims = common.start_sims(ctx, procs, SIMS, SIM_ARGS, prefix="server")
        manifests = procs.dir / "objectives.yaml"
        manifests.write_text(MANIFESTS)
        for setup, gate in (("without", "false"), ("with", "true")):
            sims = common.restart_sims(ctx, procs, sims)
            controller = common.start_controller(
                ctx, procs, sims, CONFIG.format(gate=gate, ttl=TTL_S),
                name=f"controller-{setup}", extra=["--manifests", str(manifests)])
            envoy = common.start_epp_envoy(ctx, procs, controller, name=f"envoy-{setup}")
            reports = _burst(ctx, procs, envoy, f"{KEY}-{setup}")
            results[setup] = {name: _summary(r) for name, r in reports.items()}
            print(f"  flow control {setup}: critical TTFT p90 "
                  f"{(results[setup]['critical']['ttft_ms'] or {}).get('p90')} ms", flush=True)
            procs.stop([envoy.proc, controller.proc])
    return results


def _summary(report: dict) -> dict:
    errors = report["errors"]
    rejected = sum(n for k, n in errors.items() if k == "429")
    return {
        "requests": report["requests"],
        "ok": report["ok"],
        "rejected_429": rejected,
        "other_errors": sum(errors.values()) - rejected,
        "errors": errors,
        "ttft_ms": report["ttft_ms"],
        "wall_s": report["wall_s"],
    }


def run(ctx: common.Ctx) -> common.Section:
    """Runs the section."""
    results = measure(ctx)
    p90 = {setup: (r["critical"]["ttft_ms"] or {}).get("p90") for setup, r in results.items()}
    section_ratios = {
        "flow_control_critical_ttft_p90_without_over_with": common.ratio(p90["without"],
                                                                         p90["with"]),
    }
    rows = []
    for setup, streams in results.items():
        for name, s in streams.items():
            ttft = s["ttft_ms"] or {}
            rows.append([f"flow control {'on' if setup == 'with' else 'off'}", name,
                         f"{s['ok']}/{s['requests']}", s["rejected_429"], s["other_errors"],
                         ttft.get("p50"), ttft.get("p90")])
    table = common.md_table(["setup", "stream", "answered 200", "429 (queue full or TTL)",
                             "other errors", "TTFT p50 (ms)", "TTFT p90 (ms)"], rows)
    seconds = burst_seconds(ctx.quick)
    markdown = f"""\
{SIMS} simulators (the routing section's server profile, about 16 requests/s together); for
{seconds:g} s a standard stream at {STANDARD_RATE:g} requests/s and a critical stream
(InferenceObjective priority 10) at {CRITICAL_RATE:g} requests/s, 1 KB prompts, 32 output
tokens, streamed. The same profile with `featureGates: [flowControl]` on and off; the saturation
detector is the `utilization-detector` with `queueDepthThreshold: 2`, the queue TTL {TTL_S} s.

{table}

Ratio: `flow_control_critical_ttft_p90_without_over_with` {common.fmt(section_ratios[
        "flow_control_critical_ttft_p90_without_over_with"], 2)} (> 1: the critical stream's
first tokens come sooner with flow control). Without flow control every request joins a server's
queue and the critical stream waits behind the whole backlog; with it the backlog waits inside
Envoy, the critical band leaves first, and the standard requests that cannot be served within
the TTL are answered 429 instead of being served late. What this does not show: the
time-to-first-token a client sees includes the wait in Envoy (it is in these figures), and a
real server's saturation signal (vLLM's waiting queue and KV usage) moves as the simulator's does
only approximately.
"""
    data = {"standard_rate": STANDARD_RATE, "critical_rate": CRITICAL_RATE,
            "burst_s": seconds, "ttl_s": TTL_S, "results": results}
    return common.Section(KEY, TITLE, data, section_ratios, markdown)
