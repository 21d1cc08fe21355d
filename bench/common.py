"""Shared helpers for the benchmark sections (`bench/run.py` drives them).

A section is a module with ``run(ctx: Ctx) -> Section``. It starts the processes it needs
through a :class:`Procs` (``with Procs(ctx, "name") as procs: ...``), which stops all of them
when the block ends, on an exception, or when the harness exits (SIGINT/SIGTERM included).
Everything listens on 127.0.0.1 on ports from :func:`free_port`; every wait is bounded.
Import it as ``from bench import common`` (run.py puts the repository root on sys.path).
"""

from __future__ import annotations

import atexit
import datetime
import glob
import itertools
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import string
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO = Path(__file__).resolve().parent.parent
BASE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


# ---------------------------------------------------------------------------------------------
# Context and results


@dataclass
class Ctx:
    """What every section gets: mode, paths and machine facts."""

    quick: bool
    repo: Path
    bin_dir: Path
    envoy: Path
    wasm: Path
    out_dir: Path
    scratch: Path
    machine: dict = field(default_factory=dict)

    def bin(self, name: str) -> Path:
        """Path of a release binary, checked to exist."""
        path = self.bin_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing; run `make build` and "
                                    "`cargo build --release -p wasm-epp-bench` first")
        return path


@dataclass
class Section:
    """One section's outcome: JSON-able results, headline ratios and its markdown."""

    key: str
    title: str
    results: dict = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    markdown: str = ""


# ---------------------------------------------------------------------------------------------
# Processes


_LIVE: list["Procs"] = []


def _stop_all() -> None:
    for procs in list(_LIVE):
        procs.stop_all()


def _on_signal(signum: int, _frame: Any) -> None:
    _stop_all()
    raise SystemExit(128 + signum)


atexit.register(_stop_all)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


class Proc:
    """A started process with its log file."""

    def __init__(self, name: str, popen: subprocess.Popen, log: Path):
        self.name = name
        self.popen = popen
        self.log = log

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.popen.poll() is None

    def log_tail(self, lines: int = 8) -> str:
        """The last lines of the log (for error messages)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; always reaps the process."""
        if self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=timeout)


class Procs:
    """A group of processes (logs under `ctx.scratch/<name>/`), stopped together.

    Use as a context manager; `stop_all` is also run at exit and on SIGINT/SIGTERM.
    """

    def __init__(self, ctx: Ctx, name: str):
        self.dir = ctx.scratch / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []

    def __enter__(self) -> "Procs":
        _LIVE.append(self)
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.stop_all()
        if self in _LIVE:
            _LIVE.remove(self)

    def start(self, name: str, argv: Sequence[str | os.PathLike], cwd: Path = REPO) -> Proc:
        """Starts `argv` with stdout+stderr to `<dir>/<name>.log`."""
        log = self.dir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen([str(a) for a in argv], cwd=cwd, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self, procs: Iterable[Proc]) -> None:
        """Stops some of the group's processes (e.g. to restart simulators)."""
        for proc in list(procs):
            proc.stop()
            if proc in self.procs:
                self.procs.remove(proc)

    def stop_all(self) -> None:
        """Stops every process of the group, newest first."""
        self.stop(reversed(self.procs))


# ---------------------------------------------------------------------------------------------
# Ports, HTTP, /proc

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and not handed out before by this process."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port found on 127.0.0.1")


def http_request(url: str, method: str = "GET", body: Any = None,
                 timeout: float = 5.0) -> tuple[int, bytes]:
    """One HTTP request; returns (status, body). A JSON-able `body` is sent as JSON.
    Connection errors raise OSError."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def http_json(url: str, timeout: float = 5.0) -> Any:
    """GET `url` and decode JSON; raises RuntimeError on a non-200 answer."""
    status, body = http_request(url, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"GET {url}: HTTP {status}")
    return json.loads(body)


def wait_http(url: str, timeout: float = 15.0, proc: Proc | None = None) -> None:
    """Waits until GET `url` answers 200; raises RuntimeError (with `proc`'s log tail) after
    `timeout` seconds or as soon as `proc` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}) before {url} "
                               f"answered:\n{proc.log_tail()}")
        try:
            if http_request(url, timeout=1.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    tail = f":\n{proc.log_tail()}" if proc is not None else ""
    raise RuntimeError(f"{url} did not answer 200 within {timeout:.0f} s{tail}")


_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process `pid` (its threads included)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid` in bytes."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE


# ---------------------------------------------------------------------------------------------
# Simulators and the controller


@dataclass
class Sim:
    """A running `vllm-sim`."""

    name: str
    port: int
    args: list[str]
    proc: Proc

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        """`GET /sim/stats` (real counters: requests_total, prompt_tokens_total,
        cached_prompt_tokens_total, completion_tokens_total, ...)."""
        return http_json(f"{self.url}/sim/stats")


def start_sim(ctx: Ctx, procs: Procs, name: str, args: Sequence[str] = (),
              port: int | None = None) -> Sim:
    """Starts one `vllm-sim` named `name` (extra flags `args`) and waits for `/health`."""
    port = free_port() if port is None else port
    proc = procs.start(f"sim-{name}", [ctx.bin("vllm-sim"), "--port", str(port),
                                       "--instance-name", name, *args])
    sim = Sim(name, port, list(args), proc)
    wait_http(f"{sim.url}/health", timeout=10, proc=proc)
    return sim


def start_sims(ctx: Ctx, procs: Procs, count: int, args: Sequence[str] = (),
               per_sim_args: Sequence[Sequence[str]] | None = None,
               prefix: str = "sim") -> list[Sim]:
    """Starts `count` simulators named `<prefix>-0`…, all with `args` (plus `per_sim_args[i]`)."""
    sims = []
    for i in range(count):
        extra = list(per_sim_args[i]) if per_sim_args else []
        sims.append(start_sim(ctx, procs, f"{prefix}-{i}", [*args, *extra]))
    return sims


def restart_sims(ctx: Ctx, procs: Procs, sims: list[Sim]) -> list[Sim]:
    """Restarts the simulators on the same ports and flags (cold caches, zero counters)."""
    procs.stop(s.proc for s in sims)
    return [start_sim(ctx, procs, s.name, s.args, port=s.port) for s in sims]


def sims_totals(sims: Sequence[Sim]) -> dict[str, dict]:
    """`/sim/stats` of every simulator, by name."""
    return {s.name: s.stats() for s in sims}


def stats_delta(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Per-simulator counter increase between two `sims_totals` (integer fields only)."""
    return {name: {k: v - before[name].get(k, 0) for k, v in now.items()
                   if isinstance(v, int) and not isinstance(v, bool)}
            for name, now in after.items()}


def prefix_hit_rate(delta: dict[str, dict[str, int]]) -> float:
    """Cached prompt tokens over all prompt tokens, summed over simulators (0 when none)."""
    prompt = sum(d.get("prompt_tokens_total", 0) for d in delta.values())
    cached = sum(d.get("cached_prompt_tokens_total", 0) for d in delta.values())
    return cached / prompt if prompt else 0.0


def write_endpoints_file(path: Path, sims: Sequence[Sim]) -> Path:
    """Writes the controller's endpoints file for `sims`."""
    lines = ["endpoints:"]
    lines += [f"- {{ name: {s.name}, namespace: bench, address: 127.0.0.1, port: {s.port} }}"
              for s in sims]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Controller:
    """A running `wasm-epp-controller`."""

    port: int
    admin_port: int
    proc: Proc


def start_controller(ctx: Ctx, procs: Procs, sims: Sequence[Sim], config_yaml: str | None = None,
                     name: str = "controller", extra: Sequence[str] = ()) -> Controller:
    """Starts the controller over `sims` (file discovery), optionally with an
    EndpointPickerConfig YAML text, and waits for `/readyz`."""
    endpoints = write_endpoints_file(procs.dir / f"{name}-endpoints.yaml", sims)
    port, admin = free_port(), free_port()
    argv: list[Any] = [ctx.bin("wasm-epp-controller"), "--endpoints-file", endpoints,
                       "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{admin}"]
    if config_yaml is not None:
        config = procs.dir / f"{name}-config.yaml"
        config.write_text(config_yaml)
        argv += ["--config-file", config]
    proc = procs.start(name, [*argv, *extra])
    wait_http(f"http://127.0.0.1:{admin}/readyz", timeout=15, proc=proc)
    return Controller(port, admin, proc)


# ---------------------------------------------------------------------------------------------
# Python venvs for third-party tools (inference-perf, peer routers)

PIP_TIMEOUT_S = 60  # per network operation
INSTALL_TIMEOUT_S = 1200


def pyenv_python(version: str, env_var: str) -> str:
    """A Python `version` (e.g. "3.12") interpreter: `$<env_var>`, pyenv's newest
    `<version>.x`, or `python<version>` on PATH; RuntimeError when there is none."""
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=10,
                              check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        root = ""
    candidates = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python")) if root else []
    found = candidates[-1] if candidates else shutil.which(f"python{version}")
    if not found:
        raise RuntimeError(f"no Python {version} found (set {env_var}, or install {version} "
                           "with pyenv)")
    return found


def ensure_venv(venv: Path, python: str, packages: Sequence[str], probe: Sequence[str],
                log: Path) -> Path:
    """The venv's Python; creates `venv` with `python` and pip-installs `packages` unless
    running `probe` (arguments to the venv's Python) already succeeds. RuntimeError naming
    the failed step and `log` otherwise."""
    venv_python = venv / "bin" / "python"
    if venv_python.exists() and subprocess.run([str(venv_python), *probe], capture_output=True,
                                               timeout=120, check=False).returncode == 0:
        return venv_python
    steps = [[python, "-m", "venv", str(venv)],
             [str(venv_python), "-m", "pip", "install", "--timeout", str(PIP_TIMEOUT_S),
              *packages]]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        for argv in steps:
            try:
                rc: int | str = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT,
                                               timeout=INSTALL_TIMEOUT_S, check=False).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            except OSError as err:
                rc = str(err)
            if rc != 0:
                raise RuntimeError(f"installing {' '.join(packages)} into {venv} failed ({rc}) "
                                   f"at `{' '.join(argv)}`; see {log}")
    return venv_python


def machine_cache() -> Path:
    """The per-machine cache outside the clone (`$WASM_EPP_CACHE`, else
    `$XDG_CACHE_HOME/wasm-epp` or `~/.cache/wasm-epp`), as `scripts/vllm-tools.sh` uses."""
    explicit = os.environ.get("WASM_EPP_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wasm-epp"


# ---------------------------------------------------------------------------------------------
# Envoy


@dataclass
class Envoy:
    """A running Envoy: admin and listener ports."""

    admin_port: int
    port: int
    concurrency: int
    proc: Proc

    @property
    def url(self) -> str:
        """Base URL of the listener."""
        return f"http://127.0.0.1:{self.port}"


_BASE_IDS = itertools.count((os.getpid() % 10000) * 100 + 1)


def start_envoy(ctx: Ctx, procs: Procs, config_text: str, admin_port: int, port: int,
                concurrency: int = 1, name: str = "envoy") -> Envoy:
    """Writes `config_text` and starts Envoy with `--concurrency`, a unique `--base-id` and
    `--disable-hot-restart`; waits for the admin `/ready`."""
    config = procs.dir / f"{name}.yaml"
    config.write_text(config_text)
    proc = procs.start(name, [ctx.envoy, "-c", config, "--concurrency", str(concurrency),
                              "--base-id", str(next(_BASE_IDS)), "--disable-hot-restart",
                              "-l", "warning"])
    wait_http(f"http://127.0.0.1:{admin_port}/ready", timeout=30, proc=proc)
    return Envoy(admin_port, port, concurrency, proc)


def plain_envoy_config(admin_port: int, port: int, sims: Sequence[Sim],
                       lb_policy: str = "ROUND_ROBIN") -> str:
    """Envoy without a picker (`envoy/plain.yaml.template`): a listener proxying to a STATIC
    cluster of `sims` with `lb_policy` (ROUND_ROBIN or LEAST_REQUEST)."""
    endpoints = "\n".join(
        f"        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, "
        f"port_value: {s.port} }} }} }}" for s in sims)
    template = string.Template((REPO / "envoy" / "plain.yaml.template").read_text())
    return template.substitute(ADMIN_PORT=admin_port, PORT=port, LB_POLICY=lb_policy,
                               ENDPOINTS=endpoints)


def render_envoy_template(name: str, **values: Any) -> str:
    """`envoy/<name>.template` filled with `envoy/template-defaults.json`'s values for it,
    overridden by `values` (the tests fill the same templates; a missing value raises)."""
    defaults = json.loads((REPO / "envoy" / "template-defaults.json").read_text())[name]
    template = string.Template((REPO / "envoy" / f"{name}.template").read_text())
    return template.substitute({**defaults, **{k: str(v) for k, v in values.items()}})


def epp_envoy_config(ctx: Ctx, admin_port: int, port: int, controller: Controller,
                     filter_config: str = '{"failOpen": false}',
                     wasm: Path | None = None, share_records: bool = True) -> str:
    """The shipped `envoy/envoy.yaml` (bootstrap poller singleton + wasm-epp filter +
    ORIGINAL_DST cluster), rendered from its template with these ports, controller address,
    .wasm path (`wasm`, default the shipped build) and filter configuration JSON;
    `share_records=False` keeps this Envoy's prefix records from the other replicas
    (`sharePrefixRecords`)."""
    defaults = json.loads((REPO / "envoy" / "template-defaults.json").read_text())["envoy.yaml"]
    poller = json.loads(defaults["POLLER_CONFIG"])
    if not share_records:
        poller["sharePrefixRecords"] = False
    return render_envoy_template("envoy.yaml", ADMIN_PORT=admin_port, PORT=port,
                                 CONTROLLER_PORT=controller.port, WASM=wasm or ctx.wasm,
                                 FILTER_CONFIG=filter_config, POLLER_CONFIG=json.dumps(poller))


def wait_picking(url: str, timeout: float = 15.0, proc: Proc | None = None) -> None:
    """Waits until Envoy with wasm-epp answers `GET <url>/v1/models` with 200 (the filter has a
    snapshot and picks)."""
    wait_http(f"{url}/v1/models", timeout=timeout, proc=proc)


def start_plain_envoy(ctx: Ctx, procs: Procs, sims: Sequence[Sim], lb_policy: str = "ROUND_ROBIN",
                      concurrency: int = 1, name: str = "envoy-plain") -> Envoy:
    """Starts Envoy with a plain `lb_policy` cluster over `sims`."""
    admin, port = free_port(), free_port()
    return start_envoy(ctx, procs, plain_envoy_config(admin, port, sims, lb_policy), admin, port,
                       concurrency, name)


def start_epp_envoy(ctx: Ctx, procs: Procs, controller: Controller, concurrency: int = 1,
                    name: str = "envoy-epp", filter_config: str = '{"failOpen": false}',
                    share_records: bool = True) -> Envoy:
    """Starts Envoy with wasm-epp fed by `controller` and waits until it picks."""
    admin, port = free_port(), free_port()
    config = epp_envoy_config(ctx, admin, port, controller, filter_config,
                              share_records=share_records)
    envoy = start_envoy(ctx, procs, config, admin, port, concurrency, name)
    wait_picking(envoy.url, proc=envoy.proc)
    return envoy


def envoy_stats(envoy: Envoy, pattern: str = "") -> dict[str, int]:
    """Envoy admin counters/gauges whose name contains `pattern` (`/stats?filter=`)."""
    status, body = http_request(f"http://127.0.0.1:{envoy.admin_port}/stats?format=json")
    if status != 200:
        raise RuntimeError(f"Envoy admin /stats: HTTP {status}")
    out = {}
    for stat in json.loads(body).get("stats", []):
        if "name" in stat and pattern in stat["name"] and isinstance(stat.get("value"), int):
            out[stat["name"]] = stat["value"]
    return out


# ---------------------------------------------------------------------------------------------
# Load generator


def run_loadgen(ctx: Ctx, procs: Procs, url: str | Sequence[str], args: Sequence[str],
                label: str, timeout: float = 300.0) -> dict:
    """Runs `wasm-epp-loadgen --url <url> <args> --label <label> --json ... --trace ...` to
    completion and returns its JSON report (see examples/loadgen/README.md); the per-request
    trace stays beside it (`bench/traces.py` reads it). Several URLs are taken in turn,
    request by request. Raises on failure."""
    out = procs.dir / f"loadgen-{label}.json"
    trace = trace_path(procs, label)
    log = procs.dir / f"loadgen-{label}.txt"
    urls = [url] if isinstance(url, str) else list(url)
    url_args = [arg for u in urls for arg in ("--url", u)]
    argv = [str(ctx.bin("wasm-epp-loadgen")), *url_args, *map(str, args), "--label", label,
            "--json", str(out), "--trace", str(trace)]
    with open(log, "wb") as sink:
        result = subprocess.run(argv, cwd=ctx.repo, stdout=sink, stderr=subprocess.STDOUT,
                                timeout=timeout, check=False)
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:])
        raise RuntimeError(f"loadgen {label} exited {result.returncode}:\n{tail}")
    return json.loads(out.read_text())


def trace_path(procs: Procs, label: str) -> Path:
    """Where `run_loadgen` leaves the per-request trace of the run labelled `label`."""
    return procs.dir / f"loadgen-{label}.trace.jsonl"


def instance_shares(report: dict, names: Sequence[str]) -> dict[str, float]:
    """Share (0..1) of a loadgen report's responses per instance name, 0 for absent names."""
    counts = {i["name"]: i["count"] for i in report.get("instances", [])}
    total = sum(counts.values())
    return {n: (counts.get(n, 0) / total if total else 0.0) for n in names}


# ---------------------------------------------------------------------------------------------
# Numbers, tables, plots


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..100) of `values`; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def ratio(numerator: float | None, denominator: float | None) -> float:
    """numerator / denominator, NaN when either is missing, NaN or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return math.nan
    if math.isnan(numerator) or math.isnan(denominator):
        return math.nan
    return numerator / denominator


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: floats with `digits` decimals, NaN/None as an en dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 1) -> str:
    """A GitHub markdown table; cells go through `fmt`."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(c, digits) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def save_figure(ctx: Ctx, fig: Any, filename: str) -> str:
    """Lays out and writes a matplotlib figure to `ctx.out_dir/filename`, closes it, and returns
    its link relative to the report (`bench/<filename>`)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(ctx.out_dir / filename)
    plt.close(fig)
    return f"bench/{filename}"


def plot_lines(ctx: Ctx, filename: str, title: str, xlabel: str, ylabel: str,
               series: dict[str, Sequence[tuple[float, float]]], logy: bool = False) -> str:
    """Writes a line plot of `series` (label → [(x, y), ...]) to `ctx.out_dir/filename` and
    returns the link relative to docs/ (`bench/<filename>`)."""
    import matplotlib  # imported here: only sections that plot need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for label, points in series.items():
        pts = [(x, y) for x, y in points if y is not None and not math.isnan(y)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save_figure(ctx, fig, filename)


def plot_bars(ctx: Ctx, filename: str, title: str, ylabel: str, bars: dict[str, float]) -> str:
    """Writes a bar chart (label → value) to `ctx.out_dir/filename`; returns `bench/<filename>`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    ax.bar(list(bars), [0 if math.isnan(v) else v for v in bars.values()])
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    return save_figure(ctx, fig, filename)


# ---------------------------------------------------------------------------------------------
# Machine facts


def machine_info(envoy: Path) -> dict:
    """CPU model, cores, RAM, kernel, Envoy version, Python version and the date (UTC)."""
    cpu = "unknown"
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = match.group(1).strip() if match else platform.processor() or "unknown"
    except OSError:
        pass
    ram = 0
    try:
        match = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        ram = int(match.group(1)) * 1024 if match else 0
    except OSError:
        pass
    try:
        out = subprocess.run([str(envoy), "--version"], capture_output=True, text=True,
                             timeout=20, check=False).stdout
        match = re.search(r"version:\s*\S+?/(\d+\.\d+\.\d+)", out)
        envoy_version = match.group(1) if match else out.strip().splitlines()[-1]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        envoy_version = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(ram / 2**30, 1),
        "kernel": platform.release(),
        "envoy": envoy_version,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def make_ctx(quick: bool, scratch: Path) -> Ctx:
    """The context for a run from the repository root."""
    envoy = REPO / ".venv" / "envoy"
    return Ctx(quick=quick, repo=REPO, bin_dir=REPO / "target" / "release", envoy=envoy,
               wasm=REPO / "target" / "wasm32-wasip1" / "wasm" / "wasm_epp.wasm",
               out_dir=REPO / "docs" / "bench", scratch=scratch, machine=machine_info(envoy))


# ---------------------------------------------------------------------------------------------
# Appended by the controller-cost section


def start_controller_on_file(ctx: Ctx, procs: Procs, endpoints: Path, name: str = "controller",
                             extra: Sequence[str] = (), ready_timeout: float = 30.0) -> Controller:
    """Starts the controller over an existing endpoints file (e.g. one `fake-metrics` wrote)
    with the default profile, and waits for `/readyz`."""
    port, admin = free_port(), free_port()
    proc = procs.start(name, [ctx.bin("wasm-epp-controller"), "--endpoints-file", endpoints,
                              "--listen", f"127.0.0.1:{port}",
                              "--metrics-listen", f"127.0.0.1:{admin}", *extra])
    wait_http(f"http://127.0.0.1:{admin}/readyz", timeout=ready_timeout, proc=proc)
    return Controller(port, admin, proc)
