"""``zeroplanner diagnose LOG [--config ds_config.json] [--hf-trainer] [scenario options] [--json]
[--write-calibration FILE]``: read a training log against the plan (:mod:`zeroplanner.runlog`,
:mod:`zeroplanner.diagnose`).

The scenario: the DeepSpeed config (read as ``check`` reads it) over the scenario options; without ``--config``,
the ZeRO stage, micro-batch and accumulation the log states are used where the command line does not give them
(each said in the output). Exit status 0 healthy, 1 a problem found (an OOM, communication over 30% of the step,
a part outside the model's error), 2 unreadable input (no such file, not a regular file, nothing readable in it).
"""

from __future__ import annotations

import json
import sys

from ..runlog import MAX_LOG_BYTES
from .common import EXIT_BAD_INPUT, read_input_file_tail


def register(subparsers, add_scenario_options) -> None:
    p = subparsers.add_parser(
        "diagnose", help="read a DeepSpeed / HF Trainer log against the plan: what it measured, the bottleneck, "
        "the fix", description="Read a training log (CUDA OOM messages, DeepSpeed wall_clock_breakdown timers, the "
        "comms logger summary, see_memory_usage, the HF Trainer's metrics, the flops profiler) and compare it with "
        "what zeroplanner predicts for the run. Exit 0 healthy, 1 a problem found, 2 unreadable input.")
    p.add_argument("log_path", metavar="LOG", help="the log file (only its last 8 MiB are read)")
    p.add_argument("--config", default=None, help="the run's DeepSpeed config (JSON)")
    p.add_argument("--hf-trainer", action="store_true", help="the config was run through the HF Trainer/accelerate")
    p.add_argument("--write-calibration", default=None, metavar="FILE",
                   help="write the measured figures as a file --cluster-from reads")
    p.add_argument("--json", action="store_true", help="print one JSON object: read, comparisons, problems, remedy")
    add_scenario_options(p)
    p.set_defaults(func=run)


def _error(message: str) -> int:
    sys.stderr.write(f"zeroplanner: error: {message}\n")
    return EXIT_BAD_INPUT


def _scenario(args, reading, notes):
    from .common import scenario_from_args
    from ..specs import replace

    if args.config:
        from ..deepspeed import ConfigError, from_deepspeed_config
        from .config import read_config_file

        mode = "hf_trainer" if args.hf_trainer else "deepspeed"
        config, _ = read_config_file(args.config, "--config", mode)
        from ..deepspeed.lint import hf_model_config_finding
        from .common import fail

        if hf_model_config_finding(config) is not None:
            fail("--config", f"{args.config!r} is a Hugging Face model config.json, not a DeepSpeed config; pass "
                 "it as --hf-config")
        try:
            scenario, _ = from_deepspeed_config(config, base=scenario_from_args(args), mode=mode)
        except ConfigError as exc:
            raise ValueError(f"--config {args.config!r}: {exc}") from None
        return scenario
    scenario = scenario_from_args(args)
    st = reading.settings
    zero, training = {}, {}
    if "zero_stage" in st and args.stage is None:
        zero["stage"] = st["zero_stage"].value
    if "micro_batch" in st and args.micro_batch is None:
        training["micro_batch"] = st["micro_batch"].value
    if "grad_accum" in st and args.grad_accum is None:
        training["grad_accum"] = st["grad_accum"].value
    cluster = {}
    if "world_size" in st and args.gpus_per_node is None and args.nodes is None:
        cluster["gpus_per_node"] = st["world_size"].value
    if cluster:
        try:
            scenario = replace(scenario, cluster=replace(scenario.cluster, **cluster))
            notes.append(f"GPUs from the log's world size (one node; give --nodes / --gpus-per-node otherwise): "
                         f"{cluster['gpus_per_node']}")
        except Exception as exc:  # noqa: BLE001
            notes.append(f"the log's world size {cluster['gpus_per_node']} was not applied: {str(exc).splitlines()[0]}")
    if zero or training:
        try:
            scenario = replace(scenario, zero=replace(scenario.zero, **zero),
                               training=replace(scenario.training, **training))
        except Exception as exc:  # noqa: BLE001 - a value the log states that the scenario refuses
            notes.append(f"the log's settings {zero | training} were not applied: {str(exc).splitlines()[0]}")
            return scenario
        notes.append(f"settings taken from the log (not given on the command line): {zero | training}")
    return scenario


def run(args) -> int:
    from ..diagnose import calibration, diagnose
    from ..runlog import read_log

    raw, skipped = read_input_file_tail("LOG", args.log_path, MAX_LOG_BYTES)  # not a regular file: exit 2
    reading = read_log(raw)
    if skipped:
        reading.skipped.insert(0, f"the first {skipped:,} bytes of the file (only the last {MAX_LOG_BYTES // 2**20} MiB "
                                  "of a log are read)")
    if reading.empty:
        where = f"its last {MAX_LOG_BYTES // 2**20} MiB (the file has {(skipped + len(raw)) / 2**20:.1f} MiB)" \
            if skipped else "it"
        return _error(f"LOG {args.log_path!r}: nothing readable in {where} (no CUDA OOM message, DeepSpeed timer, "
                      "comms summary, see_memory_usage line, HF Trainer metrics or flops profiler output)")
    notes: list[str] = []
    try:
        scenario = _scenario(args, reading, notes)
    except ValueError as exc:  # ConfigError; a --config path that is no regular file raised UsageError (exit 2)
        return _error(str(exc))
    from .common import model_source

    model_from = model_source(args)
    if model_from == "default":
        # a log (and a DeepSpeed config) does not say which model trained: say the comparison is with the default
        # model, first, as `check` does, rather than flag its parts as outside the model's error without a word
        notes.insert(0, f"no model named: a training log does not say which model it trained, so it is compared "
                        f"with the default {scenario.model.name} ({scenario.parameters / 1e9:.2f}B parameters); its "
                        "predicted figures are for that model. Name yours: --model NAME (see `zeroplanner "
                        "models`), --hf-config config.json or --params N")
    d = diagnose(reading, scenario)
    d.notes[:0] = notes
    written = None
    cal: dict = {}
    if args.write_calibration:
        cal, cal_notes = calibration(reading, scenario)
        if not cal:
            d.notes += cal_notes + ["nothing to calibrate from this log: no file written"]
    if args.write_calibration and cal:
        try:
            with open(args.write_calibration, "w", encoding="utf-8") as f:
                json.dump(cal, f, indent=1)
        except OSError as exc:
            return _error(f"--write-calibration {args.write_calibration!r}: cannot write it ({exc.strerror or exc})")
        d.notes += cal_notes
        written = args.write_calibration
    if getattr(args, "json", False):
        obj = d.to_json()
        obj["scenario"] = {"model": scenario.model.name, "model_from": model_from, "stage": scenario.zero.stage,
                           "gpus_per_node": scenario.cluster.gpus_per_node, "nodes": scenario.cluster.nodes,
                           "micro_batch": scenario.training.micro_batch, "grad_accum": scenario.training.grad_accum,
                           "seq_len": scenario.training.seq_len}
        obj["calibration_written"] = written
        print(json.dumps(obj, indent=1, default=str))
    else:
        named = " (the default: no model named)" if model_from == "default" else ""
        print(f"Diagnosed against: {scenario.model.name}{named}, ZeRO-{scenario.zero.stage}, "
              f"{scenario.cluster.nodes} x {scenario.cluster.gpus_per_node} {scenario.cluster.gpu.name}, micro-batch "
              f"{scenario.training.micro_batch} x {scenario.training.grad_accum}, sequence {scenario.training.seq_len}")
        print(d.text())
        if written:
            print(f"calibration written to {written} (use it with --cluster-from {written})")
    return 1 if d.healthy is False else 0
