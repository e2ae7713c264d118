"""Every rule zeroplanner can report with severity "error" fails in the real library, under the client it names.

Issue 18: "every error rule has a test that shows the failure with DeepSpeed's own config classes or a DeepSpeed run
on CPU ranks, under the client it names". :func:`error_rules_in_code` reads the rule names out of the modules that
emit findings (zeroplanner/deepspeed/lint.py, zeroplanner/pitfalls.py, zeroplanner/deepspeed/read.py: every
``_add``/``note``/``Finding`` call whose severity is the literal ``"error"`` or not a literal at all), and
:func:`test_every_error_rule_has_evidence` fails when one of them has no case in :data:`EVIDENCE`, so a new error
rule cannot land without showing the failure. Each case asserts both halves: zeroplanner reports the rule as an
error for that config and client, and the library fails on it.

What shows a failure (DeepSpeed 0.19.8, transformers 5.24, accelerate; paths under the installed ``deepspeed/``):

* DeepSpeed's config classes: ``runtime/config.py`` ``DeepSpeedConfig(config, mpu=None)`` (pydantic sub-configs in
  ``runtime/zero/config.py``, ``runtime/zero/offload_config.py``, ``runtime/precision_config.py``; the batch
  assertion ``_batch_assertion``; ``_reject_removed_config_keys``), with the world size ``deepspeed.initialize``
  would give it (the stand-in of zeroplanner/deepspeed/library.py, ``_deepspeed_world``);
* DeepSpeed's group builders with a stand-in world (``utils/groups.py`` ``_create_zero_param_parallel_group``);
* the HF client: transformers' ``HfTrainerDeepSpeedConfig`` fill (``library_findings(..., "hf_trainer")``) and
  accelerate's ``HfDeepSpeedConfig`` file loader (``accelerate/utils/deepspeed.py``: ``json.load``);
* ``deepspeed.initialize`` (DeepSpeed alone) or accelerate's ``Accelerator.prepare`` with a ``DeepSpeedPlugin``
  (the HF Trainer's path; ``DummyOptim`` for a config optimizer) and two optimizer steps on 1 or 2 CPU ranks
  (gloo), all cases of a rank count in one launch (:func:`engine_runs`), on an 8 -> 16 -> 2 MLP (178 parameters)
  or, for AutoTP, a 1-layer Llama.

:data:`ACCEPTED` holds the other half: conditions the rules used to call errors (or that sit next to an error)
that the library accepts and runs; zeroplanner reports them as warnings that say what happens.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest

from zeroplanner.deepspeed import from_deepspeed_config, load_config_text, to_deepspeed_config
from zeroplanner.deepspeed.keys import INTEGER_KEYS, REMOVED_TOP_LEVEL_KEYS, REMOVED_ZERO_KEYS
from zeroplanner.deepspeed.lint import _NONPOSITIVE_ACCEPTED, _POSITIVE_KEYS, lint
from zeroplanner.pitfalls import RULES
from tests.core.test_dsconfig import scenario

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402

from zeroplanner.deepspeed.library import _deepspeed_world, library_findings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("zeroplanner/deepspeed/lint.py", "zeroplanner/pitfalls.py", "zeroplanner/deepspeed/read.py")
EMITTERS = {"_add", "note", "Finding"}
SEVERITIES = {"error", "warning", "info"}

BASE8 = scenario(2, nodes=1)  # 8 GPUs on one node, micro 2 x accumulation 4
BASE2 = scenario(2, nodes=1, gpus_per_node=2, micro=1, accum=1)  # the 2-rank CPU runs


# ----------------------------------------------------------------------------------------------------------------
# The error rules, read from the code
# ----------------------------------------------------------------------------------------------------------------
def error_rules_in_code() -> dict[str, list[str]]:
    """rule -> ["file:line", ...] for every emitter call that can give severity "error": its severity argument is
    the literal "error", or not a literal (a variable that may hold "error"). A call with the literal "error" and no
    rule name among its literal arguments is returned under "<unnamed>" (so the test fails on it too)."""
    found: dict[str, list[str]] = {}
    for rel in SOURCES:
        tree = ast.parse((ROOT / rel).read_text(), rel)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name not in EMITTERS:
                continue
            values = list(node.args) + [k.value for k in node.keywords]
            literals = [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            severities = [v for v in literals if v in SEVERITIES]
            rules = [v for v in literals if v in RULES]
            if severities and "error" not in severities:
                continue
            if not rules:
                if "error" in severities:
                    found.setdefault("<unnamed>", []).append(f"{rel}:{node.lineno}")
                continue  # e.g. lint's forwarding of a Pitfall (p.severity, p.rule): pitfalls.py is read itself
            for rule in rules:
                found.setdefault(rule, []).append(f"{rel}:{node.lineno}")
    return found


# ----------------------------------------------------------------------------------------------------------------
# Helpers: zeroplanner's verdict, DeepSpeed's config classes
# ----------------------------------------------------------------------------------------------------------------
def findings(config: Any, mode: str = "deepspeed", base=BASE2, text: str | None = None):
    """What ``zeroplanner check`` reports (reader + reader's parse + lint) for the config under ``mode``."""
    out = []
    if text is not None:
        config, out = load_config_text(text, mode)
    if not isinstance(config, dict):
        return out + lint(config, None, mode)
    s, parsed = from_deepspeed_config(copy.deepcopy(config), base=base, mode=mode)
    return out + parsed + lint(copy.deepcopy(config), s, mode)


def errors(config: Any, mode: str = "deepspeed", base=BASE2, text: str | None = None) -> set[str]:
    return {f.rule for f in findings(config, mode, base, text) if f.severity == "error"}


def severities(config: Any, rule: str, mode: str = "deepspeed", base=BASE2) -> set[str]:
    return {f.severity for f in findings(config, mode, base) if f.rule == rule}


def ds_rejects(config: Any, world: int, match: str | None = None) -> None:
    """DeepSpeedConfig raises on the config at that world size."""
    with _deepspeed_world(world), pytest.raises(Exception, match=match):
        DeepSpeedConfig(copy.deepcopy(config))


def hf_rejects(config: dict[str, Any], base=BASE2) -> None:
    """The HF client, as library.py runs it: transformers' HfTrainerDeepSpeedConfig fill, then DeepSpeedConfig on
    the filled dict, fails (zeroplanner reports the same rule as an error under --hf-trainer)."""
    assert library_findings(copy.deepcopy(config), base, "hf_trainer"), config


def ds_accepts(config: Any, world: int) -> DeepSpeedConfig:
    with _deepspeed_world(world):
        return DeepSpeedConfig(copy.deepcopy(config))


def mini(**changes) -> dict[str, Any]:
    """The run configs: micro-batch 1, torch's AdamW (FusedAdam would be JIT-compiled), ZeRO-1."""
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": 1}}
    for dotted, value in changes.items():
        node = config
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return config


# ----------------------------------------------------------------------------------------------------------------
# deepspeed.initialize on CPU ranks: every case of a rank count in one launch
# ----------------------------------------------------------------------------------------------------------------
TINY_LLAMA = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32}
SGD = {"type": "SGD", "params": {"lr": 0.01}}

ENGINE: dict[str, dict[str, Any]] = {
    # 1 rank
    "baseline": {"config": mini()},
    "nvme_param_no_path": {"config": mini(zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}})},
    "nvme_optimizer_no_path": {"config": mini(zero_optimization={"stage": 3,
                                                                 "offload_optimizer": {"device": "nvme"}})},
    "nvme_optimizer_stage2_no_path": {"config": mini(zero_optimization={"stage": 2,
                                                                        "offload_optimizer": {"device": "nvme"}})},
    "clipping_auto": {"config": mini(gradient_clipping="auto")},
    "scheduler_auto": {"config": mini(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}})},
    "lr_auto": {"config": mini(optimizer__params__lr="auto")},
    "warmup_negative": {"config": mini(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": -1}})},
    "micro_fractional": {"config": mini(train_micro_batch_size_per_gpu=2.5), "training_data": True},
    "accumulation_fractional": {"config": mini(gradient_accumulation_steps=2.5), "micro_steps": 5},
    "micro_true": {"config": mini(train_micro_batch_size_per_gpu=True)},
    "bucket_true": {"config": mini(zero_optimization={"stage": 2, "reduce_bucket_size": True})},
    "auto_in_pydantic_blocks": {"config": mini(zero_optimization={"stage": 2, "reduce_bucket_size": "auto"},
                                               bf16={"enabled": "auto"})},
    "max_grad_norm": {"config": mini(optimizer__params__max_grad_norm=1.0)},
    "untested_sgd": {"config": mini(optimizer=SGD, zero_optimization={"stage": 2})},
    "untested_sgd_allowed": {"config": mini(optimizer=SGD, zero_optimization={"stage": 2},
                                            zero_allow_untested_optimizer=True)},
    "offload_client_adamw": {"config": mini(optimizer=None, zero_optimization={
        "stage": 2, "offload_optimizer": {"device": "cpu"}}), "client_optimizer": "torch_adamw"},
    "offload_client_adamw_unforced": {"config": mini(optimizer=None, zero_force_ds_cpu_optimizer=False,
                                                     zero_optimization={"stage": 2,
                                                                        "offload_optimizer": {"device": "cpu"}}),
                                      "client_optimizer": "torch_adamw"},
    "offload_optimizer_stage0": {"config": mini(zero_optimization={"stage": 0,
                                                                   "offload_optimizer": {"device": "cpu"}})},
    "offload_param_stage2": {"config": mini(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}})},
    # 1 rank, the HF client: accelerate's Accelerator.prepare (the Trainer's path; DummyOptim for a config optimizer)
    "hf_baseline": {"client": "hf_trainer", "config": mini()},
    "hf_max_grad_norm": {"client": "hf_trainer", "config": mini(optimizer__params__max_grad_norm=1.0)},
    "hf_untested_sgd": {"client": "hf_trainer", "config": mini(optimizer=SGD, zero_optimization={"stage": 2})},
    "hf_nvme_param_no_path": {"client": "hf_trainer", "config": mini(zero_optimization={
        "stage": 3, "offload_param": {"device": "nvme"}})},
    "pinned_offload_stage3": {"config": mini(optimizer=SGD, zero_allow_untested_optimizer=True, zero_optimization={
        "stage": 3, "offload_param": {"device": "cpu", "pin_memory": True},
        "offload_optimizer": {"device": "cpu", "pin_memory": True}})},
    # 2 ranks (one node of 2 "GPUs"); the AutoTP cases last: they set DeepSpeed's global TP mesh
    "allgather_zero": {"ranks": 2, "config": mini(zero_optimization={"stage": 2, "allgather_bucket_size": 0})},
    "allgather_zero_legacy_backend": {"ranks": 2, "legacy_allgather": True,
                                      "config": mini(zero_optimization={"stage": 2, "allgather_bucket_size": 0})},
    "autotp_3_of_2": {"ranks": 2, "llama": TINY_LLAMA, "config": mini(tensor_parallel={"autotp_size": 3})},
    "autotp_2_of_2": {"ranks": 2, "llama": TINY_LLAMA, "config": mini(tensor_parallel={"autotp_size": 2})},
    "autotp_2_of_3_heads": {"ranks": 2, "llama": dict(TINY_LLAMA, hidden_size=48, num_attention_heads=3,
                                                      num_key_value_heads=3),
                            "config": mini(tensor_parallel={"autotp_size": 2})},
}

WORKER = r'''
import datetime, json, os, sys, time, traceback
import torch
import deepspeed
import deepspeed.comm as ds_comm
from deepspeed.utils import groups

cases = json.load(open(sys.argv[1]))
deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=60))
rank = int(os.environ["RANK"])
real_has_all_gather_into_tensor = ds_comm.has_all_gather_into_tensor
out = {}
for name, spec in cases.items():
    for g in ("_TENSOR_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP"):
        if hasattr(groups, g):
            setattr(groups, g, None)
    # a backend without all_gather_into_tensor (DeepSpeed #8260's): runtime/utils.py all_gather_dp_groups
    ds_comm.has_all_gather_into_tensor = (lambda: False) if spec.get("legacy_allgather") else \
        real_has_all_gather_into_tensor
    torch.manual_seed(0)
    t0 = time.time()
    if "llama" in spec:
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(**spec["llama"]))
    else:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if spec.get("client_optimizer") == "torch_adamw" else None
    data = torch.utils.data.TensorDataset(torch.randn(8, 8)) if spec.get("training_data") else None
    try:
        if spec.get("client") == "hf_trainer":  # accelerate, as the HF Trainer prepares model and optimizer
            from accelerate import Accelerator
            from accelerate.state import AcceleratorState
            from accelerate.utils import DeepSpeedPlugin, DummyOptim
            AcceleratorState._reset_state(True)
            acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=spec["config"]))
            engine, zero_opt = acc.prepare(model, DummyOptim(model.parameters()))
            for _ in range(2):
                loss = engine(torch.randn(1, 8)).float().pow(2).mean()
                acc.backward(loss)
                zero_opt.step()
            out[name] = {"ok": True, "global_steps": int(engine.global_steps), "wrapper": type(zero_opt).__name__,
                         "seconds": time.time() - t0}
            continue
        engine, zero_opt, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                           optimizer=opt, config=spec["config"], training_data=data)
        micro = int(engine.train_micro_batch_size_per_gpu())
        batches = iter(loader) if loader is not None else None  # torch's DataLoader is built here (dataloader.py)
        for _ in range(spec.get("micro_steps", 2 * int(engine.gradient_accumulation_steps()))):
            if "llama" in spec:
                ids = torch.randint(0, spec["llama"]["vocab_size"], (micro, 8),
                                    generator=torch.Generator().manual_seed(0))
                loss = engine(input_ids=ids, labels=ids).loss
            else:
                x = next(batches)[0] if batches is not None else torch.randn(micro, 8)
                loss = engine(x).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
        attn = {n: list(p.shape) for n, p in model.named_parameters() if n.endswith("layers.0.self_attn.q_proj.weight")}
        out[name] = {"ok": True, "global_steps": int(engine.global_steps), "wrapper": type(zero_opt).__name__,
                     "optimizer": type(getattr(zero_opt, "optimizer", zero_opt)).__name__,
                     "partitioned": any(hasattr(p, "ds_id") for p in model.parameters()),
                     "q_proj": next(iter(attn.values()), None), "seconds": time.time() - t0}
    except Exception as exc:
        out[name] = {"ok": False, "error": type(exc).__name__, "message": str(exc)[:300],
                     "where": traceback.format_exc()[-3000:], "seconds": time.time() - t0}
print("RESULT " + json.dumps(out), flush=True)
'''
LAUNCH_TIMEOUT_SECONDS = 180


def _free_ports(n: int) -> list[int]:
    """n distinct free ports (all held open while choosing, so two launches never share one)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _launch(tmp: Path, groups: list[int]) -> dict[int, str | dict[str, Any]]:
    """Start one launch per rank count in ``groups`` at the same time; rank count -> rank 0's results, or the
    failing rank's log tail."""
    procs = []
    for ranks, port in zip(groups, _free_ports(len(groups))):
        cases = {k: v for k, v in ENGINE.items() if v.get("ranks", 1) == ranks}
        (tmp / f"cases{ranks}.json").write_text(json.dumps(cases))
        for rank in range(ranks):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                       LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
            log = (tmp / f"w{ranks}.rank{rank}.log").open("w")
            proc = subprocess.Popen([sys.executable, str(tmp / "worker.py"), str(tmp / f"cases{ranks}.json")],
                                    env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
            procs.append((ranks, rank, proc, log))
    deadline = time.monotonic() + LAUNCH_TIMEOUT_SECONDS
    try:
        for _, _, proc, _ in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for _, _, proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    out: dict[int, str | dict[str, Any]] = {}
    for ranks, rank, proc, _ in procs:
        text = (tmp / f"w{ranks}.rank{rank}.log").read_text()
        lines = [x for x in text.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            out[ranks] = f"{ranks}-rank launch, rank {rank}, exit {proc.returncode}:\n{text[-3000:]}"
        elif rank == 0 and not isinstance(out.get(ranks), str):
            out[ranks] = json.loads(lines[-1][len("RESULT "):])
    return out


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Every :data:`ENGINE` case, run once: the 1-rank cases in one process and the 2-rank cases in one 2-rank
    launch (RANK/WORLD_SIZE/MASTER_* set as torchrun would), both at the same time. A launch that dies (not a
    case that fails: each case's exception is caught and reported) is started once more, alone, and its first log
    is kept in the assertion. name -> result."""
    tmp = tmp_path_factory.mktemp("engine")
    (tmp / "worker.py").write_text(WORKER)
    got = _launch(tmp, [1, 2])
    first = {r: v for r, v in got.items() if isinstance(v, str)}
    for ranks, log in first.items():
        warnings.warn(f"engine launch died and was started again: {log[-1500:]}", stacklevel=1)
        got.update(_launch(tmp, [ranks]))
    broken = [v for v in got.values() if isinstance(v, str)]
    assert not broken, "\n\n".join(list(first.values()) + broken)
    results: dict[str, dict[str, Any]] = {}
    for value in got.values():
        results.update(value)
    return results


def run(request, name: str) -> dict[str, Any]:
    return request.getfixturevalue("engine_runs")[name]


def fails(request, name: str, error: str, text: str = "") -> dict[str, Any]:
    result = run(request, name)
    assert result["ok"] is False, (name, result)
    assert result["error"] == error and text in result["message"] + result["where"], (name, result)
    return result


def runs_ok(request, name: str) -> dict[str, Any]:
    result = run(request, name)
    assert result["ok"] is True, (name, result)
    return result


# ----------------------------------------------------------------------------------------------------------------
# Evidence: one or more cases per error rule
# ----------------------------------------------------------------------------------------------------------------
EVIDENCE: dict[str, list[Callable]] = {}
ACCEPTED: list[Callable] = []


def evidence(rule: str) -> Callable:
    def register(fn: Callable) -> Callable:
        EVIDENCE.setdefault(rule, []).append(fn)
        return fn
    return register


def accepted(fn: Callable) -> Callable:
    ACCEPTED.append(fn)
    return fn


# -- config text (zeroplanner/deepspeed/read.py) -----------------------------------------------------------------
@evidence("invalid_syntax")
def invalid_syntax_hf_trainer(request, tmp_path):
    """HF client: accelerate's HfDeepSpeedConfig reads the file with json.load (accelerate/utils/deepspeed.py) and
    fails on a comment/trailing comma; DeepSpeed alone reads it with hjson (runtime/config.py DeepSpeedConfig:
    hjson.load) and accepts it, where zeroplanner reports only info."""
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    text = '{"train_micro_batch_size_per_gpu": 1, // one\n "gradient_accumulation_steps": 1,}'
    assert "invalid_syntax" in errors(None, "hf_trainer", text=text)
    assert "invalid_syntax" not in errors(None, "deepspeed", text=text)
    path = tmp_path / "commented.json"
    path.write_text(text)
    with pytest.raises(json.JSONDecodeError):
        HfDeepSpeedConfig(str(path))
    ds_accepts(str(path), 1)


@evidence("duplicate_key")
def duplicate_key_deepspeed(request, tmp_path):
    """DeepSpeed alone: runtime/config.py loads a file with object_pairs_hook=dict_raise_error_on_duplicate_keys
    (runtime/config_utils.py), which raises 'Duplicate keys in DeepSpeed config'."""
    text = '{"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 2}'
    assert "duplicate_key" in errors(None, "deepspeed", text=text)
    path = tmp_path / "dup.json"
    path.write_text(text)
    ds_rejects(str(path), 1, "Duplicate keys")


@evidence("unknown_key")
def unknown_key_in_strict_blocks(request, tmp_path):
    """DeepSpeedConfigModel has extra='forbid' (runtime/config_utils.py): a misspelt key in zero_optimization
    (runtime/zero/config.py DeepSpeedZeroConfig) or fp16's keys in bf16 (runtime/precision_config.py
    DeepSpeedBF16Config) are rejected, under both clients (the HF fill leaves them in place)."""
    typo = mini(zero_optimization__overlap_com=True)
    for mode in ("deepspeed", "hf_trainer"):
        assert "unknown_key" in errors(typo, mode)
    ds_rejects(typo, 2, "overlap_com")
    bf16 = mini(bf16={"enabled": True, "loss_scale": 0})
    assert "unknown_key" in errors(bf16)
    ds_rejects(bf16, 2, "loss_scale")
    found = library_findings(bf16, BASE2, "hf_trainer")
    assert found and found[0].key == "bf16.loss_scale"


@evidence("wrong_type")
def wrong_type_values_deepspeed_rejects(request, tmp_path):
    """Each wrong_type condition, given to DeepSpeedConfig: a non-object config (runtime/config.py treats it as a
    path and fails), a non-object zero_optimization (DeepSpeedZeroConfig(**block): TypeError), stage 7
    (ZeroStageEnum), offload device 'gpu' (offload_config.py OffloadDeviceEnum), a non-string optimizer.type
    (runtime/config.py get_optimizer_name: .lower()), autotp_size 'two' (TPTrainingConfig int field)."""
    assert "wrong_type" in errors([1])
    ds_rejects([1], 2)
    cases = [mini(zero_optimization=5), mini(zero_optimization__stage=7),
             mini(zero_optimization={"stage": 2, "offload_optimizer": {"device": "gpu"}}),
             mini(optimizer={"type": 5}), mini(tensor_parallel={"autotp_size": "two"})]
    for config in cases:
        assert "wrong_type" in errors(config) and "wrong_type" in errors(config, "hf_trainer"), config
        ds_rejects(config, 2)
        hf_rejects(config)


@evidence("tensor_parallel_size")
def autotp_not_dividing_the_ranks(request, tmp_path):
    """deepspeed.initialize on 2 CPU ranks of one node with tensor_parallel.autotp_size 3: the engine builds the
    TP mesh (runtime/engine.py _configure_tensor_parallel_states -> utils/groups.py _init_tp_mesh_device ->
    dist.initialize_mesh_device((world // 3, 3))) and torch's DeviceMesh asserts; autotp_size 2 on the same ranks
    trains (control)."""
    bad = mini(tensor_parallel={"autotp_size": 3})
    assert "tensor_parallel_size" in errors(bad, base=BASE2)
    assert "tensor_parallel_size" in errors(bad, "hf_trainer", base=BASE2)
    fails(request, "autotp_3_of_2", "AssertionError", "_init_tp_mesh_device")
    assert "tensor_parallel_size" not in errors(mini(tensor_parallel={"autotp_size": 2}), base=BASE2)
    assert runs_ok(request, "autotp_2_of_2")["q_proj"] == [16, 32]  # 4 heads x 8 -> 2 per rank



@evidence("sequence_parallel_size")
def ulysses_degree_deepspeed_refuses(request, tmp_path, monkeypatch):
    """Each condition lint reports for the Ulysses degree, in DeepSpeed 0.19.8's own code: (1) a degree that is not
    a number >= 1 in DeepSpeedConfig (runtime/config.py, no mpu: world / sequence_parallel_size); (2) a fractional
    degree or one that does not divide the world in parallel_state_sp.py initialize_sequence_parallel (stand-in world
    of 8 ranks; 4 builds its groups); (3) a degree the heads do not take in ulysses_sp.py UlyssesSPAttentionHF
    (stand-in SP group of 3 ranks for llama-2-7b's 32 heads, 7 for qwen2.5-7b's 4 KV heads); (4) under the HF
    Trainer at ZeRO-3 the key in the JSON, where zero.Init's DeepSpeedConfig (no mpu) divides the world by it against
    the Trainer's train_batch_size (the same config without the key passes)."""
    import types

    import deepspeed.runtime.sequence_parallel.parallel_state_sp as sp_state
    from deepspeed.runtime.sequence_parallel import ulysses_sp

    def with_sp(value, base=None):
        return {**(base or mini()), "sequence_parallel_size": value}

    base8 = scenario(2, nodes=1, gpus_per_node=8, micro=1, accum=1)
    for raw, exc in (("4", TypeError), (None, TypeError), ([4], TypeError), (0, ZeroDivisionError),
                     (-2, AssertionError)):
        assert "sequence_parallel_size" in errors(with_sp(raw), base=base8), raw
        with _deepspeed_world(8), pytest.raises(exc):
            DeepSpeedConfig(with_sp(raw))
    monkeypatch.setattr(sp_state, "dist", types.SimpleNamespace(
        is_initialized=lambda: True, get_world_size=lambda *a, **k: 8, get_rank=lambda *a, **k: 0,
        new_group=lambda ranks, *a, **k: tuple(ranks)))
    for bad in (3, 2.5):
        assert "sequence_parallel_size" in errors(with_sp(bad), base=base8), bad
        with pytest.raises(RuntimeError, match="not divisible"):
            sp_state.initialize_sequence_parallel(bad)
    monkeypatch.setattr(sp_state, "_SEQUENCE_PARALLEL_GROUP", None)
    monkeypatch.setattr(sp_state, "_SEQUENCE_DATA_PARALLEL_GROUP", None)
    sp_state.initialize_sequence_parallel(4)
    assert sp_state._SEQUENCE_PARALLEL_GROUP == (0, 1, 2, 3)
    assert "sequence_parallel_size" not in errors(with_sp(4), base=base8)

    monkeypatch.setattr(ulysses_sp, "register_all_to_all_group", lambda group: None)
    for model, sp, match in (("llama-2-7b", 3, "Attention head count 32"), ("qwen2.5-7b", 7, "KV attention head")):
        s = scenario(2, nodes=1, gpus_per_node=sp * 2, micro=1, accum=1, model=model)
        assert "sequence_parallel_size" in errors(with_sp(sp), base=s), model
        monkeypatch.setattr(ulysses_sp, "dist", types.SimpleNamespace(get_world_size=lambda *a, sp=sp, **k: sp,
                                                                      get_rank=lambda *a, **k: 0))
        m = s.model
        with pytest.raises(ValueError, match=match):
            ulysses_sp.UlyssesSPAttentionHF(attn=None, batch_size=1, attn_head_count=m.n_heads,
                                            attn_head_size=m.hidden_size // m.n_heads, kv_head_count=m.kv_heads,
                                            num_hidden_layers=m.n_layers, process_group=None,
                                            seq_length_is_variable=True)

    s3 = scenario(3, nodes=1, gpus_per_node=8, micro=1, accum=2)
    s3 = s3.model_copy(update={"cluster": s3.cluster.model_copy(update={"sequence_parallel_size": 4})})
    hf = to_deepspeed_config(s3, mode="hf_trainer")
    assert "sequence_parallel_size" not in hf and library_findings(hf, s3, "hf_trainer") == []
    keyed = with_sp(4, hf)
    assert "sequence_parallel_size" in errors(keyed, "hf_trainer", base=s3)
    found = library_findings(copy.deepcopy(keyed), s3, "hf_trainer")
    assert [f.key for f in found] == ["sequence_parallel_size"] and "AssertionError" in found[0].message

# -- config-only lint rules ----------------------------------------------------------------------------------------
@evidence("integer_type")
def integer_type_values_deepspeed_rejects(request, tmp_path):
    """pydantic int fields of runtime/zero/config.py reject '5e8' ('unable to parse string as an integer') and
    15099494.4 ('fractional part'; LlamaFactory #5252) and a list; train_batch_size 2.5 fails
    DeepSpeedConfig._batch_assertion; train_micro_batch_size_per_gpu 2.5 passes the config classes and the engine's
    DataLoader raises (runtime/engine.py deepspeed_io -> torch BatchSampler: batch_size must be an int)."""
    for value, match in (("5e8", "parse string as an integer"), (15099494.4, "fractional part"), ([1], "integer"),
                         (float("inf"), "finite")):
        config = mini(zero_optimization={"stage": 2, "reduce_bucket_size": value})
        assert "integer_type" in errors(config) and "integer_type" in errors(config, "hf_trainer"), value
        ds_rejects(config, 2, match)
        hf_rejects(config)
    batch = mini(train_batch_size=2.5, gradient_accumulation_steps=None)
    assert "integer_type" in errors(batch, base=BASE2)
    ds_rejects(batch, 2, "train_batch_size is not equal")
    micro = ENGINE["micro_fractional"]["config"]
    assert "integer_type" in errors(micro)
    ds_accepts(micro, 1)
    fails(request, "micro_fractional", "ValueError", "batch_size")


@evidence("nonpositive_value")
def nonpositive_values_deepspeed_rejects(request, tmp_path):
    """For every count key zeroplanner calls non-positive with an error: DeepSpeedConfig rejects -1 (pydantic
    ge=0/gt=0 fields of runtime/zero/config.py, offload_config.py, precision_config.py; the batch assertion), and 0
    where 0 is an error too (reduce_bucket_size gt=0, the batch keys, fp16.loss_scale_window/min_loss_scale);
    false is 0. scheduler.params.warmup_num_steps passes the config classes and WarmupLR raises in
    deepspeed.initialize (runtime/lr_schedules.py: 'must be a positive integer')."""
    engine_keys = {"scheduler.params.warmup_num_steps"}
    base = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {
                "device": "cpu"}}, "fp16": {"enabled": True}, "scheduler": {"type": "WarmupLR", "params": {}}}
    checked = 0
    for key in sorted(INTEGER_KEYS | _POSITIVE_KEYS):
        for value in (-1, 0, False):
            config = copy.deepcopy(base)
            if key == "train_batch_size":
                config.pop("gradient_accumulation_steps")
            node = config
            *parents, last = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value
            if "nonpositive_value" not in errors(config, base=BASE2):
                continue
            checked += 1
            if key in engine_keys:
                ds_accepts(config, 2)
            else:
                ds_rejects(config, 2)
                if key.startswith("zero_optimization."):  # the fill passes these through unchanged
                    assert "nonpositive_value" in errors(config, "hf_trainer", base=BASE2), key
                    hf_rejects(config)
    assert checked >= 35  # 39 (key, value) pairs with DeepSpeed 0.19.8's key tables
    assert "nonpositive_value" in errors(ENGINE["warmup_negative"]["config"])
    fails(request, "warmup_negative", "ValueError", "warmup_num_steps must be a positive integer")


@evidence("batch_mismatch")
def batch_mismatch_both_clients(request, tmp_path):
    """DeepSpeed alone: DeepSpeedConfig._batch_assertion / _set_batch_related_parameters (runtime/config.py) with
    the data-parallel world, and with no batch key at all ('Either train_batch_size or
    train_micro_batch_size_per_gpu needs to be provided'). HF client: transformers' trainer_config_finalize raises
    on the same concrete mismatch (library_findings gives hf_fill_mismatch)."""
    bad = to_deepspeed_config(BASE8)
    bad["train_batch_size"] += 1
    assert "batch_mismatch" in errors(bad, base=BASE8)
    ds_rejects(bad, BASE8.cluster.data_parallel_degree, "train_batch_size is not equal")
    ds_accepts(to_deepspeed_config(BASE8), BASE8.cluster.data_parallel_degree)
    none = {"zero_optimization": {"stage": 1}}
    assert "batch_mismatch" in errors(none, base=BASE8)
    ds_rejects(none, 8, "Either train_batch_size or train_micro_batch_size_per_gpu")
    # train_batch_size with one or none of the per-GPU factors, on 2 ranks: DeepSpeed derives the missing one by
    # floor division (_set_batch_related_parameters) and the assertion then fails
    for partial in ({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2}, {"train_batch_size": 7}):
        assert "batch_mismatch" in errors(partial, base=BASE2), partial
        ds_rejects(partial, 2, "train_batch_size is not equal")
    # without a scenario (lint alone): 7 is no multiple of micro 2 x accumulation 1 at any world size
    odd = {"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
    assert "batch_mismatch" in {f.rule for f in lint(odd) if f.severity == "error"}
    for world in range(1, 9):
        ds_rejects(odd, world, "train_batch_size is not equal")
    hf = to_deepspeed_config(BASE8, "hf_trainer")
    hf["train_batch_size"] = 7
    assert "batch_mismatch" in errors(hf, "hf_trainer", base=BASE8)
    assert [f.rule for f in library_findings(hf, BASE8, "hf_trainer")] == ["hf_fill_mismatch"]


@evidence("fp16_and_bf16")
def fp16_and_bf16_deepspeed_asserts(request, tmp_path):
    """runtime/config.py DeepSpeedConfig._do_error_check: 'bfloat16 and fp16 modes cannot be simultaneously
    enabled'; under the HF client transformers' trainer_config_finalize already raises (one of the two never
    matches TrainingArguments, which itself refuses bf16 and fp16 together)."""
    bad = mini(fp16={"enabled": True}, bf16={"enabled": True})
    for mode in ("deepspeed", "hf_trainer"):
        assert "fp16_and_bf16" in errors(bad, mode)
    ds_rejects(bad, 2, "cannot be simultaneously enabled")
    found = library_findings(bad, BASE2, "hf_trainer")  # the Trainer's fill raises first: fp16 != the bf16 args
    assert [(f.rule, f.key) for f in found] == [("hf_fill_mismatch", "fp16.enabled")]


@evidence("removed_key")
def removed_keys_deepspeed_rejects(request, tmp_path):
    """runtime/config.py _reject_removed_config_keys: every key of _REMOVED_TOP_LEVEL_CONFIG_KEYS and
    _REMOVED_ZERO_CONFIG_KEYS raises DeepSpeedConfigError (zeroplanner's REMOVED_* tables, one by one)."""
    from deepspeed.runtime import config as ds_config

    assert set(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS) == REMOVED_TOP_LEVEL_KEYS
    assert set(ds_config._REMOVED_ZERO_CONFIG_KEYS) == REMOVED_ZERO_KEYS
    for key in sorted(REMOVED_TOP_LEVEL_KEYS):
        config = mini(**{key: {"enabled": True}})
        assert "removed_key" in errors(config) and "removed_key" in errors(config, "hf_trainer"), key
        ds_rejects(config, 2, "removed")
        hf_rejects(config)
    for key in sorted(REMOVED_ZERO_KEYS):
        config = mini(zero_optimization={"stage": 3, key: 2})
        assert "removed_key" in errors(config), key
        ds_rejects(config, 2, "removed")


@evidence("auto_outside_hf")
def auto_outside_hf_deepspeed_alone(request, tmp_path):
    """DeepSpeed alone, "auto" unfilled: in a batch key DeepSpeedConfig's batch arithmetic raises TypeError
    (runtime/config.py _set_batch_related_parameters); in gradient_clipping the first step compares the string
    with 0.0 (runtime/engine.py _take_model_step); in the scheduler WarmupLR's constructor raises
    (runtime/lr_schedules.py); as the optimizer's lr torch's AdamW raises. Under the HF client the Trainer fills
    them (info, no error)."""
    batch = mini(train_micro_batch_size_per_gpu="auto")
    assert "auto_outside_hf" in errors(batch)
    assert "auto_outside_hf" not in errors(batch, "hf_trainer")
    ds_rejects(batch, 2)
    for name, error, text in (("clipping_auto", "TypeError", "_take_model_step"),
                              ("scheduler_auto", "ValueError", "warmup_num_steps"),
                              ("lr_auto", "", "")):
        config = ENGINE[name]["config"]
        assert "auto_outside_hf" in errors(config), name
        assert "auto_outside_hf" not in errors(config, "hf_trainer"), name
        if error:
            fails(request, name, error, text)
        else:
            assert run(request, name)["ok"] is False


@evidence("max_grad_norm_param")
def max_grad_norm_engine_raises(request, tmp_path):
    """runtime/engine.py _configure_basic_optimizer raises ValueError on 'max_grad_norm' in optimizer.params
    (config classes accept it); the same config without it trains (baseline). Under the HF client accelerate's
    Accelerator.prepare hands the config optimizer (DummyOptim) to the same engine code: same ValueError."""
    config = ENGINE["max_grad_norm"]["config"]
    assert "max_grad_norm_param" in errors(config) and "max_grad_norm_param" in errors(config, "hf_trainer")
    ds_accepts(config, 1)
    fails(request, "max_grad_norm", "ValueError", "max_grad_norm")
    assert runs_ok(request, "baseline")["global_steps"] == 2
    fails(request, "hf_max_grad_norm", "ValueError", "max_grad_norm")  # the HF client: accelerate, same engine
    runs_ok(request, "hf_baseline")


@evidence("untested_optimizer")
def untested_optimizer_engine_asserts(request, tmp_path):
    """runtime/engine.py _do_optimizer_sanity_check asserts on a torch.optim optimizer with ZeRO unless
    zero_allow_untested_optimizer is true; with the flag the same SGD config trains. Under the HF client
    (accelerate, DummyOptim) the same assertion."""
    config = ENGINE["untested_sgd"]["config"]
    assert "untested_optimizer" in errors(config)
    fails(request, "untested_sgd", "AssertionError", "untested ZeRO Optimizer")
    assert "untested_optimizer" in errors(config, "hf_trainer")
    fails(request, "hf_untested_sgd", "AssertionError", "untested ZeRO Optimizer")  # via accelerate
    assert "untested_optimizer" not in errors(ENGINE["untested_sgd_allowed"]["config"])
    assert runs_ok(request, "untested_sgd_allowed")["optimizer"] == "SGD"


@evidence("offload_client_optimizer")
def offload_client_optimizer_engine_raises(request, tmp_path):
    """DeepSpeed alone: ZeRO-Offload with the script's torch AdamW and no optimizer block raises
    ZeRORuntimeException (runtime/engine.py _configure_optimizer, zero_force_ds_cpu_optimizer); with the flag false
    it trains. Under the HF client accelerate swaps in DeepSpeedCPUAdam (info; shown in test_shipped_configs)."""
    config = ENGINE["offload_client_adamw"]["config"]
    assert "offload_client_optimizer" in errors(config)
    assert "offload_client_optimizer" not in errors(config, "hf_trainer")
    fails(request, "offload_client_adamw", "ZeRORuntimeException")
    assert "offload_client_optimizer" not in errors(ENGINE["offload_client_adamw_unforced"]["config"])
    runs_ok(request, "offload_client_adamw_unforced")


def _trainer_refuses(config: dict[str, Any], match: str) -> None:
    """The HF Trainer's whole path (TrainingArguments(deepspeed=config), Trainer.train() for one step on a CPU rank:
    zeroplanner/calibrate/config_judge.py) stops on the config with ``match`` in its message."""
    from zeroplanner.calibrate.config_judge import judge_config

    verdict = judge_config(copy.deepcopy(config), "hf_trainer")
    assert verdict["verdict"] == "refused" and match in verdict["error"], verdict


_HF_AUTO = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto", "bf16": {"enabled": "auto"}}


@evidence("auto_not_filled")
def auto_not_filled_accelerate_raises(request, tmp_path):
    """A key neither the Trainer nor accelerate fills, left "auto" (FastChat's sub_group_size; a legacy
    ``bfloat16`` block): accelerate raises ValueError "not found in kwargs" before DeepSpeed starts."""
    config = {**_HF_AUTO, "zero_optimization": {"stage": 2, "allgather_bucket_size": "auto"}}
    assert "auto_not_filled" in errors(config, "hf_trainer")
    hf_rejects(config)
    _trainer_refuses(config, "`zero_optimization.allgather_bucket_size` not found in kwargs")


@evidence("no_zero_block_hf")
def no_zero_block_accelerate_raises(request, tmp_path):
    """No zero_optimization block (bigscience's ds_zero0.json): accelerate's DeepSpeedPlugin refuses the config;
    DeepSpeed alone runs it without ZeRO."""
    config = dict(_HF_AUTO)
    assert "no_zero_block_hf" in errors(config, "hf_trainer")
    assert "no_zero_block_hf" not in errors({"train_micro_batch_size_per_gpu": 1})
    _trainer_refuses(config, "Please specify the ZeRO optimization config")


@evidence("nvme_without_path")
def nvme_without_path_engine_fails(request, tmp_path):
    """ZeRO-3 NVMe offload with no nvme_path: for offload_param deepspeed.initialize asserts
    (runtime/zero/partition_parameters.py _validate_remote_device: '"nvme_path" ... cannot be None'); for
    offload_optimizer it fails building the swap folder (runtime/zero/stage3.py _configure_tensor_swapping:
    os.path.join(None, ...) -> TypeError); accelerate (the HF client) reaches the same assertion. A non-path
    nvme_path is rejected by the config class
    (runtime/zero/offload_config.py: nvme_path: Optional[Path])."""
    for name, error, text in (("nvme_param_no_path", "AssertionError", "nvme_path"),
                              ("nvme_optimizer_no_path", "TypeError", "_configure_tensor_swapping")):
        assert "nvme_without_path" in errors(ENGINE[name]["config"]), name
        assert "nvme_without_path" in errors(ENGINE[name]["config"], "hf_trainer"), name
        ds_accepts(ENGINE[name]["config"], 1)
        fails(request, name, error, text)
    fails(request, "hf_nvme_param_no_path", "AssertionError", "nvme_path")  # the HF client, via accelerate
    bad_type = mini(zero_optimization={"stage": 3, "offload_param": {"device": "nvme", "nvme_path": 5}})
    assert "nvme_without_path" in errors(bad_type)
    ds_rejects(bad_type, 1, "nvme_path")


@evidence("hf_model_config")
def hf_model_config_given_as_the_deepspeed_config(request, tmp_path):
    """A Hugging Face model config.json (model_type, architectures, shape keys) given where the DeepSpeed config
    goes: DeepSpeed alone asserts a batch size (runtime/config.py _set_batch_related_parameters: 'Either
    train_batch_size or train_micro_batch_size_per_gpu needs to be provided'); the HF client fails too
    (library_findings: transformers' fill, then DeepSpeedConfig). zeroplanner says only that, once."""
    model = dict(TINY_LLAMA, model_type="llama", architectures=["LlamaForCausalLM"], transformers_version="5.24.0")
    for mode in ("deepspeed", "hf_trainer"):
        assert [f.rule for f in lint(model, BASE2, mode)] == ["hf_model_config"]
        assert "hf_model_config" in errors(model, mode)
    ds_rejects(model, 2, "Either train_batch_size or train_micro_batch_size_per_gpu")
    hf_rejects(model)


@evidence("hpz_not_dividing")
def hpz_not_dividing_the_world(request, tmp_path, monkeypatch):
    """utils/groups.py _create_zero_param_parallel_group (called by deepspeed.initialize for ZeRO-3 with
    zero_hpz_partition_size > 1) asserts _ensure_divisibility(world, min(hpz, world)) before building any group:
    shown with a stand-in world of 16 ranks (2 nodes x 8) for hpZ 3, which raises, and 8, which passes the check.
    Two CPU ranks cannot show it: min(hpz, 2) always divides 2."""
    import types

    from deepspeed.utils import groups

    s = scenario(3, nodes=2, gpus_per_node=8)
    bad = to_deepspeed_config(s)
    bad["zero_optimization"]["zero_hpz_partition_size"] = 3
    assert "hpz_not_dividing" in errors(bad, base=s)
    monkeypatch.setattr(groups, "dist", types.SimpleNamespace(
        is_initialized=lambda: True, get_world_size=lambda *a, **k: 16, get_rank=lambda *a, **k: 0,
        new_group=lambda ranks, *a, **k: tuple(ranks)))
    monkeypatch.setattr(groups, "_ZERO_PARAM_INTRA_PARALLEL_GROUP", None)
    with pytest.raises(AssertionError, match="is not divisible by"):
        groups._create_zero_param_parallel_group(3)
    monkeypatch.setattr(groups, "_ZERO_PARAM_INTRA_PARALLEL_GROUP", None)
    groups._create_zero_param_parallel_group(8)


# ----------------------------------------------------------------------------------------------------------------
# Accepted by the library: warnings, not errors
# ----------------------------------------------------------------------------------------------------------------
@accepted
def bool_counts_are_read_as_integers(request, tmp_path):
    """pydantic's lax int fields read true as 1 (DeepSpeedZeroConfig.reduce_bucket_size) and DeepSpeedConfig's
    batch arithmetic takes true as 1: both configs train (integer_type warning, not error)."""
    for name in ("bucket_true", "micro_true"):
        assert severities(ENGINE[name]["config"], "integer_type") == {"warning"}, name
        assert "error" not in {f.severity for f in findings(ENGINE[name]["config"])}, name
        runs_ok(request, name)
    assert ds_accepts(ENGINE["bucket_true"]["config"], 1).zero_config.reduce_bucket_size == 1


@accepted
def fractional_accumulation_runs_with_an_odd_boundary(request, tmp_path):
    """gradient_accumulation_steps 2.5 passes DeepSpeedConfig and trains; the optimizer steps when
    (micro_steps + 1) % 2.5 == 0 (runtime/engine.py is_gradient_accumulation_boundary): once in 5 micro-steps."""
    config = ENGINE["accumulation_fractional"]["config"]
    assert severities(config, "integer_type") == {"warning"}
    assert runs_ok(request, "accumulation_fractional")["global_steps"] == 1


@accepted
def allgather_bucket_zero_runs_on_gloo(request, tmp_path):
    """allgather_bucket_size 0 passes DeepSpeedConfig (ge=0) and ZeRO-2 trains on 2 gloo ranks: with
    all_gather_into_tensor (runtime/utils.py all_gather_dp_groups -> all_gather_into_tensor_dp_groups) the bucket
    is never read. On a backend without it (stood in by has_all_gather_into_tensor -> False) the first step divides
    by it: ZeroDivisionError, DeepSpeed #8260 -- what the warning says."""
    config = ENGINE["allgather_zero"]["config"]
    assert severities(config, "nonpositive_value") == {"warning"}
    ds_accepts(config, 2)
    assert runs_ok(request, "allgather_zero")["global_steps"] == 2
    fails(request, "allgather_zero_legacy_backend", "ZeroDivisionError", "all_gather_dp_groups")


@accepted
def negative_values_deepspeed_accepts_are_warnings(request, tmp_path):
    """Keys whose negative values DeepSpeedConfig accepts (no ge=0 bound, or read with dict.get): a warning."""
    for key in sorted(_NONPOSITIVE_ACCEPTED):
        if key == "zero_optimization.allgather_bucket_size":
            continue
        config = mini(fp16={"enabled": True}, scheduler={"type": "WarmupDecayLR", "params": {}})
        node = config
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = -1
        assert severities(config, "nonpositive_value") == {"warning"}, key
        ds_accepts(config, 2)


@accepted
def hpz_zero_is_off_like_one(request, tmp_path):
    """zero_hpz_partition_size 0 passes DeepSpeedZeroConfig (ge=0) and, like 1, turns hpZ off (stage3.py builds
    the secondary partition only for > 1): no finding (it used to be a nonpositive_value error)."""
    config = mini(zero_optimization={"stage": 3, "zero_hpz_partition_size": 0})
    assert not [f for f in findings(config) if f.severity == "error"]
    assert ds_accepts(config, 2).zero_config.zero_hpz_partition_size == 0


@accepted
def auto_in_pydantic_blocks_is_dropped(request, tmp_path):
    """DeepSpeedConfigModel drops "auto" values (runtime/config_utils.py), so "auto" in zero_optimization or
    bf16 runs with DeepSpeed's defaults (reduce_bucket_size 500000000, bf16 off): a warning."""
    config = ENGINE["auto_in_pydantic_blocks"]["config"]
    assert {f.severity for f in findings(config) if f.rule == "auto_outside_hf"} == {"warning"}
    got = ds_accepts(config, 1)
    assert got.zero_config.reduce_bucket_size == 500_000_000 and got.bfloat16_config.enabled is False
    runs_ok(request, "auto_in_pydantic_blocks")


@accepted
def offload_blocks_the_stage_ignores_run(request, tmp_path):
    """offload_optimizer at stage 0 (the engine's optimizer is the bare torch AdamW) and offload_param at stage 2
    (no parameter reaches ZeRO-3's partitioner: only stage3.py reads offload_param) are accepted and train."""
    assert severities(ENGINE["offload_optimizer_stage0"]["config"], "offload_optimizer_stage0") == {"warning"}
    assert runs_ok(request, "offload_optimizer_stage0")["wrapper"] == "AdamW"
    assert severities(ENGINE["offload_param_stage2"]["config"], "offload_param_below_stage3") == {"warning"}
    assert runs_ok(request, "offload_param_stage2")["partitioned"] is False


@accepted
def nvme_optimizer_below_stage3_needs_no_path(request, tmp_path):
    """Stage 1/2 treat any offload_optimizer device as CPU (runtime/zero/stage_1_and_2.py cpu_offload): NVMe
    without nvme_path trains, so nvme_without_path stays silent there (nvme_optimizer_below_stage3 warns)."""
    config = ENGINE["nvme_optimizer_stage2_no_path"]["config"]
    assert "nvme_without_path" not in {f.rule for f in findings(config)}
    assert severities(config, "nvme_optimizer_below_stage3") == {"warning"}
    runs_ok(request, "nvme_optimizer_stage2_no_path")


@accepted
def pinned_offload_above_host_ram_is_a_memory_warning(request, tmp_path):
    """pinned_exceeds_host is about the machine, not the config: DeepSpeedConfig accepts the pinned ZeRO-3
    offload config (it knows nothing of host RAM) and a tiny pinned-offload run trains; on a real node the pinned
    buffers exceed RAM and the OOM killer ends it at run time (DeepSpeed #3448, #3481): a warning."""
    from zeroplanner.costmodel import estimate

    s = scenario(3, opt="cpu", par="cpu", nodes=1)
    small = s.model_copy(update={"cluster": s.cluster.model_copy(
        update={"cpu_memory_bytes": int(estimate(s).per_node_cpu_bytes // 2)})})
    found = [f for f in lint(to_deepspeed_config(small), small) if f.rule == "pinned_exceeds_host"]
    assert [f.severity for f in found] == ["warning"] and "not a config error" in found[0].message
    ds_accepts(to_deepspeed_config(small), small.cluster.data_parallel_degree)
    assert runs_ok(request, "pinned_offload_stage3")["partitioned"] is True


@accepted
def autotp_not_dividing_the_heads_runs(request, tmp_path):
    """DeepSpeed's AutoTP shards 3 attention heads over 2 ranks unevenly (module_inject/tp_shard.py
    get_shard_size: 2 heads on rank 0) and trains: read.py warns (autotp_uneven_heads) and the cost model prices
    the largest rank's share of each attention layer, the q_proj rows rank 0 holds in the run (32 of 48)."""
    from zeroplanner.costmodel.context import attention_tp_share

    rows, width = runs_ok(request, "autotp_2_of_3_heads")["q_proj"]
    assert (rows, width) == (32, 48)
    assert attention_tp_share(3, 2) == pytest.approx(rows / width)
    assert attention_tp_share(4, 2) == pytest.approx(16 / 32)  # autotp_2_of_2: 4 heads x 8 -> 16 of 32 rows
    s = BASE2.model_copy(update={"model": BASE2.model.model_copy(
        update={"n_heads": 3, "n_kv_heads": 3, "hidden_size": 3072})})
    config = mini(tensor_parallel={"autotp_size": 2})
    assert "tensor_parallel_size" not in errors(config, base=s)
    assert severities(config, "autotp_uneven_heads", base=s) == {"warning"}


READER_FALSE_ERRORS = [
    ("stage_true", {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": True}}, "wrong_type"),
    ("int_top_level_key", {"train_micro_batch_size_per_gpu": 1, 1: 2}, "wrong_type"),
]
"""Reader (zeroplanner/deepspeed/read.py) errors DeepSpeedConfig accepts: stage true is ZeroStageEnum 1 (pydantic's
lax enum), a non-string top-level key is ignored (DeepSpeedConfig reads the top level with dict.get; JSON cannot
produce one). read.py reports both as warnings now, as it does autotp_size not dividing the heads
(autotp_not_dividing_the_heads_runs)."""


@pytest.mark.parametrize("config,rule", [c[1:] for c in READER_FALSE_ERRORS], ids=[c[0] for c in READER_FALSE_ERRORS])
def test_reader_errors_deepspeed_accepts(config, rule):
    ds_accepts(config, 2)
    assert rule not in errors(config)


# ----------------------------------------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------------------------------------
def test_every_error_rule_has_evidence():
    """Every rule the code can report as "error" has at least one evidence case, and no case is stale."""
    in_code = error_rules_in_code()
    assert "<unnamed>" not in in_code, f"error findings without a literal rule name: {in_code['<unnamed>']}"
    missing = sorted(set(in_code) - set(EVIDENCE))
    assert not missing, f"error rules without a test showing the failure in the real library: {missing}"
    stale = sorted(set(EVIDENCE) - set(in_code))
    assert not stale, f"evidence for rules the code no longer reports as errors: {stale}"


def test_the_walk_finds_the_known_error_rules():
    """The AST walk sees lint's, pitfalls' and the reader's emitters (guards against a walk that finds nothing)."""
    in_code = error_rules_in_code()
    assert {"integer_type", "batch_mismatch", "fp16_and_bf16", "nvme_without_path", "hpz_not_dividing",
            "duplicate_key", "unknown_key", "wrong_type", "tensor_parallel_size"} <= set(in_code)
    assert "pinned_exceeds_host" not in in_code  # a memory warning now
    assert "offload_param_below_stage3" not in in_code and "offload_optimizer_stage0" not in in_code


def _param(case: Callable, *values: Any, id: str):
    """Cases that use :func:`engine_runs` carry the ``engine`` mark (``-m "not engine"`` leaves them out)."""
    uses_engine = any(f"{name}(request" in inspect.getsource(case) for name in ("run", "fails", "runs_ok"))
    uses_engine = uses_engine or "_trainer_refuses(" in inspect.getsource(case)
    return pytest.param(*values, id=id, marks=[pytest.mark.engine] if uses_engine else [])


CASES = [_param(fn, rule, fn, id=f"{rule}-{fn.__name__}") for rule, fns in EVIDENCE.items() for fn in fns]


@pytest.mark.timeout(LAUNCH_TIMEOUT_SECONDS + 60)
@pytest.mark.parametrize("rule,case", CASES)
def test_error_rule_fails_in_the_real_library(rule, case, request, tmp_path, monkeypatch):
    if "monkeypatch" in case.__code__.co_varnames[:case.__code__.co_argcount]:
        case(request, tmp_path, monkeypatch)
    else:
        case(request, tmp_path)


@pytest.mark.timeout(LAUNCH_TIMEOUT_SECONDS + 60)
@pytest.mark.parametrize("case", [_param(fn, fn, id=fn.__name__) for fn in ACCEPTED])
def test_what_the_library_accepts_is_not_an_error(case, request, tmp_path):
    case(request, tmp_path)
