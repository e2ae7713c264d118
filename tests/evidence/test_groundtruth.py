"""Ground truth: the cost model against the real DeepSpeed 0.19.8 engine on CPU ranks (gloo).

Each rank count is ONE launch of ``zeroplanner/calibrate/_worker.py`` that runs every configuration of
``calibrate.VALIDATION_CONFIGS`` one after another (fresh model and engine each), so the launcher and import
start-up is paid once per rank count. The tiny model is ``calibrate.tiny_hf_config(llama-2-7b)`` (LlamaForCausalLM,
hidden 64, 32 layers, 4 heads, vocabulary 500: Ψ = 1,649,216); stage 3 releases every parameter after use
(``calibrate.validation_scenario``). What is measured (zeroplanner/calibrate/__init__.py, measured_terms / measured_comms):

- model states per rank: a census of live tensor storages (deduplicated by data_ptr) in the optimizer step;
- message bytes per collective in the last of 3 steps from DeepSpeed's comms logger.

Every expected value in these tests is a measurement taken by the fixture; the assertions hold the cost model
(zeroplanner.costmodel) to it.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from zeroplanner.calibrate import VALIDATION_CONFIGS, run_calibrations, validation_scenario  # noqa: E402

pytestmark = pytest.mark.timeout(1200)
engine = pytest.mark.engine

CONFIGS = VALIDATION_CONFIGS
CASES = [(ranks, name) for ranks, names in CONFIGS.items() for name in names]


@functools.lru_cache(maxsize=None)
def reports(ranks: int) -> dict:
    names = CONFIGS[ranks]
    scenarios = {n: validation_scenario(n, ranks) for n in names}
    if ranks == 2:  # DeepSpeed's default stage3_max_live_parameters / reuse distance (scaled to the tiny model)
        scenarios["s3_bf16_reuse_default"] = validation_scenario("s3_bf16", ranks, release_all=False)
    out = run_calibrations(scenarios, ranks=ranks, steps=3, timeout_seconds=900)
    return {r.name: r for r in out}


def close(predicted: float, measured: float, rel: float, slack_bytes: float = 64.0) -> bool:
    """|predicted - measured| <= rel * measured + slack (slack: a few bytes of grad-norm all-reduces and the
    optimizer's scalar step counters, which the cost model does not count)."""
    return abs(predicted - measured) <= rel * abs(measured) + slack_bytes


@engine
@pytest.mark.parametrize("ranks,name", CASES)
def test_model_states_within_2_percent(ranks, name):
    """Predicted per-rank model-state bytes (parameters + gradients + optimizer states incl. fp32 master) within
    2% of the census taken in the optimizer step."""
    rep = reports(ranks)[name]
    row = rep.row("model_states")
    assert close(row.predicted, row.measured, 0.02), rep.table()
    for term in ("parameters", "optimizer_states"):
        r = rep.row(term)
        assert close(r.predicted, r.measured, 0.02), (term, rep.table())


@engine
@pytest.mark.parametrize("ranks,name", [c for c in CASES if c[1].endswith("_off")])
def test_offloaded_host_bytes_within_2_percent(ranks, name):
    """offload_optimizer=cpu: host bytes per rank (fp32 master, optimizer states, gradient partitions, staging
    buffers) within 2% of the census."""
    rep = reports(ranks)[name]
    row = rep.row("host_offload")
    assert row.measured > 0
    assert close(row.predicted, row.measured, 0.02), rep.table()


@engine
@pytest.mark.parametrize("ranks,name", CASES)
def test_bytes_per_collective_within_5_percent(ranks, name):
    """Predicted message bytes per collective per step within 5% of DeepSpeed's comms logger."""
    rep = reports(ranks)[name]
    for kind in ("all_reduce", "reduce_scatter", "all_gather"):
        r = rep.row(f"comm_{kind}")
        assert close(r.predicted, r.measured, 0.05), (kind, rep.table())


@engine
@pytest.mark.parametrize("ranks,name", [c for c in CASES if c[0] == 2])
def test_activation_row_within_5_percent(ranks, name):
    """The report's activation row: the cost model's activation term for the tiny model the engine ran against
    the bytes that model saves for backward (measure_activation_bytes, same sequence and micro-batch)."""
    rep = reports(ranks)[name]
    row = rep.row("activations")
    assert row.measured > 0
    assert close(row.predicted, row.measured, 0.05), rep.table()


@engine
def test_zero3_default_reuse_gathers_less_in_backward():
    """With DeepSpeed's default stage3_max_live_parameters / stage3_max_reuse_distance, parameters kept resident
    from forward into backward are not gathered again: predicted all-gather bytes within 5% of the comms logger."""
    rep = reports(2)["s3_bf16_reuse_default"]
    released = reports(2)["s3_bf16"]
    r = rep.row("comm_all_gather")
    assert close(r.predicted, r.measured, 0.05), rep.table()
    assert r.measured < released.row("comm_all_gather").measured


@engine
@pytest.mark.parametrize("ranks", sorted(CONFIGS))
def test_census_accounts_for_every_live_tensor(ranks):
    """The category walk finds (nearly) every storage a Python tensor holds: what it misses in the step is the
    loss/input of the step and the like, under 1% of the total."""
    for rep in reports(ranks).values():
        c = rep.census_totals["during_step"]
        assert c["gc_total_bytes"] > 0
        assert c["unattributed_bytes"] <= 0.01 * c["gc_total_bytes"] + 4096, rep.name


@engine
def test_zero3_volume_against_zero2_as_measured():
    """ZeRO-3 moves 1.5x ZeRO-2's message bytes (all-gather fwd + bwd + reduce-scatter = 3Ψ vs all-reduce +
    all-gather = 2Ψ), measured. On the wire DeepSpeed 0.19.8's ZeRO-2 all-reduces its buckets
    (use_multi_rank_bucket_allreduce), so its ring volume equals ZeRO-3's: the predicted ratio must match the
    measured one, whatever it is."""
    rep = reports(2)
    z2, z3 = rep["s2_bf16"], rep["s3_bf16"]

    def message_total(r, which):
        return sum(getattr(r.row(f"comm_{k}"), which) for k in ("all_reduce", "reduce_scatter", "all_gather"))

    measured_ratio = message_total(z3, "measured") / message_total(z2, "measured")
    assert measured_ratio == pytest.approx(1.5, rel=0.05)
    predicted_ratio = message_total(z3, "predicted") / message_total(z2, "predicted")
    assert predicted_ratio == pytest.approx(measured_ratio, rel=0.05)
    wire_measured = z3.row("comm_wire").measured / z2.row("comm_wire").measured
    wire_predicted = z3.row("comm_wire").predicted / z2.row("comm_wire").predicted
    assert wire_predicted == pytest.approx(wire_measured, rel=0.05)


@engine
def test_timings_are_recorded():
    rep = reports(2)["s2_bf16"]
    t = rep.timings
    assert t["forward_seconds"] > 0 and t["backward_seconds"] > 0 and t["step_seconds"] > 0


# --- no engine: the harness's inputs and the command line ---------------------------------------------------------
def test_tiny_model_keeps_the_architecture_proportions():
    """The tiny copy keeps family, layer count, GQA ratio, FFN/hidden and vocabulary/hidden ratios (source: the
    Llama-2-7B and Qwen2.5-7B catalog entries, docs/references.md section 3)."""
    from zeroplanner import catalog
    from zeroplanner.calibrate import tiny_hf_config
    from zeroplanner.catalog.hfconfig import architecture_from_hf_config

    for name in ("llama-2-7b", "qwen2.5-7b"):
        arch = catalog.model(name)
        tiny = architecture_from_hf_config(tiny_hf_config(arch))
        assert tiny.family == arch.family and tiny.n_layers == min(arch.n_layers, 32)
        assert tiny.n_heads // tiny.kv_heads == min(arch.n_heads // arch.kv_heads, tiny.n_heads)
        assert tiny.ffn_size / tiny.hidden_size == pytest.approx(arch.ffn_size / arch.hidden_size, rel=0.02)
        assert tiny.vocab_size / tiny.hidden_size == pytest.approx(arch.vocab_size / arch.hidden_size, rel=0.02)
        assert tiny.qkv_bias == arch.qkv_bias and tiny.tied_embeddings == arch.tied_embeddings


def test_engine_config_adds_the_comms_logger_and_keeps_the_zero_block():
    from zeroplanner.calibrate import calibration_scenario, engine_config

    tiny, _ = calibration_scenario(validation_scenario("s2_bf16_off", 2), 2)
    cfg = engine_config(tiny)
    assert cfg["comms_logger"] == {"enabled": True, "verbose": False, "prof_all": True, "debug": False}
    assert cfg["zero_optimization"]["stage"] == 2
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "torch_adam" not in cfg["optimizer"]["params"]  # offload runs DeepSpeedCPUAdam, as in production
    cfg = engine_config(calibration_scenario(validation_scenario("s1_fp32", 2), 2)[0])
    assert cfg["optimizer"]["params"]["torch_adam"] is True and "bf16" not in cfg
    assert cfg["train_batch_size"] == 2  # micro-batch 1 x grad_accum 1 x 2 ranks (DeepSpeed's batch rule)


def test_stage3_knobs_scale_with_the_model():
    """Element-count knobs scale by Ψ_tiny / Ψ_user; the persistence threshold keeps vectors whole, matrices not."""
    from zeroplanner.calibrate import calibration_scenario
    from zeroplanner.scenarios import build_scenario

    user = build_scenario(model="llama-2-7b", stage=3, gpus_per_node=2)
    tiny, _ = calibration_scenario(user, 2)
    ratio = tiny.model.parameter_count / user.parameters
    assert tiny.zero.stage3_max_live_parameters == pytest.approx(1e9 * ratio, rel=1e-3)
    assert tiny.zero.stage3_prefetch_bucket_size == pytest.approx(5e7 * ratio, rel=1e-3)
    m = tiny.model
    assert max(m.hidden_size, m.ffn_size) < tiny.zero.stage3_param_persistence_threshold < m.hidden_size * m.kv_size


def test_cli_rejects_bad_options_in_one_line():
    import subprocess
    import sys

    for args, option in ((["--ranks", "0"], "--ranks"), (["--steps", "1"], "--steps"), (["--device", "tpu"], "--device")):
        out = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "calibrate", *args], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2, out
        lines = [ln for ln in out.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
        assert len(lines) == 1 and option in lines[0] and "Traceback" not in out.stderr


def test_run_calibration_rejects_bad_arguments_before_launching():
    from zeroplanner.calibrate import run_calibration

    sc = validation_scenario("s2_bf16", 2)
    with pytest.raises(ValueError, match="steps"):
        run_calibration(sc, steps=1)
    with pytest.raises(ValueError, match="ranks"):
        run_calibration(sc, ranks=0)
    with pytest.raises(ValueError, match="device"):
        run_calibration(sc, device="tpu")
