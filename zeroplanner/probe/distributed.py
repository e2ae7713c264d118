"""The probe as one rank of the user's own distributed job: torchrun, the DeepSpeed launcher or Slurm's ``srun``.

``zeroplanner probe --distributed`` (and ``zeroplanner calibrate --distributed``) do not launch anything: the user's
launcher starts one process per GPU on every node, and each process

1. reads the launcher's environment (:func:`launcher_environment`): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
   ``LOCAL_WORLD_SIZE`` (torchrun) or ``LOCAL_SIZE`` (DeepSpeed's launcher), ``MASTER_ADDR``, ``MASTER_PORT``; or,
   under ``srun``, ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and the first host of
   ``SLURM_STEP_NODELIST`` as the master address (unless ``MASTER_ADDR`` is set);
2. initialises torch.distributed with ``init_method="env://"`` (NCCL on CUDA, gloo on CPU ranks) and a rendezvous
   timeout, so a rank that never arrives gives a one-line :class:`DistributedError`, not a hang;
3. groups the ranks by node (:func:`gather_topology`): the node of a rank is its host name, or the
   ``--node-id`` option / ``ZEROPLANNER_NODE_ID`` environment variable when set. The override exists so that
   several "nodes" can be simulated on one machine (the tests run 2 pretend nodes on 127.0.0.1); on a real
   cluster leave it unset;
4. times all-reduce, all-gather and reduce-scatter per level (:func:`measure_levels`): ``intra_node`` (each
   node's ranks among themselves, all nodes at once), ``inter_node`` (one rank per node: the link between nodes)
   and ``world`` (every rank: the ring DeepSpeed's ZeRO collectives use), each within its share of the time budget;
5. rank 0 fits latency and bus bandwidth per level (:func:`~zeroplanner.probe.fit_alpha_beta`) and writes one
   report (:func:`build_report`; JSON and text) that ``--cluster-from`` accepts: the nodes, ranks (GPUs) per
   node and the measured network (rules in :func:`zeroplanner.probe.cluster_changes`).

Sockets: the rendezvous store listens on ``MASTER_ADDR:MASTER_PORT`` only (rank 0 binds it: :func:`_store`; under
torchrun the agent's store on ``--rdzv-endpoint`` is used); when the master address is a loopback address
``GLOO_SOCKET_IFNAME`` defaults to ``lo`` so gloo's pairs bind to loopback too (torch's ``ProcessGroupGloo``
reads that variable: torch/csrc/distributed/c10d/ProcessGroupGloo.cpp ``createDefaultDevice``).

torch is imported inside functions only.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

REPORT_FORMAT = "zeroplanner-cluster/1"
"""``format`` of the report rank 0 writes (a probe result with ``topology`` and ``cluster`` added)."""

DEFAULT_MASTER_PORT = 29500
"""Port when the environment gives none (Slurm without ``MASTER_PORT``): torchrun's default ``--master-port`` and
DeepSpeed's ``TORCH_DISTRIBUTED_DEFAULT_PORT`` (deepspeed/constants.py)."""

DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS = 120.0
"""zeroplanner's default bound on the rendezvous and on every collective (torch's own default, 30 min for gloo
and 10 min for NCCL per torch.distributed.constants.default_pg_timeout, would hide a missing rank for too long)."""

RENDEZVOUS_GRACE_SECONDS = 5.0
"""Least time past the rendezvous timeout that :func:`init_process_group` waits for torch before it reports the
rendezvous as failed (a quarter of the timeout when that is more), so that torch's own, more specific error comes
first whenever torch keeps to the timeout."""

NODE_ID_ENV = "ZEROPLANNER_NODE_ID"
"""Environment variable that overrides a rank's node (host name by default): for simulating nodes on one machine."""


class DistributedError(RuntimeError):
    """The distributed job could not start or finish: environment missing, rendezvous timed out, a rank failed."""


# ------------------------------------------------------------------------------------------------------------------
# The launcher's environment (pure)
# ------------------------------------------------------------------------------------------------------------------
def parse_slurm_nodelist(text: str) -> list[str]:
    """Host names of a Slurm node list in its compressed form (what ``scontrol show hostnames`` prints), e.g.
    ``"gpu[01-03,07],login1"`` -> ``["gpu01", "gpu02", "gpu03", "gpu07", "login1"]`` (zero padding kept).

    Raises ``ValueError`` naming the list for an unbalanced bracket or a descending range."""
    parts, depth, current = [], 0, ""
    for ch in text.strip():
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0 or depth > 1:
            raise ValueError(f"Slurm node list {text!r}: unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise ValueError(f"Slurm node list {text!r}: unbalanced brackets")
    parts.append(current)
    hosts: list[str] = []
    for part in (p.strip() for p in parts):
        expanded = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
            options = [literal]
            if ranges:
                options = []
                for item in ranges.split(","):
                    lo, _, hi = item.strip().partition("-")
                    if not lo.isdigit() or (hi and not hi.isdigit()):
                        raise ValueError(f"Slurm node list {text!r}: bad range {item!r}")
                    if hi and int(hi) < int(lo):
                        raise ValueError(f"Slurm node list {text!r}: descending range {item!r}")
                    options += [literal + str(i).zfill(len(lo)) for i in range(int(lo), int(hi or lo) + 1)]
            expanded = [prefix + o for prefix in expanded for o in options]
        hosts += [h for h in expanded if h]
    return hosts


def _int(env: Mapping[str, str], name: str, low: int = 0) -> int:
    text = env.get(name, "")
    try:
        value = int(text)
    except ValueError:
        raise DistributedError(f"environment variable {name}={text!r}: expected an integer >= {low}") from None
    if value < low:
        raise DistributedError(f"environment variable {name}={value}: expected an integer >= {low}")
    return value


def _tasks_per_node(text: str) -> int | None:
    """First count of ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"`` -> 2)."""
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def launcher_environment(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the launcher told this process: ``launcher`` ("torchrun", "deepspeed", "slurm" or "env"), ``rank``,
    ``world_size``, ``local_rank``, ``local_world_size`` (None when not given), ``node_rank`` (torchrun's
    ``GROUP_RANK``, DeepSpeed's ``CROSS_RANK``, ``SLURM_NODEID``; None when not given), ``master_addr``,
    ``master_port``.

    torchrun / DeepSpeed's launcher / any ``env://`` launcher: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` are
    required. Slurm (``SLURM_PROCID`` set and no ``RANK``): rank ``SLURM_PROCID``, world ``SLURM_NTASKS``, local
    rank ``SLURM_LOCALID``, master = ``MASTER_ADDR`` or the first host of ``SLURM_STEP_NODELIST`` (then
    ``SLURM_JOB_NODELIST``), port = ``MASTER_PORT`` or :data:`DEFAULT_MASTER_PORT`.

    Raises :class:`DistributedError` naming the variable when one is missing or malformed."""
    env = os.environ if env is None else env
    if "RANK" in env or "WORLD_SIZE" in env:
        launcher = ("torchrun" if "TORCHELASTIC_RUN_ID" in env else
                    "deepspeed" if "CROSS_RANK" in env else "env")
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            if not env.get(name):
                raise DistributedError(f"environment variable {name} is not set ({launcher} launch): start this "
                                       "command with torchrun, the deepspeed launcher or srun (see 'zeroplanner "
                                       "launch-script')")
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", 1)
        local_rank = _int(env, "LOCAL_RANK") if env.get("LOCAL_RANK") else None
        local_world = None
        for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
            if env.get(name):
                local_world = _int(env, name, 1)
                break
        node_rank = None
        for name in ("GROUP_RANK", "CROSS_RANK"):
            if env.get(name):
                node_rank = _int(env, name)
                break
        addr = env["MASTER_ADDR"]
    elif "SLURM_PROCID" in env:
        launcher = "slurm"
        rank = _int(env, "SLURM_PROCID")
        if not env.get("SLURM_NTASKS") and not env.get("SLURM_NPROCS"):
            raise DistributedError("environment variable SLURM_NTASKS is not set: run under srun (see "
                                   "'zeroplanner launch-script --launcher slurm')")
        world = _int(env, "SLURM_NTASKS" if env.get("SLURM_NTASKS") else "SLURM_NPROCS", 1)
        local_rank = _int(env, "SLURM_LOCALID") if env.get("SLURM_LOCALID") else None
        local_world = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", ""))
        node_rank = _int(env, "SLURM_NODEID") if env.get("SLURM_NODEID") else None
        addr = env.get("MASTER_ADDR", "")
        if not addr:
            for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
                if env.get(name):
                    try:
                        hosts = parse_slurm_nodelist(env[name])
                    except ValueError as exc:
                        raise DistributedError(f"environment variable {name}: {exc}") from None
                    if hosts:
                        addr = hosts[0]
                        break
        if not addr:
            raise DistributedError("no master address under Slurm: set MASTER_ADDR or run inside a job step "
                                   "(SLURM_STEP_NODELIST)")
        if not env.get("MASTER_PORT"):
            env = {**env, "MASTER_PORT": str(DEFAULT_MASTER_PORT)}
    else:
        raise DistributedError("not started by a distributed launcher: neither RANK/WORLD_SIZE (torchrun, the "
                               "deepspeed launcher) nor SLURM_PROCID (srun) is set; 'zeroplanner launch-script' "
                               "prints the command")
    port = _int(env, "MASTER_PORT", 1)
    if port > 65535:
        raise DistributedError(f"environment variable MASTER_PORT={port}: expected a port in 1-65535")
    if rank >= world:
        raise DistributedError(f"rank {rank} is not below the world size {world}")
    if local_rank is not None and local_world is not None and local_rank >= local_world:
        raise DistributedError(f"local rank {local_rank} is not below the local world size {local_world}")
    return {"launcher": launcher, "rank": rank, "world_size": world, "local_rank": local_rank,
            "local_world_size": local_world, "node_rank": node_rank, "master_addr": addr, "master_port": port}


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------------------------------------------------------
# Inside the job (torch)
# ------------------------------------------------------------------------------------------------------------------
def init_process_group(info: dict[str, Any], backend: str = "auto",
                       timeout_seconds: float = DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS) -> tuple[str, Any]:
    """Initialise torch.distributed from :func:`launcher_environment`'s ``info`` (``env://``; the variables a Slurm
    job lacks are exported first so DeepSpeed, started later in the same process, sees the same world). Returns
    (backend, device). ``timeout_seconds`` bounds the rendezvous and every later collective.

    Raises :class:`DistributedError` when the rendezvous fails or times out (which rank, which address)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ.setdefault("RANK", str(info["rank"]))
    os.environ.setdefault("WORLD_SIZE", str(info["world_size"]))
    os.environ.setdefault("MASTER_ADDR", str(info["master_addr"]))
    os.environ.setdefault("MASTER_PORT", str(info["master_port"]))
    local_rank = info["local_rank"] if info["local_rank"] is not None else 0
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    if info["local_world_size"] is not None:
        os.environ.setdefault("LOCAL_WORLD_SIZE", str(info["local_world_size"]))
    if is_loopback(str(info["master_addr"])):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise DistributedError("backend nccl needs CUDA; this rank sees no CUDA device")
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # one core per CPU rank, as the calibration launcher does
    where = f"{info['master_addr']}:{info['master_port']}"
    timeout = timedelta(seconds=float(timeout_seconds))
    failed = f"rank {info['rank']} of {info['world_size']}: rendezvous at {where} failed or timed out after " \
             f"{float(timeout_seconds):g} s"
    outcome: list[BaseException | None] = []
    lock = threading.Lock()  # the worker's result and the caller's giving up exclude each other
    abandoned: list[bool] = []

    def connect(store) -> None:
        result: BaseException | None = None
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)  # the current CUDA device is per thread
            if store is None:
                dist.init_process_group(backend, init_method="env://", rank=info["rank"],
                                        world_size=info["world_size"], timeout=timeout)
            else:
                dist.init_process_group(backend, store=store, rank=info["rank"], world_size=info["world_size"],
                                        timeout=timeout)
            dist.barrier()  # the rendezvous is complete only once every rank has joined
        except BaseException as exc:  # noqa: BLE001 - torch raises DistStoreError, RuntimeError, ValueError ...
            result = exc
        with lock:
            if not abandoned:
                outcome.append(result)
                return
        # the caller was already told the rendezvous failed: a process group this thread made after that (torch
        # was slow, not stuck) is torn down, so that the process is as the error says and may try again
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001,S110 - best effort, in a thread nobody waits for
            pass

    try:
        store = _store(info, timeout)  # TCPStore keeps to the timeout itself
    except Exception as exc:  # noqa: BLE001
        outcome.append(exc)
    else:
        # The process group is made in a daemon thread that this one waits for, at most the timeout and a grace,
        # because torch's timeout does not bound it: when a peer dies after publishing its gloo address but before
        # connecting to this rank, ProcessGroupGloo's constructor (connectFullMesh, waiting in gloo's
        # Pair::waitUntilConnected) returned only after about 5 times the timeout (measured with torch 2.13 on 2
        # CPU ranks: ~28 s at 5 s, ~100 s at 20 s; "Connect timeout [none]"). Past the bound the thread is left
        # behind, blocked in C++ without the GIL; the caller gets the one-line error and the process can exit. If
        # the thread still makes the process group later, it destroys it (connect).
        worker = threading.Thread(target=connect, args=(store,), name="zeroplanner-rendezvous", daemon=True)
        worker.start()
        worker.join(float(timeout_seconds) + max(RENDEZVOUS_GRACE_SECONDS, float(timeout_seconds) / 4))
        with lock:
            if not outcome:
                abandoned.append(True)
    if not outcome:
        raise DistributedError(f"{failed} (a rank left or stalled while the {backend} process group was connecting)")
    exc = outcome[0]
    if exc is not None and not isinstance(exc, Exception):
        raise exc
    if exc is not None:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise DistributedError(f"{failed} ({type(exc).__name__}: {first})") from None
    return backend, device


def _store(info: dict[str, Any], timeout) -> Any:
    """The rendezvous store, bound to the launcher's address only; None to let ``env://`` make it.

    torch's ``env://`` store on rank 0 listens on every interface (measured: ``*:MASTER_PORT`` in ``ss -ltn``).
    Here rank 0 binds a listening socket to ``MASTER_ADDR:MASTER_PORT`` itself and hands it to ``TCPStore``
    (``master_listen_fd``, the hook torchelastic uses), so the store listens where the launcher said. Under torchrun
    (``TORCHELASTIC_USE_AGENT_STORE=True``) the agent's store is used as ``env://`` does. A host name is bound to
    the address it resolves to here, unless that is a loopback address and the name is not ``localhost`` (Debian
    maps a host's own name to 127.0.1.1 in /etc/hosts: the other nodes could not reach it); then, and when rank 0
    cannot bind the address, ``env://`` decides, as torch does."""
    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return None
    host, port, world = str(info["master_addr"]), int(info["master_port"]), int(info["world_size"])
    if info["rank"] != 0:
        return dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
    try:
        ipaddress.ip_address(host)
        bind = host
    except ValueError:
        try:
            resolved = [a[4][0] for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
        except OSError:
            return None
        if not resolved or (host != "localhost" and any(is_loopback(a) for a in resolved)):
            return None
        bind = resolved[0]
    try:
        listener = socket.create_server((bind, port), family=socket.AF_INET6 if ":" in bind else socket.AF_INET)
    except OSError:
        return None
    return dist.TCPStore(host, port, world, is_master=True, timeout=timeout, master_listen_fd=listener.detach())


def gather_topology(node_id: str | None = None, launcher_node_rank: int | None = None) -> dict[str, Any]:
    """Every rank's node, gathered on every rank: ``{"nodes": [{"node", "key", "hostname", "ranks",
    "launcher_node_ranks"}], "ranks_per_node": min ranks on a node, "uniform": all nodes hold as many ranks,
    "node_of_rank": [...], "note"}``. The node key is ``node_id``, else ``$ZEROPLANNER_NODE_ID``, else the host
    name; nodes are numbered in the order of their lowest rank. ``note`` says when the launcher's own node numbers
    (``launcher_node_rank``: GROUP_RANK, CROSS_RANK, SLURM_NODEID) group the ranks differently (e.g. two torchrun
    agents on one host without an override: the "inter-node" level then measures one host)."""
    import torch.distributed as dist

    hostname = socket.gethostname()
    key = node_id or os.environ.get(NODE_ID_ENV) or hostname
    mine = {"rank": dist.get_rank(), "key": str(key)[:200], "hostname": hostname[:200],
            "launcher_node_rank": launcher_node_rank}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    nodes: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    for entry in sorted(everyone, key=lambda e: e["rank"]):
        if entry["key"] not in index:
            index[entry["key"]] = len(nodes)
            nodes.append({"node": len(nodes), "key": entry["key"], "hostname": entry["hostname"], "ranks": [],
                          "launcher_node_ranks": []})
        node = nodes[index[entry["key"]]]
        node["ranks"].append(entry["rank"])
        if entry["launcher_node_rank"] is not None and entry["launcher_node_rank"] not in node["launcher_node_ranks"]:
            node["launcher_node_ranks"].append(entry["launcher_node_rank"])
    counts = [len(n["ranks"]) for n in nodes]
    launcher_nodes = {e["launcher_node_rank"] for e in everyone}
    note = ""
    if None not in launcher_nodes and (len(launcher_nodes) != len(nodes)
                                       or any(len(n["launcher_node_ranks"]) != 1 for n in nodes)):
        note = (f"the launcher numbers {len(launcher_nodes)} nodes but the ranks sit on {len(nodes)} "
                f"{'hosts' if not (node_id or os.environ.get(NODE_ID_ENV)) else 'node ids'}: levels follow the latter")
    return {"nodes": nodes, "ranks_per_node": min(counts), "uniform": len(set(counts)) == 1,
            "node_of_rank": [index[e["key"]] for e in sorted(everyone, key=lambda e: e["rank"])], "note": note}


def measure_levels(topology: dict[str, Any], message_bytes: Sequence[int], iterations: int, warmup: int,
                   budget_seconds: float, device,
                   timeout_seconds: float = DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Time the collectives per level on every rank (all ranks must call this, in the same order).

    Levels: ``intra_node`` when some node holds 2+ ranks (each such node's ranks at once, one group per node),
    ``inter_node`` when there are 2+ nodes (the lowest rank of each node), ``world`` when there are 2+ ranks.
    Each level gets an equal share of ``budget_seconds`` (the sweep of :func:`zeroplanner.probe._worker.measure`
    stops once its share is spent). ``timeout_seconds`` bounds each collective of the level groups (torch gives a
    new group its backend's default, 30 min for gloo, not the world's timeout: a stalled peer held an inter-node
    all-reduce past a 5 s rendezvous timeout). Returns, on every rank, ``{level: {"records" (the slowest node's for
    intra_node), "by_node" (intra_node only), "truncated", "seconds"}}``."""
    from datetime import timedelta

    import torch.distributed as dist

    from ._worker import measure

    timeout = timedelta(seconds=float(timeout_seconds))
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes = topology["nodes"]
    multi = [n for n in nodes if len(n["ranks"]) > 1]
    levels = (["intra_node"] if multi else []) + (["inter_node"] if len(nodes) > 1 else []) + (
        ["world"] if world > 1 else [])
    share = budget_seconds / max(1, len(levels))
    out: dict[str, Any] = {}
    for level in levels:
        t0 = time.perf_counter()
        mine: dict[str, Any] | None = None
        if level == "intra_node":
            groups = [(n, dist.new_group(n["ranks"], timeout=timeout)) for n in multi]  # every rank creates every group
            for n, group in groups:
                if rank in n["ranks"]:
                    recs, trunc = measure(group, len(n["ranks"]), list(message_bytes), iterations, warmup, share,
                                          device)
                    mine = {"node": n["node"], "records": recs, "truncated": trunc}
        elif level == "inter_node":
            leaders = [n["ranks"][0] for n in nodes]
            group = dist.new_group(leaders, timeout=timeout)
            if rank in leaders:
                recs, trunc = measure(group, len(leaders), list(message_bytes), iterations, warmup, share, device)
                mine = {"node": None, "records": recs, "truncated": trunc}
        else:
            recs, trunc = measure(dist.group.WORLD, world, list(message_bytes), iterations, warmup, share, device)
            mine = {"node": None, "records": recs, "truncated": trunc}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine if (mine and _first_in_group(rank, level, nodes)) else None)
        results = [g for g in gathered if g]
        entry: dict[str, Any] = {"truncated": any(g["truncated"] for g in results),
                                 "seconds": time.perf_counter() - t0}
        if level == "intra_node":
            entry["by_node"] = {str(g["node"]): g["records"] for g in results}
            entry["records"] = min(results, key=lambda g: _allreduce_busbw(g["records"]))["records"]
            entry["slowest_node"] = min(results, key=lambda g: _allreduce_busbw(g["records"]))["node"]
        else:
            entry["records"] = results[0]["records"]
        out[level] = entry
    return out


def _first_in_group(rank: int, level: str, nodes: list[dict[str, Any]]) -> bool:
    """The rank that reports a group's records: a node's lowest rank (intra_node), rank 0 otherwise."""
    if level == "intra_node":
        return any(n["ranks"][0] == rank for n in nodes)
    return rank == 0


def _allreduce_busbw(records: list[dict]) -> float:
    """Largest-message all-reduce busbw of a record list (to pick the slowest node); inf when absent."""
    rows = [r for r in records if r["collective"] == "all_reduce"]
    return max(rows, key=lambda r: r["bytes"])["busbw_gb_per_s"] if rows else float("inf")


def gather_inventories(topology: dict[str, Any], nvme_path: str = ".") -> list[dict[str, Any] | None]:
    """:func:`zeroplanner.probe.inventory` taken by the lowest rank of each node, gathered on every rank
    (index = node number)."""
    import torch.distributed as dist

    from .hardware import inventory

    rank = dist.get_rank()
    mine = None
    for n in topology["nodes"]:
        if n["ranks"][0] == rank:
            mine = {"node": n["node"], "inventory": inventory(nvme_path)}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    by_node: list[dict[str, Any] | None] = [None] * len(topology["nodes"])
    for g in gathered:
        if g:
            by_node[g["node"]] = g["inventory"]
    return by_node


# ------------------------------------------------------------------------------------------------------------------
# The report (pure)
# ------------------------------------------------------------------------------------------------------------------
def build_report(info: dict[str, Any], backend: str, topology: dict[str, Any], inventories: list[dict | None],
                 levels: dict[str, Any], budget_seconds: float, elapsed_seconds: float) -> dict[str, Any]:
    """The report rank 0 writes: a probe result (node 0's inventory, so ``--cluster-from`` reads it like a
    one-machine probe, with the host RAM of the node that has the least available) plus ``launcher``,
    ``topology``, ``nodes_inventory``, ``benchmarks.collectives`` (records and alpha-beta fits per level) and
    ``cluster``: ``nodes``, ``gpus_per_node`` (ranks per node: one rank per GPU), and per level the fitted
    all-reduce ``busbw_gb_per_s`` and ``latency_seconds`` (alpha / 2(n-1), per ring step)."""
    from .benchmarks import fit_alpha_beta

    first = dict(inventories[0] or {"cuda_available": False, "message": "no inventory from node 0"})
    hosts = [inv.get("host") for inv in inventories if inv and isinstance(inv.get("host"), dict)]
    if hosts:
        first["host"] = min(hosts, key=lambda h: h.get("ram_available_bytes", 0))
    fits = {level: fit_alpha_beta(entry["records"]) for level, entry in levels.items()}
    coll: dict[str, Any] = {
        "ok": True, "backend": backend, "device": "cuda" if backend == "nccl" else "cpu",
        "world_size": info["world_size"], "nodes": len(topology["nodes"]),
        "ranks_per_node": topology["ranks_per_node"], "budget_seconds": budget_seconds,
        "truncated": any(e["truncated"] for e in levels.values()), "fits": fits,
    }
    for level, entry in levels.items():
        coll[level] = entry["records"]
        if "by_node" in entry:
            coll["intra_node_by_node"] = entry["by_node"]
            coll["intra_node_slowest_node"] = entry["slowest_node"]
    summary = {}
    for level, f in fits.items():
        ar = f.get("all_reduce") or {}
        if ar.get("ok"):
            n = int(ar["ranks"])
            summary[level] = {"ranks": n, "busbw_gb_per_s": ar["busbw_gb_per_s"], "alpha_seconds": ar["alpha_seconds"],
                              "latency_seconds": ar["alpha_seconds"] / (2 * (n - 1))}
        else:
            summary[level] = {"ranks": ar.get("ranks"), "message": ar.get("message", "no all-reduce fit")}
    ar = (fits.get("world") or {}).get("all_reduce") or {}
    bw = f"{ar['busbw_gb_per_s']:.3g} GB/s" if ar.get("ok") else "not identifiable"
    coll["message"] = f"{backend} over {info['world_size']} ranks on {len(topology['nodes'])} nodes: world " \
                      f"all-reduce busbw {bw}"
    bench = {"collectives": coll}
    report = {
        **first,
        "format": REPORT_FORMAT,
        "probe_format": first.get("format"),
        "message": f"{len(topology['nodes'])} nodes x {topology['ranks_per_node']} ranks ({backend}, "
                   f"{info['launcher']}); node 0: {first.get('message', '')}",
        "launcher": {k: info[k] for k in ("launcher", "world_size", "master_addr", "master_port")},
        "topology": topology,
        "nodes_inventory": [{"node": i, "cuda_available": (inv or {}).get("cuda_available"),
                             "gpu_count": (inv or {}).get("gpu_count"), "host": (inv or {}).get("host"),
                             "gpus": [g.get("name") for g in (inv or {}).get("gpus", [])]}
                            for i, inv in enumerate(inventories)],
        "benchmarks": bench,
        "cluster": {"nodes": len(topology["nodes"]), "gpus_per_node": topology["ranks_per_node"],
                    "uniform": topology["uniform"], "backend": backend, "levels": summary},
        "elapsed_seconds": elapsed_seconds,
    }
    return report


def format_report_text(report: dict[str, Any]) -> str:
    """The report for people: nodes and their ranks, per-level fits, the cluster description, the calibration."""
    lines = [report.get("message", "")]
    for n in report.get("topology", {}).get("nodes", []):
        lines.append(f"node {n['node']} ({n['key']}, host {n['hostname']}): ranks {n['ranks']}")
    if report.get("topology", {}).get("note"):
        lines.append(f"note: {report['topology']['note']}")
    coll = (report.get("benchmarks") or {}).get("collectives") or {}
    lines.append(f"{'level':<11}{'collective':<16}{'ranks':>6}{'busbw GB/s':>12}{'alpha us':>10}{'max rel err':>13}")
    from .benchmarks import fit_rows

    for level, name, f in fit_rows(coll):
        if f.get("ok"):
            lines.append(f"{level:<11}{name:<16}{f['ranks']:>6}{f['busbw_gb_per_s']:>12.3g}"
                         f"{f['alpha_seconds'] * 1e6:>10.0f}{f['max_relative_error']:>13.2f}")
        else:
            lines.append(f"{level:<11}{name:<16}{f.get('ranks', ''):>6}  {f.get('message')}")
    cl = report.get("cluster") or {}
    lines.append(f"cluster for --cluster-from: {cl.get('nodes')} nodes x {cl.get('gpus_per_node')} GPUs (ranks) "
                 f"per node, {cl.get('backend')}")
    for level, s in (cl.get("levels") or {}).items():
        if "busbw_gb_per_s" in s:
            lines.append(f"  {level}: all-reduce busbw {s['busbw_gb_per_s']:.3g} GB/s, latency "
                         f"{s['latency_seconds'] * 1e6:.1f} us per ring step over {s['ranks']} ranks")
        else:
            lines.append(f"  {level}: {s.get('message')}")
    if report.get("calibration_table"):
        lines.append(report["calibration_table"])
    if coll.get("truncated"):
        lines.append("note: the time budget cut the sweep short (raise --budget-seconds for more sizes)")
    return "\n".join(line for line in lines if line)


def write_report(report: dict[str, Any], output: str | None) -> list[str]:
    """Write ``output`` (JSON) and ``output`` with a ``.txt`` suffix (text), atomically. Returns the paths."""
    import json

    if not output:
        return []
    base, _ext = os.path.splitext(output)
    paths = []
    for path, text in ((output, json.dumps(report, indent=1) + "\n"), (base + ".txt", format_report_text(report)
                                                                         + "\n")):
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------------------------------
# One call per rank
# ------------------------------------------------------------------------------------------------------------------
def start(*, backend: str = "auto", node_id: str | None = None, message_bytes: Sequence[int] | None = None,
          iterations: int | None = None, warmup: int = 1, budget_seconds: float = 30.0,
          rendezvous_timeout_seconds: float = DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS, nvme_path: str = ".",
          env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Join the job and measure it: :func:`launcher_environment`, :func:`init_process_group`,
    :func:`gather_topology`, :func:`gather_inventories`, :func:`measure_levels`. Returns, on every rank,
    ``{"info", "backend", "device", "topology", "report"}`` (``report`` from :func:`build_report`; the same on
    every rank). The process group stays initialised (calibration runs DeepSpeed on it next); call
    :func:`finish`. Raises :class:`DistributedError` (rendezvous, a failed rank: the collective's timeout)."""
    from .benchmarks import CPU_MESSAGE_BYTES, GPU_MESSAGE_BYTES

    t0 = time.perf_counter()
    info = launcher_environment(env)
    backend, device = init_process_group(info, backend, rendezvous_timeout_seconds)
    try:
        topology = gather_topology(node_id, info["node_rank"])
        inventories = gather_inventories(topology, nvme_path)
        sizes = sorted(set(message_bytes or (GPU_MESSAGE_BYTES if backend == "nccl" else CPU_MESSAGE_BYTES)))
        levels = measure_levels(topology, sizes, iterations or (20 if backend == "nccl" else 5), warmup,
                                budget_seconds, device, rendezvous_timeout_seconds)
    except DistributedError:
        finish(barrier=False)
        raise
    except Exception as exc:  # noqa: BLE001 - a peer died or timed out inside a collective
        finish(barrier=False)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise DistributedError(f"rank {info['rank']}: a collective failed (a rank exited or timed out after "
                               f"{rendezvous_timeout_seconds:g} s): {type(exc).__name__}: {first}") from None
    report = build_report(info, backend, topology, inventories, levels, budget_seconds, time.perf_counter() - t0)
    return {"info": info, "backend": backend, "device": device, "topology": topology, "report": report}


def finish(barrier: bool = True) -> None:
    """Tear down the process group, after a barrier when ``barrier`` (not after a failure: a dead peer would hold
    it until the timeout). Best effort: never raises."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            if barrier:
                dist.barrier()
        except Exception:  # noqa: BLE001,S110 - teardown after the result is written; the peer may be gone
            pass
        finally:
            dist.destroy_process_group()


def run_distributed_probe(*, output: str | None = None, **kwargs: Any) -> dict[str, Any] | None:
    """``zeroplanner probe --distributed`` on one rank: :func:`start`, then rank 0 writes the report (``output``
    and its ``.txt``) and returns it; other ranks return None. Raises :class:`DistributedError`."""
    ctx = start(**kwargs)
    try:
        if ctx["info"]["rank"] == 0:
            write_report(ctx["report"], output)
            return ctx["report"]
        return None
    finally:
        finish()


def fail_message(exc: BaseException) -> str:
    """One line for a CLI error."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


__all__ = [
    "REPORT_FORMAT",
    "DistributedError",
    "build_report",
    "finish",
    "format_report_text",
    "is_loopback",
    "launcher_environment",
    "parse_slurm_nodelist",
    "run_distributed_probe",
    "start",
    "write_report",
]
