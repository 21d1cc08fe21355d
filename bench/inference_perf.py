"""Section `inference_perf`: the upstream benchmark client against wasm-epp and round-robin.

inference-perf (the Gateway API Inference Extension project's load generator, from PyPI) runs
one shared-prefix scenario against Envoy's OpenAI completions endpoint, first through plain
round-robin Envoy, then through Envoy with wasm-epp, over the same simulators (restarted in
between, so both start with cold prefix caches). Its JSON reports give TTFT, end-to-end latency
and throughput side by side. inference-perf needs Python 3.12 and a tokenizer; the section
creates its own venv (`.venv-inference-perf/`) when missing and trains a small local tokenizer
once (`bench/inference_perf/build_tokenizer.py`). Full mode only.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from bench import common

KEY = "inference_perf"
TITLE = "inference-perf: wasm-epp vs round-robin (shared-prefix workload)"
PACKAGE = "inference-perf==0.7.0"
POLICIES = ("round-robin", "wasm-epp")
# Simulators of different speed, 4 sequences each: two fast, a medium and a slow one.
SIM_SCALES = ("2", "2", "4", "8")
SIM_ARGS = ("--max-num-seqs", "4")
# Constant-rate stages (requests/s, seconds): the second is near the pool's capacity.
STAGES = ((8, 20), (16, 20))
# shared_prefix data: groups of prompts that share a long system prompt (tokens of the
# local word-level tokenizer).
DATA = {"num_groups": 8, "num_prompts_per_group": 16, "system_prompt_len": 1500,
        "question_len": 50, "output_len": 32}
SEED = 7
QUANTILES = ("median", "p90", "p99")


def venv_dir(ctx: common.Ctx) -> Path:
    """Where inference-perf is installed (git-ignored)."""
    return ctx.repo / ".venv-inference-perf"


def ensure_venv(ctx: common.Ctx) -> Path:
    """The venv's Python, creating the venv and installing inference-perf if needed."""
    python = common.pyenv_python("3.12", "INFERENCE_PERF_PYTHON")
    return common.ensure_venv(venv_dir(ctx), python, [PACKAGE],
                              ["-c", "import inference_perf, tokenizers, transformers"],
                              ctx.scratch / "inference-perf-install.log")


def ensure_tokenizer(ctx: common.Ctx, python: Path) -> Path:
    """The local tokenizer directory, trained once into the venv directory."""
    out = venv_dir(ctx) / "bench-tokenizer"
    if (out / "tokenizer.json").is_file():
        return out
    script = ctx.repo / "bench" / "inference_perf" / "build_tokenizer.py"
    result = subprocess.run([str(python), str(script), str(out)], capture_output=True,
                            text=True, timeout=300, check=False)
    if result.returncode != 0 or not (out / "tokenizer.json").is_file():
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-5:])
        raise RuntimeError(f"building the inference-perf tokenizer failed:\n{tail}")
    return out


def config_text(base_url: str, tokenizer: Path, reports: Path) -> str:
    """The inference-perf YAML configuration (JSON is valid YAML)."""
    config = {
        "api": {"type": "completion", "streaming": True},
        "data": {"type": "shared_prefix", "shared_prefix": {**DATA, "seed": SEED}},
        "load": {"type": "constant",
                 "stages": [{"rate": rate, "duration": duration} for rate, duration in STAGES],
                 "num_workers": 1, "worker_max_concurrency": 128},
        "server": {"type": "vllm", "model_name": common.BASE_MODEL, "base_url": base_url,
                   "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "report": {"request_lifecycle": {"summary": True, "per_stage": True,
                                         "per_request": False},
                   "prometheus": {"summary": False, "per_stage": False}},
        "storage": {"local_storage": {"path": str(reports)}},
    }
    return json.dumps(config, indent=1) + "\n"


def summarize(report: dict) -> dict:
    """TTFT / e2e quantiles (ms), throughput and counts from one lifecycle report."""
    ok = report.get("successes") or {}
    latency = ok.get("latency") or {}
    throughput = ok.get("throughput") or {}
    failures = report.get("failures") or {}

    def ms(metric: str) -> dict:
        values = latency.get(metric) or {}
        return {q: 1000 * values[q] for q in QUANTILES if values.get(q) is not None}

    return {
        "successes": int(ok.get("count") or 0),
        "failures": int(failures.get("count") or 0),
        "failures_by_label": {label: (info or {}).get("count")
                              for label, info in (failures.get("by_label") or {}).items()},
        "ttft_ms": ms("time_to_first_token"),
        "e2e_ms": ms("request_latency"),
        "itl_ms": ms("inter_token_latency"),
        "requests_per_s": throughput.get("requests_per_sec"),
        "output_tokens_per_s": throughput.get("output_tokens_per_sec"),
        "achieved_rate": (report.get("load_summary") or {}).get("achieved_rate"),
    }


def run_client(ctx: common.Ctx, procs: common.Procs, tokenizer: Path, url: str,
               label: str) -> dict:
    """Runs inference-perf against `url`; returns the summary and per-stage results."""
    reports = procs.dir / f"reports-{label}"
    config = procs.dir / f"inference-perf-{label}.yaml"
    config.write_text(config_text(url, tokenizer, reports))
    log = procs.dir / f"inference-perf-{label}.log"
    client = venv_dir(ctx) / "bin" / "inference-perf"
    timeout = sum(d for _, d in STAGES) + 240
    with open(log, "wb") as out:
        try:
            rc = subprocess.run([str(client), "--config_file", str(config)], cwd=procs.dir,
                                stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                check=False).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    summary_file = reports / "summary_lifecycle_metrics.json"
    if rc != 0 or not summary_file.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
        raise RuntimeError(f"inference-perf ({label}) exited {rc} without a report:\n{tail}")
    result = summarize(json.loads(summary_file.read_text()))
    result["stages"] = [summarize(json.loads((reports / f"stage_{i}_lifecycle_metrics.json")
                                             .read_text()))
                        for i in range(len(STAGES))]
    if result["successes"] == 0:
        raise RuntimeError(f"inference-perf ({label}): every request failed "
                           f"({result['failures']} failures: {result['failures_by_label']}); "
                           f"see {log}")
    return result


def measure(ctx: common.Ctx, tokenizer: Path) -> dict[str, dict]:
    """Both policies over the same simulators, restarted in between."""
    results: dict[str, dict] = {}
    with common.Procs(ctx, KEY) as procs:
        per_sim = [("--time-scale", scale) for scale in SIM_SCALES]
        sims = common.start_sims(ctx, procs, len(SIM_SCALES), SIM_ARGS, per_sim)
        names = [s.name for s in sims]
        for policy in POLICIES:
            if policy != POLICIES[0]:
                sims = common.restart_sims(ctx, procs, sims)
            if policy == "round-robin":
                envoy = common.start_plain_envoy(ctx, procs, sims, name="envoy-rr")
                started = [envoy.proc]
            else:
                controller = common.start_controller(ctx, procs, sims)
                envoy = common.start_epp_envoy(ctx, procs, controller)
                started = [envoy.proc, controller.proc]
            before = common.sims_totals(sims)
            began = time.monotonic()
            result = run_client(ctx, procs, tokenizer, envoy.url, policy)
            result["wall_s"] = time.monotonic() - began
            delta = common.stats_delta(before, common.sims_totals(sims))
            result["prefix_hit_rate"] = common.prefix_hit_rate(delta)
            result["requests_per_sim"] = {n: delta[n].get("requests_total", 0) for n in names}
            results[policy] = result
            procs.stop(started)
    return results


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """Round-robin over wasm-epp for latencies, wasm-epp over round-robin for throughput."""
    rr, epp = results["round-robin"], results["wasm-epp"]
    out = {}
    for metric in ("ttft", "e2e"):
        for q in ("median", "p90"):
            name = "p50" if q == "median" else q
            out[f"inference_perf_{metric}_{name}_roundrobin_over_epp"] = common.ratio(
                rr[f"{metric}_ms"].get(q), epp[f"{metric}_ms"].get(q))
    out["inference_perf_throughput_epp_over_roundrobin"] = common.ratio(
        epp["output_tokens_per_s"], rr["output_tokens_per_s"])
    return out


def markdown(results: dict[str, dict], figure: str, section_ratios: dict[str, float]) -> str:
    """The section's text."""
    rr, epp = results["round-robin"], results["wasm-epp"]

    def row(label: str, key: str, q: str | None = None, digits: int = 1) -> list:
        values = [(r[key].get(q) if q else r[key]) for r in (rr, epp)]
        return [label, *[common.fmt(v, digits) for v in values]]

    rows = [row("requests ok", "successes"), row("requests failed", "failures")]
    for metric, label in (("ttft_ms", "TTFT"), ("e2e_ms", "end-to-end"), ("itl_ms", "ITL")):
        rows += [row(f"{label} {q} (ms)", metric, q) for q in QUANTILES]
    rows += [row("requests/s", "requests_per_s", digits=2),
             row("output tokens/s", "output_tokens_per_s"),
             ["prefix-cache hit rate (simulators)",
              *[f"{100 * r['prefix_hit_rate']:.1f} %" for r in (rr, epp)]]]
    main = common.md_table(["", "round-robin", "wasm-epp"], rows)
    stage_rows = []
    for i, (rate, duration) in enumerate(STAGES):
        a, b = rr["stages"][i], epp["stages"][i]
        stage_rows.append([f"{rate} req/s × {duration} s", a["ttft_ms"].get("p90"),
                           b["ttft_ms"].get("p90"), a["e2e_ms"].get("p90"),
                           b["e2e_ms"].get("p90"), a["failures"] + b["failures"]])
    stages = common.md_table(["stage", "TTFT p90 RR (ms)", "TTFT p90 EPP (ms)",
                              "e2e p90 RR (ms)", "e2e p90 EPP (ms)", "failures (both)"],
                             stage_rows)
    spread = common.md_table(["simulator (time scale)", "round-robin", "wasm-epp"],
                             [[f"{n} (×{SIM_SCALES[i]})", rr["requests_per_sim"][n],
                               epp["requests_per_sim"][n]]
                              for i, n in enumerate(rr["requests_per_sim"])])
    listed = ", ".join(f"`{k}` {common.fmt(v, 2)}" for k, v in section_ratios.items())
    return f"""\
[inference-perf](https://github.com/kubernetes-sigs/inference-perf) {PACKAGE.split('==')[1]}
drives `data.type: shared_prefix` ({DATA['num_groups']} groups × {DATA['num_prompts_per_group']}
prompts, {DATA['system_prompt_len']}-token system prompt, {DATA['question_len']}-token question,
{DATA['output_len']} output tokens; a word-level tokenizer trained on its bundled corpus) with
streaming `completion` requests at constant rates against Envoy's listener: plain round-robin
first, then wasm-epp with the controller, over the same {len(SIM_SCALES)} simulators
(`{' '.join(SIM_ARGS)}`, time scales {', '.join(SIM_SCALES)}), restarted in between so both
runs start with cold prefix caches. All numbers are inference-perf's own (its summary report),
except the hit rate and the request spread, which come from the simulators' counters.

{main}

Per stage:

{stages}

Where the requests went:

{spread}

![inference-perf]({figure})

Ratios (round-robin over wasm-epp for latencies, wasm-epp over round-robin for throughput):
{listed}. The load is open-loop at fixed rates, so both policies are offered the same requests;
throughput (inference-perf divides by the whole run, drain included) differs only where a
policy builds a backlog that takes longer to drain, i.e. near saturation.
"""


def plot(ctx: common.Ctx, results: dict[str, dict]) -> str:
    """TTFT p90 and e2e p90 per stage, both policies."""
    xs = [rate for rate, _ in STAGES]
    series = {}
    for policy in POLICIES:
        for metric, label in (("ttft_ms", "TTFT p90"), ("e2e_ms", "e2e p90")):
            series[f"{policy} {label}"] = [(x, s[metric].get("p90", float("nan")))
                                           for x, s in zip(xs, results[policy]["stages"])]
    return common.plot_lines(ctx, "inference-perf.png", "inference-perf, shared prefix",
                             "offered rate (requests/s)", "latency (ms)", series, logy=True)


def run(ctx: common.Ctx) -> common.Section:
    """Sets up inference-perf, runs both policies and compares them (full mode only)."""
    section = common.Section(KEY, TITLE)
    if ctx.quick:
        section.markdown = "Runs in full mode only (`make bench`)."
        return section
    python = ensure_venv(ctx)
    tokenizer = ensure_tokenizer(ctx, python)
    results = measure(ctx, tokenizer)
    section.results = {"policies": results, "stages": [list(s) for s in STAGES], "data": DATA,
                       "sim_time_scales": list(SIM_SCALES), "package": PACKAGE}
    section.ratios = ratios(results)
    section.markdown = markdown(results, plot(ctx, results), section.ratios)
    return section
