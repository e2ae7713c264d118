"""The log reader (zeroplanner/runlog.py) on real logs: 31 public excerpts and 5 logs of DeepSpeed on CPU ranks.

- tests/data/run_logs/public: excerpts copied from GitHub issues, DeepSpeed's docs and projects' files
  (SOURCES.json: the source URL, the settings the thread states, and ``stated``: the figures the excerpt prints,
  typed in by hand from the text). Each is read to those figures.
- tests/data/run_logs/engine: whole launch logs of DeepSpeed 0.19.8 on 2 CPU ranks (gloo), ZeRO-1/2/3 and offload,
  with wall_clock_breakdown, the comms logger, the flops profiler and see_memory_usage on, written by
  benchmarks/make_engine_logs.py with the engine's own counters beside each (``<run>.counters.json``: the timers'
  values when printed, ``comms_logger.comms_dict`` / ``log_summary()``, the raw bytes of each see_memory_usage).
  Each log is read to the engine's counters.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zeroplanner.runlog import _bytes, read_log

DATA = Path(__file__).resolve().parents[1] / "data" / "run_logs"
PUBLIC = json.loads((DATA / "public" / "SOURCES.json").read_text())
ENGINE_RUNS = sorted(p.name.removesuffix(".counters.json") for p in (DATA / "engine").glob("*.counters.json"))
GIB, MIB = 2**30, 2**20


def _reading(path: Path):
    return read_log(path.read_bytes())


def _size(text: str) -> int:
    m = re.fullmatch(r"([0-9.]+)\s*([KMGT]?B)", text.strip())
    return _bytes(m.group(1), m.group(2))


def _close(got, want, printed_step: float) -> bool:
    return got is not None and abs(got - want) <= printed_step / 2 + 1e-9 * abs(want)


OOM_KEYS = {  # stated key -> (OOM attribute, unit bytes)
    "tried_to_allocate_gib": ("tried_bytes", GIB), "tried_to_allocate_mib": ("tried_bytes", MIB),
    "total_capacity_gib": ("total_bytes", GIB), "free_gib": ("free_bytes", GIB), "free_mib": ("free_bytes", MIB),
    "free_bytes": ("free_bytes", 1), "allocated_by_pytorch_gib": ("allocated_bytes", GIB),
    "already_allocated_gib": ("allocated_bytes", GIB), "reserved_unallocated_gib": ("reserved_unallocated_bytes", GIB),
    "reserved_unallocated_mib": ("reserved_unallocated_bytes", MIB), "reserved_total_gib": ("reserved_bytes", GIB),
    "cached_mib": ("reserved_unallocated_bytes", MIB),
}


def test_the_public_corpus():
    kinds = {e["kind"] for e in PUBLIC}
    assert len(PUBLIC) >= 12 and {"oom", "wall_clock", "comms_summary", "memory_usage", "trainer_metrics"} <= kinds
    assert {e["torch_wording"] for e in PUBLIC if e["kind"] == "oom"} >= {"new", "1.x", "cached"}
    assert all(e["source_url"].startswith("https://") for e in PUBLIC)


@pytest.mark.parametrize("entry", [e for e in PUBLIC if e["kind"] == "oom"], ids=lambda e: e["file"])
def test_public_oom_read_to_its_figures(entry):
    r = _reading(DATA / "public" / entry["file"])
    assert r.ooms, entry["file"]
    o = r.ooms[-1]
    assert o.wording == entry["torch_wording"]
    checked = 0
    for key, value in entry["stated"].items():
        if key == "gpu_index":
            assert o.gpu_index == value
        elif key in OOM_KEYS:
            attr, unit = OOM_KEYS[key]
            assert _close(getattr(o, attr), value * unit, 0.01 * unit if unit > 1 else 0), (key, getattr(o, attr))
            checked += 1
    assert checked >= 4


def _timer_lines(stated: dict) -> list[dict]:
    return stated.get("timer_lines") or stated.get("deepspeed_timer_lines") or []


@pytest.mark.parametrize("entry", [e for e in PUBLIC if _timer_lines(e["stated"])], ids=lambda e: e["file"])
def test_public_timers_read_to_their_figures(entry):
    r = _reading(DATA / "public" / entry["file"])
    parsed = [{f"{k}_ms": v for k, v in t.value.items()} for t in r.timers]
    for line in _timer_lines(entry["stated"]):
        assert line in parsed, line
    # Megatron's own "time (ms)" line (forward-compute, backward-backward, ...) is not read as DeepSpeed's
    if "megatron_timer_line_ms" in entry["stated"]:
        assert len(parsed) == len(_timer_lines(entry["stated"]))


@pytest.mark.parametrize("entry", [e for e in PUBLIC if e["kind"] == "comms_summary"], ids=lambda e: e["file"])
def test_public_comms_summary_read_to_its_rows(entry):
    r = _reading(DATA / "public" / entry["file"])
    got = [(c.op, c.message_bytes, c.count, c.total_latency_ms, c.busbw_gbps) for c in r.comms]
    want = [(row["op"].split(" |")[0], _size(row["message_size"]), row["count"], row["total_latency_ms"],
             row["busbw_avg_gbps"]) for row in entry["stated"]["rows"]]
    assert got == want


@pytest.mark.parametrize("entry", [e for e in PUBLIC if e["kind"] == "memory_usage"], ids=lambda e: e["file"])
def test_public_memory_usage_read_to_its_rows(entry):
    r = _reading(DATA / "public" / entry["file"])
    got = [(m.value["ma_gib"], m.value["max_ma_gib"], m.value["ca_gib"], m.value["max_ca_gib"]) for m in r.memory]
    want = [(row["ma_gb"], row["max_ma_gb"], row["ca_gb"], row["max_ca_gb"]) for row in entry["stated"]["rows"]]
    assert got[-len(want):] == want


@pytest.mark.parametrize("entry", [e for e in PUBLIC if e["kind"] == "trainer_metrics"], ids=lambda e: e["file"])
def test_public_trainer_metrics_read(entry):
    r = _reading(DATA / "public" / entry["file"])
    stated = entry["stated"].get("train_metrics_dicts") or [entry["stated"]]
    for want, got in zip(stated, r.trainer):
        for key in ("train_samples_per_second", "train_steps_per_second", "train_loss"):
            assert got.value[key] == pytest.approx(float(want[key]), rel=1e-9), key


@pytest.mark.parametrize("entry", [e for e in PUBLIC if e["kind"] == "flops_profiler"], ids=lambda e: e["file"])
def test_public_flops_profiler_read(entry):
    r = _reading(DATA / "public" / entry["file"])
    st = entry["stated"]
    assert r.flops["world_size"].value == st["world_size"]
    assert r.flops["batch_size_per_gpu"].value == st["batch_size_per_gpu"]
    assert r.flops["params_per_gpu"].value == pytest.approx(st["params_per_gpu_m"] * 1e6)
    if "fwd_flops_per_gpu_g" in st:
        assert r.flops["fwd_flops_per_gpu"].value == pytest.approx(st["fwd_flops_per_gpu_g"] * 1e9)
        fwd = st.get("fwd_latency_ms", 0) * 1e-3 or st["fwd_latency_s"]
        assert r.flops["fwd_latency_seconds"].value == pytest.approx(fwd)


def _engine(run):
    return _reading(DATA / "engine" / f"{run}.log"), json.loads((DATA / "engine" / f"{run}.counters.json").read_text())


@pytest.mark.parametrize("run", ENGINE_RUNS)
def test_engine_log_timers_are_the_engines(run):
    r, counters = _engine(run)
    lines = counters["timers"]["lines"]
    assert len(r.timers) == len(lines) >= 8
    for got, want in zip(r.timers, lines):
        assert list(got.value) == want["names"]
        for name in want["names"]:
            assert got.value[name] == pytest.approx(want["values_ms"][name], abs=0.0051), name


@pytest.mark.parametrize("run", ENGINE_RUNS)
def test_engine_log_comms_summary_is_the_loggers(run):
    r, counters = _engine(run)
    printed = counters["comms"]["log_summary_printed"]
    want = [(row["op"], row["msg_size_bytes"], row["count"], round(row["total_latency_ms"], 2),
             round(row["busbw_avg_gbps"], 2)) for row in printed]
    got = [(c.op, c.message_bytes, c.count, c.total_latency_ms, c.busbw_gbps) for c in r.comms]
    assert [g[0] for g in got] == [w[0] for w in want] and [g[2:] for g in got] == [w[2:] for w in want]
    # the printed size is DeepSpeed's convert_size, 2 decimals in 1024-based units
    for g, w in zip(got, want):
        assert g[1] == pytest.approx(w[1], rel=0.005)


@pytest.mark.parametrize("run", ENGINE_RUNS)
def test_engine_log_memory_is_what_see_memory_usage_read(run):
    r, counters = _engine(run)
    calls = counters["memory"]["calls"]
    assert len(r.memory) == len(calls) >= 4
    for got, call in zip(r.memory, calls):
        assert got.value["ma_gib"] == round(call["memory_allocated_bytes"] / GIB, 2)
        assert got.value["max_ma_gib"] == round(call["max_memory_allocated_bytes"] / GIB, 2)


def test_a_communication_bound_engine_log_gets_the_30_percent_rule_and_a_priced_remedy(capsys):
    """z2: ZeRO-2 on 2 CPU ranks over gloo; DeepSpeed's own timers put bwd_allreduce + optimizer_allgather at 35%
    of the step (13.3 of 38.3 ms in the stored log)."""
    from zeroplanner.cli import main

    rc = main(["diagnose", str(DATA / "engine" / "z2.log"), "--model", "llama-2-7b", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["comm_share_of_step"] == pytest.approx(13.31 / 38.25, rel=0.01)
    assert any("above the 30% rule of thumb" in p for p in out["problems"])
    assert out["remedy"]["tokens_per_second"] > 0 and out["remedy"]["label"]
    # the log's own settings were used: 2 ranks, ZeRO-2, micro-batch 2 x 2
    assert (out["scenario"]["gpus_per_node"], out["scenario"]["stage"], out["scenario"]["micro_batch"],
            out["scenario"]["grad_accum"]) == (2, 2, 2, 2)


def test_an_oom_with_memory_held_elsewhere_is_said_and_not_priced(capsys):
    """trl3172: GRPO on 8 H100 (the thread); PyTorch holds 10.6 GiB of the 79.1 GiB in use: the rest is another
    process's (the generation server), which no ZeRO setting changes."""
    from zeroplanner.cli import main

    rc = main(["diagnose", str(DATA / "public" / "trl3172_oom_new_split_line_many_processes.log"), "--model",
               "qwen2.5-7b", "--gpu", "H100-80GB", "--gpus-per-node", "8", "--stage", "3", "--lora-rank", "16",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and "neither this process's PyTorch memory nor its CUDA context" in out["problems"][0]
    assert out["oom_phase"] == "model loading"  # the traceback: nn.Module._apply -> t.to(
    assert out["remedy"]["changes"] == []


@pytest.mark.parametrize("file,phase", [
    ("ds237_oom_cached_zero2_optimizer_state_init.log", "engine initialisation"),  # initialize_optimizer_states
    ("lf9510_oom_new_rank_prefix_interleaved.log", "model loading"),  # load_model
    ("lightning18134_oom_1x_zero3_offload_forward_fetch.log", "forward"),  # fetch_sub_module(forward=True)
    ("lf7532_oom_new_zero3_offload_optimizer_step.log", "optimizer step"),
    ("ds115_oom_cached_inactive_after_backward.log", "backward"),  # backward_step
])
def test_public_oom_phase_from_its_traceback(file, phase):
    assert _reading(DATA / "public" / file).ooms[-1].phase == phase
