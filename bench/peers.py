"""The LLM routers a self-hosting team would run instead of wasm-epp, as benchmark policies.

`sglang-router` (the SGLang model gateway, Rust) and its fork `vllm-router` route plain OpenAI
workers by URL. Each is installed once per machine from PyPI into its own venv under the
machine cache (`~/.cache/wasm-epp/peers/<package>-<version>/`, Python 3.11), and runs as its
own HTTP proxy in front of the same simulators: the load generator talks to it instead of to
Envoy. Neither reads a worker's `/metrics`: their load signal is their own count of requests
in flight (plus a `/get_load` poll every 30 s, which the simulator answers as SGLang does), and
`cache_aware` keeps its own approximate radix tree of the prompts it has sent to each worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bench import common

# How long a router may take to answer /health after start (both take 1-2 s here).
READY_TIMEOUT_S = 60


@dataclass(frozen=True)
class Peer:
    """A router package from PyPI and how to start it."""

    key: str
    package: str
    version: str
    module: str  # the Python module its venv must import
    launcher: tuple[str, ...]  # the command in the venv's bin/ that starts it, then its args

    def venv(self) -> Path:
        """Where this version is installed (outside the clone, shared by every clone)."""
        return common.machine_cache() / "peers" / f"{self.package}-{self.version}" / "venv"

    def argv(self, bin_dir: Path, port: int, metrics_port: int, policy: str,
             workers: Sequence[str]) -> list[str]:
        """The command line that serves `workers` on 127.0.0.1:`port` with `policy`."""
        program, *args = self.launcher
        return [str(bin_dir / program), *args, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                "--worker-urls", *workers]


PEERS = {
    "sglang": Peer("sglang", "sglang-router", "0.3.2", "sglang_router",
                   ("python", "-m", "sglang_router.launch_router")),
    "vllm": Peer("vllm", "vllm-router", "0.1.17", "vllm_router", ("vllm-router",)),
}


@dataclass
class Router:
    """A running peer router: where clients send requests."""

    port: int
    proc: common.Proc

    @property
    def url(self) -> str:
        """Base URL the load generator uses (same role as an Envoy listener)."""
        return f"http://127.0.0.1:{self.port}"


def ensure(ctx: common.Ctx, peer: Peer) -> Path:
    """The peer's venv `bin/` directory, installing the package on first use."""
    python = common.pyenv_python("3.11", "PEER_ROUTER_PYTHON")
    venv_python = common.ensure_venv(peer.venv(), python, [f"{peer.package}=={peer.version}"],
                                     ["-c", f"import {peer.module}"],
                                     ctx.scratch / f"{peer.package}-install.log")
    return venv_python.parent


def start(ctx: common.Ctx, procs: common.Procs, peer: Peer, policy: str,
          sims: Sequence[common.Sim], name: str) -> Router:
    """Starts `peer` with `policy` over `sims` and waits until it answers `/health`."""
    bin_dir = ensure(ctx, peer)
    port, metrics_port = common.free_port(), common.free_port()
    proc = procs.start(name, peer.argv(bin_dir, port, metrics_port, policy,
                                       [s.url for s in sims]))
    router = Router(port, proc)
    common.wait_http(f"{router.url}/health", timeout=READY_TIMEOUT_S, proc=proc)
    return router
