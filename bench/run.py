"""The wasm-epp benchmark: `make bench` (full), `make bench-quick`, `make overhead`.

Runs the sections in one process, side by side on this machine, then writes the report:

- a full run of every section writes `docs/benchmarks.md`, `docs/bench/results.json` and the
  plots under `docs/bench/`;
- `--quick` or `--only` runs write the same three things under `.run/bench-<name>/` instead,
  so they never overwrite the published report;
- `--merge .run/bench-<name>` puts the sections of such an `--only` run into the published
  report in place of the same sections (the full run takes about 85 minutes here, its routing
  section alone about 65), and says so at the top of the page.

It ends by printing every headline figure as `RATIO <name> <value>`, one per line. The exit
status is 1 when a section failed (the others still run and are reported).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from bench import (controller_cost, flow_control, inference_perf, overhead,  # noqa: E402
                   replicas, routing, shortest_first, vllm, workers)

SECTIONS = {m.KEY: m for m in (routing, inference_perf, overhead, controller_cost, workers,
                               replicas, flow_control, shortest_first, vllm)}
# Printed first, in this order: the figures the project's claims rest on.
HEADLINE = ("ttft_p90_roundrobin_over_epp", "throughput_epp_over_roundrobin",
            "goodput_epp_over_roundrobin", "goodput_epp_over_sglang", "ttft_p90_sglang_over_epp",
            "added_p50_extproc_over_wasm_1kb", "added_p50_extproc_over_wasm_100kb",
            "added_p50_extproc_over_wasm_1mb", "cpu_extproc_over_wasm_1kb",
            "cpu_extproc_over_wasm_100kb", "cpu_extproc_over_wasm_1mb",
            "decision_wasm_over_native_1kb", "decision_wasm_over_native_100kb",
            "decision_wasm_over_native_1mb", "pick_1000_endpoints_us",
            "prefix_hit_4workers_over_1worker", "prefix_hit_3replicas_over_1replica",
            "ttft_p90_unshared_over_shared_3replicas", "vllm_prefix_hit_epp_minus_roundrobin",
            "vllm_ttft_p90_roundrobin_over_epp")

INTRO = """\
# Benchmarks

{provenance}
Machine: {cpu}, {cores} cores, {ram_gib} GiB RAM, Linux {kernel}; Envoy {envoy} (V8), Python
{python}. Everything ran on this one machine over 127.0.0.1: model-server simulators, the
controller, Envoy and the clients share its cores, so absolute figures are those of a small,
noisy VM. Read the ratios and the side-by-side columns, which come from the same run under the
same conditions.

## How to run it

```bash
make bench        # every section (about 85 minutes here); writes this page, docs/bench/*.png
                  # and docs/bench/results.json
bench/run.py --only routing          # one section, written under .run/bench-routing/
bench/run.py --merge .run/bench-routing  # … then put in place of that section here
make bench-quick  # the headline figures in about 5 minutes, written under .run/bench-quick/;
                  # ends with one `RATIO <name> <value>` line per figure
make overhead     # the data-plane overhead section alone (.run/bench-overhead/)
```

The harness is `bench/run.py` with one module per section (`bench/routing.py`,
`bench/inference_perf.py`, `bench/overhead.py`, `bench/controller_cost.py`,
`bench/workers.py`, `bench/replicas.py`, `bench/flow_control.py`, `bench/shortest_first.py`,
`bench/vllm.py`); the ext_proc baseline and the fake
metrics servers are the Rust crate `bench/` (`wasm-epp-extproc`, `fake-metrics`), and the overhead
section's do-nothing Proxy-Wasm filter is `bench/host-floor`. The model servers are `vllm-sim`
([examples/simulator](../examples/simulator/README.md)), except in the real-vLLM section (two real
vLLM servers on CPU, installed once per machine by `scripts/vllm-tools.sh`), and the client is
`wasm-epp-loadgen` ([examples/loadgen](../examples/loadgen/README.md)), except in the
inference-perf section. Every
loop is bounded; every process is stopped at the end, on error and on Ctrl-C.

## Headline

| figure | value | meaning |
|---|---|---|
{headline}

## What this run found

{findings}

## What these numbers show, and what they do not

- **Routing quality is measured against simulators, not GPUs.** `vllm-sim` models what a
  picker can exploit — queueing at `max-num-seqs`, prefill cost per uncached token, a finite
  prefix cache, LoRA slots, slowdown under batch load — with a fixed cost model. The ratios say
  how much a policy gains *under that model*; on real servers the gain depends on how much of
  the latency is prefill, how large the shared prefixes are and how the cache is sized.
- **Round-robin and least-request are Envoy's own load balancers** on a static cluster, the
  baselines an Envoy user has without a picker. wasm-epp is compared with them, not with the
  upstream EPP's routing, which follows the same scoring (same scorers and weights by default).
- **The overhead section compares designs, not implementations.** The ext_proc baseline is our
  own minimal Rust gRPC server making the same pick from the same snapshot with the upstream
  EPP's processing mode (body streamed full-duplex, header mutation); the upstream Go EPP does more per
  request (flow control, tokenization, metrics) and would cost more, not less.
- **Client-measured latency includes the client.** Added latency is the difference between
  Envoy with a picker and Envoy without one under the same offered rate, median over alternating
  rounds; differences under about 0.1 ms are within this machine's noise.
- **Controller cost** uses fake metrics servers that answer instantly with bodies the size of a
  real vLLM server's; a real fleet adds network latency, not controller CPU.
- **Replicas share one machine here**: the controller that relays their records is one local
  hop away; across machines add the network round trip to how fast records spread.
- Not measured here: several controllers relaying records to each other, real Kubernetes, real GPUs, tokenizer-based prefix
  matching, and tail behaviour over hours.
"""


def _ratio_text(value: float) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.3f}"


def headline_rows(ratios: dict[str, float]) -> str:
    """The headline table's rows."""
    meaning = {
        "ttft_p90_roundrobin_over_epp": "TTFT p90, round-robin over wasm-epp (shared prefix, "
                                        "near saturation); > 1: wasm-epp is faster",
        "throughput_epp_over_roundrobin": "output tokens/s, wasm-epp over round-robin (same "
                                          "step); > 1: wasm-epp serves more",
        "goodput_epp_over_roundrobin": "goodput (highest offered rate with TTFT p90 within the "
                                       "SLO), wasm-epp's shipped profile over round-robin, "
                                       "shared prefix; > 1: the fleet carries more",
        "goodput_epp_over_sglang": "the same over sglang-router cache_aware",
        "ttft_p90_sglang_over_epp": "TTFT p90, sglang-router cache_aware over wasm-epp's "
                                    "shipped profile (shared prefix, near saturation)",
        "added_p50_extproc_over_wasm_1kb": "latency an ext_proc picker adds over what wasm-epp "
                                           "adds, p50, 1 KB prompts",
        "added_p50_extproc_over_wasm_100kb": "the same, 100 KB prompts",
        "added_p50_extproc_over_wasm_1mb": "the same, 1 MB prompts",
        "cpu_extproc_over_wasm_1kb": "CPU per request, ext_proc (its Envoy + its server) over "
                                     "wasm-epp's Envoy, 1 KB prompts; > 1: wasm-epp is cheaper",
        "cpu_extproc_over_wasm_100kb": "the same, 100 KB prompts",
        "cpu_extproc_over_wasm_1mb": "the same, 1 MB prompts",
        "decision_wasm_over_native_1kb": "one decision inside Envoy (Wasm) over the same decision "
                                         "natively in the ext_proc server, p50, 1 KB prompts",
        "decision_wasm_over_native_100kb": "the same, 100 KB prompts",
        "decision_wasm_over_native_1mb": "the same, 1 MB prompts",
        "pick_1000_endpoints_us": "one pick inside Envoy at 1,000 endpoints, p50, µs",
        "prefix_hit_4workers_over_1worker": "prefix-cache hit rate with 4 Envoy workers over 1; "
                                            "≈ 1: workers share what they learn",
        "prefix_hit_3replicas_over_1replica": "prefix-cache hit rate with 3 Envoy replicas "
                                              "(sharing records) over 1 Envoy; ≈ 1: replicas "
                                              "act as one",
        "ttft_p90_unshared_over_shared_3replicas": "TTFT p90 of 3 replicas not sharing over 3 "
                                                   "sharing; > 1: sharing pays",
        "vllm_prefix_hit_epp_minus_roundrobin": "real vLLM (2 CPU servers): prefix-cache hit "
                                                "rate, wasm-epp minus round-robin (0.2 = 20 points)",
        "vllm_ttft_p90_roundrobin_over_epp": "real vLLM: round-robin's TTFT p90 over "
                                             "wasm-epp's; > 1: wasm-epp is faster",
    }
    missing = [name for name in HEADLINE if name not in meaning]
    assert not missing, f"headline figures without a meaning: {missing}"
    return "\n".join(f"| `{name}` | {_ratio_text(ratios.get(name, math.nan))} | "
                     f"{meaning[name]} |" for name in HEADLINE)


def findings(ratios: dict[str, float]) -> str:
    """Bullets stating what this run's ratios say, with their values."""
    def has(*names: str) -> bool:
        return all(not math.isnan(ratios.get(n, math.nan)) for n in names)

    out = []
    if has("ttft_p90_roundrobin_over_epp", "throughput_epp_over_roundrobin"):
        hit = ratios.get("prefix_hit_epp_minus_roundrobin", math.nan)
        out.append(
            f"- **Routing.** On the shared-prefix workload near saturation, round-robin's TTFT p90 "
            f"is {ratios['ttft_p90_roundrobin_over_epp']:.1f}× wasm-epp's and wasm-epp delivers "
            f"{ratios['throughput_epp_over_roundrobin']:.2f}× the output tokens/s"
            + (f", with a prefix-cache hit rate {100 * hit:.0f} points higher" if not math.isnan(hit)
               else "") + ".")
    if has("goodput_epp_over_roundrobin", "goodput_epp_over_sglang"):
        peers = [(w, ratios[f"{w}_goodput_epp_over_best_peer"]) for w in
                 ("shared_prefix", "sharegpt", "multi_lora", "heterogeneous")
                 if has(f"{w}_goodput_epp_over_best_peer")]
        out.append(
            "- **Goodput.** Within the TTFT p90 SLO, wasm-epp's shipped profile carries "
            f"{ratios['goodput_epp_over_roundrobin']:.2f}× round-robin's offered rate and "
            f"{ratios['goodput_epp_over_sglang']:.2f}× sglang-router cache_aware's on shared "
            "prefix" + ("; over the best peer per workload: " + ", ".join(
                f"{w} {v:.2f}×" for w, v in peers) if peers else "") + ".")
    if has("multi_lora_ttft_p90_leastrequest_over_epp_tuned",
           "multi_lora_ttft_p90_leastrequest_over_epp_default"):
        out.append(
            "- **LoRA.** On multi-LoRA traffic, least-request's TTFT p90 is "
            f"{ratios['multi_lora_ttft_p90_leastrequest_over_epp_tuned']:.2f}× that of wasm-epp "
            "with the `lora-affinity-scorer`, and "
            f"{ratios['multi_lora_ttft_p90_leastrequest_over_epp_default']:.2f}× that of the "
            "default profile, which has no LoRA scorer: adapter-heavy traffic needs that scorer "
            "in the profile.")
    sizes = {"1 KB": "1kb", "100 KB": "100kb", "1 MB": "1mb"}
    added = {label: ratios[f"added_p50_extproc_over_wasm_{key}"] for label, key in sizes.items()
             if has(f"added_p50_extproc_over_wasm_{key}")}
    cheaper = [f"{label} {r:.1f}×" for label, r in added.items() if r >= 1]
    dearer = [f"{label} {1 / r:.1f}×" for label, r in added.items() if r < 1]
    if cheaper:
        out.append("- **Overhead.** The ext_proc hop adds more latency than wasm-epp (p50, ext_proc's "
                   "added latency over wasm-epp's): " + ", ".join(cheaper) + ".")
    if dearer:
        out.append("- **Overhead, large prompts.** wasm-epp adds more than the ext_proc hop (p50, "
                   "wasm-epp's added latency over ext_proc's): " + ", ".join(dearer) + "; see "
                   "where the time goes, phase by phase, in the overhead section.")
    cpu = {label: ratios[f"cpu_extproc_over_wasm_{key}"] for label, key in sizes.items()
           if has(f"cpu_extproc_over_wasm_{key}")}
    if cpu:
        out.append("- **CPU.** Per request, the ext_proc design (its Envoy and its server) uses "
                   + ", ".join(f"{label} {r:.1f}×" for label, r in cpu.items())
                   + " the CPU of wasm-epp's Envoy.")
    floor = {label: (ratios[f"cpu_extproc_over_floor_{key}"],
                     ratios[f"cpu_wasm_minus_floor_us_{key}"]) for label, key in sizes.items()
             if has(f"cpu_extproc_over_floor_{key}", f"cpu_wasm_minus_floor_us_{key}")}
    if floor:
        out.append("- **Proxy-Wasm floor.** Against a Proxy-Wasm filter that decides nothing "
                   "(it only pauses, buffers and sets the destination), the ext_proc design uses "
                   + ", ".join(f"{label} {r:.1f}×" for label, (r, _) in floor.items())
                   + " the CPU: the most any body-reading Proxy-Wasm picker could reach on this "
                   "Envoy at these rates. wasm-epp's own work costs "
                   + " / ".join(f"{us:.0f}" for _, us in floor.values())
                   + " µs of CPU per request on top of that floor.")
    decision = {label: ratios[f"decision_wasm_over_native_{key}"] for label, key in sizes.items()
                if has(f"decision_wasm_over_native_{key}")}
    if decision:
        out.append("- **Decision under V8.** One decision inside Envoy takes "
                   + ", ".join(f"{label} {r:.1f}×" for label, r in decision.items())
                   + " the same decision natively"
                   + (f"; one pick at 1,000 endpoints takes {ratios['pick_1000_endpoints_us']:.0f} µs "
                      "in Envoy" if has("pick_1000_endpoints_us") else "") + ".")
    if has("prefix_hit_4workers_over_1worker"):
        out.append(f"- **Workers.** The prefix-cache hit rate with 4 Envoy workers is "
                   f"{ratios['prefix_hit_4workers_over_1worker']:.2f}× that with 1: the "
                   "workers share their prefix index.")
    if has("prefix_hit_3replicas_over_1replica", "ttft_p90_unshared_over_shared_3replicas"):
        out.append(f"- **Replicas.** Three Envoy replicas sharing their prefix records through the "
                   f"controller keep {ratios['prefix_hit_3replicas_over_1replica']:.2f}× the "
                   "prefix-cache hit rate of one Envoy; with sharing off their TTFT p90 is "
                   f"{ratios['ttft_p90_unshared_over_shared_3replicas']:.2f}× that with sharing.")
    return "\n".join(out) or "- No headline figure was measured in this run."


def write_report(out: Path, command: str, machine: dict, sections: list[common.Section],
                 failures: dict[str, str], ratios: dict[str, float], elapsed_s: float) -> Path:
    """Writes the markdown report and results.json; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    provenance = (f"Generated by `{command}` on {machine['date']}; every number on this page "
                  "comes from that one run.")
    parts = [INTRO.format(provenance=provenance, headline=headline_rows(ratios),
                          findings=findings(ratios), **machine)]
    for section in sections:
        parts.append(f"## {section.title}\n\n{section.markdown}")
    for key, error in failures.items():
        parts.append(f"## {SECTIONS[key].TITLE}\n\nThis section failed in this run:\n\n"
                     f"```\n{error}\n```\n")
    parts.append(f"---\nThe run took {elapsed_s / 60:.1f} minutes.\n")
    report = out / "benchmarks.md"
    report.write_text("\n".join(parts))
    results = {"command": command, "machine": machine, "elapsed_s": round(elapsed_s, 1),
               "ratios": {k: (None if math.isnan(v) else v) for k, v in ratios.items()},
               "sections": {s.key: s.results for s in sections}, "failures": failures}
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return report


def _split_sections(markdown: str) -> tuple[str, dict[str, str], str]:
    """A report's intro, its sections by title (each from its `## ` line up to the next
    section's) and its closing lines (from `---`)."""
    titles = {m.TITLE for m in SECTIONS.values()}
    body, sep, trailer = markdown.rpartition("\n---\n")
    if not sep:
        body, trailer = markdown, ""
    intro_lines: list[str] = []
    sections: dict[str, list[str]] = {}
    current: list[str] = intro_lines
    for line in body.split("\n"):
        if line.startswith("## ") and line[3:] in titles:
            current = sections.setdefault(line[3:], [])
        current.append(line)
    return ("\n".join(intro_lines), {t: "\n".join(lines).rstrip("\n") + "\n"
                                     for t, lines in sections.items()}, trailer)


def merge(partial_dir: Path, docs: Path = common.REPO / "docs") -> Path:
    """Puts the sections of an `--only` run (written under `partial_dir`) into the published
    report under `docs`, its results and plots, in place of the same sections; returns the
    report's path."""
    partial = json.loads((partial_dir / "bench" / "results.json").read_text())
    published = json.loads((docs / "bench" / "results.json").read_text())
    _, new_sections, _ = _split_sections((partial_dir / "benchmarks.md").read_text())
    _, old_sections, old_trailer = _split_sections((docs / "benchmarks.md").read_text())
    keys = list(partial["sections"])
    if not keys or partial["command"].startswith(("make", "bench/run.py --merge")):
        raise SystemExit(f"{partial_dir} holds no `--only` run to merge")
    ratios = {k: (math.nan if v is None else v) for k, v in published["ratios"].items()}
    ratios.update({k: (math.nan if v is None else v) for k, v in partial["ratios"].items()})
    sections = dict(old_sections)
    for key in keys:
        sections[SECTIONS[key].TITLE] = new_sections[SECTIONS[key].TITLE]
    for plot in (partial_dir / "bench").glob("*.png"):
        shutil.copyfile(plot, docs / "bench" / plot.name)
    merges = published.get("merged", []) + [
        {"command": partial["command"], "date": partial["machine"]["date"], "sections": keys,
         "elapsed_s": partial["elapsed_s"], "cpu": partial["machine"]["cpu"]}]
    base = published["machine"]
    provenance = (f"Generated by `{published['command']}` on {base['date']}. "
                  + " ".join(f"The {', '.join(SECTIONS[k].TITLE.split(':')[0].lower() for k in m['sections'])} "
                             f"section{'s' if len(m['sections']) > 1 else ''} "
                             f"{'were' if len(m['sections']) > 1 else 'was'} run again on {m['date']} "
                             f"by `{m['command']}`"
                             + (f" on another machine ({m['cpu']})" if m.get("cpu", base["cpu"]) != base["cpu"] else "")
                             + " and merged in with `bench/run.py --merge`."
                             for m in merges)
                  + " Every section's numbers come from one run; the headline and findings "
                  "combine them.")
    parts = [INTRO.format(provenance=provenance, headline=headline_rows(ratios),
                          findings=findings(ratios), **base)]
    parts.extend(f"{text}" for text in sections.values())
    trailer = old_trailer.strip() or "---"
    parts.append("---\n" + trailer.removeprefix("---").strip() + "\n"
                 + f"The re-run of {', '.join(keys)} took {partial['elapsed_s'] / 60:.1f} minutes.\n")
    report = docs / "benchmarks.md"
    report.write_text("\n".join(parts))
    published["ratios"] = {k: (None if math.isnan(v) else v) for k, v in ratios.items()}
    published["sections"].update(partial["sections"])
    published["merged"] = merges
    (docs / "bench" / "results.json").write_text(json.dumps(published, indent=1) + "\n")
    return report


def main() -> int:
    """Runs the benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the headline figures in about 5 minutes")
    parser.add_argument("--only", metavar="SECTION[,SECTION]",
                        help=f"run only these sections ({', '.join(SECTIONS)})")
    parser.add_argument("--merge", metavar="DIR", type=Path,
                        help="put the sections of the `--only` run written under DIR into "
                             "docs/benchmarks.md in place of the same sections")
    args = parser.parse_args()
    if args.merge:
        print(f"report: {merge(args.merge).relative_to(common.REPO)}")
        return 0
    keys = list(SECTIONS)
    if args.only:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        unknown = [k for k in keys if k not in SECTIONS]
        if unknown:
            parser.error(f"unknown section(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(SECTIONS)}")
    if importlib.util.find_spec("matplotlib") is None:
        # Every section plots after it has measured: without this check a run loses its
        # results (an hour for `routing`) at the end.
        parser.error("matplotlib is not installed in this Python; run the benchmark through "
                     "`make bench` / `make bench-quick` (they install it into .venv) or "
                     "`.venv/bin/pip install matplotlib`")
    partial = args.quick or args.only
    name = "quick" if args.quick else ("-".join(keys) if args.only else "")
    out = common.REPO / ".run" / f"bench-{name}" if partial else common.REPO / "docs"
    command = "make bench-quick" if args.quick else (
        f"bench/run.py --only {','.join(keys)}" if args.only else "make bench")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wasm-epp-bench-") as scratch:
        ctx = common.make_ctx(args.quick, Path(scratch))
        ctx.out_dir = out / "bench"
        sections: list[common.Section] = []
        failures: dict[str, str] = {}
        for key in keys:
            print(f"== {key}: {SECTIONS[key].TITLE}", flush=True)
            began = time.monotonic()
            try:
                sections.append(SECTIONS[key].run(ctx))
            except Exception:  # noqa: BLE001 - reported, and the run goes on
                failures[key] = traceback.format_exc(limit=4).strip()
                print(f"!! {key} failed:\n{failures[key]}", file=sys.stderr, flush=True)
            print(f"   {key}: {time.monotonic() - began:.0f} s", flush=True)
    ratios: dict[str, float] = {}
    for section in sections:
        ratios.update(section.ratios)
    report = write_report(out, command, ctx.machine, sections, failures, ratios,
                          time.monotonic() - started)
    print(f"report: {report.relative_to(common.REPO)}")
    ordered = [k for k in HEADLINE if k in ratios] + sorted(k for k in ratios if k not in HEADLINE)
    for key in ordered:
        print(f"RATIO {key} {_ratio_text(ratios[key])}")
    missing = [] if args.only else [k for k in HEADLINE if k not in ratios]
    for key in missing:
        print(f"RATIO {key} nan")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
