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
import math
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import catalog
from .inputs import BY_KEY, CATALOG_KINDS, INPUTS, Input, input_for_error
from .scenarios import build_scenario
from .specs import Scenario
from .units import GIB

PLUGINS: tuple[str, ...] = (
    "zeroplanner.cli_app",
    "zeroplanner.cli_probe",
    "zeroplanner.cli_config",
    "zeroplanner.cli_calibrate",
    "zeroplanner.cli_launch",
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


def _positive_float(name: str, inp: Input):
    def parse(text: str) -> float:
        bad = argparse.ArgumentTypeError(f"{name} must be a number in {inp.range_text} (got {text!r})")
        try:
            value = float(text)
        except ValueError:
            raise bad from None
        if not math.isfinite(value) or not inp.in_range(value):
            raise bad
        return value

    return parse


def _input_type(inp: Input):
    """argparse type of an int/float input: the bounds of its spec field, in the input's unit."""
    flag = inp.cli_flag
    if inp.kind == "int":
        return _positive_int(flag, int(inp.low), int(inp.high))
    return _positive_float(flag, inp)


def _input_help(inp: Input) -> str:
    default = inp.default
    text = inp.help
    if inp.kind in ("int", "float") and inp.low is not None:
        text += f"; {inp.range_text}"
    if default is not None and inp.kind != "bool" and inp.kind not in CATALOG_KINDS and "default" not in text:
        text += f" (default {default:g})" if isinstance(default, float) else f" (default {default})"
    return text


def add_scenario_options(p: argparse.ArgumentParser) -> None:
    """The scenario options shared by every scenario command, one per input of :data:`zeroplanner.inputs.INPUTS`
    (defaults: Llama-2-7B, 1 node x 8 A100-80GB), plus ``--hf-config`` and ``--cluster-from`` (files)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for inp in INPUTS:
        if inp.group not in groups:
            groups[inp.group] = p.add_argument_group(inp.group)
            if inp.group == "model (one of)":
                groups[inp.group].add_argument("--hf-config", default=None, metavar="PATH",
                                               help="a Hugging Face config.json")
        g = groups[inp.group]
        if inp.kind == "bool":
            if inp.nullable:
                g.add_argument(inp.cli_flag, dest=inp.key, action=argparse.BooleanOptionalAction, default=None,
                               help=inp.help)
            else:
                g.add_argument(inp.cli_flag, dest=inp.key, action="store_false" if inp.default else "store_true",
                               default=None, help=inp.help)
        elif inp.kind == "choice":
            g.add_argument(inp.cli_flag, dest=inp.key, choices=inp.choices, default=None, help=_input_help(inp))
        elif inp.kind in CATALOG_KINDS:
            g.add_argument(inp.cli_flag, dest=inp.key, default=None, help=inp.help)
        else:
            g.add_argument(inp.cli_flag, dest=inp.key, type=_input_type(inp), default=None, help=_input_help(inp))
    groups["cluster"].add_argument("--cluster-from", default=None, metavar="PROBE_JSON",
                                   help="cluster from `zeroplanner probe --json`")


def _option(key: str | None, args: argparse.Namespace, hf: Any) -> str:
    """The CLI flag of an input key (a model error names the model source that was given)."""
    if key in (None, "model", "params"):
        return "--hf-config" if hf is not None else "--params" if args.params is not None else "--model"
    return BY_KEY[key].cli_flag


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
    for name, option in ((i.key, i.cli_flag) for i in INPUTS if i.kind in CATALOG_KINDS):
        value = getattr(args, name)
        names = {"model": catalog.model_names, "gpu": catalog.gpu_names, "network": catalog.network_names}[name]()
        if value is not None and value.lower() not in {n.lower() for n in names}:
            close = difflib.get_close_matches(value.lower(), [n.lower() for n in names], n=3, cutoff=0.5)
            close += [n.lower() for n in names if value.lower() in n.lower() and n.lower() not in close]
            hint = f"did you mean {', '.join(close[:3])}? " if close else ""
            fail(option, f"unknown {name} {value!r}; {hint}known: {', '.join(names)}")
    values = {inp.key: getattr(args, inp.key, None) for inp in INPUTS}
    values = {k: v for k, v in values.items() if v is not None}
    try:
        scenario = build_scenario(hf_config=hf, **values)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        key = input_for_error(tuple(err["loc"]), msg, given=values)
        option = _option(key, args, hf) if key is not None or not err["loc"] else "--" + str(err["loc"][-1])
        fail(option, msg)
    except (ValueError, KeyError) as exc:
        fail(_option(None, args, hf), str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
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
    p.add_argument("--nodes", type=_positive_int("--nodes", 1, int(BY_KEY["nodes"].high)), default=1)
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
