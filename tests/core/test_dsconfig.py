"""zeroplanner.deepspeed: generated configs are valid for DeepSpeed 0.19.8's own config classes, use integers where
DeepSpeed wants integers, round-trip through from_deepspeed_config, match transformers' "auto" rules, and bad input
gives findings or a one-line ConfigError (never a traceback, never code execution)."""

from __future__ import annotations

import itertools
import json
import os
import time
import types

import pytest

from zeroplanner import catalog
from zeroplanner.deepspeed import (
    MAX_CONFIG_BYTES,
    ConfigError,
    from_deepspeed_config,
    generation_notes,
    hf_auto_values,
    hf_training_arguments,
    load_config_text,
    to_accelerate_config,
    to_deepspeed_config,
)
from zeroplanner.deepspeed.keys import (
    BF16_KEYS,
    FP16_KEYS,
    HF_TRAINER_AUTO_KEYS,
    INTEGER_KEYS,
    OFFLOAD_OPTIMIZER_KEYS,
    OFFLOAD_PARAM_KEYS,
    REMOVED_TOP_LEVEL_KEYS,
    REMOVED_ZERO_KEYS,
    TOP_LEVEL_KEYS,
    ZERO_KEYS,
)
from zeroplanner.specs import ClusterSpec, NetworkSpec, OffloadSpec, Scenario, TrainingSpec, ZeroSpec

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # noqa: E402

from ..helpers import hf_args  # noqa: E402

ETHERNET_25 = NetworkSpec(name="25GbE-test", kind="ethernet", link_gbps=25.0)


def scenario(stage=2, opt="none", par="none", precision="bf16", optimizer="adamw", zpp=False, nodes=2,
             gpus_per_node=8, micro=2, accum=4, checkpointing="full", overlap=None, model="llama-2-7b",
             pin=True, **zero) -> Scenario:
    def offload(device):
        return OffloadSpec(device=device, pin_memory=pin, nvme_path="/nvme/zp" if device == "nvme" else None)

    zero_spec = ZeroSpec(
        stage=stage, offload_optimizer=offload(opt), offload_param=offload(par), overlap_comm=overlap,
        zero_hpz_partition_size=gpus_per_node if zpp else 1, zero_quantized_weights=zpp,
        zero_quantized_gradients=zpp, **zero,
    )
    return Scenario(
        model=catalog.model(model),
        cluster=ClusterSpec(gpu=catalog.gpu("A100-80GB"), network=catalog.network("ib-hdr"), nodes=nodes,
                            gpus_per_node=gpus_per_node),
        training=TrainingSpec(precision=precision, optimizer=optimizer, micro_batch=micro, grad_accum=accum,
                              checkpointing=checkpointing),
        zero=zero_spec,
    )


def sweep() -> list[Scenario]:
    """All stages x every offload combination each stage allows x precisions x optimizers x ZeRO++ on/off."""
    out = []
    devices = ("none", "cpu", "nvme")
    for stage in range(4):
        opts = ("none",) if stage == 0 else devices
        pars = devices if stage == 3 else ("none",)
        zpps = (False, True) if stage == 3 else (False,)
        for opt, par, zpp, precision, optimizer in itertools.product(
                opts, pars, zpps, ("bf16", "fp16", "fp32"), ("adamw", "adam", "sgd", "adam8bit")):
            out.append(scenario(stage, opt, par, precision, optimizer, zpp))
    # knobs the grid above leaves at defaults
    out.append(scenario(3, overlap=False, checkpointing="none", reduce_bucket_size=200_000_000,
                        stage3_prefetch_bucket_size=1_000_000, stage3_param_persistence_threshold=0))
    out.append(scenario(2, overlap=True, checkpointing="selective", allgather_bucket_size=123_456_789,
                        contiguous_gradients=False))
    out.append(scenario(1, nodes=1, gpus_per_node=1, micro=7, accum=3, pin=False, opt="cpu"))
    return out


SWEEP = sweep()


@pytest.fixture
def ds_world(monkeypatch):
    """DeepSpeedConfig asks deepspeed.comm for rank and world size; without a process group it falls back to world
    size 1. Patch the two functions (nothing else) so the batch assertion runs with the scenario's world size."""
    import deepspeed.comm as dist

    def set_world(size: int) -> None:
        monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
        monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: size)

    return set_world


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix, node


FLOAT_KEYS = {"gradient_clipping", "optimizer.params.lr", "optimizer.params.eps", "optimizer.params.weight_decay",
              "optimizer.params.momentum", "scheduler.params.warmup_max_lr"}


def test_sweep_size():
    # 1 (stage 0) + 3 + 3 (stages 1, 2) + 18 (stage 3: 3 x 3 offloads x ZeRO++ on/off) = 25 ZeRO variants,
    # x 3 precisions x 4 optimizers, + 3 extra
    assert len(SWEEP) == 25 * 12 + 3


@pytest.mark.parametrize("idx", range(len(SWEEP)))
def test_generated_config_accepted_by_deepspeed_and_round_trips(idx, ds_world):
    s = SWEEP[idx]
    config = to_deepspeed_config(s)
    ds_world(s.cluster.data_parallel_degree)
    # DeepSpeed's own parser: pydantic ZeRO/offload/precision models + batch assertion + sanity checks.
    parsed = DeepSpeedConfig(json.loads(json.dumps(config)))
    assert parsed.zero_optimization_stage == s.zero.stage
    assert parsed.train_batch_size == s.global_batch_size
    assert parsed.bfloat16_config.enabled == (s.training.precision == "bf16")
    assert parsed.float16_config.enabled == (s.training.precision == "fp16")
    zc = parsed.zero_config
    assert zc.reduce_bucket_size == s.zero.reduce_bucket_size
    assert zc.allgather_bucket_size == s.zero.allgather_bucket_size
    assert zc.overlap_comm == s.zero.overlap
    if s.zero.stage == 3:
        assert zc.prefetch_bucket_size == s.zero.stage3_prefetch_bucket_size
        assert zc.param_persistence_threshold == s.zero.stage3_param_persistence_threshold
        assert zc.zero_hpz_partition_size == s.zero.zero_hpz_partition_size
        assert zc.zero_quantized_weights == s.zero.zero_quantized_weights
    for name in ("offload_optimizer", "offload_param"):
        want = getattr(s.zero, name).device
        got = getattr(zc, name)
        assert (got.device if got is not None else "none") == want
    # strict pydantic (no "auto" dropping, no lax coercion of strings) accepts the ZeRO block too
    DeepSpeedZeroConfig(strict=True, **config["zero_optimization"])

    # integers where DeepSpeed wants integers; floats only for learning-rate-like values
    for key, value in _leaves(config):
        if key in INTEGER_KEYS:
            assert type(value) is int, (key, value)
        if isinstance(value, float):
            assert key in FLOAT_KEYS, (key, value)

    # round trip, also through JSON text
    back, findings = from_deepspeed_config(config, base=s)
    assert back == s
    assert not [f for f in findings if f.severity != "info"], findings
    assert from_deepspeed_config(json.dumps(config), base=s)[0] == s


_hf_args = hf_args


HF_SWEEP = [s for s in SWEEP if s.training.optimizer in ("adamw", "adam8bit", "sgd")]


@pytest.mark.parametrize("idx", range(0, len(HF_SWEEP), 3))
def test_hf_mode_filled_by_transformers_matches_hf_auto_values(idx, ds_world):
    """Run transformers 5.24's own HfTrainerDeepSpeedConfig over the hf_trainer config: every "auto" is replaced,
    the values are the ones hf_auto_values documents, and DeepSpeed accepts the result."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    s = HF_SWEEP[idx]
    config = to_deepspeed_config(s, mode="hf_trainer", hf_auto=True)  # the all-"auto" variant (--hf-auto)
    autos = {k for k, v in _leaves(config) if v == "auto"}
    assert autos <= set(HF_TRAINER_AUTO_KEYS)
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    try:
        args = _hf_args(s)
        hf.trainer_config_process(args)
        model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=s.model.hidden_size))
        hf.trainer_config_finalize(args, model, num_training_steps=1000)
        filled = hf.config
    finally:
        unset_hf_deepspeed_config()
    leaves = dict(_leaves(filled))
    assert "auto" not in leaves.values()
    for key, value in hf_auto_values(s).items():
        assert leaves[key] == value, key
    assert leaves["scheduler.params.total_num_steps"] == 1000
    ds_world(s.cluster.data_parallel_degree)
    DeepSpeedConfig(filled)
    # round trip of the "auto" config: the scenario with the Trainer's bucket values
    back, findings = from_deepspeed_config(config, base=s)
    zero_changes = {"reduce_bucket_size": s.model.hidden_size ** 2}
    if s.zero.stage == 3:
        zero_changes["stage3_prefetch_bucket_size"] = int(0.9 * s.model.hidden_size ** 2)
        zero_changes["stage3_param_persistence_threshold"] = 10 * s.model.hidden_size
    assert back == s.model_copy(update={"zero": s.zero.model_copy(update=zero_changes)})
    assert any(f.rule == "auto_resolved" and f.key == "zero_optimization.reduce_bucket_size" for f in findings)


def test_hf_auto_rules_for_a_known_hidden_size():
    # Llama-2-7B hidden_size 4096 (HF config.json): 4096^2 = 16777216; int(0.9 * 4096^2) = 15099494;
    # 10 * 4096 = 40960 (transformers integrations/deepspeed.py, trainer_config_finalize)
    auto = hf_auto_values(scenario(3))
    assert auto["zero_optimization.reduce_bucket_size"] == 16777216
    assert auto["zero_optimization.stage3_prefetch_bucket_size"] == 15099494
    assert auto["zero_optimization.stage3_param_persistence_threshold"] == 40960
    assert "zero_optimization.stage3_prefetch_bucket_size" not in hf_auto_values(scenario(2))


def test_key_tables_match_deepspeed():
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    def names(model):
        return {n for n in model.model_fields} | {f.alias for f in model.model_fields.values() if f.alias}

    assert ZERO_KEYS == names(DeepSpeedZeroConfig)
    assert OFFLOAD_PARAM_KEYS == names(DeepSpeedZeroOffloadParamConfig)
    assert OFFLOAD_OPTIMIZER_KEYS == names(DeepSpeedZeroOffloadOptimizerConfig)
    assert BF16_KEYS == names(DeepSpeedBF16Config)
    assert FP16_KEYS == names(DeepSpeedFP16Config)
    assert REMOVED_TOP_LEVEL_KEYS == set(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    assert REMOVED_ZERO_KEYS == set(ds_config._REMOVED_ZERO_CONFIG_KEYS)
    # every top-level key we call "known" is a quoted string somewhere in DeepSpeed's source
    root = os.path.dirname(deepspeed.__file__)
    text = []
    for dirpath, _, files in os.walk(root):
        text += [open(os.path.join(dirpath, f), encoding="utf-8", errors="ignore").read()
                 for f in files if f.endswith(".py")]
    blob = "\n".join(text)
    missing = [k for k in TOP_LEVEL_KEYS if f'"{k}"' not in blob and f"'{k}'" not in blob]
    assert not missing


def test_integer_fields_are_ints_for_deepspeed():
    # every INTEGER_KEYS entry that DeepSpeed models with pydantic is an int field there
    fields = DeepSpeedZeroConfig.model_fields
    by_alias = {f.alias or n: f for n, f in fields.items()} | dict(fields)
    for key in INTEGER_KEYS:
        if key.startswith("zero_optimization.") and key.count(".") == 1:
            annotation = by_alias[key.split(".", 1)[1]].annotation
            assert annotation is int or issubclass(annotation, int), key  # stage: ZeroStageEnum(int, Enum)


def test_eight_bit_adam_has_no_optimizer_block_and_a_note(ds_world):
    s = scenario(2, optimizer="adam8bit")
    config = to_deepspeed_config(s)
    assert "optimizer" not in config
    assert config["zero_allow_untested_optimizer"] is True
    notes = generation_notes(s)
    assert any(n.rule == "client_optimizer" and "adamw_bnb_8bit" in n.fix for n in notes)
    assert hf_training_arguments(s)["optim"] == "adamw_bnb_8bit"
    offload = scenario(2, opt="cpu", optimizer="adam8bit")
    assert to_deepspeed_config(offload)["zero_force_ds_cpu_optimizer"] is False
    assert any(n.rule == "client_optimizer_offload" for n in generation_notes(offload))


def test_total_num_steps_gives_warmup_decay(ds_world):
    s = scenario(2)
    config = to_deepspeed_config(s, total_num_steps=5000)
    assert config["scheduler"]["type"] == "WarmupDecayLR"
    assert config["scheduler"]["params"]["total_num_steps"] == 5000
    ds_world(s.cluster.data_parallel_degree)
    DeepSpeedConfig(config)
    with pytest.raises(ValueError):
        to_deepspeed_config(s, total_num_steps=0)
    with pytest.raises(ValueError):
        to_deepspeed_config(s, mode="megatron")


def test_nvme_without_path_uses_placeholder_and_says_so():
    s = scenario(3, opt="nvme").model_copy(update={"zero": ZeroSpec(stage=3, offload_optimizer=OffloadSpec(
        device="nvme"))})
    config = to_deepspeed_config(s)
    assert config["zero_optimization"]["offload_optimizer"]["nvme_path"] == "/local_nvme"
    assert any(n.rule == "nvme_placeholder" for n in generation_notes(s))


def test_plan_like_object_is_accepted():
    s = scenario(1)
    assert to_deepspeed_config(types.SimpleNamespace(scenario=s)) == to_deepspeed_config(s)
    with pytest.raises(TypeError):
        to_deepspeed_config({"stage": 2})


def test_accelerate_yaml_is_read_by_accelerate(tmp_path):
    from accelerate.commands.config.config_args import ClusterConfig

    s = scenario(3, nodes=2)
    path = tmp_path / "accelerate.yaml"
    path.write_text(to_accelerate_config(s, deepspeed_config_file="configs/ds z3.json"))
    cfg = ClusterConfig.from_yaml_file(str(path))
    assert cfg.distributed_type.value == "DEEPSPEED"
    assert cfg.num_processes == 16 and cfg.num_machines == 2
    assert cfg.deepspeed_config["deepspeed_config_file"] == "configs/ds z3.json"
    assert cfg.deepspeed_config["zero3_init_flag"] is True
    assert cfg.mixed_precision is None  # accelerate refuses a precision beside deepspeed_config_file
    single = tmp_path / "single.yaml"
    single.write_text(to_accelerate_config(scenario(2, nodes=1)))
    cfg = ClusterConfig.from_yaml_file(str(single))
    assert cfg.num_processes == 8 and "deepspeed_multinode_launcher" not in cfg.deepspeed_config


# ----------------------------------------------------------------------------------------------------------------
# Reading users' configs
# ----------------------------------------------------------------------------------------------------------------
SEED_STAGE3 = """{ "zero_optimization": { "stage": 3, "offload_optimizer": { "device": "cpu", "pin_memory": true },
 "offload_param": { "device": "cpu", "pin_memory": true }, "contiguous_gradients": true,
 "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9, "stage3_prefetch_bucket_size": 5e6,
 "stage3_param_persistence_threshold": 1e5, "reduce_bucket_size": 1e6, "allgather_bucket_size": 1e6 },
 "activation_checkpointing": { "partition_activations": true, "cpu_checkpointing": true, "number_checkpoints": null,
 "synchronize_checkpoint_boundary": false } }"""
"""The seed article's ZeRO-3 'memory squeeze' config, verbatim (floats written as 1e9 etc.)."""


def test_seed_article_config_is_read():
    base = scenario(2, checkpointing="none")
    s, findings = from_deepspeed_config(SEED_STAGE3, base=base)
    z = s.zero
    assert (z.stage, z.offload_optimizer.device, z.offload_param.device) == (3, "cpu", "cpu")
    assert (z.stage3_prefetch_bucket_size, z.reduce_bucket_size, z.stage3_max_live_parameters) == (
        5_000_000, 1_000_000, 1_000_000_000)
    assert s.training.checkpointing == "full"
    assert any(f.rule == "coerced" and f.key == "zero_optimization.reduce_bucket_size" for f in findings)
    assert not any(f.rule == "stage0" for f in findings)


def test_absent_keys_take_deepspeed_defaults():
    base = scenario(2, reduce_bucket_size=123, overlap=True)
    s, _ = from_deepspeed_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}, base=base)
    # DeepSpeedZeroConfig defaults: reduce_bucket_size 5e8, overlap_comm None -> stage == 3
    defaults = DeepSpeedZeroConfig(stage=2)
    assert s.zero.reduce_bucket_size == defaults.reduce_bucket_size
    assert s.zero.overlap == defaults.overlap_comm
    assert (s.training.micro_batch, s.training.grad_accum) == (1, 1)


@pytest.mark.parametrize("tb,mb,ga,want", [
    (64, 2, None, (2, 2)),      # DeepSpeed: ga = tb // mb // world (world 16)
    (64, None, 2, (2, 2)),      # micro = tb // world // ga
    (32, None, None, (2, 1)),   # micro = tb // world, ga = 1
    (None, 3, None, (3, 1)),
])
def test_batch_keys_derived_like_deepspeed(tb, mb, ga, want, ds_world):
    config = {k: v for k, v in (("train_batch_size", tb), ("train_micro_batch_size_per_gpu", mb),
                                ("gradient_accumulation_steps", ga)) if v is not None}
    base = scenario(0)
    s, _ = from_deepspeed_config(config, base=base)
    assert (s.training.micro_batch, s.training.grad_accum) == want
    ds_world(base.cluster.data_parallel_degree)
    parsed = DeepSpeedConfig(dict(config))
    assert (parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps) == want


def test_unknown_keys_are_reported_not_dropped():
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimisation": {"stage": 3},
              "zero_optimization": {"stage": 2, "reduce_bucket_sise": 5, "offload_optimizer": {"device": "cpu",
                                                                                               "pinned": True}},
              "bf16": {"enabled": True, "loss_scale": 0}}
    _, findings = from_deepspeed_config(config, base=scenario(2))
    got = {(f.key, f.severity) for f in findings if f.rule == "unknown_key"}
    assert got == {
        ("zero_optimisation", "warning"),  # top level: DeepSpeed ignores it silently
        ("zero_optimization.reduce_bucket_sise", "error"),  # DeepSpeedZeroConfig forbids extra keys
        ("zero_optimization.offload_optimizer.pinned", "error"),
        ("bf16.loss_scale", "error"),
    }
    # DeepSpeed agrees the strict blocks reject them
    with pytest.raises(Exception):
        DeepSpeedZeroConfig(**config["zero_optimization"])


def test_stage_rules_deepspeed_ignores_are_priced_without():
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 2, "offload_param": {"device": "cpu"}, "zero_hpz_partition_size": 8}}
    s, findings = from_deepspeed_config(config, base=scenario(2))
    assert s.zero.offload_param.device == "none" and s.zero.zero_hpz_partition_size == 1
    assert {f.key for f in findings if f.rule == "ignored_by_deepspeed"} == {
        "zero_optimization.offload_param", "zero_optimization.zero_hpz_partition_size"}
    s0, _ = from_deepspeed_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 0, "offload_optimizer": {"device": "cpu"}}}, base=scenario(2))
    assert s0.zero.offload_optimizer.device == "none"


def test_optimizer_types_are_read():
    base = scenario(2, optimizer="sgd")
    cases = {"AdamW": "adamw", "adamw": "adamw", "SGD": "sgd", "Lamb": "adamw", "OneBitAdam": "adamw"}
    for kind, want in cases.items():
        s, _ = from_deepspeed_config({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": kind}}, base=base)
        assert s.training.optimizer == want, kind
    s, findings = from_deepspeed_config({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam"}},
                                        base=base)
    assert s.training.optimizer == "adamw" and any(f.rule == "optimizer_mapped" for f in findings)
    s, _ = from_deepspeed_config({"train_micro_batch_size_per_gpu": 1,
                                  "optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}}, base=base)
    assert s.training.optimizer == "adam"


# ----------------------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------------------
def test_invalid_json_is_one_line_error():
    with pytest.raises(ConfigError) as err:
        from_deepspeed_config('{"zero_optimization": {"stage": 2 "offload_param"}}', base=scenario(2))
    assert "not valid JSON" in str(err.value) and "line 1" in str(err.value) and "\n" not in str(err.value)
    for text in ("[1, 2]", '"just a string"', "NaN", '{"train_batch_size": NaN}', '{"a": Infinity}', "",
                 b"\xff\xfe{}", '{"a": 1e999}'):
        with pytest.raises(ConfigError):
            load_config_text(text)


HJSON_TEXT = """{
  // comments and trailing commas: DeepSpeed reads config files with hjson
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 4,
  "zero_optimization": {"stage": 2,},
}"""


def test_hjson_file_read_as_deepspeed_reads_it(tmp_path, ds_world):
    """DeepSpeedConfig(path) uses hjson.load (deepspeed/runtime/config.py): comments and trailing commas are fine
    for DeepSpeed alone; accelerate's HfDeepSpeedConfig(path) uses json.load and raises, so --hf-trainer errors."""
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    path = tmp_path / "ds.json"
    path.write_text(HJSON_TEXT)
    ds_world(16)
    assert DeepSpeedConfig(str(path)).zero_optimization_stage == 2
    with pytest.raises(ValueError):
        HfDeepSpeedConfig(str(path))
    config, findings = load_config_text(HJSON_TEXT)
    assert config["zero_optimization"] == {"stage": 2}
    assert [(f.rule, f.severity) for f in findings] == [("invalid_syntax", "info")]
    _, hf = load_config_text(HJSON_TEXT, "hf_trainer")
    assert [(f.rule, f.severity) for f in hf] == [("invalid_syntax", "error")]
    s, _ = from_deepspeed_config(HJSON_TEXT, base=scenario(3))
    assert s.zero.stage == 2 and s.training.micro_batch == 2


def test_fifty_megabytes_is_refused_quickly():
    blob = b'{"pad": "' + b"x" * (50 * 2**20) + b'"}'
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        from_deepspeed_config(blob, base=scenario(2))
    elapsed = time.perf_counter() - start
    assert str(MAX_CONFIG_BYTES) in str(err.value)
    assert elapsed < 0.5  # measured ~1 ms: refused on length, never parsed
    with pytest.raises(ConfigError):
        load_config_text(blob.decode())


def test_deep_nesting_is_refused():
    with pytest.raises(ConfigError, match="deeper"):
        load_config_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ConfigError, match="deeper"):
        load_config_text('{"a":' * 40 + "1" + "}" * 40)
    nested: dict = {}
    node = nested
    for _ in range(50):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(ConfigError, match="deeper"):
        from_deepspeed_config(nested, base=scenario(2))
    # brackets inside strings do not count
    config, _ = load_config_text('{"comment": "' + "[" * 100 + '", "train_batch_size": 16}')
    assert config["train_batch_size"] == 16


def test_wrong_types_give_findings_not_exceptions():
    base = scenario(2)
    bad = {
        "train_batch_size": [16], "train_micro_batch_size_per_gpu": "two", "gradient_accumulation_steps": True,
        "bf16": "yes", "fp16": {"enabled": "no"}, "optimizer": ["AdamW"],
        "zero_optimization": {"stage": "three", "reduce_bucket_size": {"x": 1}, "allgather_bucket_size": -5,
                              "offload_optimizer": "cpu", "offload_param": {"device": "disk"},
                              "overlap_comm": "sometimes", "zero_hpz_partition_size": 1e30},
        "activation_checkpointing": 7,
    }
    s, findings = from_deepspeed_config(bad, base=base)
    assert isinstance(s, Scenario)
    keys = {f.key for f in findings}
    for key in ("bf16", "optimizer", "zero_optimization.stage", "zero_optimization.reduce_bucket_size",
                "zero_optimization.allgather_bucket_size", "zero_optimization.offload_optimizer",
                "zero_optimization.offload_param.device", "zero_optimization.overlap_comm",
                "zero_optimization.zero_hpz_partition_size", "activation_checkpointing",
                "train_micro_batch_size_per_gpu"):
        assert key in keys, key
    s, findings = from_deepspeed_config({"zero_optimization": [1, 2]}, base=base)
    assert any(f.key == "zero_optimization" and f.severity == "error" for f in findings)


def test_duplicate_keys_reported(tmp_path, ds_world):
    """DeepSpeed's file loader raises on a duplicate key (dict_raise_error_on_duplicate_keys): an error for
    DeepSpeed alone; accelerate's json.load keeps the last value: a warning under --hf-trainer."""
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    text = '{"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 2}'
    path = tmp_path / "dup.json"
    path.write_text(text)
    ds_world(8)
    with pytest.raises(ValueError, match="Duplicate keys"):
        DeepSpeedConfig(str(path))
    assert HfDeepSpeedConfig(str(path)).config["train_micro_batch_size_per_gpu"] == 2
    config, findings = load_config_text(text)
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert [(f.key, f.severity) for f in findings if f.rule == "duplicate_key"] == [
        ("train_micro_batch_size_per_gpu", "error")]
    _, hf = load_config_text(text, "hf_trainer")
    assert [(f.key, f.severity) for f in hf if f.rule == "duplicate_key"] == [
        ("train_micro_batch_size_per_gpu", "warning")]


def test_nothing_in_the_text_is_executed(tmp_path):
    marker = tmp_path / "pwned"
    payload = {"__class__": f"__import__('os').system('touch {marker}')", "!!python/object/apply:os.system":
               [f"touch {marker}"], "zero_optimization": {"stage": 2}}
    s, findings = from_deepspeed_config(json.dumps(payload), base=scenario(2))
    assert not marker.exists()
    assert {f.key for f in findings if f.rule == "unknown_key"} >= {"__class__", "!!python/object/apply:os.system"}
    # hjson (DeepSpeed's reader) takes this YAML tag for a key with a quoteless string value; nothing runs
    config, _ = load_config_text(f"!!python/object/apply:os.system ['touch {marker}']")
    assert list(config) == ["!!python/object/apply"] and not marker.exists()
    assert not marker.exists()


# ----------------------------------------------------------------------------------------------------------------
# CLI: zeroplanner config / check
# ----------------------------------------------------------------------------------------------------------------
def test_cli_config_writes_deepspeed_and_accelerate_files(cli_main, tmp_path, capsys, ds_world):
    from accelerate.commands.config.config_args import ClusterConfig

    out = tmp_path / "ds.json"
    code = cli_main(["config", "--stage", "3", "--offload-optimizer", "cpu", "--nodes", "2", "--micro-batch", "2",
                     "--grad-accum", "4", "-o", str(out), "--accelerate"])
    assert code == 0
    config = json.loads(out.read_text())
    assert config["zero_optimization"]["stage"] == 3
    assert config["train_batch_size"] == 2 * 4 * 16
    ds_world(16)
    DeepSpeedConfig(config)
    yaml_cfg = ClusterConfig.from_yaml_file(str(tmp_path / "ds.accelerate.yaml"))
    assert yaml_cfg.deepspeed_config["deepspeed_config_file"] == str(out) and yaml_cfg.num_processes == 16
    assert "wrote" in capsys.readouterr().err

    assert cli_main(["config", "--hf-trainer", "--hf-auto", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["config"]["train_batch_size"] == "auto" and obj["mode"] == "hf_trainer"
    assert cli_main(["config", "--accelerate"]) == 2
    assert "--accelerate" in capsys.readouterr().err


def test_cli_check_reports_findings_and_estimate(cli_main, tmp_path, capsys):
    path = tmp_path / "user.json"
    path.write_text(json.dumps({
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "5e8", "offload_param": {"device": "cpu"},
                              "typo_key": 1}}))
    code = cli_main(["check", str(path), "--nodes", "2", "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert code == 1 and obj["errors"] >= 2
    keys = {(f["rule"], f["key"]) for f in obj["findings"]}
    assert ("integer_type", "zero_optimization.reduce_bucket_size") in keys
    assert ("unknown_key", "zero_optimization.typo_key") in keys
    assert obj["scenario"]["zero"]["stage"] == 3 and obj["scenario"]["zero"]["offload_param"]["device"] == "cpu"
    assert obj["estimate"]["data_parallel_degree"] == 16 and obj["estimate"]["step_seconds"] > 0

    good = tmp_path / "good.json"
    good.write_text(json.dumps(to_deepspeed_config(scenario(2, nodes=1, micro=1, accum=8))))
    assert cli_main(["check", str(good)]) == 0
    assert "0 error(s)" in capsys.readouterr().out


@pytest.mark.parametrize("content,expect", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2, 3]", "JSON object"),
    (b"[" * 100_000 + b"]" * 100_000, "deeper"),
    (b"\x00\xff\xfe", "UTF-8"),
])
def test_cli_check_bad_input_one_line_exit_2(cli_main, tmp_path, capsys, content, expect):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    assert cli_main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert expect in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_check_fifty_megabytes_subprocess(tmp_path):
    """The real command line on a 50 MB file: exit 2, one line on stderr, no traceback, nothing parsed."""
    import subprocess
    import sys

    path = tmp_path / "huge.json"
    with open(path, "wb") as fh:
        fh.write(b'{"pad": "' + b"x" * (50 * 2**20) + b'"}')
    proc = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "check", str(path), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and "1 MB" in proc.stderr
    assert "Traceback" not in proc.stderr
