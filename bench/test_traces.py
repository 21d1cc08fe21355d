"""Unit tests of the trace reading (`make test-bench`)."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from bench import traces


def req(server: str, sent_s: float, ttft_ms: float, latency_ms: float) -> traces.Request:
    return traces.Request(server, sent_s, ttft_ms, latency_ms)


class FullFleetTest(unittest.TestCase):
    def test_full_only_while_every_server_is_at_its_limit(self) -> None:
        requests = [
            req("a", 0.0, 10, 5000),  # a busy 0-5 s
            req("b", 0.0, 10, 2000),  # b busy 0-2 s
            req("a", 1.0, 900, 1000),  # both servers have one in flight: full at limit 1
            req("b", 3.0, 20, 100),  # b is idle again: not full
        ]
        self.assertEqual(traces.full_fleet(requests, 1), [False, False, True, False])
        self.assertEqual(traces.full_fleet(requests, 2), [False] * 4)

    def test_summary_counts_the_tail_that_met_a_full_fleet(self) -> None:
        requests = [req("a", 0.0, 10, 5000), req("b", 0.0, 10, 2000),
                    req("a", 1.0, 900, 1000), req("b", 3.0, 20, 100)]
        s = traces.summary(requests, 1)
        self.assertEqual((s["requests"], s["ttft_p90_ms"]), (4, 900))
        self.assertEqual((s["at_full_fleet"], s["tail"], s["tail_at_full_fleet"]), (1, 1, 1))

    def test_reads_answered_streamed_requests_only(self) -> None:
        lines = [
            {"index": 0, "sent_s": 0.5, "prompt_bytes": 9, "max_tokens": 4,
             "instance": "server-0", "status": 200, "ttft_ms": 12.5, "latency_ms": 40.0,
             "error": None},
            {"index": 1, "sent_s": 0.6, "prompt_bytes": 9, "max_tokens": 4, "instance": None,
             "status": None, "ttft_ms": None, "latency_ms": None, "error": "timeout"},
        ]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "t.trace.jsonl"
            path.write_text("".join(json.dumps(line) + "\n" for line in lines))
            self.assertEqual(traces.read(path), [req("server-0", 0.5, 12.5, 40.0)])


if __name__ == "__main__":
    unittest.main()
