"""The pitfall rules about a run (scenario), shared by ``zeroplanner estimate`` and ``zeroplanner check``.

:func:`scenario_pitfalls` is the one statement of each rule that depends on the scenario (cluster, ZeRO settings,
model) and, for two of them, on the cost model's numbers. :func:`zeroplanner.costmodel.estimate` turns them into its
``warnings`` (the message text) and :func:`zeroplanner.deepspeed.lint.lint` into findings (with severity, key and fix), so
the two commands can no longer disagree about, e.g., ZeRO-3 at 64 GPUs on 150 Gb/s.

Each rule states what the client that runs the config really does: ``client="deepspeed"`` (``deepspeed.initialize``
in the user's script) or ``"hf_trainer"`` (transformers' Trainer / accelerate, which fill ``"auto"`` and build the
optimizer). The config-text rules (which need the JSON itself) live in :mod:`zeroplanner.deepspeed.lint`; :data:`RULES` lists
every rule of both modules with what checks it in the real stack, which the tests use to compare zeroplanner's
verdicts with DeepSpeed's own config classes.

Core module: imports only :mod:`zeroplanner.specs` and :mod:`zeroplanner.units` (no numpy, torch, deepspeed, ui;
the cost model's :class:`~zeroplanner.costmodel.Evaluation` for type checking only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from .specs import Scenario, hardware_precision
from .units import GIB

if TYPE_CHECKING:  # the values' type only: pitfalls imports no numpy (costmodel.evaluate imports this module)
    from .costmodel.evaluation import Evaluation

Client = Literal["deepspeed", "hf_trainer"]
Severity = Literal["error", "warning", "info"]

COMMUNICATION_SHARE_LIMIT = 0.30
"""A common rule of thumb, not a measured threshold: when exposed communication (all-gathers, reductions) takes more
than ~30% of the step, the network is the bottleneck."""

SLOW_INTER_NODE_GBPS = 25.0
"""ZeRO-3 across nodes at or below this per-node rate is flagged (DeepSpeed #5770: slower with more nodes)."""
LARGE_RUN_GPUS = 64
LARGE_RUN_MIN_GBPS = 200.0
"""DeepSpeed maintainers (DeepSpeed #2928): ZeRO-3 at 64+ GPUs needs 200-400 Gb/s between nodes; below 200 Gb/s per
node is flagged (so 100 and 150 Gb/s both are)."""


class Pitfall(BaseModel):
    """One rule that fired: ``rule`` id, ``severity``, the DeepSpeed ``key`` concerned (dotted, ``""`` for the whole
    run), ``message`` (why; also the ``estimate`` warning text) and ``fix``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: str
    severity: Severity
    key: str
    message: str
    fix: str = ""


class Rule(BaseModel):
    """What a rule is about and what, in the real stack, shows it: ``"config"`` = DeepSpeed's config classes
    (``DeepSpeedConfig``) reject the config, ``"trainer"`` = the HF Trainer's/accelerate's fill or loader rejects it,
    ``"engine"`` = ``deepspeed.initialize`` raises, ``"runtime"`` = it starts and then fails, swaps or runs slowly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checked_by: Literal["config", "trainer", "engine", "runtime"]
    source: str


RULES: dict[str, Rule] = {
    # config text (zeroplanner.deepspeed.lint, zeroplanner.deepspeed reader)
    "invalid_syntax": Rule(checked_by="config", source="deepspeed/runtime/config.py DeepSpeedConfig: hjson.load"),
    "duplicate_key": Rule(checked_by="config", source="deepspeed/runtime/config_utils.py "
                          "dict_raise_error_on_duplicate_keys (DeepSpeed); accelerate HfDeepSpeedConfig json.load "
                          "(HF: last value wins)"),
    "unknown_key": Rule(checked_by="config", source="DeepSpeedConfigModel extra='forbid' (strict blocks); "
                        "DeepSpeedConfig reads the top level with dict.get (ignored)"),
    "wrong_type": Rule(checked_by="config", source="pydantic fields of deepspeed/runtime/zero/config.py"),
    "integer_type": Rule(checked_by="config", source="pydantic int fields (LlamaFactory #5252)"),
    "nonpositive_value": Rule(checked_by="config", source="pydantic ge=0/gt=0 fields, the batch assertion; "
                              "WarmupLR (engine); allgather_bucket_size 0 accepted (DeepSpeed #8260: warning)"),
    "batch_mismatch": Rule(checked_by="config", source="DeepSpeedConfig._batch_assertion (DeepSpeed #6914)"),
    "fp16_and_bf16": Rule(checked_by="config", source="DeepSpeedConfig._do_error_check"),
    "hf_model_config": Rule(checked_by="config", source="a Hugging Face model config.json has no batch key: "
                            "DeepSpeedConfig._set_batch_related_parameters asserts ('Either train_batch_size or "
                            "train_micro_batch_size_per_gpu needs to be provided')"),
    "removed_key": Rule(checked_by="config", source="_REMOVED_TOP_LEVEL_CONFIG_KEYS, _REMOVED_ZERO_CONFIG_KEYS"),
    "auto_outside_hf": Rule(checked_by="config", source="\"auto\" reaches DeepSpeed unfilled (docs/references.md s.7): "
                            "batch keys raise in DeepSpeedConfig, optimizer/scheduler/clipping in the engine, "
                            "pydantic blocks drop it (warning)"),
    "auto_not_filled": Rule(checked_by="trainer", source="transformers integrations/deepspeed.py and accelerate's "
                            "DeepSpeedPlugin fill only their keys; accelerate fill_match raises on the rest"),
    "no_zero_block_hf": Rule(checked_by="trainer", source="accelerate utils/dataclasses.py DeepSpeedPlugin.__post_init__ "
                             "(\"Please specify the ZeRO optimization config\")"),
    "hf_fill_mismatch": Rule(checked_by="trainer", source="HfTrainerDeepSpeedConfig.trainer_config_finalize "
                             "(mismatches with TrainingArguments raise ValueError)"),
    "tensor_parallel_size": Rule(checked_by="engine", source="engine.py _configure_tensor_parallel; "
                                 "ClusterSpec/Scenario: TP divides GPUs per node and heads"),
    "sequence_parallel_size": Rule(checked_by="engine", source="DeepSpeedConfig (world / sequence_parallel_size); "
                                   "parallel_state_sp.py initialize_sequence_parallel; ulysses_sp.py "
                                   "UlyssesSPAttentionHF.__init__ (heads); HF: zero.Init's DeepSpeedConfig"),
    "offload_param_below_stage3": Rule(checked_by="runtime", source="only stage3.py reads offload_param"),
    "offload_optimizer_stage0": Rule(checked_by="runtime", source="no ZeRO optimizer at stage 0"),
    "nvme_optimizer_below_stage3": Rule(checked_by="runtime", source="stage_1_and_2.py cpu_offload"),
    "nvme_without_path": Rule(checked_by="engine", source="partition_parameters.py _validate_remote_device; "
                              "stage3.py _configure_tensor_swapping: os.path.join(None, ...)"),
    "max_grad_norm_param": Rule(checked_by="engine", source="engine.py _configure_basic_optimizer"),
    "untested_optimizer": Rule(checked_by="engine", source="engine.py _do_optimizer_sanity_check"),
    "offload_client_optimizer": Rule(checked_by="engine", source="engine.py _configure_optimizer "
                                     "(ZeRORuntimeException); accelerate Accelerator._prepare_deepspeed maps the "
                                     "Trainer's optimizer (map_pytorch_optim_to_deepspeed)"),
    # run (this module)
    "small_buckets_multinode": Rule(checked_by="runtime", source="rule of thumb; DeepSpeed config docs "
                                    "(reduce_bucket_size / allgather_bucket_size: elements per collective, "
                                    "default 5e8)"),
    "zero3_slow_network": Rule(checked_by="runtime", source="DeepSpeed #2928, #5770"),
    "offload_without_pin": Rule(checked_by="runtime", source="DeepSpeed config docs (offload_param / "
                                "offload_optimizer pin_memory: page-locked memory 'could boost throughput')"),
    "pinned_exceeds_host": Rule(checked_by="runtime", source="DeepSpeed #3448, #3481 (OOM at run time: warning)"),
    "host_ram_short": Rule(checked_by="runtime", source="unpinned pages swap"),
    "hpz_not_dividing": Rule(checked_by="engine", source="utils/groups.py _create_zero_param_parallel_group "
                             "(_ensure_divisibility over the world); across nodes: runs, slow"),
    "zero_at_dp1": Rule(checked_by="runtime", source="DeepSpeed #4953"),
    "vision_input_text_model": Rule(checked_by="runtime", source="Architecture.vision_params and "
                                    "vision_tokens_per_image are 0 for a text-only model"),
    "bf16_unsupported": Rule(checked_by="runtime", source="GPUSpec.supports_bf16: bf16 needs sm_80 or newer "
                             "(torch.cuda.is_bf16_supported); specs.hardware_precision prices fp16 instead"),
    "qlora_stage3": Rule(checked_by="runtime", source="DeepSpeed #5819, peft #2016; PEFT docs "
                         "accelerate/deepspeed.md (bnb_4bit_quant_storage for ZeRO-3)"),
    "communication_share": Rule(checked_by="runtime", source="rule of thumb (> ~30% of the step)"),
    "zero2_offload_full_weights": Rule(checked_by="runtime", source="DeepSpeed #1883, #3770"),
    "nvme_offload_slow": Rule(checked_by="runtime", source="DeepSpeed #1130, #3000"),
}
"""Every rule of :mod:`zeroplanner.deepspeed.lint` and of :func:`scenario_pitfalls`, by ``Finding.rule`` / ``Pitfall.rule``."""


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f} GiB"


def _add(out: list[Pitfall], rule: str, severity: Severity, key: str, message: str, fix: str = "") -> None:
    out.append(Pitfall(rule=rule, severity=severity, key=key, message=message, fix=fix))


def node_gbps(scenario: Scenario) -> float:
    """Inter-node rate per node, Gb/s (link rate x NICs)."""
    network = scenario.cluster.network
    return network.link_gbps * network.nics_per_node


def scenario_pitfalls(scenario: Scenario, values: Evaluation | None = None,
                      client: Client = "deepspeed") -> list[Pitfall]:
    """The run-level pitfalls of ``scenario``.

    ``values``: the cost model's numbers for the scenario (:func:`zeroplanner.costmodel.evaluate` at this one
    candidate, :meth:`~zeroplanner.costmodel.Evaluation.at`: ``step_seconds``,
    ``communication.exposed_seconds_per_step``, ``per_node_cpu_bytes``, ``fits_cpu``); without them the two
    cost-model rules (communication share, host RAM) are skipped. ``client`` is the program that runs the config; no run-level rule differs between the two today
    (they are about the cluster and DeepSpeed's ZeRO, which both clients run), it is accepted so callers state it.
    """
    del client  # every run-level rule below holds for DeepSpeed alone and under the HF Trainer alike
    z, t, c = scenario.zero, scenario.training, scenario.cluster
    out: list[Pitfall] = []
    n = c.data_parallel_degree
    stage = z.stage
    if (t.freeze_vision and not scenario.model.vision_params) or (
            t.images_per_sample and not scenario.model.vision_tokens_per_image):
        what = " and ".join(x for x, on in (("freeze_vision", t.freeze_vision and not scenario.model.vision_params),
                                             ("images_per_sample", t.images_per_sample
                                              and not scenario.model.vision_tokens_per_image)) if on)
        _add(out, "vision_input_text_model", "warning", "",
             f"{what} set, but {scenario.model.name} has no vision tower (no vision parameters or image tokens): "
             "the setting changes nothing in this estimate",
             "Pick a vision-language model (e.g. a Qwen2.5-VL entry of `zeroplanner models`) or drop the option.")
    if hardware_precision(scenario) != t.precision:
        _add(out, "bf16_unsupported", "warning", "fp16",
             f"{c.gpu.name} has no bf16 (bf16 needs Ampere, sm_80, or newer): priced as fp16 with dynamic loss "
             "scaling (loss_scale 0, DeepSpeed's defaults), which is what `zeroplanner config` writes for this GPU; "
             "memory is the same (2 bytes per value), compute uses the GPU's fp16 peak. A config with bf16 "
             "enabled asks this GPU for a precision it has no tensor cores for",
             "Keep fp16 (and TrainingArguments(fp16=True) under the HF Trainer), or plan an Ampere or newer GPU "
             "for bf16.")
    if stage >= 1 and n == 1:
        _add(out, "zero_at_dp1", "warning", "zero_optimization.stage",
             f"data-parallel degree is 1: ZeRO-{stage} has nobody to shard with and saves no GPU memory "
             "(DeepSpeed #4953); only offload helps", "Use stage 0 (or ZeRO-1/2 with offload_optimizer if memory is short: stage 0 cannot offload), or more GPUs.")
    if stage in (1, 2) and z.offload_optimizer.device != "none":
        weights = scenario.parameters * (2 if t.precision in ("bf16", "fp16") else 4)
        _add(out, "zero2_offload_full_weights", "info", "zero_optimization.offload_optimizer",
             f"ZeRO-{stage} with offload_optimizer still keeps the full {'16' if t.precision != 'fp32' else '32'}-bit "
             f"weights on every GPU ({_gib(weights)} here): GPU model states do not fall with more GPUs "
             "(DeepSpeed #1883, #3770)", "If the weights do not fit, use ZeRO-3 (with offload_param).")
    if t.qlora and stage == 3 and t.bnb_4bit_quant_storage == "uint8":
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(t.precision, "bfloat16")
        _add(out, "qlora_stage3", "warning", "zero_optimization.stage",
             f"QLoRA with ZeRO-3: ZeRO-3 does not shard the 4-bit base unless bnb_4bit_quant_storage={dtype} "
             "(bitsandbytes' default uint8 keeps a full copy per GPU: DeepSpeed #5819, peft #2016); priced whole",
             f"Set BitsAndBytesConfig(bnb_4bit_quant_storage=torch.{dtype}) and torch_dtype=torch.{dtype} in the "
             f"training script, as PEFT's DeepSpeed guide does (--bnb-4bit-quant-storage {dtype} here), or use "
             "ZeRO-2 (the 4-bit base is small).")
    gbps = node_gbps(scenario)
    if stage == 3 and c.nodes > 1:
        slow = gbps <= SLOW_INTER_NODE_GBPS
        large = n >= LARGE_RUN_GPUS and gbps < LARGE_RUN_MIN_GBPS
        if slow or large:
            why = (f"ZeRO-3 with data-parallel degree {n} across {c.nodes} nodes on {gbps:g} Gb/s per node "
                   f"({c.network.name}): it all-gathers every parameter in the forward and again in the backward of every micro-step over "
                   "that link and gets slower "
                   "with more nodes (DeepSpeed #5770); maintainers say ZeRO-3 at 64+ GPUs needs 200-400 Gb/s "
                   "between nodes (DeepSpeed #2928)")
            fix = ("Prefer ZeRO-2 where it fits (one all-reduce volume per step), or keep ZeRO-3 with "
                   f"\"zero_hpz_partition_size\": {c.gpus_per_node} (hierarchical partitioning inside the node), "
                   "or a faster network.")
            if z.zero_hpz_partition_size == c.gpus_per_node:
                fix = ("zero_hpz_partition_size already keeps the backward's parameter all-gathers inside the node "
                       "(hpZ's secondary copy; the forward's still cross nodes, ZeRO++ paper arXiv 2306.10209); "
                       "gradients still cross the network: prefer ZeRO-2 where it fits, or a faster network.")
            _add(out, "zero3_slow_network", "warning", "zero_optimization.stage", why, fix)
    for name, spec in (("offload_optimizer", z.offload_optimizer), ("offload_param", z.offload_param)):
        if stage == 3 and spec.device != "none" and not spec.pin_memory:
            _add(out, "offload_without_pin", "warning", f"zero_optimization.{name}.pin_memory",
                 f"ZeRO-3 {name} without pinned memory: every transfer is staged through pageable memory, which is "
                 "slower (DeepSpeed's config docs: page-locked memory 'could boost throughput at the cost of extra "
                 "memory overhead')",
                 "Set \"pin_memory\": true (and check that host RAM can hold the pinned buffers).")
    if z.offload_optimizer.device == "nvme" or z.offload_param.device == "nvme":
        _add(out, "nvme_offload_slow", "info", "zero_optimization",
             "NVMe offload needs libaio and pinned host buffers and can be ~10x slower than ZeRO-2 "
             "(DeepSpeed #1130, #3000)", "Check that the async_io op builds (ds_report) and the drive is local.")
    if values is None:
        return out
    step = float(values.step_seconds)
    exposed = float(values.communication.exposed_seconds_per_step)
    share = exposed / step if step > 0 else 0.0
    network = float(values.communication.collectives_exposed_seconds_per_step)
    host = max(0.0, exposed - network)  # ZeRO's host-side work: gradient hooks, ZeRO-3 fetch coordination
    if share > COMMUNICATION_SHARE_LIMIT and host > network:
        _add(out, "communication_share", "warning", "zero_optimization",
             f"exposed communication is {share:.0%} of the step ({exposed:.3g} s of {step:.3g} s; > 30%, a common "
             f"rule of thumb for a network-bound step), most of it ZeRO's host-side work ({host:.3g} s of gradient "
             f"hooks and ZeRO-3 fetch coordination per step), not the network ({network:.3g} s waiting on collectives)",
             "Try more samples per micro-step (the hooks run once per parameter tensor per micro-step), ZeRO-2 if "
             "it fits (fewer hooks, no per-module fetches), or fewer gradient accumulation steps.")
    elif share > COMMUNICATION_SHARE_LIMIT:
        fixes = ["a faster network"]
        if stage == 3:
            fixes.insert(0, "ZeRO++ (zero_hpz_partition_size = GPUs per node, quantized weights and gradients)"
                         if c.nodes > 1 and z.zero_hpz_partition_size == 1 else "a larger micro-batch")
            fixes.append("ZeRO-2 if it fits (no per-layer parameter gathers)")
        elif stage == 2:
            fixes.insert(0, "overlap_comm" if not z.overlap else "a larger micro-batch with fewer accumulation "
                         "steps (ZeRO-2 reduces every micro-step)")
            fixes.append("ZeRO-1 if it fits (reduces once per step)")
        else:
            fixes.insert(0, "a larger batch per step (the all-reduce is paid once per step)")
        _add(out, "communication_share", "warning", "zero_optimization",
             f"exposed communication is {share:.0%} of the step ({exposed:.3g} s of {step:.3g} s; > 30%, a common "
             "rule of thumb for a network-bound step): the GPUs wait on the network"
             + (f" ({network:.3g} s on collectives, {host:.3g} s in ZeRO's host-side hooks)" if host > 0.05 * exposed
                else ""), "Try " + ", ".join(fixes) + ".")
    offloaded = [(name, spec) for name, spec in (("offload_optimizer", z.offload_optimizer),
                                                 ("offload_param", z.offload_param)) if spec.device != "none"]
    if not bool(values.fits_cpu):
        factor = scenario.assumptions.host_buffer_factor
        need = float(values.per_node_cpu_bytes)
        have = c.cpu_memory_bytes
        text = (f"host RAM: offload needs {_gib(need)} per node x {factor:g} buffer factor = {_gib(need * factor)}, "
                f"the node has {_gib(have)}")
        key = f"zero_optimization.{offloaded[0][0]}" if offloaded else "zero_optimization"
        if any(spec.pin_memory for _, spec in offloaded) or not offloaded:
            _add(out, "pinned_exceeds_host", "warning", key + (".pin_memory" if offloaded else ""),
                 text + "; pinned memory cannot be swapped out, so the run is likely killed by the kernel's "
                 "out-of-memory killer once the buffers are allocated (DeepSpeed #3448, #3481). DeepSpeed's config "
                 "classes accept the config (they know nothing of host RAM): a memory warning, not a config error",
                 "Add nodes (offload RAM is per node), offload to NVMe, or get more host RAM.")
        else:
            _add(out, "host_ram_short", "warning", key, text + "; unpinned pages will swap and the step crawls",
                 "Add nodes, offload to NVMe, or more host RAM.")
    return out


CONFIG_CHECKED_AUTO_KEYS = frozenset({"train_batch_size", "train_micro_batch_size_per_gpu",
                                      "gradient_accumulation_steps"})
"""``"auto"`` in these keys makes DeepSpeedConfig's batch arithmetic raise (TypeError on the string); elsewhere
DeepSpeed drops it (pydantic blocks) or passes it on to the optimizer/scheduler, which fails at engine build."""


ENGINE_CHECKED_ERRORS = frozenset({("nonpositive_value", "scheduler.params.warmup_num_steps"),
                                   ("integer_type", "train_micro_batch_size_per_gpu")})
"""(rule, key) errors of config-checked rules that DeepSpeedConfig accepts and ``deepspeed.initialize`` (or its
DataLoader) rejects: WarmupLR's positive-integer check, the DataLoader's int batch size."""


def config_checked(finding: object) -> bool:
    """Whether DeepSpeed's own config classes (``DeepSpeedConfig``) reject what this error finding reports
    (``finding`` has ``severity``, ``rule`` and ``key``, e.g. a :class:`zeroplanner.deepspeed.Finding`)."""
    if getattr(finding, "severity", None) != "error":
        return False
    rule, key = getattr(finding, "rule", ""), getattr(finding, "key", "")
    if rule == "auto_outside_hf":
        return key in CONFIG_CHECKED_AUTO_KEYS
    if (rule, key) in ENGINE_CHECKED_ERRORS:
        return False
    entry = RULES.get(rule)
    return entry is not None and entry.checked_by == "config"
