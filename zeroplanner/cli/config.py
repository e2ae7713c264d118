"""``zeroplanner config`` and ``zeroplanner check``: write a DeepSpeed config for a scenario, or check and price one.

Subcommand module of :mod:`zeroplanner.cli`::

    zeroplanner config [scenario options] [--recommend] [--hf-trainer] [--accelerate] [--total-steps N] -o FILE
    zeroplanner check CONFIG.json [scenario options] [--hf-trainer] [--accelerate-config YAML] [--json]

``config`` writes the DeepSpeed JSON for the scenario (``--recommend``: for the planner's choice) to FILE, or to
stdout without ``-o``. ``--hf-trainer`` writes the variant the HF Trainer runs: the plan's batch, precision and
bucket values, ``"auto"`` for optimizer, scheduler and clipping (``--hf-auto``: ``"auto"`` wherever the Trainer fills
values). ``--accelerate`` also writes ``FILE``'s sibling ``<stem>.accelerate.yaml`` for ``accelerate launch
--config_file``, pointing at FILE exactly as given (launch from the directory the path is relative to); on several
nodes ``--main-process-ip`` is node 0's address in it. Notes and lint findings go to stderr (or into
the ``--json`` object).

``check`` reads a user's config (at most 1 MB, nothing executed) the way the client that runs it reads the file:
DeepSpeed alone (default) uses hjson (comments and trailing commas accepted, a duplicate key is an error);
``--hf-trainer`` means the HF Trainer / accelerate, which use ``json.load`` (strict JSON; a duplicate key silently
keeps the last value) and fill ``"auto"``. It builds the scenario from the scenario options (model, cluster,
sequence length, ...) overridden by what the config says (stage, offload, buckets, batch, precision, optimizer,
``tensor_parallel.autotp_size``, the Ulysses degree from ``sequence_parallel_size`` or LLaMA-Factory's
``sequence_parallel`` block; ``--accelerate-config``: nodes and GPUs per node from accelerate's
``num_machines`` / ``num_processes``, the Ulysses degree from its ``parallelism_config`` block), and prints the findings (reading + lint, the run-level rules shared with
``estimate``) and the estimate of that scenario, saying which model and shape it priced (a warning when no model
was named). Where DeepSpeed (and, for ``--hf-trainer``, transformers) is installed the config is also handed to
their own validation (:mod:`zeroplanner.deepspeed.library`; ``--no-library-check`` skips it). With ``--json``: one object
``{"inputs": {...} (every input as priced: the file's value where it set one), "fits": bool, "findings": [...], "errors": n, "warnings": n, "mode": ..., "priced": {"model", "model_from", "seq_len", ...},
"from_config": {option: {"config": v, "command_line": v}}, "validated_by": [...] | null, "scenario": {"training": ..., "zero": ...}, "estimate": {...}}`` (estimate as in
``zeroplanner estimate --json``).

With a Ulysses degree > 1 (``--sequence-parallel-size``) the DeepSpeed JSON carries ``sequence_parallel_size`` and
``train_batch_size`` = micro x accumulation x world / sp; ``--hf-trainer`` leaves both to accelerate instead and
prints the ``ParallelismConfig`` snippet (``parallelism_config`` in the JSON), and ``--accelerate`` writes the YAML's
``parallelism_config`` block (:func:`zeroplanner.deepspeed.parallelism_config_kwargs`).

``config`` states the verdict of the config it writes (``verdict`` in the JSON: fits, GPU memory per GPU, host RAM
per node) and, when it does not fit, the nearest configuration that does (:func:`zeroplanner.planner.nearest_fit`:
fewest settings changed; ``nearest_fit`` in the JSON, null when nothing fits this cluster). With ``--recommend``
the planner holds the search options given (as ``recommend`` does).

Exit status (the same for estimate, recommend, config, check): 0 = fits (``check``: and no error findings),
1 = does not fit (``config``: the config it wrote; ``config --recommend``: nothing fits, no config written;
``check``: the config does not fit or has error findings), 2 = bad input (one line on stderr naming the option or
the file, never a traceback).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..deepspeed import (
    MAX_CONFIG_BYTES,
    ConfigError,
    Finding,
    from_deepspeed_config,
    explain_config,
    generation_notes,
    load_config_text,
    parallelism_config_kwargs,
    parallelism_config_snippet,
    to_accelerate_config,
    to_deepspeed_config,
)
from ..deepspeed.lint import hf_model_config_finding, lint, order_findings
from .common import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_STATUSES_HELP, advice_json, advice_text


def register(subparsers, add_scenario_options) -> None:
    """Add ``config`` and ``check`` (:mod:`zeroplanner.cli` registers each module)."""
    p = subparsers.add_parser(
        "config", help="write a DeepSpeed config (and optionally an accelerate YAML) for a scenario",
        description="Write a complete DeepSpeed config for the scenario: batch keys that multiply out, precision, "
        "optimizer and scheduler, zero_optimization with integer bucket sizes, offload and ZeRO++ keys. Prints "
        "whether that config fits and, when it does not, the nearest configuration that does (exit status 1).",
        epilog=EXIT_STATUSES_HELP,
    )
    add_scenario_options(p)
    p.add_argument("--recommend", action="store_true", help="use the planner's recommended configuration")
    p.add_argument("--hf-trainer", action="store_true", help="for the HF Trainer / accelerate: the plan's batch, "
                   "precision and bucket values, 'auto' for optimizer, scheduler and clipping")
    p.add_argument("--hf-auto", action="store_true", help="with --hf-trainer: 'auto' in every field the Trainer "
                   "fills (its batch and bucket sizes, not the plan's)")
    p.add_argument("--main-process-ip", default=None, metavar="ADDR", help="with --accelerate on several nodes: "
                   "node 0's address for the YAML's main_process_ip (default: a placeholder to replace)")
    p.add_argument("--accelerate", action="store_true",
                   help="also write <stem>.accelerate.yaml next to -o FILE for accelerate launch --config_file")
    p.add_argument("--total-steps", type=_steps, default=None, help="total optimizer steps (WarmupDecayLR)")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write the DeepSpeed JSON here")
    p.add_argument("--explain", action="store_true", help="also print, for every setting that differs from "
                   "DeepSpeed's default, one line saying why it is written (JSON: explain)")
    p.add_argument("--json", action="store_true", help="print one JSON object: config, notes, findings, explain, "
                   "files")
    p.set_defaults(func=run_config)

    p = subparsers.add_parser(
        "check", help="lint a DeepSpeed config and estimate what it costs on the given cluster",
        description="Read CONFIG (JSON or hjson, at most 1 MB; '-' for stdin), report unknown keys, 'auto' values "
        "and pitfalls, and estimate memory and step time of that config with the scenario options' model and "
        "cluster. It names the model and shape it prices and every value it took from the file instead of the "
        "command line.",
        epilog=EXIT_STATUSES_HELP,
    )
    p.add_argument("config_path", metavar="CONFIG", help="DeepSpeed config JSON file, or - for stdin")
    add_scenario_options(p)
    p.add_argument("--hf-trainer", action="store_true",
                   help="the config is run by the HF Trainer / accelerate (they fill 'auto' and build the optimizer) "
                   "instead of deepspeed.initialize in your own script")
    p.add_argument("--accelerate-config", default=None, metavar="YAML",
                   help="the accelerate config the run is launched with (`accelerate launch --config_file`): its "
                   "num_machines and num_processes set --nodes and --gpus-per-node (reported as taken from it)")
    p.add_argument("--no-library-check", action="store_true",
                   help="skip DeepSpeed's (and, with --hf-trainer, transformers') own config validation even where "
                   "they are installed; only zeroplanner's key tables and rules are used")
    p.add_argument("--json", action="store_true", help="print one JSON object: findings, priced, from_config, "
                   "estimate")
    p.set_defaults(func=run_check)


def _steps(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--total-steps must be an integer >= 1 (got {text!r})") from None
    if value < 1 or value > 10**12:
        raise argparse.ArgumentTypeError(f"--total-steps must be an integer in [1, 1e12] (got {text!r})")
    return value


def _error(message: str) -> int:
    sys.stderr.write(f"zeroplanner: error: {message}\n")
    return EXIT_BAD_INPUT


def _finding_line(f: Finding) -> str:
    where = f" {f.key}:" if f.key else ":"
    fix = f" Fix: {f.fix}" if f.fix else ""
    return f"{f.severity}{where} {f.message}{fix}"


def _verdict(scenario, est) -> dict:
    """What the written config costs against the cluster: JSON ``verdict`` (bytes; GiB only on screen)."""
    usable = est.gpu_memory_bytes * (1 - scenario.assumptions.gpu_memory_margin_fraction)
    return {"fits": est.fits, "fits_gpu": est.fits_gpu, "fits_cpu": est.fits_cpu,
            "per_gpu_bytes": est.per_gpu_bytes.total, "gpu_memory_bytes": est.gpu_memory_bytes,
            "usable_gpu_memory_bytes": usable, "per_node_cpu_bytes": est.per_node_cpu_bytes,
            "cpu_memory_bytes": scenario.cluster.cpu_memory_bytes, "summary": est.summary()}


def _option_json(option) -> dict | None:
    from .common import estimate_json

    if option is None:
        return None
    return {"label": option.label, "changes": option.why_not, "choice": option.choice.model_dump(),
            "per_gpu_bytes": option.estimate.per_gpu_bytes.total,
            "tokens_per_second": option.estimate.tokens_per_second, "estimate": estimate_json(option.estimate)}


def run_config(args) -> int:
    from ..costmodel import estimate
    from .common import given_inputs, inputs_json, scenario_from_args

    scenario = scenario_from_args(args)
    inputs = inputs_json(args, scenario)
    if args.accelerate and not args.output:
        return _error("--accelerate: needs -o FILE (the YAML points at the DeepSpeed JSON file)")
    if args.recommend:
        from ..planner import SEARCH_INPUTS, plan

        given = given_inputs(args)
        held = sorted(set(given) & set(SEARCH_INPUTS))
        p = plan(scenario, held=held, given=given)
        if not p.fits:
            said = (f" with the options held ({', '.join(f'{k}={v}' for k, v in p.held.items())})" if held else "")
            message = f"--recommend: nothing fits this cluster{said}; no config written. {p.warnings[0]}"
            if args.json:
                sys.stdout.write(json.dumps({"inputs": inputs, "fits": False, "config": None, "held": p.held,
                                             "warnings": p.warnings, **advice_json(p), "files": []},
                                            indent=2) + "\n")
            else:
                sys.stderr.write(f"zeroplanner: {message}\n" + advice_text(p))
            return EXIT_DOES_NOT_FIT
        scenario = p.scenario
        planned = p
    else:
        planned = None
    mode = "hf_trainer" if args.hf_trainer else "deepspeed"
    if args.hf_auto and not args.hf_trainer:
        return _error("--hf-auto: needs --hf-trainer ('auto' is resolved only by the HF Trainer / accelerate)")
    try:
        yaml_text = to_accelerate_config(scenario, str(args.output), args.main_process_ip) if args.accelerate else ""
    except ValueError as exc:  # the message names the value: main_process_ip, deepspeed_config_file (-o) or sp
        option = next((o for k, o in (("main_process_ip", "--main-process-ip"),
                                      ("sequence_parallel_size", "--sequence-parallel-size")) if k in str(exc)), "-o")
        return _error(f"{option}: {exc}")
    config = to_deepspeed_config(scenario, mode=mode, total_num_steps=args.total_steps, hf_auto=args.hf_auto)
    parallelism = None
    if mode == "hf_trainer" and scenario.cluster.sequence_parallel_size > 1:
        try:
            parallelism = parallelism_config_kwargs(scenario)
        except ValueError as exc:  # Ulysses with a tensor-parallel degree: not written
            return _error(f"--sequence-parallel-size: {exc}")
    notes = generation_notes(scenario, mode, hf_auto=args.hf_auto, accelerate=args.accelerate,
                             main_process_ip=args.main_process_ip)
    findings = lint(config, scenario, mode)
    est = estimate(scenario)
    verdict = _verdict(scenario, est)
    nearest, short = None, None
    if not est.fits:
        from ..planner import nearest_fit, plan

        nearest = nearest_fit(scenario)
        if nearest is None:  # the planner's own account of what is short
            short = plan(scenario).warnings[0]
    text = json.dumps(config, indent=2) + "\n"
    files: list[str] = []
    if args.output:
        out = Path(args.output)
        try:
            out.write_text(text, encoding="utf-8")
            files.append(str(out))
            if args.accelerate:
                yaml_path = out.with_name(out.stem + ".accelerate.yaml")
                yaml_path.write_text(yaml_text, encoding="utf-8")
                files.append(str(yaml_path))
        except OSError as exc:
            return _error(f"-o {args.output!r}: {exc.strerror or exc}")
    status = EXIT_FITS if est.fits else EXIT_DOES_NOT_FIT
    if args.json:
        obj = {"inputs": inputs, "fits": est.fits, "verdict": verdict, "nearest_fit": _option_json(nearest),
               "nothing_fits": short,
               "config": config, "mode": mode, "parallelism_config": parallelism,
               "notes": [n.model_dump() for n in notes],
               "findings": [f.model_dump() for f in findings], "explain": explain_config(config, scenario),
               **(advice_json(planned) if planned is not None else {}), "files": files}
        sys.stdout.write(json.dumps(obj, indent=2) + "\n")
        return status
    if not args.output:
        sys.stdout.write(text)
    for path in files:
        sys.stderr.write(f"wrote {path}\n")
    if planned is not None:  # what the plan assumed and what to change first, as `recommend` prints them
        sys.stderr.write(advice_text(planned))
    for f in notes + [f for f in findings if f.severity != "info" or f.rule == "zero2_offload_full_weights"]:
        sys.stderr.write(_finding_line(f) + "\n")
    if args.explain:
        for key, why in explain_config(config, scenario).items():
            sys.stderr.write(f"why {key}: {why}\n")
    if args.hf_trainer:
        from ..deepspeed import hf_training_arguments

        kwargs = ", ".join(f"{k}={v!r}" for k, v in hf_training_arguments(scenario, files[0] if files else
                                                                          "ds_config.json").items())
        if parallelism is not None:  # Ulysses: accelerate's ParallelismConfig, handed over by TrainingArguments
            sys.stderr.write(parallelism_config_snippet(scenario))
            kwargs += ", parallelism_config=parallelism_config"
        sys.stderr.write(f"TrainingArguments({kwargs})\n")
    sys.stderr.write(f"verdict: {scenario.model.name}, ZeRO-{scenario.zero.stage}: {est.summary().splitlines()[0]}"
                     "\n")
    if not est.fits:
        if nearest is not None:
            sys.stderr.write(f"does not fit (exit status 1). Nearest configuration that fits: {nearest.label} "
                             f"({nearest.why_not}): {nearest.estimate.per_gpu_bytes.total / 2**30:.1f} GiB per GPU, "
                             f"{nearest.estimate.tokens_per_second:,.0f} tokens/s. Write it with the options "
                             "changed, or `zeroplanner config --recommend`.\n")
        else:
            sys.stderr.write(f"does not fit (exit status 1), and no other stage, offload, checkpointing or "
                             f"micro-batch fits this cluster either. {short}\n")
    return status


def _read_config_bytes(path: str, what: str) -> bytes:
    """The bytes of the file ``path`` given as ``what`` (``CONFIG``, ``--config``, ``--accelerate-config``), or of
    stdin for ``-``. A file is read by :func:`.common.read_input_file`: only a regular file of at most
    MAX_CONFIG_BYTES (1 MB, :data:`zeroplanner.deepspeed.MAX_CONFIG_BYTES`), else :class:`.common.UsageError`
    (one line naming ``what``, the path and what it is: a FIFO, device, directory, socket, a missing, unreadable
    or oversized file; exit status 2). Stdin: at most MAX_CONFIG_BYTES + 1 bytes, so a huge input is refused by
    the caller's length check without reading it all."""
    from .common import read_input_file

    if path == "-":
        return sys.stdin.buffer.read(MAX_CONFIG_BYTES + 1)
    return read_input_file(what, path, MAX_CONFIG_BYTES, limit_note="1 MB")


def read_config_file(path: str, what: str, mode: str) -> tuple[dict, list[Finding]]:
    """A DeepSpeed config file (or stdin for ``-``) read the way the client of ``mode`` reads it
    (:func:`zeroplanner.deepspeed.load_config_text`): (config, the reader's findings). ``what`` names it in errors
    (``CONFIG``, ``--config``). Raises :class:`.common.UsageError` (not a readable regular file, or over
    MAX_CONFIG_BYTES) or :class:`~zeroplanner.deepspeed.ConfigError` (unreadable as a config), each one line
    naming ``what`` and the path."""
    from .common import fail

    data = _read_config_bytes(path, what)
    if len(data) > MAX_CONFIG_BYTES:
        fail(what, f"{path!r} is larger than the {MAX_CONFIG_BYTES}-byte (1 MB) limit")
    try:
        return load_config_text(data, mode)
    except ConfigError as exc:
        raise ConfigError(f"{what} {path!r}: {exc}") from None


def _priced_for(args, scenario) -> tuple[dict, list[Finding]]:
    """What ``check`` prices that the config does not say: the model and shape, and where each came from."""
    from ..scenarios import DEFAULT_MODEL

    from .common import model_source

    c, t = scenario.cluster, scenario.training
    model_from = model_source(args)
    priced = {
        "model": scenario.model.name, "model_from": model_from, "parameters": scenario.parameters,
        "seq_len": t.seq_len, "gpu": c.gpu.name, "gpus_per_node": c.gpus_per_node, "nodes": c.nodes,
        "network": c.network.name, "tensor_parallel_size": c.tensor_parallel_size,
        "sequence_parallel_size": c.sequence_parallel_size,
        "data_parallel_degree": c.data_parallel_degree,
        # sample streams of the batch arithmetic: world / (tp x sp) (zeroplanner.deepspeed.deepspeed_batch_world_size)
        "batch_data_parallel_degree": c.world_size // c.tensor_parallel_size // c.sequence_parallel_size,
        "checkpointing": t.checkpointing,
        "checkpointing_from": "--checkpointing" if getattr(args, "checkpointing", None) else "default",
    }
    notes = []
    if model_from == "default":
        notes.append(Finding(
            severity="warning", key="", rule="assumed_model",
            message=f"no model named: a DeepSpeed config does not say which model it trains, so this prices the "
            f"default {DEFAULT_MODEL} ({scenario.parameters / 1e9:.2f}B parameters) at sequence length {t.seq_len} "
            f"on {c.nodes} x {c.gpus_per_node} {c.gpu.name}; the memory and step time below are for that model.",
            fix="Name the model: --model NAME (see `zeroplanner models`) or --hf-config config.json, and --seq-len."))
    return priced, notes


_FROM_CONFIG = (
    ("--stage", lambda s: s.zero.stage), ("--offload-optimizer", lambda s: s.zero.offload_optimizer.device),
    ("--offload-param", lambda s: s.zero.offload_param.device), ("--precision", lambda s: s.training.precision),
    ("--optimizer", lambda s: s.training.optimizer), ("--micro-batch", lambda s: s.training.micro_batch),
    ("--grad-accum", lambda s: s.training.grad_accum), ("--checkpointing", lambda s: s.training.checkpointing),
    ("--reduce-bucket-size", lambda s: s.zero.reduce_bucket_size),
    ("--allgather-bucket-size", lambda s: s.zero.allgather_bucket_size),
    ("tensor-parallel degree", lambda s: s.cluster.tensor_parallel_size),
    ("--sequence-parallel-size", lambda s: s.cluster.sequence_parallel_size),
    ("--tiled-mlp", lambda s: s.training.tiled_mlp), ("--tiled-loss", lambda s: s.training.tiled_loss),
)


def _from_config(base, scenario) -> tuple[dict, list[Finding]]:
    """Every priced value the config set differently from the command line (the config wins)."""
    changed = {}
    for option, get in _FROM_CONFIG:
        before, after = get(base), get(scenario)
        if before != after:
            changed[option] = {"config": after, "command_line": before}
    if not changed:
        return changed, []
    text = ", ".join(f"{k} {v['config']} (command line or its default: {v['command_line']})"
                     for k, v in changed.items())
    return changed, [Finding(severity="info", key="", rule="from_config",
                             message=f"priced with the config's values instead of the command line's: {text}.",
                             fix="")]


def _merge_library(table: list[Finding], library: list[Finding]) -> list[Finding]:
    """Library findings not already said by the tables: a keyed one unless a table error has that key, an unkeyed
    one unless the tables already found an error DeepSpeed's config classes check."""
    from ..pitfalls import config_checked

    table_keys = {f.key for f in table if f.severity == "error"}
    any_config_error = any(config_checked(f) for f in table)
    out = []
    for f in library:
        if f.key and f.key in table_keys:
            continue
        if not f.key and any_config_error:
            continue
        out.append(f)
    return out


def _accelerate_shape(path: str) -> dict[str, int]:
    """``{"nodes": n, "gpus_per_node": g, "sequence_parallel_size": sp}`` from an accelerate config YAML
    (``yaml.safe_load``: plain data, no tags executed; at most MAX_CONFIG_BYTES). accelerate's keys (accelerate
    ``commands/config/config_args.py`` ClusterConfig): ``num_machines`` nodes, ``num_processes`` processes in all,
    one per GPU, and, when there is a ``parallelism_config`` block, its ``parallelism_config_sp_size`` (the Ulysses
    degree accelerate sets up, ``sp_backend`` deepspeed). Raises UsageError naming ``--accelerate-config``."""
    import yaml

    from .common import fail

    option = "--accelerate-config"
    data = _read_config_bytes(path, option)
    if len(data) > MAX_CONFIG_BYTES:
        fail(option, f"{path!r} is larger than the {MAX_CONFIG_BYTES}-byte (1 MB) limit")
    try:
        cfg = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        fail(option, f"{path!r} is not YAML ({str(exc).splitlines()[0]})")
    if not isinstance(cfg, dict):
        fail(option, f"{path!r} must be a YAML mapping (accelerate's config file)")
    out = {}
    machines, processes = cfg.get("num_machines", 1), cfg.get("num_processes")
    for key, value in (("num_machines", machines), ("num_processes", processes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**6):
            fail(option, f"{key} must be an integer in [1, 1000000] (got {value!r})")
    out["nodes"] = machines
    if processes is not None:
        if processes % machines:
            fail(option, f"num_processes {processes} is not a multiple of num_machines {machines}")
        out["gpus_per_node"] = processes // machines
    pc = cfg.get("parallelism_config")
    if pc is not None:  # accelerate's launcher copies parallelism_config_* into its arguments (_validate_launch_command)
        if not isinstance(pc, dict):
            fail(option, "parallelism_config must be a mapping of parallelism_config_* keys")
        sp = pc.get("parallelism_config_sp_size", 1)
        if isinstance(sp, bool) or not isinstance(sp, int) or not 1 <= sp <= 1024:
            fail(option, f"parallelism_config_sp_size must be an integer in [1, 1024] (got {sp!r})")
        backend = pc.get("parallelism_config_sp_backend", "deepspeed")
        if sp > 1 and backend != "deepspeed":
            fail(option, f"parallelism_config_sp_backend {backend!r}: accelerate allows only 'deepspeed' "
                 "(parallelism_config.py)")
        out["sequence_parallel_size"] = sp
    return out


def _not_a_deepspeed_config(args, base, finding: Finding, mode: str) -> int:
    """``check``'s answer for a file that is no DeepSpeed config (a Hugging Face model config.json): that one error
    finding and nothing priced (JSON: the same keys, ``fits``, ``priced``, ``scenario`` and ``estimate`` null);
    exit status 1, the config has an error."""
    from .common import inputs_json

    if args.json:
        obj = {"inputs": inputs_json(args, base), "fits": None, "findings": [finding.model_dump()], "errors": 1,
               "warnings": 0, "mode": mode, "priced": None, "from_config": {}, "from_accelerate_config": {},
               "validated_by": None, "scenario": None, "estimate": None}
        sys.stdout.write(json.dumps(obj, indent=2) + "\n")
    else:
        sys.stdout.write(f"{_finding_line(finding)}\n1 error(s), 0 warning(s); not a DeepSpeed config, nothing "
                         f"priced; exit status {EXIT_DOES_NOT_FIT} (1 when the config has errors or does not fit)\n")
    return EXIT_DOES_NOT_FIT


def run_check(args) -> int:
    mode = "hf_trainer" if args.hf_trainer else "deepspeed"
    child = None
    if mode == "hf_trainer" and not args.no_library_check and getattr(args, "whole_process", False):
        from ..deepspeed.hf_fill import FillChild, available

        # transformers and accelerate load in a child while this process reads, prices and loads DeepSpeed
        child = FillChild() if available() else None
    try:
        return _run_check(args, mode, child)
    finally:
        if child is not None:
            child.close()


def _run_check(args, mode: str, child) -> int:
    from .common import estimate_json, inputs_json, scenario_from_args
    from ..costmodel import estimate

    try:
        config, read_findings = read_config_file(args.config_path, "CONFIG", mode)
    except ConfigError as exc:  # not readable as a config (a path that is no regular file: UsageError, exit 2)
        return _error(str(exc))
    from_accelerate: dict = {}
    if args.accelerate_config:
        from ..inputs import BY_KEY

        for key, value in _accelerate_shape(args.accelerate_config).items():
            before = getattr(args, key)
            before = before if before is not None else BY_KEY[key].default
            if before != value:
                from_accelerate[BY_KEY[key].cli_flag] = {"accelerate_config": value, "command_line": before}
            setattr(args, key, value)
    base = scenario_from_args(args)
    not_deepspeed = hf_model_config_finding(config, "config.json" if args.config_path == "-" else args.config_path)
    if not_deepspeed is not None:  # a model config.json: its keys are no DeepSpeed keys, and nothing is priced
        return _not_a_deepspeed_config(args, base, not_deepspeed, mode)
    try:
        scenario, parse_findings = from_deepspeed_config(config, base=base, mode=mode)
    except ConfigError as exc:
        return _error(f"CONFIG {args.config_path!r}: {exc}")
    priced, assumption_notes = _priced_for(args, scenario)
    from_config, override_notes = _from_config(base, scenario)
    if from_accelerate:
        said = ", ".join(f"{k} {v['accelerate_config']} (command line or its default: {v['command_line']})"
                         for k, v in from_accelerate.items())
        override_notes.append(Finding(severity="info", key="", rule="from_accelerate_config", fix="",
                                      message=f"priced with the accelerate config's shape ({args.accelerate_config}) "
                                      f"instead of the command line's: {said}."))
        priced["cluster_from"] = args.accelerate_config
    assumption_notes += override_notes
    findings = read_findings + lint(config, scenario, mode) + parse_findings
    validated_by = None
    if not args.no_library_check:
        from ..deepspeed.library import library_findings, library_versions

        library = library_findings(config, scenario, mode, child)
        if library is not None:
            versions = library_versions() or {}
            names = [f"deepspeed {versions.get('deepspeed', '?')} DeepSpeedConfig"]
            if mode == "hf_trainer":
                names.insert(0, f"transformers {versions.get('transformers', '?')} HfTrainerDeepSpeedConfig, "
                             "accelerate's DeepSpeedPlugin")
            validated_by = names
            findings += _merge_library(findings, library)
    if validated_by is None:
        findings.append(Finding(severity="info", key="", rule="library_check",
                                message="checked with zeroplanner's key tables only (DeepSpeed's own config classes "
                                "not installed or --no-library-check).", fix=""))
    else:
        findings.append(Finding(severity="info", key="", rule="library_check",
                                message="also handed to the installed libraries' own config classes the way the client "
                                f"fills and reads the config: {', then '.join(validated_by)}"
                                + (" (any error they raised is among the findings above)."
                                   if any(f.severity == "error" for f in findings) else "; they accepted it."),
                                fix=""))
    findings = order_findings([*findings, *assumption_notes])  # each once, errors first (text and JSON alike)
    try:
        est = estimate(scenario)
    except ValueError as exc:
        return _error(f"CONFIG {args.config_path!r}: cannot estimate this scenario: {str(exc).splitlines()[0]}")
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    status = EXIT_DOES_NOT_FIT if errors or not est.fits else EXIT_FITS
    if args.json:
        obj = {
            "inputs": inputs_json(args, scenario),
            "fits": est.fits,
            "findings": [f.model_dump() for f in findings],
            "errors": errors,
            "warnings": warnings,
            "mode": mode,
            "priced": priced,
            "from_config": from_config,
            "from_accelerate_config": from_accelerate,
            "validated_by": validated_by,
            "scenario": {"training": scenario.training.model_dump(), "zero": scenario.zero.model_dump()},
            "estimate": estimate_json(est),
        }
        sys.stdout.write(json.dumps(obj, indent=2) + "\n")
    else:
        z, t, c = scenario.zero, scenario.training, scenario.cluster
        lines = [_finding_line(f) for f in findings]
        sp = c.sequence_parallel_size
        lines.append(
            f"Read as: ZeRO-{z.stage}, offload_optimizer={z.offload_optimizer.device}, "
            f"offload_param={z.offload_param.device}, {t.precision}, {t.optimizer}, micro-batch {t.micro_batch} x "
            f"gradient accumulation {t.grad_accum} x data-parallel degree "
            f"{c.world_size // c.tensor_parallel_size // sp}"
            + (f" (tensor-parallel {c.tensor_parallel_size})" if c.tensor_parallel_size > 1 else "")
            + (f" (Ulysses sequence-parallel {sp}: {sp} GPUs per sample)" if sp > 1 else "")
        )
        origin = "default, no model named" if priced["model_from"] == "default" else priced["model_from"]
        lines.append(
            f"Priced for: {priced['model']} ({origin}), "
            f"sequence length {priced['seq_len']}, {priced['nodes']} x {priced['gpus_per_node']} {priced['gpu']}, "
            f"{priced['network']}, activation checkpointing {priced['checkpointing']}"
            + (" (default: a DeepSpeed config does not say; --checkpointing)"
               if priced["checkpointing_from"] == "default" else "")
            + (f", Ulysses degree {sp}" if sp > 1 else "")
            + ("".join(f", {name}" for name, on in (("tiled MLP", t.tiled_mlp), ("tiled loss", t.tiled_loss),
                                                    ("checkpoint offload", t.checkpoint_offload)) if on))
        )
        summary = est.summary() if hasattr(est, "summary") else ""
        lines.append(summary)
        if mode == "deepspeed" and any(f.rule == "auto_outside_hf" for f in findings):
            lines.append("hint: this config has \"auto\" fields; if you launch it through the HF Trainer or "
                         "accelerate, run `zeroplanner check --hf-trainer ...` to read it the way they fill it.")
        lines.append(f"{errors} error(s), {warnings} warning(s), " + ("fits" if est.fits else "does NOT fit")
                     + f"; exit status {status} (1 when the config has errors or does not fit)")
        sys.stdout.write("\n".join(x for x in lines if x) + "\n")
    return status
