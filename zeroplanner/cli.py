"""Command line: ``zeroplanner estimate|recommend|deepspeed-estimate ... [--json]`` and plugin subcommands.

Contract for scripts: with ``--json`` each command prints exactly one JSON object on stdout. Bad input prints one
line ``zeroplanner: error: --option: message`` on stderr and exits with status 2, never a traceback.

Plugins: each module named in :data:`PLUGINS` defines ``register(subparsers, add_scenario_options)``; its handler
(``set_defaults(func=...)``) takes the parsed args and returns an exit status.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import catalog
from .scenarios import DEFAULT_GPU, DEFAULT_MODEL, DEFAULT_NETWORK, build_scenario
from .specs import Scenario
from .units import GIB

PLUGINS: tuple[str, ...] = (
    "zeroplanner.cli_app",
    "zeroplanner.cli_probe",
    "zeroplanner.cli_config",
    "zeroplanner.cli_calibrate",
)
"""Modules that add subcommands (one line each)."""

MAX_INPUT_FILE_BYTES = 1_000_000
"""Largest JSON file (HF config, probe output) the CLI reads: real config.json files are a few KB."""


class UsageError(Exception):
    """A user error; printed as one line and exit status 2."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option


def fail(option: str, message: str) -> None:
    """Raise the one-line usage error (exit status 2)."""
    raise UsageError(option, message)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        self.exit(2, f"zeroplanner: error: {message}\n")


_SUFFIXES = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def _positive_int(name: str, low: int = 1, high: int = 10**7):
    def parse(text: str) -> int:
        scale = 1
        if text[-1:].lower() in _SUFFIXES and text[:-1].replace(".", "", 1).isdigit():  # 7B, 1.5B, 500M
            scale, text = _SUFFIXES[text[-1].lower()], text[:-1]
            text = repr(float(text) * scale)
        try:
            value = int(float(text)) if ("e" in text.lower() or "." in text) else int(text)
        except (ValueError, OverflowError):  # OverflowError: "1e400" is inf
            raise argparse.ArgumentTypeError(f"{name} must be an integer in [{low}, {high}] (got {text!r})") from None
        if not (low <= value <= high) or (("e" in text.lower() or "." in text) and float(text) != value):
            raise argparse.ArgumentTypeError(f"{name} must be an integer in [{low}, {high}] (got {text!r})")
        return value

    return parse


def _positive_float(name: str, low: float, high: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number in [{low}, {high}] (got {text!r})") from None
        if not (low <= value <= high):
            raise argparse.ArgumentTypeError(f"{name} must be a number in [{low}, {high}] (got {text!r})")
        return value

    return parse


def add_scenario_options(p: argparse.ArgumentParser) -> None:
    """The scenario options shared by every scenario command (defaults: Llama-2-7B, 1 node x 8 A100-80GB)."""
    g = p.add_argument_group("model (one of)")
    g.add_argument("--model", default=None, help=f"catalog name (default {DEFAULT_MODEL}); see `zeroplanner models`")
    g.add_argument("--hf-config", default=None, metavar="PATH", help="a Hugging Face config.json")
    g.add_argument("--params", default=None, type=_positive_int("--params", 1_000_000, 10**15),
                   help="a bare parameter count, e.g. 7e9")
    g = p.add_argument_group("cluster")
    g.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU catalog name (default {DEFAULT_GPU})")
    g.add_argument("--gpu-memory-gib", type=_positive_float("--gpu-memory-gib", 1, 4096), default=None)
    g.add_argument("--gpus-per-node", type=_positive_int("--gpus-per-node", 1, 64), default=8)
    g.add_argument("--nodes", type=_positive_int("--nodes", 1, 100_000), default=1)
    g.add_argument("--network", default=DEFAULT_NETWORK, help=f"network preset (default {DEFAULT_NETWORK})")
    g.add_argument("--inter-node-gbps", type=_positive_float("--inter-node-gbps", 0.1, 100_000), default=None,
                   help="inter-node bandwidth per node in Gbit/s (overrides the preset's NICs)")
    g.add_argument("--cpu-memory-gib", type=_positive_float("--cpu-memory-gib", 1, 2**20), default=1024.0,
                   help="host RAM per node, GiB (default 1024)")
    g.add_argument("--cluster-from", default=None, metavar="PROBE_JSON", help="cluster from `zeroplanner probe --json`")
    g = p.add_argument_group("ZeRO")
    g.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=2)
    g.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"), default="none")
    g.add_argument("--offload-param", choices=("none", "cpu", "nvme"), default="none")
    g.add_argument("--reduce-bucket-size", type=_positive_int("--reduce-bucket-size", 1, 10**12), default=None)
    g.add_argument("--allgather-bucket-size", type=_positive_int("--allgather-bucket-size", 1, 10**12), default=None)
    g = p.add_argument_group("training")
    g.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    g.add_argument("--optimizer", choices=("adamw", "adam", "sgd", "adam8bit"), default="adamw")
    g.add_argument("--micro-batch", type=_positive_int("--micro-batch", 1, 65_536), default=1)
    g.add_argument("--grad-accum", type=_positive_int("--grad-accum", 1, 65_536), default=8)
    g.add_argument("--seq-len", type=_positive_int("--seq-len", 1, 4_194_304), default=4096)
    g.add_argument("--checkpointing", choices=("none", "selective", "full"), default="full")
    g.add_argument("--no-flash-attention", action="store_true")
    g.add_argument("--lora-rank", type=_positive_int("--lora-rank", 0, 65_536), default=0)
    g.add_argument("--qlora", action="store_true", help="4-bit NF4 base weights (needs --lora-rank)")
    g.add_argument("--mfu", type=_positive_float("--mfu", 0.01, 1.0), default=None,
                   help="fraction of the GPU's dense peak reached on the FLOPs executed, recomputation included "
                        "(default 0.40); the reported mfu counts model FLOPs only, so it is lower with checkpointing")


_FIELD_OPTIONS = {
    "micro_batch": "--micro-batch", "grad_accum": "--grad-accum", "seq_len": "--seq-len", "lora_rank": "--lora-rank",
    "qlora": "--qlora", "precision": "--precision", "gpus_per_node": "--gpus-per-node", "nodes": "--nodes",
    "gpu_memory_bytes": "--gpu-memory-gib", "cpu_memory_bytes": "--cpu-memory-gib", "stage": "--stage",
    "offload_param": "--offload-param", "offload_optimizer": "--offload-optimizer", "link_gbps": "--inter-node-gbps",
    "tensor_parallel_size": "--gpus-per-node", "mfu": "--mfu", "reduce_bucket_size": "--reduce-bucket-size",
    "allgather_bucket_size": "--allgather-bucket-size", "n_heads": "--hf-config",
}


def _read_json_file(option: str, path: str) -> Any:
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        fail(option, f"cannot read {path!r}: {exc.strerror}")
    if size > MAX_INPUT_FILE_BYTES:
        fail(option, f"{path!r} is {size} bytes; the limit is {MAX_INPUT_FILE_BYTES}")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(option, f"{path!r} is not valid JSON ({exc})")
    except RecursionError:  # a hostile file nested thousands of levels deep
        fail(option, f"{path!r} is nested too deeply to be a config")


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """Build the Scenario from parsed scenario options; raises UsageError naming the option."""
    hf = None
    if args.hf_config is not None:
        hf = _read_json_file("--hf-config", args.hf_config)
        if not isinstance(hf, dict):
            fail("--hf-config", "must be a JSON object")
    zero_overrides = {}
    if args.reduce_bucket_size is not None:
        zero_overrides["reduce_bucket_size"] = args.reduce_bucket_size
    if args.allgather_bucket_size is not None:
        zero_overrides["allgather_bucket_size"] = args.allgather_bucket_size
    for name, option in (("model", "--model"), ("gpu", "--gpu"), ("network", "--network")):
        value = getattr(args, name)
        names = {"model": catalog.model_names, "gpu": catalog.gpu_names, "network": catalog.network_names}[name]()
        if value is not None and value.lower() not in {n.lower() for n in names}:
            close = difflib.get_close_matches(value.lower(), [n.lower() for n in names], n=3, cutoff=0.5)
            close += [n.lower() for n in names if value.lower() in n.lower() and n.lower() not in close]
            hint = f"did you mean {', '.join(close[:3])}? " if close else ""
            fail(option, f"unknown {name} {value!r}; {hint}known: {', '.join(names)}")
    try:
        scenario = build_scenario(
            model=args.model, hf_config=hf, params=args.params, gpu=args.gpu, gpu_memory_gib=args.gpu_memory_gib,
            gpus_per_node=args.gpus_per_node, nodes=args.nodes, network=args.network,
            inter_node_gbps=args.inter_node_gbps, cpu_memory_gib=args.cpu_memory_gib, stage=args.stage,
            offload_optimizer=args.offload_optimizer, offload_param=args.offload_param, precision=args.precision,
            optimizer=args.optimizer, micro_batch=args.micro_batch, grad_accum=args.grad_accum, seq_len=args.seq_len,
            checkpointing=args.checkpointing, flash_attention=not args.no_flash_attention, lora_rank=args.lora_rank,
            qlora=args.qlora, mfu=args.mfu, zero_overrides=zero_overrides,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = next((str(x) for x in reversed(err["loc"]) if str(x) in _FIELD_OPTIONS), None)
        if field is None:  # a cross-field rule: name the first option its message mentions
            found = [(err["msg"].find(f), f) for f in _FIELD_OPTIONS if f in err["msg"]]
            field = min(found)[1] if found else None
        option = _FIELD_OPTIONS.get(field, "--" + "-".join(str(x) for x in err["loc"][-1:]) if err["loc"] else "input")
        fail(option, err["msg"].removeprefix("Value error, "))
    except (ValueError, KeyError) as exc:
        option = "--hf-config" if hf is not None else "--params" if args.params is not None else "--model"
        fail(option, str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
    if getattr(args, "cluster_from", None):
        data = _read_json_file("--cluster-from", args.cluster_from)
        try:
            from .probe import cluster_changes, cluster_from_probe
        except ImportError as exc:  # pragma: no cover - probe is part of the package
            fail("--cluster-from", f"probe support unavailable ({exc})")
        try:
            cluster = cluster_from_probe(data, scenario.cluster)
            _changes, notes = cluster_changes(data, scenario.cluster)
        except (ValueError, TypeError, KeyError) as exc:
            fail("--cluster-from", str(exc))
        for note in notes:  # what the probe changed (and left as given), on stderr so --json stays one object
            sys.stderr.write(f"zeroplanner: --cluster-from: {note}\n")
        scenario = scenario.model_copy(update={"cluster": cluster})
    return scenario


def _emit(args: argparse.Namespace, obj: dict, text: str) -> None:
    if args.json:
        sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    else:
        sys.stdout.write(text.rstrip() + "\n")


def estimate_json(est) -> dict:
    """The CLI's estimate object (documented contract): see README "JSON output"."""
    d = est.model_dump()
    d["per_gpu_bytes"] = est.per_gpu_bytes.model_dump()
    return d


def _cmd_estimate(args: argparse.Namespace) -> int:
    from .costmodel import estimate

    from .costmodel.deepspeed_estimator import deepspeed_row_for

    scenario = scenario_from_args(args)
    est = estimate(scenario)
    rows = "\n".join(f"  {t.name:<18} {t.bytes / GIB:8.2f} GiB" for t in est.terms)
    text = (f"{scenario.model.name}: Ψ = {est.parameters:,} ({est.trainable_parameters:,} trainable), ZeRO-"
            f"{scenario.zero.stage}, data-parallel degree {est.data_parallel_degree}\n{rows}\n{est.summary()}\n"
            + "".join(f"warning: {w}\n" for w in est.warnings))
    obj = estimate_json(est)
    ds = deepspeed_row_for(scenario)
    obj["deepspeed_estimator"] = None if ds is None else {
        **ds.model_dump(), "covers": "model states only (DeepSpeed 0.19.8 estimate_zero2/zero3_model_states_mem_needs)"}
    if ds is not None:
        text += (f"DeepSpeed's own estimator (model states only): {ds.per_gpu_bytes / GIB:.2f} GiB per GPU, "
                 f"{ds.per_cpu_bytes / GIB:.1f} GiB per CPU; zeroplanner's full total: "
                 f"{est.per_gpu_bytes.total / GIB:.2f} GiB per GPU\n")
    _emit(args, obj, text)
    return 0


def _cmd_recommend(args: argparse.Namespace) -> int:
    from .planner import largest_model, plan

    scenario = scenario_from_args(args)
    p = plan(scenario)
    obj = {
        "fits": p.fits,
        "choice": p.choice.model_dump() if p.choice else None,
        "estimate": estimate_json(p.estimate),
        "reasons": p.reasons,
        "warnings": p.warnings,
        "alternatives": [{"label": a.label, "choice": a.choice.model_dump(), "estimate": estimate_json(a.estimate)}
                         for a in p.alternatives],
        "candidates_evaluated": p.candidates_evaluated,
        "largest_model_parameters": largest_model(scenario),
    }
    if p.fits:
        text = f"Recommended: {p.choice.label}\n" + "".join(f"- {r}\n" for r in p.reasons)
    else:
        text = "Nothing fits.\n"
    text += "".join(f"warning: {w}\n" for w in p.warnings)
    text += "".join(f"alternative: {a.label}: {a.estimate.tokens_per_second:,.0f} tokens/s\n" for a in p.alternatives)
    text += "largest trainable model on this cluster (Llama-shaped, same training settings):\n" + "".join(
        f"  {label:<36} {n / 1e9:8.1f} B parameters\n" for label, n in obj["largest_model_parameters"].items())
    _emit(args, obj, text)
    return 0


def _cmd_deepspeed_estimate(args: argparse.Namespace) -> int:
    from .costmodel import deepspeed_estimate_table

    rows = deepspeed_estimate_table(args.params, args.largest_layer_params, args.gpus_per_node, args.nodes)
    obj = {"rows": [r.model_dump() for r in rows], "source": "DeepSpeed 0.19.8 estimate_zero2/zero3_model_states_mem_needs"}
    text = "\n".join(
        f"stage {r.stage} offload_param={r.offload_param:<4} offload_optimizer={r.offload_optimizer:<4} "
        f"zero_init={'-' if r.zero_init is None else r.zero_init}: per CPU {r.per_cpu_bytes / GIB:8.2f} GiB, "
        f"per GPU {r.per_gpu_bytes / GIB:8.2f} GiB"
        for r in rows
    )
    _emit(args, obj, text)
    return 0


def _catalog_row(kind: str, name: str) -> tuple[dict, str]:
    if kind == "models":
        m = catalog.model(name)
        d = {"name": m.name, "family": m.family, "parameters": m.parameter_count, "layers": m.n_layers,
             "hidden_size": m.hidden_size, "heads": m.n_heads, "kv_heads": m.kv_heads, "vocab_size": m.vocab_size,
             "experts": m.n_experts, "source": m.source}
        return d, f"{m.name:<16} {m.parameter_count / 1e9:8.2f} B params  {m.n_layers:3d} layers  h={m.hidden_size}"
    if kind == "gpus":
        g = catalog.gpu(name)
        d = {"name": g.name, "memory_gib": g.memory_bytes / GIB, "peak_bf16_tflops": g.peak_bf16_tflops,
             "peak_fp16_tflops": g.peak_fp16_tflops, "intra_node_busbw_gb_per_s": g.intra_node_busbw_gb_per_s,
             "source": g.source}
        return d, (f"{g.name:<11} {g.memory_bytes / GIB:6.1f} GiB  {g.peak_tflops('bf16'):7.1f} TFLOP/s bf16/fp16 "
                   f"dense  intra-node busbw {g.intra_node_busbw_gb_per_s:.0f} GB/s")
    n = catalog.network(name)
    d = {"name": n.name, "kind": n.kind, "link_gbps": n.link_gbps, "nics_per_node": n.nics_per_node,
         "efficiency": n.efficiency, "node_busbw_gb_per_s": n.node_busbw_bytes_per_second / 1e9,
         "latency_seconds": n.latency_seconds, "source": n.source}
    return d, (f"{n.name:<10} {n.kind:<10} {n.nics_per_node} x {n.link_gbps:g} Gbit/s per node, "
               f"~{n.node_busbw_bytes_per_second / 1e9:.1f} GB/s bus bandwidth, {n.latency_seconds * 1e6:.0f} us/step")


def _cmd_catalog(args: argparse.Namespace) -> int:
    kind = args.kind
    names = {"models": catalog.model_names, "gpus": catalog.gpu_names, "networks": catalog.network_names}[kind]()
    rows = [_catalog_row(kind, n) for n in names]
    _emit(args, {kind: [r[0] for r in rows]}, "\n".join(r[1] for r in rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="zeroplanner", description="Plan DeepSpeed ZeRO runs: memory, speed, config.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("estimate", help="memory, communication and step time of one configuration")
    add_scenario_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_estimate)
    p = sub.add_parser("recommend", help="evaluate every candidate and recommend one")
    add_scenario_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_recommend)
    p = sub.add_parser("deepspeed-estimate", help="DeepSpeed's own model-state estimator, reproduced")
    p.add_argument("--params", type=_positive_int("--params", 1, 10**15), required=True)
    p.add_argument("--largest-layer-params", type=_positive_int("--largest-layer-params", 1, 10**15), required=True)
    p.add_argument("--gpus-per-node", type=_positive_int("--gpus-per-node", 1, 1024), default=1)
    p.add_argument("--nodes", type=_positive_int("--nodes", 1, 100_000), default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_deepspeed_estimate)
    for kind in ("models", "gpus", "networks"):
        p = sub.add_parser(kind, help=f"list catalog {kind}")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=_cmd_catalog, kind=kind)
    for name in PLUGINS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue  # an optional plugin whose module is absent
        module.register(sub, add_scenario_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        sys.stderr.write(f"zeroplanner: error: {exc}\n")
        return 2
    except BrokenPipeError:  # pragma: no cover - `| head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
