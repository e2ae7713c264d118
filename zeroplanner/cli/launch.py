"""``zeroplanner launch-script --launcher {torchrun,deepspeed,slurm} --nodes N --gpus-per-node G``: the command
(or sbatch script, and the DeepSpeed hostfile) that runs ``zeroplanner probe --distributed`` or ``zeroplanner
calibrate --distributed`` on N nodes with the user's own launcher, so a user copies one line.

Subcommand module of :mod:`zeroplanner.cli`. Pure text: nothing is run or contacted. Host names and
addresses are checked against a conservative pattern and extra arguments are shell-quoted, so the printed line
is safe to paste. Launcher flags are the launchers' own:

- torchrun (torch/distributed/run.py): ``--nnodes``, ``--nproc-per-node``, ``--rdzv-backend c10d``,
  ``--rdzv-endpoint HOST:PORT``, ``--rdzv-id``; the same line on every node, the c10d rendezvous numbers them;
- DeepSpeed's launcher (deepspeed/launcher/runner.py): ``--hostfile`` (lines ``HOST slots=G``), ``--num_nodes``,
  ``--num_gpus``, ``--master_addr``, ``--master_port``, ``--module``, ``--no_local_rank``; pdsh over ssh from the
  first node, or ``--no_ssh --node_rank I`` on each node;
- Slurm (sbatch/srun man pages): ``#SBATCH --nodes``, ``--ntasks-per-node``, ``--gpus-per-node``, ``--time``;
  ``srun --kill-on-bad-exit=1`` ends the step when one task fails.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from typing import Any

LAUNCHERS = ("torchrun", "deepspeed", "slurm")
DEFAULT_PORT = 29500
"""torchrun's default ``--master-port`` and DeepSpeed's ``TORCH_DISTRIBUTED_DEFAULT_PORT`` (deepspeed/constants.py)."""
DEFAULT_OUTPUT = "zeroplanner_cluster.json"
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")


def _check_host(option: str, host: str) -> str:
    from .common import fail

    if not _HOST.match(host):
        fail(option, f"{host!r} is not a host name or address (letters, digits, '.', '-', '_', ':')")
    return host


def build_launch(launcher: str, nodes: int, gpus_per_node: int, *, task: str = "probe", master_addr: str | None = None,
                 master_port: int = DEFAULT_PORT, hosts: list[str] | None = None, output: str = DEFAULT_OUTPUT,
                 device: str = "cuda", python: str = "python3", time_limit: str = "00:30:00",
                 extra: list[str] | None = None) -> dict[str, Any]:
    """The launch for ``launcher``: ``{"launcher", "nodes", "gpus_per_node", "world_size", "master_addr",
    "master_port", "task_command" (the zeroplanner argv every rank runs), "commands" (lines to run, in order),
    "per_node" (True when every node runs the lines), "hostfile" (DeepSpeed) , "script" (Slurm sbatch), "text"}``.
    Raises :class:`zeroplanner.cli.UsageError` (exit 2) naming the option for a bad value."""
    from .common import fail

    if launcher not in LAUNCHERS:
        fail("--launcher", f"{launcher!r}; allowed: {', '.join(LAUNCHERS)}")
    if not 1 <= nodes <= 100_000:
        fail("--nodes", f"{nodes} is out of range (1-100000)")
    if not 1 <= gpus_per_node <= 64:
        fail("--gpus-per-node", f"{gpus_per_node} is out of range (1-64)")
    if not 1 <= master_port <= 65535:
        fail("--master-port", f"{master_port} is out of range (1-65535)")
    hosts = [_check_host("--hosts", h) for h in (hosts or [])]
    if hosts and len(hosts) != nodes:
        fail("--hosts", f"{len(hosts)} hosts given for --nodes {nodes}")
    if master_addr is not None:
        _check_host("--master-addr", master_addr)
    elif hosts:
        master_addr = hosts[0]
    elif launcher != "slurm":
        fail("--master-addr", "give the first node's address (or --hosts with one name per node)")
    if not re.match(r"^\d{1,3}:\d{2}:\d{2}$", time_limit):
        fail("--time", f"{time_limit!r}: expected HH:MM:SS")
    task_argv = ["-m", "zeroplanner.cli", task, "--distributed", "-o", output]
    if task == "calibrate":
        task_argv += ["--device", device]
    task_argv += list(extra or [])
    task_text = " ".join(shlex.quote(a) for a in task_argv[2:])  # after "-m zeroplanner.cli"
    world = nodes * gpus_per_node
    out: dict[str, Any] = {"launcher": launcher, "nodes": nodes, "gpus_per_node": gpus_per_node, "world_size": world,
                           "master_addr": master_addr, "master_port": master_port,
                           "task_command": ["zeroplanner", *task_argv[2:]], "hostfile": None, "script": None}
    rdzv_id = f"zeroplanner-{task}"
    if launcher == "torchrun":
        line = (f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} --rdzv-backend c10d "
                f"--rdzv-endpoint {master_addr}:{master_port} --rdzv-id {rdzv_id} -m zeroplanner.cli {task_text}")
        out.update(commands=[line], per_node=True)
        text = [(f"# torchrun: run this same line on each of the {nodes} nodes ({world} ranks, {gpus_per_node} per "
                f"node; the c10d rendezvous at {master_addr}:{master_port} numbers the nodes; rank 0 writes "
                f"{output} and its .txt)"), line]
    elif launcher == "deepspeed":
        if not hosts and nodes > 1:
            fail("--hosts", f"the DeepSpeed hostfile needs the {nodes} node names, node 0 first")
        names = hosts or [master_addr]
        hostfile = "".join(f"{h} slots={gpus_per_node}\n" for h in names)
        common = (f"--hostfile hostfile --num_nodes {nodes} --num_gpus {gpus_per_node} --master_addr {master_addr} "
                  f"--master_port {master_port} --no_local_rank --module zeroplanner.cli {task_text}")
        line = f"deepspeed {common}"
        no_ssh = f"deepspeed --no_ssh --node_rank NODE_RANK {common}"
        out.update(commands=[line], per_node=False, hostfile=hostfile, no_ssh_command=no_ssh)
        text = ["# hostfile (DeepSpeed's format: one line per node, slots = GPUs; save as ./hostfile)",
                *hostfile.splitlines(),
                (f"# on {names[0]}: the launcher starts {gpus_per_node} ranks on each of the {nodes} nodes over pdsh "
                f"(passwordless ssh); rank 0 writes {output} and its .txt"),
                line,
                ("# without ssh: run on each node, NODE_RANK = its line in the hostfile (0 .. "
                f"{nodes - 1})"),
                no_ssh]
    else:
        gpu_line = [f"#SBATCH --gpus-per-node={gpus_per_node}"] if device == "cuda" else []
        addr = (f"export MASTER_ADDR={master_addr}" if master_addr else
                'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
        srun = f"srun --kill-on-bad-exit=1 {python} -m zeroplanner.cli {task_text}"
        script = "\n".join([
            "#!/bin/bash",
            f"#SBATCH --job-name=zeroplanner-{task}",
            f"#SBATCH --nodes={nodes}",
            f"#SBATCH --ntasks-per-node={gpus_per_node}",
            *gpu_line,
            f"#SBATCH --time={time_limit}",
            "#SBATCH --output=zeroplanner-%j.log",
            "set -euo pipefail",
            ("# node 0 of the allocation hosts the rendezvous; every task reads SLURM_PROCID, SLURM_NTASKS, "
            "SLURM_LOCALID, SLURM_NODEID"),
            addr,
            f"export MASTER_PORT={master_port}",
            srun,
        ]) + "\n"
        out.update(commands=["sbatch zeroplanner_launch.sbatch"], per_node=False, script=script)
        lines = script.splitlines()  # sbatch needs "#!" on the first line: the note goes after it
        text = [lines[0], (f"# save as zeroplanner_launch.sbatch and submit with: sbatch zeroplanner_launch.sbatch "
                           f"({nodes} nodes x {gpus_per_node} tasks; rank 0 writes {output} and its .txt)"),
                *lines[1:]]
    out["text"] = "\n".join(text)
    return out


def register(subparsers, add_scenario_options=None) -> None:
    """Add ``launch-script`` to the ``zeroplanner`` command (:mod:`zeroplanner.cli` registers each module)."""
    import argparse

    parser = subparsers.add_parser(
        "launch-script",
        help="print the torchrun / deepspeed / sbatch command that runs probe or calibrate across N nodes",
        description="Print the exact command (torchrun), hostfile and command (DeepSpeed launcher) or sbatch script "
        "(Slurm) that runs 'zeroplanner probe --distributed' or 'zeroplanner calibrate --distributed' as one rank "
        "per GPU on every node. Arguments after '--' are passed to the task.",
    )
    parser.add_argument("--launcher", choices=LAUNCHERS, required=True,
                        help="the launcher your cluster uses: torchrun (one line per node), deepspeed (hostfile + "
                        "one command), slurm (an sbatch script)")
    parser.add_argument("--nodes", type=int, required=True, help="number of nodes (1-100000)")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="ranks (GPUs) per node (1-64)")
    parser.add_argument("--task", choices=("probe", "calibrate"), default="probe",
                        help="what every rank runs: probe (collective benchmarks per level) or calibrate (a real "
                        "DeepSpeed step of the scaled-down model); default probe")
    parser.add_argument("--master-addr", default=None, help="address of node 0 (default: the first of --hosts; "
                        "Slurm: the first node of the allocation)")
    parser.add_argument("--master-port", type=int, default=DEFAULT_PORT, help=f"rank 0's rendezvous port (default {DEFAULT_PORT})")
    parser.add_argument("--hosts", default=None, help="comma-separated node names, node 0 first (DeepSpeed hostfile)")
    parser.add_argument("-o", "--output", default=DEFAULT_OUTPUT, help=f"report rank 0 writes (default {DEFAULT_OUTPUT})")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="calibrate's --device; Slurm: "
                        "cpu drops --gpus-per-node (default cuda)")
    parser.add_argument("--python", default="python3", help="interpreter in the sbatch script (default python3)")
    parser.add_argument("--time", default="00:30:00", help="sbatch --time limit, HH:MM:SS (default 30 min: "
                        "zeroplanner's margin over the 1-2 min probe + 1-3 min calibration scripts/gpu_probe.sh budgets for)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then arguments for the task")
    parser.set_defaults(func=run)


def run(args) -> int:
    """Handler: 0 with the launch text (or JSON), 2 for a bad option."""
    extra = list(args.extra or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    if not re.match(r"^[A-Za-z0-9_./+-]{1,200}$", args.python):
        print(f"zeroplanner: error: --python: {args.python!r} is not an interpreter path", file=sys.stderr)
        return 2
    out = build_launch(args.launcher, args.nodes, args.gpus_per_node, task=args.task,
                       master_addr=args.master_addr, master_port=args.master_port,
                       hosts=[h.strip() for h in args.hosts.split(",") if h.strip()] if args.hosts else None,
                       output=args.output, device=args.device, python=args.python, time_limit=args.time,
                       extra=extra)  # a bad option raises UsageError: zeroplanner.cli.main prints it, exit 2
    print(json.dumps(out, indent=1) if args.json else out["text"])
    return 0
