"""Unit tests of the routing section's arithmetic (`make test-bench`)."""

from __future__ import annotations

import math
import unittest

from bench import common, routing, traces


def step(rate: float, p90: float, tokens: float, ok: int | None = None) -> dict:
    """A measured step as `routing.run_step` returns it (the fields goodput reads)."""
    requests = int(rate * 10)
    return {"rate": rate, "requests": requests, "ok": requests if ok is None else ok,
            "ttft_ms": {"p90": p90}, "e2e_ms": {"p90": p90}, "output_tokens_per_s": tokens,
            "prefix_hit_rate": 0.5}


class GoodputTest(unittest.TestCase):
    def test_interpolates_between_the_last_step_within_and_the_first_beyond(self) -> None:
        steps = [step(20, 600, 500), step(10, 200, 250), step(30, 1400, 700)]
        good = routing.goodput(steps, 1000)
        self.assertAlmostEqual(good["rate"], 25.0)
        self.assertAlmostEqual(good["output_tokens_per_s"], 600.0)
        self.assertTrue(good["bounded"])

    def test_within_at_every_step_is_a_lower_bound(self) -> None:
        good = routing.goodput([step(10, 200, 250), step(20, 300, 500)], 1000)
        self.assertEqual((good["rate"], good["bounded"]), (20, False))

    def test_beyond_at_the_first_step_is_zero(self) -> None:
        good = routing.goodput([step(10, 1200, 250), step(20, 900, 500)], 1000)
        self.assertEqual((good["rate"], good["output_tokens_per_s"]), (0.0, 0.0))

    def test_a_step_with_failed_requests_is_beyond_the_slo(self) -> None:
        steps = [step(10, 200, 250), step(20, 300, 500, ok=150), step(30, 400, 700)]
        self.assertEqual(routing.goodput(steps, 1000)["rate"], 10)

    def test_a_step_without_answers_stops_at_the_last_step_within(self) -> None:
        steps = [step(10, 200, 250), step(20, math.nan, 0, ok=0)]
        self.assertEqual(routing.goodput(steps, 1000)["rate"], 10)


def run(p90: float, tokens: float, served: dict[str, int]) -> dict:
    """One run of a repeated step, with the fields `pooled_step` sums or averages."""
    requests = sum(served.values())
    return step(12, p90, tokens) | {
        "requests": requests, "ok": requests, "errors": {"timeout": 1}, "wall_s": 20.0,
        "lora_loads": 2, "spread": routing._spread(served)}


def answers(*ttfts: float) -> list[traces.Request]:
    """A run's trace: requests to one server, each answered in its TTFT + 100 ms."""
    return [traces.Request("a", i * 0.1, t, t + 100) for i, t in enumerate(ttfts)]


class PooledStepTest(unittest.TestCase):
    def test_quantiles_are_over_every_request_of_the_runs_together(self) -> None:
        # 20 requests: 18 at 100 ms, one at 900, one at 1000. Each run alone has a p90 of
        # its own; together the p90 is over all of them.
        runs = [run(300, 500, {"a": 10, "b": 0}), run(700, 600, {"a": 5, "b": 5})]
        traced = [answers(*[100] * 9, 900), answers(*[100] * 9, 1000)]
        pooled = routing.pooled_step(runs, traced)
        every = [r.ttft_ms for t in traced for r in t]
        self.assertEqual(pooled["ttft_ms"]["p90"], common.percentile(every, 90))
        self.assertEqual(pooled["e2e_ms"]["p50"], 200)
        self.assertEqual(pooled["repeats_ttft_p90_ms"], [300, 700])
        self.assertEqual((pooled["requests"], pooled["ok"]), (20, 20))
        self.assertEqual(pooled["errors"], {"timeout": 2})
        self.assertEqual(pooled["output_tokens_per_s"], 550)
        self.assertEqual(pooled["spread"]["requests"], {"a": 15, "b": 5})
        self.assertEqual(pooled["full_fleet"]["requests"], 0)

    def test_a_step_without_answers_has_no_quantiles(self) -> None:
        runs = [run(math.nan, 0, {"a": 3}), run(math.nan, 0, {"a": 3})]
        pooled = routing.pooled_step(runs, [[], []])
        self.assertTrue(math.isnan(routing._q(pooled, "ttft_ms", "p90")))
        self.assertFalse(routing.within_slo(pooled, 1000))

    def test_a_single_run_is_kept_as_it_is(self) -> None:
        single = step(12, 300, 500)
        self.assertEqual(routing.pooled_step([single], [answers(1, 2)]), single)


# The shared-prefix workload's comparison step (between 8 and 32 requests/s).
CMP = next(w.compare_rate for w in routing.WORKLOADS if w.key == "shared_prefix")
SHARED = next(w for w in routing.WORKLOADS if w.key == "shared_prefix")


class ClimbTest(unittest.TestCase):
    def test_a_step_beyond_the_slo_before_the_comparison_step_does_not_stop_it(self) -> None:
        self.assertFalse(routing.climb_done(SHARED, []))
        self.assertFalse(routing.climb_done(SHARED, [step(8, 5000, 100)]))

    def test_the_first_step_beyond_the_slo_from_the_comparison_step_on_stops_it(self) -> None:
        self.assertTrue(routing.climb_done(SHARED, [step(8, 300, 100), step(CMP, 1200, 500)]))
        self.assertTrue(routing.climb_done(SHARED, [step(CMP, 300, 500),
                                                    step(CMP + 4, 400, 500, ok=1)]))
        self.assertTrue(routing.climb_done(SHARED, [step(CMP, math.nan, 0, ok=0)]))

    def test_a_policy_within_the_slo_climbs_on(self) -> None:
        self.assertFalse(routing.climb_done(SHARED, [step(CMP, 900, 500)]))
        self.assertFalse(routing.climb_done(SHARED, [step(CMP, 900, 500),
                                                     step(CMP + 4, 1000, 550)]))


class RunsWantedTest(unittest.TestCase):
    def test_the_comparison_step_runs_repeatedly_in_a_full_run_only(self) -> None:
        self.assertEqual(routing.runs_wanted(SHARED, CMP, [], quick=False),
                         routing.compare_repeats(False))
        self.assertEqual(routing.runs_wanted(SHARED, CMP, [], quick=True), 1)

    def test_a_step_before_the_comparison_step_runs_once_even_beyond_the_slo(self) -> None:
        self.assertEqual(routing.runs_wanted(SHARED, 8, [step(8, 5000, 100)], quick=False), 1)

    def test_a_step_past_it_repeats_only_when_its_first_run_missed_the_slo(self) -> None:
        self.assertEqual(routing.runs_wanted(SHARED, CMP + 4, [], quick=False), 1)
        self.assertEqual(routing.runs_wanted(SHARED, CMP + 4, [step(CMP + 4, 900, 500)],
                                             quick=False), 1)
        for missed in (step(CMP + 4, 1500, 500), step(CMP + 4, 400, 500, ok=1)):
            self.assertEqual(routing.runs_wanted(SHARED, CMP + 4, [missed], quick=False),
                             routing.compare_repeats(False))
        self.assertEqual(routing.runs_wanted(SHARED, CMP + 4, [step(CMP + 4, 1500, 500)],
                                             quick=True), 1)


class GoodputRatiosTest(unittest.TestCase):
    def results(self) -> dict:
        slow = [step(8, 300, 200), step(CMP, 2000, 600), step(32, 4000, 650)]
        fast = [step(8, 250, 200), step(CMP, 500, 700), step(32, 1500, 750)]
        mid = [step(8, 250, 200), step(CMP, 800, 680), step(32, 1800, 700)]
        return {"shared_prefix": {"round_robin": slow, "sglang_cache_aware": mid,
                                  "sglang_power_of_two": slow, "epp_default": mid,
                                  "epp_tuned": fast}}

    def test_the_shipped_profile_against_round_robin_and_the_best_peer(self) -> None:
        out = routing.ratios(self.results())
        rr = 8 + (CMP - 8) * (1000 - 300) / (2000 - 300)
        tuned = CMP + (32 - CMP) * (1000 - 500) / (1500 - 500)
        sglang = CMP + (32 - CMP) * (1000 - 800) / (1800 - 800)
        self.assertAlmostEqual(out["goodput_epp_over_roundrobin"], tuned / rr)
        self.assertAlmostEqual(out["goodput_epp_over_sglang"], tuned / sglang)
        self.assertAlmostEqual(out["shared_prefix_goodput_epp_over_best_peer"], tuned / sglang)
        self.assertAlmostEqual(out["ttft_p90_sglang_over_epp"], 800 / 500)
        self.assertAlmostEqual(out["shared_prefix_ttft_p90_best_peer_over_epp"], 800 / 500)


    def test_the_shortest_job_first_profile_speaks_for_wasm_epp_when_it_ran(self) -> None:
        results = self.results()
        results["shared_prefix"]["epp_sjf"] = results["shared_prefix"].pop("epp_tuned")
        results["shared_prefix"]["epp_tuned"] = results["shared_prefix"]["round_robin"]
        out = routing.ratios(results)
        self.assertAlmostEqual(out["ttft_p90_sglang_over_epp"], 800 / 500)


class FullFleetColumnTest(unittest.TestCase):
    def test_shows_the_share_of_all_and_the_count_of_the_tail(self) -> None:
        s = dict(step(9, 1100, 300), requests=180,
                 full_fleet={"requests": 45, "tail": 19, "tail_at_full_fleet": 18})
        self.assertEqual(routing._full_fleet(s), "25 % / 18 of 19")

    def test_a_step_measured_without_traces_shows_a_dash(self) -> None:
        self.assertEqual(routing._full_fleet(step(9, 1100, 300)), "–")


if __name__ == "__main__":
    unittest.main()
