"""Issue 16: probe and calibrate as ranks of the user's own multi-node job, and the launch scripts for it.

Engine tests (marker ``engine``) run real jobs on this machine as 2 pretend nodes (``ZEROPLANNER_NODE_ID`` per
node; every address is 127.0.0.1 and gloo is bound to ``lo``): torchrun with its c10d rendezvous (the command
``zeroplanner launch-script --launcher torchrun`` prints), the DeepSpeed launcher in its ``--no_ssh`` mode with a
hostfile, and Slurm's environment variables set by the test (no Slurm here). Each launch runs once per module.
The other tests are pure: the launcher environment, Slurm node lists, the generated scripts (parsed by torchrun's
and DeepSpeed's own argument parsers).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zeroplanner.cli.launch import build_launch
from zeroplanner.probe import cluster_changes, cluster_from_probe, load_probe
from zeroplanner.probe._worker import busbw_factor
from zeroplanner.probe.benchmarks import CPU_MESSAGE_BYTES, GPU_MESSAGE_BYTES
from zeroplanner.probe.distributed import (
    DistributedError,
    launcher_environment,
    parse_slurm_nodelist,
)

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "GROUP_RANK", "CROSS_RANK", "CROSS_SIZE", "ZEROPLANNER_NODE_ID")


# ------------------------------------------------------------------------------------------------------------
# The launcher's environment (pure)
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, hosts", [
    ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
    ("node7", ["node7"]),
    ("a-[1-2]-x[3,4]", ["a-1-x3", "a-1-x4", "a-2-x3", "a-2-x4"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
])
def test_parse_slurm_nodelist(text, hosts):
    # the expansions scontrol show hostnames prints for these lists (Slurm's hostlist syntax, zero padding kept)
    assert parse_slurm_nodelist(text) == hosts


@pytest.mark.parametrize("text, match", [("gpu[01-", "unbalanced"), ("gpu[3-1]", "descending"),
                                         ("gpu[a]", "bad range")])
def test_parse_slurm_nodelist_rejects(text, match):
    with pytest.raises(ValueError, match=match):
        parse_slurm_nodelist(text)


def test_launcher_environment_torchrun_deepspeed_slurm():
    torchrun = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "x"}
    assert launcher_environment(torchrun) == {
        "launcher": "torchrun", "rank": 5, "world_size": 8, "local_rank": 1, "local_world_size": 4, "node_rank": 1,
        "master_addr": "10.1.2.3", "master_port": 29400}
    # deepspeed/launcher/launch.py exports LOCAL_SIZE and CROSS_RANK (the node rank), not LOCAL_WORLD_SIZE
    ds = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_SIZE": "2", "CROSS_RANK": "1",
          "MASTER_ADDR": "h0", "MASTER_PORT": "29500"}
    info = launcher_environment(ds)
    assert (info["launcher"], info["local_world_size"], info["node_rank"]) == ("deepspeed", 2, 1)
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
             "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]"}
    assert launcher_environment(slurm) == {
        "launcher": "slurm", "rank": 3, "world_size": 4, "local_rank": 1, "local_world_size": 2, "node_rank": 1,
        "master_addr": "gpu07", "master_port": 29500}
    given = launcher_environment({**slurm, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "1234"})
    assert given["master_addr"] == "10.0.0.9"


@pytest.mark.parametrize("env, match", [
    ({}, "not started by a distributed launcher"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "rank 2 is not below"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK='x'"),
    ({"SLURM_PROCID": "0"}, "SLURM_NTASKS is not set"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "no master address"),
])
def test_launcher_environment_errors_name_the_variable(env, match):
    with pytest.raises(DistributedError, match=match):
        launcher_environment(env)


def test_cluster_changes_take_nodes_and_gpus_from_a_report():
    from zeroplanner.scenarios import default_scenario

    base = default_scenario().cluster
    changes, notes = cluster_changes({"cuda_available": False, "cluster": {"nodes": 3, "gpus_per_node": 4}}, base)
    assert (changes["nodes"], changes["gpus_per_node"]) == (3, 4)
    assert any("nodes: 3, GPUs per node: 4" in n for n in notes)
    with pytest.raises(ValueError, match="cluster.nodes"):
        cluster_changes({"cuda_available": False, "cluster": {"nodes": 0, "gpus_per_node": 4}}, base)


def test_calibration_sweeps_the_scenarios_bucket_sizes():
    from zeroplanner.calibrate.distributed import zero_message_bytes
    from zeroplanner.scenarios import build_scenario

    # DeepSpeed's default reduce_bucket_size / allgather_bucket_size: 5e8 elements (deepspeed/runtime/zero/config.py),
    # 2 bytes each in bf16; ZeRO-3 prefetches stage3_prefetch_bucket_size = 5e7 elements
    assert 10**9 in zero_message_bytes(build_scenario(stage=2), "cuda")
    assert {10**9, 10**8} <= set(zero_message_bytes(build_scenario(stage=3), "cuda"))
    assert 2 * 10**6 * 4 in zero_message_bytes(build_scenario(stage=2, precision="fp32",
                                                              zero_overrides={"reduce_bucket_size": 2 * 10**6}), "cuda")
    assert max(zero_message_bytes(build_scenario(), "cpu")) == 2**24  # capped on CPU ranks


# ------------------------------------------------------------------------------------------------------------
# launch-script: content, and parsed by the launchers' own parsers
# ------------------------------------------------------------------------------------------------------------
def test_launch_script_torchrun_is_what_torchrun_parses():
    from torch.distributed.run import get_args_parser

    out = build_launch("torchrun", 4, 8, master_addr="10.0.0.1", master_port=29611, extra=["--budget-seconds", "60"])
    assert out["world_size"] == 32 and out["per_node"] is True
    (line,) = out["commands"]
    argv = shlex.split(line)
    assert argv[0] == "torchrun"
    args = get_args_parser().parse_args(argv[1:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint) == ("4", "8", "c10d",
                                                                                            "10.0.0.1:29611")
    assert args.module and args.training_script == "zeroplanner.cli"
    assert args.training_script_args == ["probe", "--distributed", "-o", "zeroplanner_cluster.json",
                                         "--budget-seconds", "60"]


def test_launch_script_deepspeed_hostfile_and_command():
    from deepspeed.launcher.runner import parse_args

    out = build_launch("deepspeed", 2, 4, hosts=["gpu-a", "gpu-b"], master_port=29612, task="calibrate",
                       extra=["--model", "llama-2-7b"])
    assert out["hostfile"] == "gpu-a slots=4\ngpu-b slots=4\n"
    assert out["master_addr"] == "gpu-a"
    for line in (out["commands"][0], out["no_ssh_command"].replace("NODE_RANK", "1")):
        args = parse_args(shlex.split(line)[1:])
        assert (args.num_nodes, args.num_gpus, args.master_addr, args.master_port) == (2, 4, "gpu-a", 29612)
        assert args.module and args.no_local_rank and args.user_script == "zeroplanner.cli"
        assert args.user_args == ["calibrate", "--distributed", "-o", "zeroplanner_cluster.json", "--device", "cuda",
                                  "--model", "llama-2-7b"]
    assert parse_args(shlex.split(out["no_ssh_command"].replace("NODE_RANK", "1"))[1:]).node_rank == 1


def test_launch_script_deepspeed_hostfile_is_read_by_deepspeed(tmp_path):
    from deepspeed.launcher.runner import fetch_hostfile

    out = build_launch("deepspeed", 3, 2, hosts=["h0", "h1", "h2"])
    path = tmp_path / "hostfile"
    path.write_text(out["hostfile"])
    assert dict(fetch_hostfile(str(path))) == {"h0": 2, "h1": 2, "h2": 2}


def test_launch_script_slurm_sbatch():
    out = build_launch("slurm", 4, 8, master_port=29613, time_limit="01:00:00")
    lines = out["script"].splitlines()
    assert lines[0] == "#!/bin/bash"
    for expected in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                     "#SBATCH --time=01:00:00", "export MASTER_PORT=29613",
                     'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'):
        assert expected in lines
    assert lines[-1] == ("srun --kill-on-bad-exit=1 python3 -m zeroplanner.cli probe --distributed "
                         "-o zeroplanner_cluster.json")
    cpu = build_launch("slurm", 2, 2, device="cpu", task="calibrate")["script"]
    assert "--gpus-per-node" not in cpu and "calibrate --distributed -o zeroplanner_cluster.json --device cpu" in cpu


def test_launch_script_quotes_extra_arguments_and_rejects_bad_values(capsys):
    from zeroplanner import cli

    out = build_launch("torchrun", 2, 1, master_addr="h", extra=["--hf-config", "my dir/config.json"])
    assert out["commands"][0].endswith("--hf-config 'my dir/config.json'")
    for argv, option in ((["--launcher", "torchrun", "--nodes", "2", "--gpus-per-node", "8"], "--master-addr"),
                         (["--launcher", "deepspeed", "--nodes", "2", "--gpus-per-node", "8", "--master-addr", "a"],
                          "--hosts"),
                         (["--launcher", "torchrun", "--nodes", "2", "--gpus-per-node", "65", "--master-addr", "a"],
                          "--gpus-per-node"),
                         (["--launcher", "torchrun", "--nodes", "2", "--gpus-per-node", "8", "--master-addr",
                           "a;rm -rf /"], "--master-addr"),
                         (["--launcher", "slurm", "--nodes", "2", "--gpus-per-node", "8", "--master-port", "70000"],
                          "--master-port")):
        assert cli.main(["launch-script", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and option in err[0]
    assert cli.main(["launch-script", "--launcher", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 8


# ------------------------------------------------------------------------------------------------------------
# Real jobs: 2 pretend nodes on 127.0.0.1
# ------------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV and not k.startswith(("SLURM_", "TORCHELASTIC"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="",
               GLOO_SOCKET_IFNAME="lo")
    env.update(extra)
    return env


def _listening(roots: set[int], roots_are_ranks: bool = False) -> set[str]:
    """Local addresses of the TCP sockets in LISTEN state (/proc/net/tcp{,6} state 0A) held by the processes
    below ``roots`` (descendants by parent pid, their /proc/PID/fd links ``socket:[inode]``), each as
    ``"launcher ADDR:PORT"`` for a root process (the launcher the test started, unless ``roots_are_ranks``: srun's
    tasks, which the test starts itself) or ``"rank ADDR:PORT"``."""
    import ipaddress

    parent = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                parent[int(pid)] = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    owner: dict[str, str] = {}
    for pid in parent:
        p, role = pid, None
        while p in parent and p > 1:
            if p in roots:
                role = "launcher" if p == pid and not roots_are_ranks else "rank"
                break
            p = parent[p]
        if role is None:
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    owner.setdefault(link[8:-1], role)
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                parts = line.split()
                if parts[3] != "0A" or parts[9] not in owner:
                    continue
                hexip, port = parts[1].split(":")
                raw = bytes.fromhex(hexip)
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # 32-bit words, little-endian
                found.add(f"{owner[parts[9]]} {ipaddress.ip_address(raw)}:{int(port, 16)}")
    return found


def _run_all(cmds: list[tuple[list[str], dict[str, str]]], timeout: float,
             listening: set[str] | None = None, roots_are_ranks: bool = False) -> list[tuple[int, str]]:
    """Start every (argv, env) in its own session at once; kill every session after ``timeout`` seconds. With a
    ``listening`` set, the listening addresses of the sessions' processes are sampled into it while they run."""
    import time

    procs = [subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for argv, env in cmds]
    if listening is not None:
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            listening |= _listening({p.pid for p in procs}, roots_are_ranks)
            time.sleep(0.5)
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = p.communicate()
            pytest.fail(f"distributed job did not finish within {timeout} s:\n{out[-3000:]}")
        results.append((p.returncode, out))
    for code, out in results:
        assert code == 0, out[-4000:]
    return results


def _torchrun(task_args: list[str], nodes: int, per_node: int, out: Path, timeout: float, cuda: bool = False) -> dict:
    """The torchrun line ``launch-script`` prints, run once per pretend node (``--local-addr`` keeps torchrun's
    agent on loopback). ``cuda``: each pretend node sees its own ``per_node`` GPUs."""
    port = _free_port()
    launch = build_launch("torchrun", nodes, per_node, master_addr="127.0.0.1", master_port=port,
                          task=task_args[0], output=str(out), device="cuda" if cuda else "cpu", extra=task_args[1:])
    argv = shlex.split(launch["commands"][0])
    assert argv[0] == "torchrun"
    argv = [sys.executable, "-m", "torch.distributed.run", "--local-addr", "127.0.0.1", *argv[1:]]
    cmds = []
    for i in range(nodes):
        devices = ",".join(str(i * per_node + k) for k in range(per_node)) if cuda else ""
        cmds.append((argv, _env(ZEROPLANNER_NODE_ID=f"node{i}", CUDA_VISIBLE_DEVICES=devices)))
    listening: set[str] = set()
    _run_all(cmds, timeout, listening)
    report = load_probe(out)
    report["_listening"] = sorted(listening)
    return report


CALIBRATE = ["calibrate", "--model", "gpt2", "--steps", "2", "--budget-seconds", "4", "--rendezvous-timeout", "60"]


@pytest.fixture(scope="module")
def torchrun_probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("torchrun_probe") / "cluster.json"
    return _torchrun(["probe", "--budget-seconds", "6", "--rendezvous-timeout", "60"], 2, 2, path, 150), path


@pytest.fixture(scope="module")
def torchrun_calibration(tmp_path_factory):
    path = tmp_path_factory.mktemp("torchrun_cal") / "cluster.json"
    return _torchrun(CALIBRATE, 2, 1, path, 200), path


@pytest.fixture(scope="module")
def deepspeed_calibration(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deepspeed_cal")
    port, path = _free_port(), tmp / "cluster.json"
    launch = build_launch("deepspeed", 2, 1, hosts=["node0", "node1"], master_addr="127.0.0.1", master_port=port,
                          task="calibrate", output=str(path), device="cpu", extra=CALIBRATE[1:])
    (tmp / "hostfile").write_text(launch["hostfile"])
    cmds = []
    for i in range(2):
        argv = shlex.split(launch["no_ssh_command"].replace("NODE_RANK", str(i)))
        argv = [sys.executable, "-m", "deepspeed.launcher.runner", *argv[1:]]
        argv[argv.index("--hostfile") + 1] = str(tmp / "hostfile")
        cmds.append((argv, _env(ZEROPLANNER_NODE_ID=f"node{i}")))
    listening: set[str] = set()
    _run_all(cmds, 200, listening)
    report = load_probe(path)
    report["_listening"] = sorted(listening)
    return report, path


@pytest.fixture(scope="module")
def slurm_calibration(tmp_path_factory):
    """What srun exports to each task of a 2-node step with 1 task per node; the master address comes from the
    node list (its first host), the port from MASTER_PORT as the sbatch script exports it."""
    path = tmp_path_factory.mktemp("slurm_cal") / "cluster.json"
    port = _free_port()
    cmds = []
    for i in range(2):
        env = _env(SLURM_PROCID=str(i), SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_NODEID=str(i),
                   SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_STEP_NODELIST="127.0.0.1", SLURM_JOB_NUM_NODES="2",
                   MASTER_PORT=str(port), ZEROPLANNER_NODE_ID=f"node{i}")
        cmds.append(([sys.executable, "-m", "zeroplanner.cli", *CALIBRATE, "--distributed", "-o", str(path)], env))
    listening: set[str] = set()
    _run_all(cmds, 200, listening, roots_are_ranks=True)
    report = load_probe(path)
    report["_listening"] = sorted(listening)
    return report, path


def _check_topology(report: dict, nodes: int, per_node: int, launcher: str) -> None:
    # every socket zeroplanner's ranks listened on (the store, gloo's pairs) was on the launcher's 127.0.0.1; the
    # env:// store is rank 0's, on MASTER_ADDR:MASTER_PORT. torchrun's own agent (the launcher, not zeroplanner)
    # binds its c10d store to every interface whatever --rdzv-endpoint says: recorded, not asserted.
    port = report["launcher"]["master_port"]
    ranks = [a for a in report["_listening"] if a.startswith("rank ")]
    assert ranks and all(a.startswith("rank 127.0.0.1:") for a in ranks), report["_listening"]
    if launcher != "torchrun":
        assert f"rank 127.0.0.1:{port}" in ranks
        assert not [a for a in report["_listening"] if a.startswith("launcher ")]
    assert report["format"] == "zeroplanner-cluster/1"
    assert report["launcher"]["launcher"] == launcher and report["launcher"]["master_addr"] == "127.0.0.1"
    topo = report["topology"]
    assert len(topo["nodes"]) == nodes and topo["ranks_per_node"] == per_node and topo["uniform"]
    assert sorted(n["key"] for n in topo["nodes"]) == [f"node{i}" for i in range(nodes)]
    assert sorted(r for n in topo["nodes"] for r in n["ranks"]) == list(range(nodes * per_node))
    assert all(len(n["ranks"]) == per_node for n in topo["nodes"])
    assert topo["note"] == ""  # the launcher's node numbers group the ranks as the node ids do
    assert report["cluster"]["nodes"] == nodes and report["cluster"]["gpus_per_node"] == per_node


def _check_levels(report: dict, levels: dict[str, int], backend: str = "gloo") -> None:
    coll = report["benchmarks"]["collectives"]
    sizes = CPU_MESSAGE_BYTES if backend == "gloo" else GPU_MESSAGE_BYTES
    assert coll["backend"] == backend and coll["nodes"] == len(report["topology"]["nodes"])
    assert set(coll["fits"]) == set(levels)
    for level, ranks in levels.items():
        for rec in coll[level]:
            assert rec["ranks"] == ranks
            assert rec["busbw_gb_per_s"] == pytest.approx(rec["algbw_gb_per_s"] * busbw_factor(rec["collective"],
                                                                                             ranks))
            # nccl-tests sizes: the requested size rounded down to whole float32 chunks per rank
            assert any(0 <= size - rec["bytes"] < 4 * ranks for size in sizes)
        ar = coll["fits"][level]["all_reduce"]
        assert ar["ok"] and ar["ranks"] == ranks and ar["points"] >= 2, ar
        summary = report["cluster"]["levels"][level]
        assert summary["busbw_gb_per_s"] == ar["busbw_gb_per_s"]
        assert summary["latency_seconds"] == pytest.approx(ar["alpha_seconds"] / (2 * (ranks - 1)))


def _check_cluster_from(path: Path, report: dict, capsys) -> None:
    """--cluster-from on the report: the plan gets the measured nodes, GPUs per node and network."""
    from zeroplanner import cli
    from zeroplanner.scenarios import default_scenario

    base = default_scenario().cluster
    cluster = cluster_from_probe(load_probe(path), base)
    nodes, per_node = report["cluster"]["nodes"], report["cluster"]["gpus_per_node"]
    assert (cluster.nodes, cluster.gpus_per_node) == (nodes, per_node)
    world = report["cluster"]["levels"]["world"]
    assert cluster.network != base.network
    # efficiency = measured / nominal (or the link rate raised when the measurement exceeds it): either way the
    # planner's node bus bandwidth is the measured world all-reduce busbw
    assert cluster.network.node_busbw_bytes_per_second == pytest.approx(world["busbw_gb_per_s"] * 1e9)
    if world["alpha_seconds"] > 0:
        assert cluster.network.latency_seconds == pytest.approx(min(1.0, world["latency_seconds"]))
    # the same through the command line: the plan on the report vs the catalog network at the same layout
    # exit status 0 fits / 1 does not (README): the default 7B at 2 x 1 GPUs does not fit, it is still priced
    code = cli.main(["estimate", "--nodes", str(nodes), "--gpus-per-node", str(per_node), "--json"])
    catalog = json.loads(capsys.readouterr().out)
    assert code == (0 if catalog["fits"] else 1)
    code = cli.main(["estimate", "--cluster-from", str(path), "--json"])
    measured = json.loads(capsys.readouterr().out)
    assert code == (0 if measured["fits"] else 1)
    assert measured["data_parallel_degree"] == catalog["data_parallel_degree"] == nodes * per_node
    assert measured["communication"]["seconds_per_step"] != catalog["communication"]["seconds_per_step"]


def _check_calibration(report: dict, nodes: int, per_node: int) -> None:
    cal = report["calibration"]
    assert cal["ranks"] == nodes * per_node and cal["device"] == "cpu"
    assert cal["scenario"]["cluster"]["nodes"] == nodes and cal["scenario"]["cluster"]["gpus_per_node"] == per_node
    rows = {r["term"]: r for r in cal["memory"] + cal["communication"]}
    # the DeepSpeed step across the pretend nodes moved the bytes the cost model predicts for that layout
    # (DeepSpeed's comms logger; docs/validation.md shows the same agreement on one node)
    assert rows["comm_wire"]["measured"] > 0 and abs(rows["comm_wire"]["relative_error"]) < 0.01
    assert abs(rows["model_states"]["relative_error"]) < 0.05
    t = cal["timings"]
    fit = report["calibration_fit"]
    assert fit["runs"][0]["measured_step_seconds"] == pytest.approx(
        t["forward_seconds"] + t["backward_seconds"] + t["step_seconds"])
    assert fit["communication_efficiency"]["inter_node"] is not None
    assert "calibration across" in report["calibration_table"]


@pytest.mark.engine
def test_torchrun_probe_two_nodes_of_two_ranks(torchrun_probe, capsys):
    report, path = torchrun_probe
    _check_topology(report, 2, 2, "torchrun")
    _check_levels(report, {"intra_node": 2, "inter_node": 2, "world": 4})
    # every node's intra-node sweep is kept; the slowest node's is the one the planner uses
    coll = report["benchmarks"]["collectives"]
    assert set(coll["intra_node_by_node"]) == {"0", "1"}
    assert coll["intra_node"] == coll["intra_node_by_node"][str(coll["intra_node_slowest_node"])]
    text = path.with_suffix(".txt").read_text()
    assert "node 0 (" in text and "inter_node" in text and "cluster for --cluster-from: 2 nodes x 2" in text
    _check_cluster_from(path, report, capsys)
    from zeroplanner.scenarios import default_scenario

    cluster = cluster_from_probe(report, default_scenario().cluster)
    intra = report["cluster"]["levels"]["intra_node"]
    assert cluster.gpu.intra_node_busbw_gb_per_s == intra["busbw_gb_per_s"]


@pytest.mark.engine
def test_torchrun_calibration_across_two_nodes(torchrun_calibration, capsys):
    report, path = torchrun_calibration
    _check_topology(report, 2, 1, "torchrun")
    _check_levels(report, {"inter_node": 2, "world": 2})
    _check_calibration(report, 2, 1)
    _check_cluster_from(path, report, capsys)


@pytest.mark.engine
def test_deepspeed_launcher_calibration_across_two_nodes(deepspeed_calibration, capsys):
    report, path = deepspeed_calibration
    _check_topology(report, 2, 1, "deepspeed")
    _check_levels(report, {"inter_node": 2, "world": 2})
    _check_calibration(report, 2, 1)
    _check_cluster_from(path, report, capsys)


@pytest.mark.engine
def test_slurm_environment_calibration_across_two_nodes(slurm_calibration, capsys):
    report, path = slurm_calibration
    _check_topology(report, 2, 1, "slurm")
    assert report["launcher"]["world_size"] == 2
    _check_levels(report, {"inter_node": 2, "world": 2})
    _check_calibration(report, 2, 1)
    _check_cluster_from(path, report, capsys)


@pytest.mark.gpu
def test_nccl_two_nodes_of_one_gpu_on_this_machine(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices (scripts/gpu_calibrate.sh runs the same with more)")
    path = tmp_path / "cluster.json"
    report = _torchrun(["probe", "--budget-seconds", "20", "--rendezvous-timeout", "120"], 2, 1, path, 300,
                       cuda=True)
    _check_topology(report, 2, 1, "torchrun")
    assert report["cuda_available"] is True and report["gpu_count"] == 1  # each pretend node sees its own GPU
    _check_levels(report, {"inter_node": 2, "world": 2}, backend="nccl")
    _check_cluster_from(path, report, capsys)


@pytest.mark.engine
def test_rendezvous_timeout_is_one_clear_line():
    # rank 0 of a world of 2 whose rank 1 never comes: the store on 127.0.0.1 waits 5 s, then one line and exit 1
    port = _free_port()
    env = _env(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "probe", "--distributed", "--rendezvous-timeout",
                          "5"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    assert run.returncode == 1 and run.stdout == ""
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"zeroplanner probe: error: rank 0 of 2: rendezvous at 127.0.0.1:{port} failed or "
                           "timed out after 5 s"), run.stderr[-2000:]


@pytest.mark.engine
def test_a_rank_that_dies_mid_job_is_one_clear_line():
    # 2 Slurm tasks; task 1 is killed once it has joined (its gloo pair listens); task 0 must stop with one line
    import time

    port = _free_port()
    procs = []
    for i in range(2):
        env = _env(SLURM_PROCID=str(i), SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_NODEID=str(i),
                   SLURM_STEP_NODELIST="127.0.0.1", MASTER_PORT=str(port), ZEROPLANNER_NODE_ID=f"node{i}")
        procs.append(subprocess.Popen([sys.executable, "-m", "zeroplanner.cli", "probe", "--distributed",
                                       "--budget-seconds", "120", "--rendezvous-timeout", "20"], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    try:
        deadline = time.monotonic() + 60
        while not _listening({procs[1].pid}, roots_are_ranks=True) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert time.monotonic() < deadline, "task 1 never joined"
        time.sleep(0.2)  # kill early: on a loaded machine a late kill can find the whole sweep done
        os.killpg(procs[1].pid, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = procs[0].communicate(timeout=90)
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert procs[0].returncode == 1 and out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("zeroplanner probe: error: rank 0"), err[-2000:]
    assert "a collective failed" in last or "rendezvous at" in last
    assert waited < 20 + 30  # within the collective timeout, with start-up slack


@pytest.mark.engine
def test_a_process_group_that_never_connects_is_bounded(monkeypatch):
    # torch does not bound every wait of the rendezvous: when the peer died after publishing its gloo address but
    # before connecting, ProcessGroupGloo's constructor returned only after ~5x the timeout (~100 s at 20 s,
    # measured with torch 2.13). Here torch's init_process_group never returns: the rendezvous still gives up at
    # the timeout plus the grace, with the one-line error, and leaves the stuck thread behind.
    import threading
    import time

    import torch
    import torch.distributed as dist

    from zeroplanner.probe import distributed as pd

    release = threading.Event()

    def never_connects(*args, **kwargs):
        release.wait(60)
        raise RuntimeError("released by the test")

    monkeypatch.setattr(dist, "init_process_group", never_connects)
    monkeypatch.setattr(pd, "RENDEZVOUS_GRACE_SECONDS", 0.5)
    port = _free_port()
    info = {"launcher": "env", "rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1, "node_rank": 0,
            "master_addr": "127.0.0.1", "master_port": port}
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)),
                        ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"), ("GLOO_SOCKET_IFNAME", "lo")):
        monkeypatch.setenv(name, value)  # init_process_group exports these; restored after the test
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    threads = torch.get_num_threads()
    t0 = time.monotonic()
    try:
        with pytest.raises(DistributedError) as caught:
            pd.init_process_group(info, "gloo", timeout_seconds=1)
    finally:
        release.set()
        torch.set_num_threads(threads)
    assert time.monotonic() - t0 < 10
    assert str(caught.value) == (f"rank 0 of 1: rendezvous at 127.0.0.1:{port} failed or timed out after 1 s (a "
                                 "rank left or stalled while the gloo process group was connecting)")
    assert not dist.is_initialized()


@pytest.mark.engine
def test_a_process_group_made_after_the_rendezvous_gave_up_is_torn_down(monkeypatch):
    # torch slow rather than stuck: the rendezvous has already told the caller it failed when the thread's
    # init_process_group returns; the process group it made is destroyed, so the process is as the error says and
    # a second rendezvous in the same process succeeds
    import threading
    import time

    import torch
    import torch.distributed as dist

    from zeroplanner.probe import distributed as pd

    real = dist.init_process_group

    def slow(*args, **kwargs):
        time.sleep(2.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(pd, "RENDEZVOUS_GRACE_SECONDS", 0.5)
    threads = torch.get_num_threads()
    try:
        for attempt, init in enumerate((slow, real)):
            port = _free_port()
            info = {"launcher": "env", "rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1,
                    "node_rank": 0, "master_addr": "127.0.0.1", "master_port": port}
            for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                                ("MASTER_PORT", str(port)), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
                                ("GLOO_SOCKET_IFNAME", "lo")):
                monkeypatch.setenv(name, value)
            monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
            monkeypatch.setattr(dist, "init_process_group", init)
            if attempt == 0:
                with pytest.raises(DistributedError, match="a rank left or stalled"):
                    pd.init_process_group(info, "gloo", timeout_seconds=1)
                deadline = time.monotonic() + 20
                while any(t.name == "zeroplanner-rendezvous" for t in threading.enumerate()):
                    assert time.monotonic() < deadline, "the rendezvous thread did not finish"
                    time.sleep(0.1)
                assert not dist.is_initialized()
            else:
                pd.init_process_group(info, "gloo", timeout_seconds=5)
                assert dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(threads)


def test_distributed_without_a_launcher_exits_1_with_one_line():
    run = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "probe", "--distributed"], env=_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        ("zeroplanner probe: error: not started by a distributed launcher: neither RANK/WORLD_SIZE (torchrun, the "
        "deepspeed launcher) nor SLURM_PROCID (srun) is set; 'zeroplanner launch-script' prints the command")]
