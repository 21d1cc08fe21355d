"""Section `overhead`: what the picker costs on the data path, wasm-epp in Envoy against the
upstream design (an ext_proc gRPC server making the same pick, `wasm-epp-extproc`).

Four Envoys (`--concurrency 1`) run side by side over the same simulators, which answer at
once, so the proxy dominates: no picker (round-robin), the host floor (a Proxy-Wasm filter that
pauses, buffers the body and sets the destination round-robin without deciding anything,
`bench/host-floor`, in the shipped `envoy/envoy.yaml`), wasm-epp (ORIGINAL_DST) and ext_proc
(ORIGINAL_DST). Each gets the same open-loop request rate, per prompt size, in alternating
rounds (the order rotates each round) so drift hits all four alike. The floor is what any
body-reading picker costs in this Envoy before it decides anything; wasm-epp's cost over it is
its own. Reported: latency added
over the no-picker Envoy (p50/p99, median over rounds of the per-round difference), CPU per
request of Envoy and of the ext_proc server from /proc (the controller, common to both, on
its own line), and the time one pick takes at 8, 100 and 1,000 endpoints: inside Envoy (the
filter's `wasmcustom.wasm_epp_decision_ns` histogram), in the ext_proc server (the same
`Director::decide`, native) and, in full mode, `cargo bench --bench pick`. Where a request's time
goes inside the filter comes from a fourth Envoy running the filter built with the
`phase-timers` feature (per-phase histograms), on the same load after the measured rounds.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import time
from dataclasses import dataclass

from bench import common
from bench.extproc_envoy import start_extproc, start_extproc_envoy

KEY = "overhead"
TITLE = "Data-plane overhead: wasm-epp in Envoy vs an ext_proc picker"
MODES = ("plain", "floor", "wasm", "extproc")
LABELS = {"plain": "no picker", "floor": "host floor", "wasm": "wasm-epp", "extproc": "ext_proc"}
# Simulators with no modelled latency and room for every request at once.
SIM_ARGS = ["--ttft-base-ms", "0", "--prefill-ms-per-token", "0", "--itl-ms", "0",
            "--max-num-seqs", "256"]
SIMS = 3
PICK_ENDPOINTS = (8, 100, 1000)
# Ports of the pick-time runs' extra endpoints: nothing listens there (below the usual
# ephemeral range), so requests picked onto them fail after the decision, which is all that
# run measures.
IDLE_PORT_BASE = 30000
# Top-level bootstrap key: histogram quantiles are computed at each stats flush.
FAST_STATS_FLUSH = "stats_flush_interval: 1s\n"
# The filter built with per-phase histograms (`make wasm-phase-timers`).
TIMED_WASM = ("target", "phase-timers", "wasm32-wasip1", "wasm", "wasm_epp.wasm")
# The filter that decides nothing (`bench/host-floor`, built by the benchmark's make targets).
FLOOR_WASM = ("target", "wasm32-wasip1", "wasm", "wasm_epp_host_floor.wasm")
# The phase histograms, in request order, with their table headings.
PHASES = (("headers", "headers read + control headers removed"),
          ("body_copy", "body copied into Wasm"),
          ("parse", "parse (+ candidates, rewrite, admission)"),
          ("hash", "prompt hashing"),
          ("lookup", "prefix lookup"),
          ("score", "scoring + pick"),
          ("record", "prefix record"),
          ("apply", "apply (header, in-flight)"),
          ("response", "response path"))
# Seconds after which a filter instance that has routed nothing stops counting as an active
# worker (`ACTIVE_MS` in src/exchange/mod.rs), plus two heartbeats for its peers to hear it.
ACTIVE_S = 12.0
# Endpoint counts whose pick runs are also timed phase by phase.
PHASE_ENDPOINTS = (8, 1000)


@dataclass(frozen=True)
class Size:
    """One prompt size: its key, bytes, offered rate and requests per round and mode."""

    key: str
    label: str
    prompt_bytes: int
    rate: float
    requests: int


def plan(quick: bool) -> tuple[list[Size], int]:
    """The prompt sizes and the number of rounds. Rates stay well under what the slowest
    mode sustains on 2 cores, so every mode sees the same offered load."""
    if quick:
        return [Size("1kb", "1 KB", 1024, 100, 250),
                Size("100kb", "100 KB", 100 * 1024, 50, 125),
                Size("1mb", "1 MB", 1024 * 1024, 10, 30)], 3
    return [Size("1kb", "1 KB", 1024, 100, 500),
            Size("100kb", "100 KB", 100 * 1024, 50, 250),
            Size("1mb", "1 MB", 1024 * 1024, 10, 50)], 5


def _cpu(pids: list[int]) -> float:
    return sum(common.cpu_seconds(pid) for pid in pids)


def _load(ctx, procs, envoy: common.Envoy, size: Size, label: str, requests: int) -> dict:
    args = ["--requests", requests, "--rate", size.rate, "--concurrency", 64,
            "--max-tokens", 1, "--prompt-bytes", size.prompt_bytes, "--timeout", 30]
    return common.run_loadgen(ctx, procs, f"{envoy.url}/v1/completions", args, label,
                              timeout=requests / size.rate + 120)


def _check(report: dict, mode: str, sim_names: set[str]) -> None:
    """Every request succeeded and was answered by one of the pool's simulators."""
    if report["ok"] != report["requests"]:
        raise RuntimeError(f"{LABELS[mode]}: {report['ok']}/{report['requests']} ok, "
                           f"errors {report['errors']}")
    seen = {i["name"] for i in report.get("instances", [])}
    if not seen <= sim_names:
        raise RuntimeError(f"{LABELS[mode]}: answers from outside the pool: {seen - sim_names}")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _start_wasm_envoy(ctx, procs, controller: common.Controller, name: str,
                      timed: bool = False) -> common.Envoy:
    """Envoy with wasm-epp (the shipped envoy/envoy.yaml; `timed`: the phase-timers build)
    and a 1 s stats flush; the caller checks that it picks. A timed Envoy is returned once
    the filter's copies on Envoy's main thread, which route nothing, have stopped counting as
    active workers (about `ACTIVE_S` after start): until then each decision also enqueues its
    records to them, which the phase timers would count in the `apply` phase."""
    admin, port = common.free_port(), common.free_port()
    wasm = ctx.repo.joinpath(*TIMED_WASM) if timed else None
    if wasm is not None and not wasm.is_file():
        raise FileNotFoundError(f"{wasm} is missing; run `make wasm-phase-timers`")
    config = common.epp_envoy_config(ctx, admin, port, controller, wasm=wasm) + FAST_STATS_FLUSH
    started = time.monotonic()
    envoy = common.start_envoy(ctx, procs, config, admin, port, 1, name)
    if timed:
        time.sleep(max(0.0, started + ACTIVE_S - time.monotonic()))
    return envoy


def _start_floor_envoy(ctx, procs, controller: common.Controller, sims,
                       name: str) -> common.Envoy:
    """The shipped `envoy/envoy.yaml` with the host-floor filter in wasm-epp's place, setting
    the simulators' addresses in turn (its bootstrap copy, given the poller's configuration,
    does nothing)."""
    wasm = ctx.repo.joinpath(*FLOOR_WASM)
    if not wasm.is_file():
        raise FileNotFoundError(f"{wasm} is missing; run `make wasm-host-floor`")
    admin, port = common.free_port(), common.free_port()
    addresses = ",".join(f"127.0.0.1:{s.port}" for s in sims)
    config = common.epp_envoy_config(ctx, admin, port, controller, filter_config=addresses,
                                     wasm=wasm)
    return common.start_envoy(ctx, procs, config, admin, port, 1, name)


def _phase_times(envoy: common.Envoy) -> dict:
    """p50 (µs) of each phase histogram and of the whole decision, after the next stats flush;
    NaN for a phase with no samples."""
    time.sleep(1.5)
    out = {}
    for key, _ in PHASES + (("decision", ""),):
        name = "wasm_epp_decision_ns" if key == "decision" else f"wasm_epp_phase_{key}_ns"
        try:
            out[key] = _histogram_us(envoy, name)["p50_us"]
        except RuntimeError:
            out[key] = math.nan
    return out


def measure_phases(ctx, procs, controller, size: Size, sim_names: set[str]) -> dict:
    """The same load as one measured round, through the phase-timers filter."""
    envoy = _start_wasm_envoy(ctx, procs, controller, f"envoy-timed-{size.key}", timed=True)
    common.wait_picking(envoy.url, proc=envoy.proc)
    _check(_load(ctx, procs, envoy, size, f"warm-timed-{size.key}", 20), "wasm", sim_names)
    _check(_load(ctx, procs, envoy, size, f"timed-{size.key}", size.requests), "wasm",
           sim_names)
    phases = _phase_times(envoy)
    procs.stop([envoy.proc])
    return phases


def _decision_times(procs, wasm: common.Envoy, xenvoy: common.Envoy, extproc) -> dict:
    """Stops the ext_proc pair and returns both pickers' decision times so far: the filter's
    histogram (read after the next stats flush) and the server's own summary, which it prints
    when stopped (its Envoy goes first, so no gRPC stream holds the shutdown)."""
    time.sleep(1.5)
    in_envoy = _histogram_us(wasm, "wasm_epp_decision_ns")
    procs.stop([xenvoy.proc, extproc.proc])
    server = _parse_summary("EXTPROC_PICK", extproc.proc.log.read_text(errors="replace"))
    if server is None:
        raise RuntimeError(f"wasm-epp-extproc printed no EXTPROC_PICK line:\n"
                           f"{extproc.proc.log_tail()}")
    return {"wasm_in_envoy": in_envoy, "extproc_server": server}


def _summary(per_round: list[dict]) -> dict:
    """Per mode: median p50/p99 over rounds, added latency (median of the per-round
    difference to the no-picker run) and CPU per request over all rounds."""
    summary = {}
    for mode in MODES:
        runs = [row[mode] for row in per_round]
        requests = sum(x["requests"] for x in runs)
        envoy_us = sum(x["envoy_cpu_s"] for x in runs) / requests * 1e6
        picker_us = sum(x["picker_cpu_s"] for x in runs) / requests * 1e6
        summary[mode] = {
            "p50_ms": _median([x["p50_ms"] for x in runs]),
            "p99_ms": _median([x["p99_ms"] for x in runs]),
            "added_p50_ms": _median([row[mode]["p50_ms"] - row["plain"]["p50_ms"]
                                     for row in per_round]),
            "added_p99_ms": _median([row[mode]["p99_ms"] - row["plain"]["p99_ms"]
                                     for row in per_round]),
            "envoy_cpu_us_per_req": envoy_us,
            "picker_cpu_us_per_req": picker_us,
            "cpu_us_per_req": envoy_us + picker_us,
        }
    return summary


def measure_idle(pids: dict[str, list[int]], seconds: float = 5.0) -> dict[str, float]:
    """CPU each mode's processes use with no requests (ms of CPU per second, the same window
    for all): the fixed cost of polling snapshots and timers, paid whatever the traffic."""
    before, started = {m: _cpu(p) for m, p in pids.items()}, time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    return {m: (_cpu(p) - before[m]) / wall * 1000 for m, p in pids.items()}


def measure_size(ctx, procs, sims, controller, size: Size, rounds: int) -> tuple[dict, float]:
    """One prompt size with fresh Envoys (and ext_proc server), so each picker's decision
    times are this size's alone. Returns the size's results and the controller's CPU
    seconds during its runs."""
    sim_names = {s.name for s in sims}
    extproc = start_extproc(ctx, procs, controller, name=f"extproc-{size.key}")
    wasm_started = time.monotonic()
    envoys = {"plain": common.start_plain_envoy(ctx, procs, sims, name=f"envoy-plain-{size.key}"),
              "floor": _start_floor_envoy(ctx, procs, controller, sims,
                                          f"envoy-floor-{size.key}"),
              "wasm": _start_wasm_envoy(ctx, procs, controller, f"envoy-wasm-{size.key}"),
              "extproc": start_extproc_envoy(ctx, procs, extproc, name=f"envoy-extproc-{size.key}",
                                             extra_config=FAST_STATS_FLUSH)}
    common.wait_picking(envoys["wasm"].url, proc=envoys["wasm"].proc)
    common.wait_picking(envoys["extproc"].url, proc=extproc.proc)
    pids = {"plain": [envoys["plain"].proc.pid], "floor": [envoys["floor"].proc.pid],
            "wasm": [envoys["wasm"].proc.pid],
            "extproc": [envoys["extproc"].proc.pid, extproc.proc.pid]}
    # Measure wasm-epp in its steady state: for its first `ACTIVE_S` the filter's copy on
    # Envoy's main thread counts as an active worker and each decision also enqueues its
    # records to it (6 host calls per request after that, about 8 before, measured here).
    time.sleep(max(0.0, wasm_started + ACTIVE_S - time.monotonic()))
    idle = measure_idle(pids)
    for mode in MODES:  # warm-up: connections, V8 tiers, allocator pools
        _check(_load(ctx, procs, envoys[mode], size, f"warm-{mode}-{size.key}", 20), mode,
               sim_names)
    per_round: list[dict] = []
    instances: dict[str, dict[str, int]] = {m: {} for m in MODES}
    controller_cpu = 0.0
    for r in range(rounds):
        row = {}
        turn = r % len(MODES)
        for mode in MODES[turn:] + MODES[:turn]:
            envoy_cpu0 = common.cpu_seconds(envoys[mode].proc.pid)
            all_cpu0, ctl_cpu0 = _cpu(pids[mode]), common.cpu_seconds(controller.proc.pid)
            report = _load(ctx, procs, envoys[mode], size, f"{mode}-{size.key}-{r}",
                           size.requests)
            envoy_cpu = common.cpu_seconds(envoys[mode].proc.pid) - envoy_cpu0
            all_cpu = _cpu(pids[mode]) - all_cpu0
            controller_cpu += common.cpu_seconds(controller.proc.pid) - ctl_cpu0
            _check(report, mode, sim_names)
            for inst in report["instances"]:
                counts = instances[mode]
                counts[inst["name"]] = counts.get(inst["name"], 0) + inst["count"]
            row[mode] = {"p50_ms": report["latency_ms"]["p50"],
                         "p99_ms": report["latency_ms"]["p99"],
                         "requests": report["ok"], "envoy_cpu_s": envoy_cpu,
                         "picker_cpu_s": all_cpu - envoy_cpu}
        per_round.append(row)
    decisions = _decision_times(procs, envoys["wasm"], envoys["extproc"], extproc)
    procs.stop([envoys["wasm"].proc, envoys["floor"].proc, envoys["plain"].proc])
    phases = measure_phases(ctx, procs, controller, size, sim_names)
    return {"label": size.label, "prompt_bytes": size.prompt_bytes, "rate_per_s": size.rate,
            "idle_cpu_ms_per_s": idle,
            "requests_per_round": size.requests, "rounds": rounds, "per_round": per_round,
            "summary": _summary(per_round), "decision_us": decisions, "phases_us": phases,
            "instances": instances}, controller_cpu


def measure_latency(ctx, procs, sims, controller) -> dict:
    """Every prompt size of the plan, and the controller's CPU per request over them."""
    sizes, rounds = plan(ctx.quick)
    results, controller_cpu, requests = {}, 0.0, 0
    for size in sizes:
        results[size.key], cpu = measure_size(ctx, procs, sims, controller, size, rounds)
        controller_cpu += cpu
        requests += sum(row[m]["requests"] for row in results[size.key]["per_round"]
                        for m in MODES)
    return {"sizes": results,
            "controller_cpu_us_per_req": controller_cpu / requests * 1e6 if requests
            else math.nan}


def wait_snapshot(url: str, timeout: float = 20.0) -> None:
    """Waits until the picker behind `url` has a snapshot: `GET /v1/models` gets anything but
    the picker's own rejection (with dead endpoints in the pool a pick may well 503 in Envoy,
    which still proves a decision was made)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, body = common.http_request(f"{url}/v1/models", timeout=2.0)
            if status == 200 or not body.startswith(b"inference error"):
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url}: the picker had no snapshot within {timeout:.0f} s")


def _histogram_us(envoy: common.Envoy, name: str) -> dict:
    """Cumulative p50/p90/p99 (µs) of the Envoy histogram whose name contains `name`."""
    url = f"http://127.0.0.1:{envoy.admin_port}/stats?format=json&filter={name}"
    for entry in common.http_json(url).get("stats", []):
        hist = entry.get("histograms")
        if not hist:
            continue
        quantiles = hist["supported_quantiles"]
        for computed in hist["computed_quantiles"]:
            values = {q: v.get("cumulative") for q, v in zip(quantiles, computed["values"])}
            if values.get(50) is None:
                continue
            return {f"p{q}_us": values[q] / 1000 for q in (50, 90, 99)}
    raise RuntimeError(f"Envoy histogram {name} has no data")


_SUMMARY = re.compile(r"count=(\d+) p50_us=([\d.]+) p90_us=([\d.]+) p99_us=([\d.]+)")


def _parse_summary(line_prefix: str, text: str) -> dict | None:
    for line in text.splitlines():
        if line.startswith(line_prefix):
            match = _SUMMARY.search(line)
            if match:
                count, p50, p90, p99 = match.groups()
                return {"count": int(count), "p50_us": float(p50), "p90_us": float(p90),
                        "p99_us": float(p99)}
    return None


def measure_pick_time(ctx, procs, sim: common.Sim) -> dict:
    """Decision time at each pool size, in wasm-epp inside Envoy and in the ext_proc server
    (and, in full mode, `cargo bench --bench pick`)."""
    requests = 500 if ctx.quick else 2000
    args = ["--requests", requests, "--concurrency", 2, "--max-tokens", 1, "--prompt-bytes", 1024,
            "--shared-prefix-groups", 16, "--prefix-bytes", 768, "--timeout", 5]
    out = {}
    for n in PICK_ENDPOINTS:
        pool = [sim] + [common.Sim(f"idle-{i}", IDLE_PORT_BASE + i, [], None)
                        for i in range(1, n)]
        # The idle endpoints stay candidates (their scrapes fail): a pick over n endpoints.
        controller = common.start_controller(ctx, procs, pool, name=f"controller-{n}",
                                             extra=["--refresh-metrics-interval", "1s",
                                                    "--failed-scrapes-before-unready",
                                                    "1000000000"])
        wasm = _start_wasm_envoy(ctx, procs, controller, f"envoy-wasm-{n}")
        extproc = start_extproc(ctx, procs, controller, name=f"extproc-{n}")
        xenvoy = start_extproc_envoy(ctx, procs, extproc, name=f"envoy-extproc-{n}",
                                     extra_config=FAST_STATS_FLUSH)
        for label, envoy in (("wasm", wasm), ("extproc", xenvoy)):
            wait_snapshot(envoy.url)
            common.run_loadgen(ctx, procs, f"{envoy.url}/v1/completions", args,
                               f"pick-{label}-{n}", timeout=120)
        out[str(n)] = _decision_times(procs, wasm, xenvoy, extproc)
        procs.stop([wasm.proc])
        if n in PHASE_ENDPOINTS:
            timed = _start_wasm_envoy(ctx, procs, controller, f"envoy-timed-{n}", timed=True)
            wait_snapshot(timed.url)
            common.run_loadgen(ctx, procs, f"{timed.url}/v1/completions", args,
                               f"pick-timed-{n}", timeout=120)
            out[str(n)]["phases_us"] = _phase_times(timed)
            procs.stop([timed.proc])
        procs.stop([controller.proc])
    if not ctx.quick:
        native = native_pick_bench(ctx)
        for n, row in out.items():
            row["native_bench"] = native.get(n)
    return out


def native_pick_bench(ctx) -> dict:
    """`cargo bench --bench pick` (benches/pick.rs): `PICK endpoints=N ...` lines by N."""
    result = subprocess.run(["cargo", "bench", "--locked", "-p", "wasm-epp", "--bench", "pick"],
                            cwd=ctx.repo, capture_output=True, text=True, timeout=1200,
                            check=False)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.splitlines()[-5:])
        raise RuntimeError(f"cargo bench --bench pick exited {result.returncode}:\n{tail}")
    out = {}
    for line in result.stdout.splitlines():
        match = re.match(r"PICK endpoints=(\d+)\s+p50_us=([\d.]+) p90_us=([\d.]+) "
                         r"p99_us=([\d.]+)", line)
        if match:
            n, p50, p90, p99 = match.groups()
            out[n] = {"p50_us": float(p50), "p90_us": float(p90), "p99_us": float(p99)}
    return out


def plot_added_latency(ctx, sizes: dict) -> str:
    """Grouped bars: added p50 and p99 (ms) of wasm-epp and ext_proc per prompt size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [row["label"] for row in sizes.values()]
    bars = [(f"{LABELS[m]} {q}", m, q) for m in ("wasm", "extproc") for q in ("p50", "p99")]
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for i, (name, mode, q) in enumerate(bars):
        values = [row["summary"][mode][f"added_{q}_ms"] for row in sizes.values()]
        ax.bar([x + (i - (len(bars) - 1) / 2) * width for x in range(len(labels))],
               [0 if math.isnan(v) else v for v in values], width, label=name)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("prompt size")
    ax.set_ylabel("added latency over Envoy without a picker (ms)")
    ax.set_title("Latency the picker adds, same fixed request rate")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    return common.save_figure(ctx, fig, "overhead-added-latency.png")


def _added_ratio(extproc: float, wasm: float) -> float:
    """ext_proc's added latency over wasm-epp's; NaN when wasm-epp's is not above 0 (within
    noise of the no-picker Envoy, so no meaningful ratio)."""
    return common.ratio(extproc, wasm) if wasm > 0 else math.nan


def ratios(latency: dict, pick: dict) -> dict[str, float]:
    """The section's RATIO lines."""
    out = {}
    for key, row in latency["sizes"].items():
        s = row["summary"]
        out[f"added_p50_extproc_over_wasm_{key}"] = _added_ratio(
            s["extproc"]["added_p50_ms"], s["wasm"]["added_p50_ms"])
        out[f"added_p99_extproc_over_wasm_{key}"] = _added_ratio(
            s["extproc"]["added_p99_ms"], s["wasm"]["added_p99_ms"])
        out[f"cpu_extproc_over_wasm_{key}"] = common.ratio(
            s["extproc"]["cpu_us_per_req"], s["wasm"]["cpu_us_per_req"])
        out[f"decision_wasm_over_native_{key}"] = common.ratio(
            row["decision_us"]["wasm_in_envoy"]["p50_us"],
            row["decision_us"]["extproc_server"]["p50_us"])
        out[f"added_cpu_extproc_over_wasm_{key}"] = _added_ratio(
            s["extproc"]["cpu_us_per_req"] - s["plain"]["cpu_us_per_req"],
            s["wasm"]["cpu_us_per_req"] - s["plain"]["cpu_us_per_req"])
        # The best any body-reading Proxy-Wasm picker could score on this Envoy, and what
        # wasm-epp costs over that floor.
        out[f"added_p50_extproc_over_floor_{key}"] = _added_ratio(
            s["extproc"]["added_p50_ms"], s["floor"]["added_p50_ms"])
        out[f"cpu_extproc_over_floor_{key}"] = common.ratio(
            s["extproc"]["cpu_us_per_req"], s["floor"]["cpu_us_per_req"])
        out[f"added_p50_wasm_minus_floor_us_{key}"] = 1000 * (
            s["wasm"]["added_p50_ms"] - s["floor"]["added_p50_ms"])
        out[f"cpu_wasm_minus_floor_us_{key}"] = (
            s["wasm"]["cpu_us_per_req"] - s["floor"]["cpu_us_per_req"])
    biggest = str(max(PICK_ENDPOINTS))
    out[f"pick_p50_wasm_in_envoy_over_native_{biggest}ep"] = common.ratio(
        pick[biggest]["wasm_in_envoy"]["p50_us"], pick[biggest]["extproc_server"]["p50_us"])
    out[f"pick_{biggest}_endpoints_us"] = pick[biggest]["wasm_in_envoy"]["p50_us"]
    return out


def phase_table(latency: dict, pick: dict) -> str:
    """The "where a request's time goes" table: p50 of each phase histogram (µs), per prompt
    size (3 endpoints) and per pool size (1 KB prompts), with the shipped filter's added p50."""
    rows = []
    for row in latency["sizes"].values():
        phases = row["phases_us"]
        added_us = row["summary"]["wasm"]["added_p50_ms"] * 1000
        inside = sum(v for k, v in phases.items() if k != "decision" and not math.isnan(v))
        rows.append([f"{row['label']}, 3 endpoints"] + [phases[k] for k, _ in PHASES]
                    + [phases["decision"], inside, added_us, added_us - inside])
    for n in PHASE_ENDPOINTS:
        phases = pick.get(str(n), {}).get("phases_us")
        if phases:
            inside = sum(v for k, v in phases.items() if k != "decision" and not math.isnan(v))
            rows.append([f"1 KB, {n:,} endpoints"] + [phases[k] for k, _ in PHASES]
                        + [phases["decision"], inside, None, None])
    headers = (["request"] + [label for _, label in PHASES]
               + ["decision (whole)", "sum of the filter's phases", "added p50 (shipped filter)",
                  "rest: Envoy buffering, callbacks, VM entry"])
    return common.md_table(headers, rows)


def markdown(ctx, latency: dict, pick: dict, figure: str) -> str:
    """The section's tables and notes."""
    sizes = latency["sizes"]
    first = next(iter(sizes.values()))
    lines = [
        f"Four Envoys (`--concurrency 1`) side by side over the same {SIMS} simulators, which "
        "answer at once (no modelled latency), so the proxy path dominates: **no picker** "
        "(round-robin cluster), **host floor** (`bench/host-floor`: a Proxy-Wasm filter, "
        "built like wasm-epp, in the shipped `envoy/envoy.yaml`, that pauses the headers, lets "
        "Envoy buffer the body and sets the destination header round-robin — no body copy, no "
        "parse, no shared data: what any picker that reads the prompt pays this Envoy before "
        "deciding anything), **wasm-epp** (the filter, ORIGINAL_DST) and **ext_proc** "
        "(`wasm-epp-extproc`: the same `Director::decide`, snapshot long-poll, prefix index and "
        "in-flight counts, one gRPC hop away; request headers SEND, request body "
        "FULL_DUPLEX_STREAMED as the upstream EPP requires, the body streamed back in "
        "≤62,000-byte chunks, the routing header answered with `clear_route_cache`, response "
        "path SKIP, fail-closed, ORIGINAL_DST). The ext_proc server runs one Tokio worker "
        "thread, like Envoy's one worker. Completions with unique prompts, `max_tokens` 1, the "
        f"same open-loop rate for every mode, {first['rounds']} rounds in rotating order, "
        f"from {ACTIVE_S:.0f} s after wasm-epp's Envoy started (its steady state: before that "
        "the filter's copy on Envoy's main thread also gets every decision's records); "
        "added latency is the median over rounds of (mode − no picker) in the same round. "
        "Every request of every run succeeded (checked) and was answered by a pool simulator.",
        "",
        "**Added latency over Envoy without a picker** (client-measured, ms):",
        "",
        common.md_table(
            ["prompt", "rate (req/s)", "requests/round", "no picker p50",
             "host floor added p50", "wasm-epp added p50", "ext_proc added p50",
             "ext_proc / wasm-epp", "ext_proc / host floor", "no picker p99",
             "host floor added p99", "wasm-epp added p99", "ext_proc added p99"],
            [[row["label"], row["rate_per_s"], row["requests_per_round"],
              row["summary"]["plain"]["p50_ms"], row["summary"]["floor"]["added_p50_ms"],
              row["summary"]["wasm"]["added_p50_ms"],
              row["summary"]["extproc"]["added_p50_ms"],
              _added_ratio(row["summary"]["extproc"]["added_p50_ms"],
                           row["summary"]["wasm"]["added_p50_ms"]),
              _added_ratio(row["summary"]["extproc"]["added_p50_ms"],
                           row["summary"]["floor"]["added_p50_ms"]),
              row["summary"]["plain"]["p99_ms"], row["summary"]["floor"]["added_p99_ms"],
              row["summary"]["wasm"]["added_p99_ms"],
              row["summary"]["extproc"]["added_p99_ms"]] for row in sizes.values()],
            digits=3),
        "",
        f"![added latency]({figure})",
        "",
        "**CPU per request** (µs, user+system from /proc over all rounds; the ext_proc "
        "server's own CPU counted on top of its Envoy):",
        "",
        common.md_table(
            ["prompt", "no picker: Envoy", "host floor: Envoy", "wasm-epp: Envoy",
             "ext_proc: Envoy", "ext_proc: server", "ext_proc total / wasm-epp",
             "ext_proc total / host floor", "wasm-epp − host floor"],
            [[row["label"], row["summary"]["plain"]["envoy_cpu_us_per_req"],
              row["summary"]["floor"]["envoy_cpu_us_per_req"],
              row["summary"]["wasm"]["envoy_cpu_us_per_req"],
              row["summary"]["extproc"]["envoy_cpu_us_per_req"],
              row["summary"]["extproc"]["picker_cpu_us_per_req"],
              common.ratio(row["summary"]["extproc"]["cpu_us_per_req"],
                           row["summary"]["wasm"]["cpu_us_per_req"]),
              common.ratio(row["summary"]["extproc"]["cpu_us_per_req"],
                           row["summary"]["floor"]["cpu_us_per_req"]),
              row["summary"]["wasm"]["cpu_us_per_req"]
              - row["summary"]["floor"]["cpu_us_per_req"]]
             for row in sizes.values()]),
        "",
        "\"ext_proc total / host floor\" is the most any Proxy-Wasm picker that buffers the "
        "body could score against ext_proc on this Envoy at this rate; \"wasm-epp − host "
        "floor\" is what wasm-epp's own work (body copy, parse, hashing, prefix index, pick, "
        "in-flight accounting, response path) costs on top.",
        "",
        "Idle, before each size's runs (ms of CPU per second, no requests, the same 5 s for "
        "all; at r req/s a mode's idle cost adds 1000/r times this to its µs per request): "
        + "; ".join(f"{row['label']}: " + ", ".join(
            f"{LABELS[m]} {common.fmt(row['idle_cpu_ms_per_s'][m])}" for m in MODES)
            for row in sizes.values() if "idle_cpu_ms_per_s" in row) + ".",
        "",
        "**Time of one decision in those runs** (µs, all requests of that size, warm-up "
        "included; 3 endpoints): the filter's `wasmcustom.wasm_epp_decision_ns` inside "
        "Envoy (Wasm under V8) against the same `Director::decide` timed natively in the ext_proc "
        "server. Parsing the body and hashing the prompt for the prefix index grow with the "
        "prompt, so this is where a large prompt's cost goes in each design:",
        "",
        common.md_table(
            ["prompt", "wasm-epp in Envoy p50", "p99", "ext_proc server p50", "p99",
             "wasm / native p50"],
            [[row["label"], row["decision_us"]["wasm_in_envoy"]["p50_us"],
              row["decision_us"]["wasm_in_envoy"]["p99_us"],
              row["decision_us"]["extproc_server"]["p50_us"],
              row["decision_us"]["extproc_server"]["p99_us"],
              common.ratio(row["decision_us"]["wasm_in_envoy"]["p50_us"],
                           row["decision_us"]["extproc_server"]["p50_us"])]
             for row in sizes.values()]),
        "",
        "**Where a request's time goes** (µs, p50 of each phase's histogram in the filter built "
        "with the `phase-timers` feature, `wasmcustom.wasm_epp_phase_<phase>_ns`, on the same "
        "load as one measured round after them; the pool-size rows are the pick runs below). "
        "\"Added p50\" is the shipped filter's added latency from the table above, and the last "
        "column is that minus the sum of the phases' medians: the part no in-filter timer can see "
        "(Envoy buffering the body, the callbacks into the VM, context creation), a difference "
        "of medians rather than a median of differences. The timers' own clock reads add a few "
        "µs to each phase:",
        "",
        phase_table(latency, pick),
        "",
        f"The controller, which feeds both pickers, used "
        f"{common.fmt(latency['controller_cpu_us_per_req'])} µs per request over these runs "
        "(mostly scraping the simulators every 50 ms, so it depends on time, not on requests).",
        "",
        "**Time of one pick** (µs, default profile, 1 KB prompts in 16 groups sharing a "
        "768-byte prefix; one real simulator, the other endpoints addresses where nothing "
        "listens): inside Envoy is the filter's `wasmcustom.wasm_epp_decision_ns` histogram "
        "(Wasm under V8, snapshot read from shared data included); the ext_proc server times "
        "the same `Director::decide` natively"
        + ("; `cargo bench --bench pick` is the same decision in a loop, no I/O." if not ctx.quick
           else " (quick mode skips `cargo bench --bench pick`)."),
        "",
    ]
    headers = ["endpoints", "wasm-epp in Envoy p50", "p99", "ext_proc server p50", "p99"]
    if not ctx.quick:
        headers += ["cargo bench p50", "p99"]
    rows = []
    for n, row in pick.items():
        cells = [n, row["wasm_in_envoy"]["p50_us"], row["wasm_in_envoy"]["p99_us"],
                 row["extproc_server"]["p50_us"], row["extproc_server"]["p99_us"]]
        if not ctx.quick:
            native = row.get("native_bench") or {}
            cells += [native.get("p50_us"), native.get("p99_us")]
        rows.append(cells)
    lines += [common.md_table(headers, rows), ""]
    shares = []
    for row in sizes.values():
        for mode in ("wasm", "extproc"):
            counts = row["instances"][mode]
            total = sum(counts.values())
            shares.append(f"{row['label']} {LABELS[mode]}: " + ", ".join(
                f"{name} {count / total:.0%}" for name, count in sorted(counts.items())))
    lines += ["Where the picked requests went (both pickers over the same pool): "
              + "; ".join(shares) + ".", ""]
    return "\n".join(lines)


def run(ctx: common.Ctx) -> common.Section:
    """Runs the section."""
    with common.Procs(ctx, KEY) as procs:
        sims = common.start_sims(ctx, procs, SIMS, SIM_ARGS, prefix="fast")
        controller = common.start_controller(ctx, procs, sims)
        latency = measure_latency(ctx, procs, sims, controller)
        procs.stop([controller.proc])
        pick = measure_pick_time(ctx, procs, sims[0])
    figure = plot_added_latency(ctx, latency["sizes"])
    results = {"mode": "quick" if ctx.quick else "full", "simulators": SIMS,
               "sim_args": SIM_ARGS, **latency, "pick_time": pick, "figure": figure}
    json.dumps(results)  # fail here, not in the report, if something is not JSON-able
    return common.Section(KEY, TITLE, results, ratios(latency, pick),
                          markdown(ctx, latency, pick, figure))
