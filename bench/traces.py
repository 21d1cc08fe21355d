"""Reads load generator traces (`wasm-epp-loadgen --trace`, one JSON line per request; every
benchmark step writes one, `loadgen-<label>.trace.jsonl` beside its report) to tell whether a
step's slow requests met a full fleet: for each request, how many requests each server had in
flight when it was sent (counted from the other requests' send times and latencies, as the
client saw them), and so whether every server was at its batch limit then.

    python3 -m bench.traces --limit 8 .run/bench-routing/loadgen-heterogeneous-*.trace.jsonl

prints per trace: its TTFT p90, how many requests arrived while every server had at least
`--limit` in flight, and how many of those at or above the p90 did. When nearly all of the
tail arrived at a full fleet, the p90 measures which queue a request joined, not whether a
router could have started it sooner.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from bench import common


@dataclass(frozen=True)
class Request:
    """One answered request of a trace."""

    server: str
    sent_s: float
    ttft_ms: float
    latency_ms: float

    def in_flight_at(self, t_s: float) -> bool:
        """Whether the client had this request outstanding at `t_s`."""
        return self.sent_s <= t_s < self.sent_s + self.latency_ms / 1000.0


def read(path: Path) -> list[Request]:
    """The answered, streamed requests of a trace file (those with a server and a TTFT)."""
    requests = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("instance") and entry.get("ttft_ms") is not None:
            requests.append(Request(entry["instance"], entry["sent_s"], entry["ttft_ms"],
                                    entry["latency_ms"]))
    return requests


def full_fleet(requests: list[Request], limit: int) -> list[bool]:
    """Per request: whether every server had at least `limit` other requests in flight when
    it was sent."""
    servers = sorted({r.server for r in requests})
    flags = []
    for request in requests:
        busy = {server: 0 for server in servers}
        for other in requests:
            if other is not request and other.in_flight_at(request.sent_s):
                busy[other.server] += 1
        flags.append(all(count >= limit for count in busy.values()))
    return flags


def summary(requests: list[Request], limit: int, tail_from: float | None = None) -> dict:
    """A trace's TTFT p90 and how many requests (and of its tail: those at or above
    `tail_from`, by default that p90) arrived at a full fleet."""
    p90 = common.percentile([r.ttft_ms for r in requests], 90)
    tail_from = p90 if tail_from is None else tail_from
    flags = full_fleet(requests, limit)
    tail = [full for r, full in zip(requests, flags) if r.ttft_ms >= tail_from]
    return {"requests": len(requests), "ttft_p90_ms": p90,
            "at_full_fleet": sum(flags), "tail": len(tail), "tail_at_full_fleet": sum(tail)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, required=True,
                        help="the servers' batch limit (vLLM --max-num-seqs)")
    parser.add_argument("traces", nargs="+", type=Path)
    args = parser.parse_args()
    for path in args.traces:
        s = summary(read(path), args.limit)
        print(f"{path.name}: TTFT p90 {s['ttft_p90_ms']:.0f} ms; {s['at_full_fleet']} of "
              f"{s['requests']} requests arrived at a full fleet, {s['tail_at_full_fleet']} of "
              f"the {s['tail']} at or above the p90")


if __name__ == "__main__":
    main()
