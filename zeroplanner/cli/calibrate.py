"""``zeroplanner calibrate [scenario options] --ranks N --steps K [--device cpu|cuda] [--json]``.

Subcommand module of :mod:`zeroplanner.cli`: runs the real DeepSpeed engine on ``--ranks`` local ranks
with a tiny model of the scenario's architecture and the DeepSpeed config zeroplanner generates, and prints the
cost model's prediction beside the measurement, term by term (:func:`zeroplanner.calibrate.run_calibration`).
Torch, DeepSpeed and transformers are imported only when the command runs.

Exit status: 0 with a report; 2 for a bad option (one line naming it); 1 when the engine could not run
(missing package, launcher failure, timeout), with one line saying why.

Example::

    zeroplanner calibrate --model mistral-7b --stage 3 --ranks 2 --steps 3 --json > calibration.json

Across nodes, ``--distributed`` runs as one rank of the user's torchrun / deepspeed / srun job instead of
launching local ranks (:mod:`zeroplanner.calibrate.distributed`; ``zeroplanner launch-script`` prints the
command); rank 0 writes one report (``-o``: JSON, and text beside it) that ``--cluster-from`` accepts.
"""

from __future__ import annotations

import json
import sys


def _int_in(name: str, low: int, high: int):
    def parse(text: str) -> int:
        import argparse

        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer in [{low}, {high}] (got {text!r})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be an integer in [{low}, {high}] (got {text!r})")
        return value

    return parse


def register(subparsers, add_scenario_options) -> None:
    """Add ``calibrate`` to the ``zeroplanner`` command (:mod:`zeroplanner.cli` registers each module)."""
    parser = subparsers.add_parser(
        "calibrate",
        help="run real DeepSpeed on a tiny copy of the model and compare the cost model with the measurement",
        description="Launch DeepSpeed (gloo on CPU ranks, NCCL on CUDA) on a scaled-down model of the scenario's "
        "architecture with zeroplanner's DeepSpeed config; measure per rank the live tensor storages by category, "
        "the bytes per collective from DeepSpeed's comms logger and the forward/backward/step seconds; print "
        "predicted vs measured with the relative error per term.",
    )
    add_scenario_options(parser)
    g = parser.add_argument_group("calibration")
    g.add_argument("--ranks", type=_int_in("--ranks", 1, 64), default=None, help="local ranks to launch (default 2)")
    g.add_argument("--steps", type=_int_in("--steps", 2, 100), default=3, help="optimizer steps (default 3)")
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo) or cuda (NCCL) (default cpu)")
    g.add_argument("--timeout", type=_int_in("--timeout", 10, 86_400), default=600,
                   help="seconds before the launch is killed (default 600)")
    g.add_argument("--calibration-seq-len", type=_int_in("--calibration-seq-len", 8, 65_536), default=64,
                   help="sequence length of the tiny run (default 64)")
    g.add_argument("--out", default=None, metavar="DIR", help="keep the per-rank raw JSON in DIR")
    d = parser.add_argument_group("across nodes (run as one rank of a torchrun / deepspeed / srun job)")
    d.add_argument("--distributed", action="store_true",
                   help="join the launcher's job (RANK, WORLD_SIZE, MASTER_ADDR... or SLURM_*): measure the "
                   "collectives per level, run DeepSpeed across all ranks; rank 0 writes the report (-o)")
    d.add_argument("-o", "--output", default=None, metavar="REPORT_JSON",
                   help="with --distributed: the report rank 0 writes (text beside it as .txt)")
    d.add_argument("--node-id", default=None, help="this rank's node name (default: $ZEROPLANNER_NODE_ID, else "
                   "the host name); only to simulate several nodes on one machine")
    d.add_argument("--budget-seconds", type=_int_in("--budget-seconds", 1, 600), default=20,
                   help="time budget of the collective sweep over all levels (default 20)")
    d.add_argument("--rendezvous-timeout", type=_int_in("--rendezvous-timeout", 5, 3600), default=120,
                   help="seconds to wait for every rank, and bound on each collective (default 120)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args) -> int:
    """Handler: 0 with a report, 2 for a bad option, 1 when the engine could not run."""
    from ..calibrate import CalibrationError, run_calibration
    from .common import fail, scenario_from_args

    scenario = scenario_from_args(args)
    if args.distributed:
        return _run_distributed(args, scenario)
    if args.output:
        print("zeroplanner: error: --output: only with --distributed (without it, --json prints the report and --out "
              "keeps the raw per-rank files)", file=sys.stderr)
        return 2
    try:
        report = run_calibration(scenario, ranks=args.ranks or 2, steps=args.steps, device=args.device,
                                 timeout_seconds=float(args.timeout), seq_len=args.calibration_seq_len,
                                 out_dir=args.out)
    except ValueError as exc:
        fail("--ranks/--steps/--device", str(exc))
    except CalibrationError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"zeroplanner calibrate: error: {first}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.model_dump(), indent=1))
    else:
        print(report.table())
    return 0


def _run_distributed(args, scenario) -> int:
    """``--distributed``: 0 with a report (rank 0 prints it) or on the other ranks, 1 when the job failed."""
    from ..calibrate import CalibrationError
    from ..calibrate.distributed import run_distributed_calibration
    from ..probe.distributed import DistributedError, fail_message, format_report_text
    from .common import fail

    if args.ranks is not None:
        fail("--ranks", "not with --distributed (the launcher decides the ranks)")
    try:
        report = run_distributed_calibration(
            scenario, steps=args.steps, device=args.device, seq_len=args.calibration_seq_len,
            budget_seconds=float(args.budget_seconds), node_id=args.node_id,
            rendezvous_timeout_seconds=float(args.rendezvous_timeout), output=args.output)
    except (DistributedError, CalibrationError) as exc:
        print(f"zeroplanner calibrate: error: {fail_message(exc)}", file=sys.stderr)
        return 1
    if report is not None:
        print(json.dumps(report, indent=1) if args.json else format_report_text(report))
    return 0
