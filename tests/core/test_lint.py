"""zeroplanner.deepspeed.lint: one test per rule -- a small config that triggers it and the fixed config that does not. Where
DeepSpeed itself rejects the bad config at parse time, the test shows DeepSpeedConfig raising on it too."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeroplanner.deepspeed import ConfigError, from_deepspeed_config, load_config_text, to_deepspeed_config
from zeroplanner.deepspeed.lint import lint
from zeroplanner.pitfalls import COMMUNICATION_SHARE_LIMIT
from zeroplanner.specs import Scenario, TrainingSpec
from tests.core.test_dsconfig import ETHERNET_25, SWEEP, scenario

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402


def rules(config, s=None, mode="deepspeed", severity=None):
    return {f.rule for f in lint(config, s, mode) if severity is None or f.severity == severity}


def on(s: Scenario, **cluster) -> Scenario:
    return s.model_copy(update={"cluster": s.cluster.model_copy(update=cluster)})


def cfg(s: Scenario, **zero) -> dict:
    config = to_deepspeed_config(s)
    config["zero_optimization"].update(zero)
    return config


@pytest.fixture
def ds_world(monkeypatch):
    import deepspeed.comm as dist

    def set_world(size: int) -> None:
        monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
        monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: size)

    return set_world


BASE = scenario(2, nodes=1)


def test_generated_configs_have_no_config_errors():
    """What zeroplanner writes passes its own config-level rules (cluster/cost rules are about the scenario)."""
    for s in SWEEP:
        findings = [f for f in lint(to_deepspeed_config(s)) if f.severity == "error"]
        assert not findings, (s.zero, s.training, findings)
        hf = [f for f in lint(to_deepspeed_config(s, "hf_trainer"), s, "hf_trainer")
              if f.rule in ("auto_outside_hf", "auto_not_filled") and f.severity != "info"]
        assert not hf


@pytest.mark.parametrize("value,severity", [("5e8", "error"), (15099494.4, "error"), (True, "warning"),
                                            (5e8, "info"), ("500000000", "warning")])
def test_integer_type(value, severity, ds_world):
    bad = cfg(BASE, reduce_bucket_size=value)
    found = [f for f in lint(bad) if f.rule == "integer_type"]
    assert [(f.key, f.severity) for f in found] == [("zero_optimization.reduce_bucket_size", severity)]
    assert "integer_type" not in rules(cfg(BASE, reduce_bucket_size=500_000_000))
    ds_world(BASE.cluster.data_parallel_degree)
    if severity == "error":
        with pytest.raises(Exception, match="reduce_bucket_size"):
            DeepSpeedConfig(bad)
    elif value is True:  # pydantic (lax) reads true as 1: accepted, so a warning
        assert DeepSpeedConfig(bad).zero_config.reduce_bucket_size == 1
    batch = to_deepspeed_config(BASE)
    batch["train_micro_batch_size_per_gpu"] = 2.0
    assert ("train_micro_batch_size_per_gpu", "warning") in {(f.key, f.severity) for f in lint(batch)}


def test_nonpositive_value(ds_world):
    ds_world(BASE.cluster.data_parallel_degree)
    for key, severity in (("reduce_bucket_size", "error"), ("allgather_bucket_size", "warning")):
        bad = cfg(BASE, **{key: 0})
        assert [f.severity for f in lint(bad) if f.rule == "nonpositive_value"
                and f.key == f"zero_optimization.{key}"] == [severity]
    with pytest.raises(Exception, match="greater than 0"):
        DeepSpeedConfig(cfg(BASE, reduce_bucket_size=0))
    DeepSpeedConfig(cfg(BASE, allgather_bucket_size=0))  # accepted; runs on gloo/NCCL (tests/evidence)
    assert "nonpositive_value" in rules(cfg(BASE, reduce_bucket_size=False))  # false is 0
    assert "nonpositive_value" in rules(cfg(BASE, stage3_max_live_parameters=-1))
    assert "nonpositive_value" not in rules(cfg(BASE, reduce_bucket_size=1, allgather_bucket_size=1))


def test_batch_mismatch(ds_world):
    bad = to_deepspeed_config(BASE)
    bad["train_batch_size"] = bad["train_batch_size"] + 1
    assert "batch_mismatch" in rules(bad, BASE)
    ds_world(BASE.cluster.data_parallel_degree)
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        DeepSpeedConfig(bad)
    good = to_deepspeed_config(BASE)
    assert "batch_mismatch" not in rules(good, BASE)
    DeepSpeedConfig(good)
    # without a scenario: a train_batch_size no world size can produce
    assert "batch_mismatch" in rules({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2,
                                      "gradient_accumulation_steps": 1})
    assert "batch_mismatch" not in rules({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                                          "gradient_accumulation_steps": 1})
    assert "batch_mismatch" in rules({"zero_optimization": {"stage": 1}})  # no batch key at all


def test_fp16_and_bf16(ds_world):
    bad = to_deepspeed_config(BASE)
    bad["fp16"] = {"enabled": True}
    assert "fp16_and_bf16" in rules(bad)
    ds_world(BASE.cluster.data_parallel_degree)
    with pytest.raises(AssertionError, match="cannot be simultaneously enabled"):
        DeepSpeedConfig(bad)
    bad["fp16"]["enabled"] = False
    assert "fp16_and_bf16" not in rules(bad)


def test_offload_param_below_stage3():
    bad = cfg(BASE, offload_param={"device": "cpu", "pin_memory": True})
    assert "offload_param_below_stage3" in rules(bad, severity="warning")
    assert "offload_param_below_stage3" not in rules(cfg(scenario(3, par="cpu")))


def test_offload_optimizer_stage0():
    bad = cfg(scenario(0), offload_optimizer={"device": "cpu"})
    assert "offload_optimizer_stage0" in rules(bad, severity="warning")
    assert "offload_optimizer_stage0" not in rules(cfg(scenario(1, opt="cpu")))


def test_nvme_optimizer_below_stage3():
    assert "nvme_optimizer_below_stage3" in rules(to_deepspeed_config(scenario(2, opt="nvme")))
    assert "nvme_optimizer_below_stage3" not in rules(to_deepspeed_config(scenario(3, opt="nvme")))


def test_auto_outside_hf():
    hf = to_deepspeed_config(BASE, "hf_trainer", hf_auto=True)  # "auto" in every field the Trainer fills
    raw = [f for f in lint(hf, BASE) if f.rule == "auto_outside_hf"]
    assert "train_batch_size" in {f.key for f in raw if f.severity == "error"}
    # DeepSpeed's pydantic blocks drop "auto" and run with the default: a warning
    assert "zero_optimization.reduce_bucket_size" in {f.key for f in raw if f.severity == "warning"}
    in_hf = [f for f in lint(hf, BASE, "hf_trainer") if f.rule == "auto_outside_hf"]
    assert [f.severity for f in in_hf] == ["info"] and "16777216" in in_hf[0].message  # 4096^2
    assert "auto_outside_hf" not in rules(to_deepspeed_config(BASE))


def test_auto_not_filled():
    """Judged on the engine (HF Trainer.train() on a CPU rank, zeroplanner.calibrate.config_judge): at stage 2
    allgather_bucket_size "auto" stops training in accelerate ("not found in kwargs"); stage3_prefetch_bucket_size
    "auto" is filled by accelerate's hidden-size fill and accepted."""
    bad = cfg(BASE, allgather_bucket_size="auto", stage3_prefetch_bucket_size="auto")  # stage 2
    found = {f.key: f.severity for f in lint(bad, BASE, "hf_trainer") if f.rule == "auto_not_filled"}
    assert found == {"zero_optimization.allgather_bucket_size": "error"}
    assert "auto_not_filled" not in rules(to_deepspeed_config(BASE, "hf_trainer"), BASE, "hf_trainer")


def test_removed_key(ds_world):
    bad = to_deepspeed_config(BASE)
    bad["amp"] = {"enabled": True}
    assert "removed_key" in rules(bad)
    ds_world(BASE.cluster.data_parallel_degree)
    with pytest.raises(Exception, match="Apex AMP"):
        DeepSpeedConfig(bad)
    assert "removed_key" not in rules(to_deepspeed_config(BASE))


def test_max_grad_norm_param():
    bad = to_deepspeed_config(BASE)
    bad["optimizer"]["params"]["max_grad_norm"] = 1.0
    assert "max_grad_norm_param" in rules(bad)
    assert "max_grad_norm_param" not in rules(to_deepspeed_config(BASE))


def test_untested_optimizer():
    bad = to_deepspeed_config(scenario(2, optimizer="sgd"))
    del bad["zero_allow_untested_optimizer"]
    assert "untested_optimizer" in rules(bad)
    assert "untested_optimizer" not in rules(to_deepspeed_config(scenario(2, optimizer="sgd")))


def test_offload_client_optimizer():
    """ZeRO-Offload with no optimizer block: DeepSpeed alone raises on the client's torch optimizer, the HF Trainer
    runs it (accelerate swaps in DeepSpeedCPUAdam). A config-typed optimizer (even torch's SGD) is built by DeepSpeed
    itself and never reaches the check. Shown on real runs in tests/evidence/test_shipped_configs.py (engine tests)."""
    bad = to_deepspeed_config(scenario(2, opt="cpu"))
    del bad["optimizer"]
    found = [f for f in lint(bad) if f.rule == "offload_client_optimizer"]
    assert [f.severity for f in found] == ["error"]
    in_hf = [f for f in lint(bad, mode="hf_trainer") if f.rule == "offload_client_optimizer"]
    assert [f.severity for f in in_hf] == ["info"] and "DeepSpeedCPUAdam" in in_hf[0].message
    assert "offload_client_optimizer" not in rules({**bad, "zero_force_ds_cpu_optimizer": False})
    sgd = to_deepspeed_config(scenario(2, opt="cpu", optimizer="sgd"))
    del sgd["zero_force_ds_cpu_optimizer"]
    assert "offload_client_optimizer" not in rules(sgd)  # DeepSpeed builds torch.optim.SGD itself: it runs
    assert "offload_client_optimizer" not in rules(to_deepspeed_config(scenario(2, opt="cpu")))


def test_small_buckets_multinode():
    # the seed article: multi-node ZeRO-2 with 5e7 buckets was slow; 2e8 was 2.1x faster
    two_nodes = scenario(2, nodes=2)
    bad = cfg(two_nodes, reduce_bucket_size=50_000_000, allgather_bucket_size=50_000_000)
    assert {f.key for f in lint(bad, two_nodes) if f.rule == "small_buckets_multinode"} == {
        "zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size"}
    fixed = cfg(two_nodes, reduce_bucket_size=200_000_000, allgather_bucket_size=200_000_000)
    assert "small_buckets_multinode" not in rules(fixed, two_nodes)
    assert "small_buckets_multinode" not in rules(bad, scenario(2, nodes=1))


def test_zero3_slow_network():
    slow = on(scenario(3, nodes=2), network=ETHERNET_25)
    assert "zero3_slow_network" in rules(to_deepspeed_config(slow), slow)
    fast = scenario(3, nodes=2)  # InfiniBand HDR
    assert "zero3_slow_network" not in rules(to_deepspeed_config(fast), fast)
    stage2 = on(scenario(2, nodes=2), network=ETHERNET_25)
    assert "zero3_slow_network" not in rules(to_deepspeed_config(stage2), stage2)


def test_offload_without_pin():
    s = scenario(3, opt="cpu", par="cpu", pin=False, nodes=1)
    assert "offload_without_pin" in rules(to_deepspeed_config(s), s)
    s = scenario(3, opt="cpu", par="cpu", nodes=1)
    assert "offload_without_pin" not in rules(to_deepspeed_config(s), s)


def test_pinned_exceeds_host():
    from zeroplanner.costmodel import estimate

    s = scenario(3, opt="cpu", par="cpu", nodes=1)
    need = estimate(s).per_node_cpu_bytes
    small = on(s, cpu_memory_bytes=int(need // 2))
    assert need > small.cluster.cpu_memory_bytes
    assert "pinned_exceeds_host" in rules(to_deepspeed_config(small), small, severity="warning")
    big = on(s, cpu_memory_bytes=int(need * 2))
    assert "pinned_exceeds_host" not in rules(to_deepspeed_config(big), big)
    unpinned = scenario(3, opt="cpu", par="cpu", nodes=1, pin=False)
    unpinned = on(unpinned, cpu_memory_bytes=int(estimate(unpinned).per_node_cpu_bytes // 2))
    got = rules(to_deepspeed_config(unpinned), unpinned)
    assert "host_ram_short" in got and "pinned_exceeds_host" not in got


def test_nvme_without_path():
    bad = cfg(scenario(3), offload_param={"device": "nvme", "pin_memory": True})
    assert "nvme_without_path" in rules(bad)
    # below stage 3 no NVMe swapper is built: offload_optimizer nvme runs as CPU offload (nvme_optimizer_below_stage3)
    assert "nvme_without_path" not in rules(cfg(scenario(2), offload_optimizer={"device": "nvme"}))
    assert "nvme_without_path" not in rules(to_deepspeed_config(scenario(3, par="nvme")))


def test_hpz_not_dividing():
    """DeepSpeed asserts only that the hpZ size divides the data-parallel world (utils/groups.py,
    _create_zero_param_parallel_group -> _ensure_divisibility(world, min(hpz, world))): an error there; a size that
    divides the world but not the GPUs per node runs with groups spanning nodes: a warning."""
    from deepspeed.utils.groups import _ensure_divisibility

    s = scenario(3, nodes=2, gpus_per_node=8)  # data-parallel degree 16
    found = [f for f in lint(cfg(s, zero_hpz_partition_size=3), s) if f.rule == "hpz_not_dividing"]
    assert [f.severity for f in found] == ["error"]
    with pytest.raises(AssertionError):
        _ensure_divisibility(16, 3)
    s3 = scenario(3, nodes=3, gpus_per_node=8)  # 24 ranks: 3 divides the world, not the 8 GPUs of a node
    _ensure_divisibility(24, 3)
    found = [f for f in lint(cfg(s3, zero_hpz_partition_size=3), s3) if f.rule == "hpz_not_dividing"]
    assert [f.severity for f in found] == ["warning"]
    assert "hpz_not_dividing" not in rules(cfg(s, zero_hpz_partition_size=8), s)
    assert "hpz_not_dividing" not in rules(cfg(s, zero_hpz_partition_size=4), s)


def test_zero_at_dp1():
    one = scenario(2, nodes=1, gpus_per_node=1)
    assert "zero_at_dp1" in rules(to_deepspeed_config(one), one)
    assert "zero_at_dp1" not in rules(to_deepspeed_config(scenario(0, nodes=1, gpus_per_node=1)),
                                      scenario(0, nodes=1, gpus_per_node=1))
    assert "zero_at_dp1" not in rules(to_deepspeed_config(BASE), BASE)


def test_qlora_stage3():
    def qlora(stage):
        s = scenario(stage, nodes=1)
        return s.model_copy(update={"training": TrainingSpec(lora_rank=16, qlora=True)})

    assert "qlora_stage3" in rules(to_deepspeed_config(qlora(3)), qlora(3))
    assert "qlora_stage3" not in rules(to_deepspeed_config(qlora(2)), qlora(2))


def test_communication_share():
    from zeroplanner.costmodel import estimate

    def share(s):
        e = estimate(s)
        return e.communication.exposed_seconds_per_step / e.step_seconds

    slow = on(scenario(3, nodes=2), network=ETHERNET_25)
    fast = scenario(3, nodes=1)
    assert share(slow) > COMMUNICATION_SHARE_LIMIT > share(fast)  # cost model, not hard-coded
    assert "communication_share" in rules(to_deepspeed_config(slow), slow)
    assert "communication_share" not in rules(to_deepspeed_config(fast), fast)


def test_zero2_offload_full_weights():
    s = scenario(2, opt="cpu", nodes=1)
    found = [f for f in lint(to_deepspeed_config(s), s) if f.rule == "zero2_offload_full_weights"]
    # Llama-2-7B has 6738415616 parameters (HF config); 2 bytes each in bf16 = 12.55 GiB
    assert len(found) == 1 and found[0].severity == "info" and "12.6 GiB" in found[0].message
    z3 = scenario(3, opt="cpu", nodes=1)
    assert "zero2_offload_full_weights" not in rules(to_deepspeed_config(z3), z3)


def test_findings_sorted_and_cli_style_input():
    bad = json.dumps({"train_batch_size": "16", "zero_optimization": {"stage": 2, "reduce_bucket_size": "5e8"},
                      "bf16": {"enabled": True}, "fp16": {"enabled": True}})
    config, _ = load_config_text(bad)
    severities = [f.severity for f in lint(config, BASE)]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
    | st.sampled_from(["auto", "cpu", "nvme", "5e8"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["stage", "device", "pin_memory", "enabled", "reduce_bucket_size", "offload_param",
                         "offload_optimizer", "nvme_path", "type", "params", "x"]), children, max_size=4),
    max_leaves=12,
)
configs = st.dictionaries(
    st.sampled_from(["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16",
                     "fp16", "optimizer", "zero_optimization", "activation_checkpointing", "amp", "foo"]),
    json_values, max_size=6)


def test_long_and_odd_keys_are_clipped_not_crashing():
    key = "k" * 5000
    config = {key: 1, "zero_optimization": {"stage": 2, key: 1, "offload_param": {key: 1}}, "auto": "auto"}
    config[key + "x"] = "auto"
    findings = lint(config, BASE) + from_deepspeed_config(config, base=BASE)[1]
    assert all(len(f.key) <= 300 for f in findings)
    _, dup = load_config_text('{"%s": 1, "%s": 2}' % (key, key))
    assert dup and len(dup[0].key) <= 300
    config = {"train_micro_batch_size_per_gpu": float("inf"), "zero_optimization": {"reduce_bucket_size": 1e308}}
    assert {"integer_type"} <= {f.rule for f in lint(config, BASE)}
    from_deepspeed_config(config, base=BASE)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(configs)
def test_garbage_never_raises(config):
    """Any JSON-shaped input: lint and from_deepspeed_config return findings, they never raise."""
    findings = lint(copy.deepcopy(config), BASE)
    assert all(f.severity in ("error", "warning", "info") for f in findings)
    s, _ = from_deepspeed_config(copy.deepcopy(config), base=BASE)
    assert isinstance(s, Scenario)
    text = json.dumps(config)
    assert from_deepspeed_config(text, base=BASE)[0] == s


def test_non_object_config():
    assert [f.rule for f in lint([1, 2])] == ["wrong_type"]
    with pytest.raises(ConfigError):
        from_deepspeed_config([1, 2], base=BASE)  # type: ignore[arg-type]
