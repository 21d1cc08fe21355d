"""Section `controller_cost`: what the controller costs at 10, 100 and 1,000 endpoints.

One `fake-metrics` process serves vLLM-style `/metrics` on N ports (bodies the size of a real
server's, with histograms). The real `wasm-epp-controller` scrapes them at its default 50 ms
interval while one long-poll client (standing in for Envoy's poller) follows the snapshots.
After a warm-up, a fixed window measures, from /proc and the controller's own counters: CPU
(cores = CPU seconds / wall seconds), RSS, snapshot size and versions per second, and scrape
success; the fake server's CPU is reported separately. Full mode only.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench import common

KEY = "controller_cost"
TITLE = "Controller cost: scraping 10, 100 and 1,000 endpoints"
COUNTS = (10, 100, 1000)
WARMUP_S = 5.0
WINDOW_S = 25.0
INTERVAL_S = 0.05  # the controller's default --refresh-metrics-interval
HISTOGRAMS = 12  # every histogram fake-metrics has: a body of roughly a real server's size
RSS_SAMPLE_S = 1.0
LONG_POLL_WAIT_MS = 1000

_SCRAPES = re.compile(r'^wasm_epp_controller_scrapes_total\{result="(\w+)"\}\s+(\d+)', re.M)


class SnapshotFollower(threading.Thread):
    """Long-polls `/v1/snapshot` like Envoy's poller, recording each new version's size."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/v1/snapshot"
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.versions: list[tuple[float, int, int]] = []  # (monotonic time, version, bytes)
        self.errors = 0

    def run(self) -> None:
        since = 0
        while not self.stop_event.is_set():
            url = f"{self.url}?since={since}&wait_ms={LONG_POLL_WAIT_MS}"
            try:
                with urllib.request.urlopen(url, timeout=LONG_POLL_WAIT_MS / 1000 + 5) as resp:
                    body = resp.read()
                    version = int(resp.headers.get("x-snapshot-version", "0"))
            except urllib.error.HTTPError as err:
                err.read()
                if err.code != 304:
                    self.errors += 1
                    self.stop_event.wait(0.1)
                continue
            except (OSError, ValueError):
                self.errors += 1
                self.stop_event.wait(0.1)
                continue
            if version > since:
                since = version
                with self.lock:
                    self.versions.append((time.monotonic(), version, len(body)))

    def between(self, start: float, end: float) -> list[tuple[float, int, int]]:
        """Versions received in [start, end)."""
        with self.lock:
            return [v for v in self.versions if start <= v[0] < end]


def scrape_counters(admin_port: int) -> dict[str, int]:
    """`wasm_epp_controller_scrapes_total` by result, from the controller's admin `/metrics`."""
    status, body = common.http_request(f"http://127.0.0.1:{admin_port}/metrics", timeout=10)
    if status != 200:
        raise RuntimeError(f"controller /metrics: HTTP {status}")
    counters = {m.group(1): int(m.group(2)) for m in _SCRAPES.finditer(body.decode())}
    if "success" not in counters:
        raise RuntimeError("controller /metrics has no wasm_epp_controller_scrapes_total")
    return counters


def start_fake(ctx: common.Ctx, procs: common.Procs, count: int) -> tuple[common.Proc, Path, int]:
    """Starts `fake-metrics` with `count` endpoints; returns it, its endpoints file and the
    body size in bytes."""
    endpoints = procs.dir / "endpoints.yaml"
    proc = procs.start("fake-metrics", [ctx.bin("fake-metrics"), "--count", count,
                                        "--histograms", HISTOGRAMS,
                                        "--endpoints-file", endpoints])
    deadline = time.monotonic() + 15
    while not endpoints.exists():
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"fake-metrics did not write {endpoints}:\n{proc.log_tail()}")
        time.sleep(0.05)
    first = re.search(r"port: (\d+)", endpoints.read_text())
    if first is None:
        raise RuntimeError(f"{endpoints} lists no port")
    port = int(first.group(1))
    stats = common.http_json(f"http://127.0.0.1:{port}/fake/stats")
    return proc, endpoints, int(stats["body_bytes"])


def measure(ctx: common.Ctx, count: int) -> dict:
    """Runs the controller against `count` fake endpoints and measures one window."""
    with common.Procs(ctx, f"{KEY}-{count}") as procs:
        fake, endpoints, body_bytes = start_fake(ctx, procs, count)
        controller = common.start_controller_on_file(ctx, procs, endpoints)
        follower = SnapshotFollower(controller.port)
        follower.start()
        try:
            time.sleep(WARMUP_S)
            pids = {"controller": controller.proc.pid, "fake": fake.pid}
            cpu0 = {k: common.cpu_seconds(p) for k, p in pids.items()}
            scrapes0 = scrape_counters(controller.admin_port)
            start = time.monotonic()
            rss: list[int] = []
            while time.monotonic() - start < WINDOW_S:
                for proc in (controller.proc, fake):
                    if not proc.alive():
                        raise RuntimeError(f"{proc.name} exited during the window:\n"
                                           f"{proc.log_tail()}")
                rss.append(common.rss_bytes(controller.proc.pid))
                time.sleep(RSS_SAMPLE_S)
            end = time.monotonic()
            cpu1 = {k: common.cpu_seconds(p) for k, p in pids.items()}
            scrapes1 = scrape_counters(controller.admin_port)
            debug = common.http_json(f"http://127.0.0.1:{controller.admin_port}/debug/endpoints",
                                     timeout=10)
        finally:
            follower.stop_event.set()
        follower.join(timeout=LONG_POLL_WAIT_MS / 1000 + 6)
    wall = end - start
    seen = follower.between(start, end)
    ok = scrapes1.get("success", 0) - scrapes0.get("success", 0)
    failed = scrapes1.get("error", 0) - scrapes0.get("error", 0)
    attempted = ok + failed
    if not seen:
        raise RuntimeError(f"{count} endpoints: no snapshot version arrived in the window")
    if ok == 0:
        raise RuntimeError(f"{count} endpoints: no successful scrape in the window")
    return {
        "endpoints": count,
        "body_bytes": body_bytes,
        "window_s": round(wall, 2),
        "controller_cores": (cpu1["controller"] - cpu0["controller"]) / wall,
        "fake_cores": (cpu1["fake"] - cpu0["fake"]) / wall,
        "controller_rss_mib_max": max(rss) / 2**20,
        "controller_rss_mib_last": rss[-1] / 2**20,
        "snapshot_bytes": seen[-1][2],
        "snapshot_versions_per_s": len(seen) / wall,
        "scrapes_ok_per_s": ok / wall,
        "controller_cpu_us_per_scrape": 1e6 * (cpu1["controller"] - cpu0["controller"]) / ok,
        "scrapes_failed": failed,
        "scrape_success": ok / attempted,
        # Scrapes done over what one scrape per endpoint every interval would be.
        "scrape_rate_of_nominal": ok / (count * wall / INTERVAL_S),
        "endpoints_last_scrape_ok": sum(1 for e in debug if e.get("last_error") is None),
        "follower_errors": follower.errors,
    }


def markdown(rows: list[dict], figure: str, ratios: dict[str, float]) -> str:
    """The section's text."""
    table = common.md_table(
        ["endpoints", "controller cores", "cores per 100 endpoints", "RSS MiB (max)",
         "snapshot KiB", "versions/s", "scrapes/s", "of nominal 20/s/endpoint",
         "CPU µs per scrape",
         "scrape success", "fake server cores"],
        [[r["endpoints"], r["controller_cores"], 100 * r["controller_cores"] / r["endpoints"],
          r["controller_rss_mib_max"], r["snapshot_bytes"] / 1024, r["snapshot_versions_per_s"],
          round(r["scrapes_ok_per_s"]), f"{100 * r['scrape_rate_of_nominal']:.0f} %",
          r["controller_cpu_us_per_scrape"],
          f"{100 * r['scrape_success']:.1f} %", r["fake_cores"]] for r in rows],
        digits=2)
    body = rows[0]["body_bytes"] if rows else 0
    return f"""\
One `fake-metrics` process serves vLLM-style Prometheus text ({body / 1024:.1f} KiB per scrape:
the five families the controller reads plus {HISTOGRAMS} latency/token histograms, values moving
every second) on N ports of 127.0.0.1. The controller scrapes every endpoint at its default
50 ms interval; one long-poll client follows `/v1/snapshot` as Envoy's poller would. After
{WARMUP_S:.0f} s of warm-up, a {WINDOW_S:.0f} s window is measured: CPU from `/proc/<pid>/stat`
(cores = CPU seconds / wall seconds), RSS sampled every second, scrapes from the controller's
`wasm_epp_controller_scrapes_total`, versions and sizes from the snapshots received.

{table}

![controller cost]({figure})

Per-endpoint CPU at 1,000 endpoints over that at 10:
{common.fmt(ratios.get("controller_cores_per_endpoint_1000_over_10"), 2)}×; CPU per successful
scrape, 1,000 over 10: {common.fmt(ratios.get("controller_cpu_per_scrape_1000_over_10"), 2)}×;
RSS at 1,000 over 10: {common.fmt(ratios.get("controller_rss_1000_over_10"), 2)}×. The fake
server's CPU is shown
separately: on this 2-core machine it competes with the controller, so at 1,000 endpoints the
controller may be CPU-bound and scrape less often than nominal (the "of nominal" column shows
it; the controller skips an endpoint whose previous scrape is still in flight rather than
queueing).

For orientation only, not a same-run comparison: the upstream EPP's sizing notes report about
7.5 cores idle at 100 pods, spent on metric scraping (a different implementation, machine and
pod metrics, see the reference notes). Here the whole controller at 100 endpoints used
{common.fmt(next((r["controller_cores"] for r in rows if r["endpoints"] == 100), None), 3)} cores.
"""


def plot(ctx: common.Ctx, rows: list[dict]) -> str:
    """Two panels: controller (and fake server) cores, and controller RSS, vs endpoints."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["endpoints"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 4.0), dpi=110)
    left.plot(xs, [r["controller_cores"] for r in rows], marker="o", label="controller")
    left.plot(xs, [r["fake_cores"] for r in rows], marker="s", linestyle="--",
              label="fake metrics server")
    left.set_ylabel("CPU cores")
    right.plot(xs, [r["controller_rss_mib_max"] for r in rows], marker="o", color="tab:green")
    right.set_ylabel("controller RSS (MiB, max)")
    for ax, title in ((left, "CPU at 50 ms scrape interval"), (right, "memory")):
        ax.set_xscale("log")
        ax.set_xlabel("endpoints")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    left.legend()
    return common.save_figure(ctx, fig, "controller-cost.png")


def run(ctx: common.Ctx) -> common.Section:
    """Measures every count (full mode only)."""
    section = common.Section(KEY, TITLE)
    if ctx.quick:
        section.markdown = "Runs in full mode only (`make bench`)."
        return section
    rows = [measure(ctx, count) for count in COUNTS]
    by = {r["endpoints"]: r for r in rows}
    figure = plot(ctx, rows)
    section.results = {"counts": rows, "warmup_s": WARMUP_S, "window_s": WINDOW_S,
                       "interval_s": INTERVAL_S, "histograms": HISTOGRAMS}
    section.ratios = {
        "controller_cores_per_endpoint_1000_over_10": common.ratio(
            by[1000]["controller_cores"] / 1000, by[10]["controller_cores"] / 10),
        "controller_cores_1000_over_10": common.ratio(by[1000]["controller_cores"],
                                                      by[10]["controller_cores"]),
        "controller_cpu_per_scrape_1000_over_10": common.ratio(
            by[1000]["controller_cpu_us_per_scrape"], by[10]["controller_cpu_us_per_scrape"]),
        "controller_rss_1000_over_10": common.ratio(by[1000]["controller_rss_mib_max"],
                                                    by[10]["controller_rss_mib_max"]),
    }
    section.markdown = markdown(rows, figure, section.ratios)
    return section
