"""Unit tests of the shortest_first section's setups and ratios (no processes)."""

import math
import unittest

from bench import shortest_first


class SetupsTest(unittest.TestCase):
    def test_first_come_first_served_differs_from_the_profile_only_in_its_band(self):
        sjf = shortest_first.SJF_CONFIG
        fcfs = shortest_first.first_come_first_served(sjf)
        self.assertIn("featureGates: [flowControl]", fcfs)
        self.assertIn("pluginRef: concurrency-detector", fcfs)
        self.assertIn("orderingPolicyRef: fcfs-ordering-policy", fcfs)
        self.assertNotIn("orderingPolicyRef: shortest-job-first-ordering-policy", fcfs)
        self.assertEqual(fcfs.replace(shortest_first.FCFS_BAND, shortest_first.SJF_BAND), sjf)
        with self.assertRaises(ValueError):
            shortest_first.first_come_first_served("plugins: []\n")


class RatiosTest(unittest.TestCase):
    def test_first_come_over_shortest_first_per_quantile(self):
        def setup(p50, p90, p99):
            return {"ttft_ms": {"p50": p50, "p90": p90, "p99": p99},
                    "overload": {"ttft_ms": {"p90": 2 * p90}}}
        ratios = shortest_first.ratios({"none": setup(100, 900, 2000),
                                        "fcfs": setup(120, 600, 1500),
                                        "sjf": setup(60, 400, 3000)})
        self.assertEqual(ratios["shortest_first_ttft_p50_fcfs_over_sjf"], 2.0)
        self.assertEqual(ratios["shortest_first_ttft_p90_fcfs_over_sjf"], 1.5)
        self.assertEqual(ratios["shortest_first_ttft_p99_fcfs_over_sjf"], 0.5)
        self.assertEqual(ratios["shortest_first_ttft_p90_none_over_sjf"], 2.25)
        self.assertEqual(ratios["shortest_first_overload_ttft_p90_fcfs_over_sjf"], 1.5)
        missing = shortest_first.ratios({"sjf": setup(60, 400, 3000)})
        self.assertTrue(math.isnan(missing["shortest_first_ttft_p90_fcfs_over_sjf"]))


if __name__ == "__main__":
    unittest.main()
