"""Read a training log: the figures DeepSpeed, PyTorch and the HF Trainer print, each with the line it came from.

:func:`read_log` takes the text (or bytes) of a log and returns a :class:`LogReading`:

- ``ooms``: CUDA out-of-memory messages in three PyTorch wordings (:data:`OOM_WORDINGS`), with the phase the
  traceback around them names (forward, loss, backward, optimizer step) when it does;
- ``timers``: DeepSpeed's ``wall_clock_breakdown`` lines (deepspeed/utils/timer.py ``SynchronizedWallClockTimer.log``:
  ``time (ms) | fwd_microstep: 12.34 | bwd_microstep: ...``; the names of deepspeed/utils/timer.py), milliseconds;
- ``comms``: the comms logger's summary (deepspeed/utils/comms_logging.py ``CommsLogger.log_all``: a header
  ``Comm. Op  Message Size  Count  Total Latency(ms)  Avg Latency(ms)  tput_avg (Gbps)  busbw_avg (Gbps)``, an op
  name line, then one row per message size, sizes as ``convert_size`` writes them: 1024-based "KB", "MB", ...);
- ``memory``: ``see_memory_usage`` lines (deepspeed/runtime/utils.py: ``MA 1.2 GB  Max_MA ... CA ... Max_CA ...``,
  GiB although printed "GB": the values are bytes / 1024^3);
- ``trainer``: the HF Trainer's metrics dicts (``{'train_runtime': ..., 'train_samples_per_second': ...}``);
- ``flops``: the DeepSpeed flops profiler's summary figures (``fwd flops per GPU``, ``fwd latency``, ``iter latency``,
  ``FLOPS per GPU``) when present;
- ``settings``: what the log states about the run (world size, ZeRO stage, micro-batch, accumulation) from
  DeepSpeed's config printout.

Hostile input gives a partial reading, never an exception: only the last :data:`MAX_LOG_BYTES` of a file are read
(and ``skipped`` says so); bytes that are not UTF-8 are replaced; ANSI colour codes and rank prefixes
(``[rank0]:``, ``[Rank 0]``, ``0:``) are removed; lines with NUL bytes or mostly unprintable characters are
counted as binary and skipped; when the log holds several runs (DeepSpeed's launcher or engine starting again),
only the last is read and ``skipped`` says how many came before. Pure Python: no torch, no numpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAX_LOG_BYTES = 8 * 2**20
"""How much of a log is read: its last 8 MiB (a training log can be gigabytes; the figures that matter are at the
end: the last timers, the comms summary, the OOM)."""

_GIB, _MIB, _KIB = 2**30, 2**20, 2**10
_UNITS = {"B": 1, "BYTES": 1, "KIB": _KIB, "MIB": _MIB, "GIB": _GIB, "TIB": 2**40,
          # PyTorch's OOM message and DeepSpeed's convert_size/see_memory_usage write 1024-based sizes with these
          "KB": _KIB, "MB": _MIB, "GB": _GIB, "TB": 2**40}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RANK_PREFIX = re.compile(r"^(?:>\s?|\^\[c)*(?:\[(?:rank|Rank)\s*\d+\]:?\s*|\d+:\s(?=\S)|\[default\d+\]:)?")
_SIZE = r"([0-9][0-9.,]*)\s*([KMGT]i?B|bytes|B)\b"

OOM_WORDINGS = {
    # torch >= 2.1 (c10/cuda/CUDACachingAllocator.cpp): "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of
    # 79.15 GiB of which 1.23 GiB is free. ... Of the allocated memory 75.01 GiB is allocated by PyTorch, and
    # 1.45 GiB is reserved by PyTorch but unallocated."
    "new": re.compile(
        r"Tried to allocate " + _SIZE + r"\.\s*GPU\s*(\d*) has a total capac(?:i)?ty of " + _SIZE
        + r" of which " + _SIZE + r" is free\.(?:.*?this process has " + _SIZE + r" memory in use\.)?"
        + r"(?:.*?Of the allocated memory " + _SIZE + r" is allocated by PyTorch,(?: with [^,]* private pools"
        + r" \(e\.g\., CUDA Graphs\),)? and " + _SIZE
        + r" is reserved by PyTorch but unallocated)?", re.S),
    # torch 1.x - 2.0: "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already
    # allocated; 3.44 MiB free; 14.63 GiB reserved in total by PyTorch)"
    "1.x": re.compile(
        r"Tried to allocate " + _SIZE + r"\s*\(GPU\s*(\d*);\s*" + _SIZE + r" total capacity;\s*" + _SIZE
        + r" already allocated;\s*" + _SIZE + r" free;\s*" + _SIZE + r" reserved in total by PyTorch"),
    # torch <= 1.4: "... already allocated; 11.81 MiB free; 426.00 KiB cached)"
    "cached": re.compile(
        r"Tried to allocate " + _SIZE + r"\s*\(GPU\s*(\d*);\s*" + _SIZE + r" total capacity;\s*" + _SIZE
        + r" already allocated;\s*" + _SIZE + r" free;\s*" + _SIZE + r" cached(?:;[^)]*)?\)"),
}
"""The CUDA out-of-memory wordings of PyTorch releases, newest first (sizes 1024-based as PyTorch's
``format_size`` writes them)."""

_TIMER_LINE = re.compile(r"time \(ms\)\s*(\|.*)$")
_TIMER_PART = re.compile(r"^\s*([A-Za-z_]+):\s*(-?[0-9.]+)\s*$")
LEGACY_TIMERS = {"forward_microstep": "fwd_microstep", "backward_microstep": "bwd_microstep",
                 "backward_inner_microstep": "bwd_inner_microstep",
                 "backward_allreduce_microstep": "bwd_allreduce_microstep", "forward": "fwd", "backward": "bwd",
                 "backward_inner": "bwd_inner", "backward_allreduce": "bwd_allreduce"}
"""DeepSpeed's timer names before 0.3.x (``forward_microstep``, ...) -> today's (deepspeed/utils/timer.py)."""
_COMMS_HEADER = re.compile(r"Comm\. Op\s+Message Size\s+Count\s+Total Latency\(ms\)\s+Avg Latency\(ms\)")
_COMMS_ROW = re.compile(r"^\s+" + _SIZE + r"\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")
_OP_NAME = re.compile(r"^([a-z_][a-z0-9_]*)\s*(?:\|\s*\[Caller Func:[^\]]*\])?\s*$")
_MEMORY = re.compile(r"MA\s+([0-9.]+)\s*GB\s+Max_MA\s+([0-9.]+)\s*GB\s+CA\s+([0-9.]+)\s*GB\s+Max_CA\s+([0-9.]+)\s*GB")
_TRAINER = re.compile(r"\{[^{}]*'train_(?:runtime|samples_per_second|loss)'[^{}]*\}")
_TRAINER_ITEM = re.compile(r"'([a-z_]+)':\s*'?([-0-9.eE+]+)'?(?=[,}\s])")
_FLOPS = {  # deepspeed/profiling/flops_profiler/profiler.py print_model_profile, the summary block
    "fwd_flops_per_gpu": re.compile(r"^\s*fwd flops per GPU:\s*([0-9.]+)\s*([KMGTP]?)\s*$"),
    "params_per_gpu": re.compile(r"^\s*params per gpu:\s*([0-9.]+)\s*([KMGTP]?)\s*$", re.I),
    "fwd_latency_seconds": re.compile(r"^\s*fwd latency:\s*([0-9.]+)\s*(m?s|us)\s*$"),
    "bwd_latency_seconds": re.compile(r"^\s*bwd latency:\s*([0-9.]+)\s*(m?s|us)\s*$"),
    "step_latency_seconds": re.compile(r"^\s*step latency:\s*([0-9.]+)\s*(m?s|us)\s*$"),
    "iter_latency_seconds": re.compile(r"^\s*iter latency:\s*([0-9.]+)\s*(m?s|us)\s*$"),
    "fwd_bwd_flops_per_second": re.compile(r"fwd\+bwd FLOPS per GPU = .*?:\s*([0-9.]+)\s*([KMGTP]?)FLOPS"),
    "world_size": re.compile(r"^\s*world size:\s*(\d+)()\s*$"),
    "batch_size_per_gpu": re.compile(r"^\s*batch size per GPU:\s*(\d+)()\s*$"),
}
_SETTINGS = {  # DeepSpeed's config printout (runtime/config.py DeepSpeedConfig.print: "  name ...... value")
    "world_size": re.compile(r"\bdist_world_size=(\d+)|Config mesh_device \S+ world_size = (\d+)"),
    "zero_stage": re.compile(r"\]\s+zero_optimization_stage\s*\.*\s*(\d)\s*$|Creating \S+ ZeRO stage (\d) optimizer"),
    "micro_batch": re.compile(r"\]\s+train_micro_batch_size_per_gpu\s*\.*\s*(\d+)\s*$"),
    "grad_accum": re.compile(r"\]\s+gradient_accumulation_steps\s*\.*\s*(\d+)\s*$"),
}
_RUN_START = re.compile(r"DeepSpeed info: version=|\[launch\.py:\d+:main\] WORLD INFO DICT|Setting ds_accelerator to")
_PHASE_FRAMES = (  # traceback frames (innermost last) -> the phase of the step
    ("optimizer step", re.compile(r"in (?:step|_take_model_step|_optimizer_step|optimizer_step)\b|\.step\(\)")),
    ("backward", re.compile(r"in (?:\w*backward\w*|allreduce_gradients|reduce_ipg_grads)\b|\.backward\(")),
    ("loss", re.compile(r"in (?:cross_entropy|ForCausalLMLoss|loss_function|log_softmax|nll_loss)\b")),
    ("forward", re.compile(r"in (?:forward|_call_impl|_wrapped_call_impl)\b|model\(\*\*|engine\(|forward=True")),
)


def _bytes(number: str, unit: str) -> int:
    return int(round(float(number.replace(",", "")) * _UNITS[unit.upper()]))


@dataclass
class Figure:
    """One figure read from the log: its value (unit in the key), the 1-based line number and the line."""

    value: Any
    line_number: int
    line: str


@dataclass
class OOM:
    """A CUDA out-of-memory message (bytes). ``wording``: the key of :data:`OOM_WORDINGS`; ``phase``: from the
    traceback lines before it, or "" when none names one."""

    tried_bytes: int
    gpu_index: int | None
    total_bytes: int
    free_bytes: int
    allocated_bytes: int | None
    reserved_bytes: int | None
    reserved_unallocated_bytes: int | None
    wording: str
    phase: str
    line_number: int
    line: str


@dataclass
class CommRow:
    """One row of the comms logger's summary: op, message bytes, count, milliseconds, Gbit/s (DeepSpeed's units)."""

    op: str
    message_bytes: int
    count: int
    total_latency_ms: float
    avg_latency_ms: float
    algbw_gbps: float
    busbw_gbps: float
    line_number: int


@dataclass
class LogReading:
    """What :func:`read_log` found (see the module docstring). ``skipped``: one line per thing not read."""

    ooms: list[OOM] = field(default_factory=list)
    timers: list[Figure] = field(default_factory=list)
    """Each a Figure whose value is {timer name: milliseconds} of one ``time (ms)`` line."""
    comms: list[CommRow] = field(default_factory=list)
    memory: list[Figure] = field(default_factory=list)
    """Each a Figure whose value is {"ma_gib", "max_ma_gib", "ca_gib", "max_ca_gib"}."""
    trainer: list[Figure] = field(default_factory=list)
    """Each a Figure whose value is the metrics dict (numbers only)."""
    flops: dict[str, Figure] = field(default_factory=dict)
    settings: dict[str, Figure] = field(default_factory=dict)
    lines_read: int = 0
    skipped: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.ooms or self.timers or self.comms or self.memory or self.trainer or self.flops)

    def global_timers(self) -> list[dict[str, float]]:
        """The timer lines that carry the per-step totals (``fwd``, ``bwd``, ``step``: DeepSpeed's GLOBAL timers,
        summed over the step's micro-steps), oldest first, names as today's DeepSpeed writes them
        (:data:`LEGACY_TIMERS`)."""
        named = [{LEGACY_TIMERS.get(k, k): v for k, v in t.value.items()} for t in self.timers]
        return [t for t in named if "fwd" in t or ("step" in t and "bwd" in t)]

    def micro_timers(self) -> list[dict[str, float]]:
        """The timer lines of micro-steps (``fwd_microstep``, ``bwd_microstep``, ``step_microstep``), today's names."""
        named = [{LEGACY_TIMERS.get(k, k): v for k, v in t.value.items()} for t in self.timers]
        return [t for t in named if any(k.endswith("_microstep") for k in t)]


def _clean(raw: str) -> str:
    line = _ANSI.sub("", raw).replace("\r", "")
    return _RANK_PREFIX.sub("", line)


def _binary(line: str) -> bool:
    if "\x00" in line:
        return True
    if len(line) < 8:
        return False
    bad = sum(1 for c in line if c == "\ufffd" or (ord(c) < 32 and c != "\t"))
    return bad > 0.3 * len(line)


_OUTER_PHASES = (  # frames that put the whole traceback before training, whatever runs inside them
    ("engine initialisation", re.compile(r"in (?:initialize|initialize_optimizer_states|_configure_optimizer|"
                                         r"_configure_zero_optimizer|_create_fp32_partitions|__init__)\b.*|"
                                         r"deepspeed\.initialize\(")),
    ("model loading", re.compile(r"in (?:from_pretrained|load_model|_load_pretrained_model|load_state_dict|_apply)"
                                 r"\b|\bload_model\(|\bt\.to\(|\.cuda\(\)")),
)


def _phase_before(lines: list[str], end: int) -> str:
    """The phase of an OOM from the traceback around it (the 60 lines before ``end``, where Python prints the
    frames, else the 10 after it, for excerpts that quote the error first): "engine initialisation" or "model
    loading" when a frame of deepspeed.initialize (which runs a first optimizer step inside) or of model loading
    is in it, else the phase of the innermost matching frame."""
    window = [*reversed(lines[max(0, end - 60):end + 1]), *lines[end + 1:end + 11]]
    for phase, pattern in _OUTER_PHASES:
        if any(pattern.search(ln) and "Traceback" not in ln for ln in window if "File " in ln or "(" in ln):
            if phase == "engine initialisation" and not any(
                    re.search(r"deepspeed|initialize", ln) for ln in window):
                continue
            return phase
    for ln in window:
        for phase, pattern in _PHASE_FRAMES:
            if pattern.search(ln):
                return phase
    return ""


def read_log(data: str | bytes, *, max_bytes: int = MAX_LOG_BYTES) -> LogReading:
    """Read ``data`` (a log's text or bytes) into a :class:`LogReading`. Never raises on content: what it cannot
    read is listed in ``skipped``. Raises ``TypeError`` only when ``data`` is neither str nor bytes."""
    out = LogReading()
    if isinstance(data, str):
        raw = data.encode("utf-8", errors="replace")
    elif isinstance(data, (bytes, bytearray)):
        raw = bytes(data)
    else:
        raise TypeError(f"read_log takes str or bytes, not {type(data).__name__}")
    if len(raw) > max_bytes:
        out.skipped.append(f"the first {len(raw) - max_bytes:,} bytes (only the last {max_bytes // _MIB} MiB of a "
                           "log are read)")
        raw = raw[-max_bytes:]
        raw = raw[raw.find(b"\n") + 1:] if b"\n" in raw else raw
    text = raw.decode("utf-8", errors="replace")
    lines = [_clean(x) for x in text.split("\n")]
    starts = [i for i, ln in enumerate(lines) if _RUN_START.search(ln)]
    first = 0
    if len(starts) > 1:
        # a run starts where the launcher/engine banner appears; keep the last run (several ranks print the banner
        # at once: lines within 50 of each other are one start)
        groups = [starts[0]]
        for s in starts[1:]:
            if s - groups[-1] > 50:
                groups.append(s)
        if len(groups) > 1:
            first = groups[-1]
            out.skipped.append(f"{len(groups) - 1} earlier run(s) in the same file (lines 1-{first}): only the last "
                               "run is read")
    binary = 0
    op = None
    in_comms = False
    for i in range(first, len(lines)):
        ln = lines[i]
        number = i + 1
        if _binary(ln):
            binary += 1
            continue
        out.lines_read += 1
        # an OOM message spans a few sentences, often wrapped or split over lines: matched on a window of the
        # next lines, built only where a message starts
        window = " ".join(x.strip() for x in lines[i:i + 6]) if "Tried to allocate" in ln else ""
        for wording, pattern in (OOM_WORDINGS.items() if window else ()):
            m = pattern.search(window)
            if m:
                g = m.groups()
                tried, gpu, total = _bytes(g[0], g[1]), int(g[2]) if g[2] else None, _bytes(g[3], g[4])
                if wording == "new":
                    free = _bytes(g[5], g[6])
                    alloc = _bytes(g[9], g[10]) if g[9] else None
                    unalloc = _bytes(g[11], g[12]) if g[11] else None
                    reserved = alloc + unalloc if alloc is not None and unalloc is not None else None
                elif wording == "1.x":
                    alloc, free, reserved = _bytes(g[5], g[6]), _bytes(g[7], g[8]), _bytes(g[9], g[10])
                    unalloc = reserved - alloc
                else:  # "cached": the caching allocator's cache, reserved but not allocated
                    alloc, free, unalloc = _bytes(g[5], g[6]), _bytes(g[7], g[8]), _bytes(g[9], g[10])
                    reserved = alloc + unalloc
                out.ooms.append(OOM(tried, gpu, total, free, alloc, reserved, unalloc, wording,
                                    _phase_before(lines, i), number, ln.strip()[:500]))
                break
        m = _TIMER_LINE.search(ln)
        if m:
            # every part must be "name: number" with DeepSpeed's names (letters and _): Megatron prints its own
            # "time (ms) | forward: ... | backward-backward: ..." lines, which are not DeepSpeed's timers
            parts = [_TIMER_PART.match(x) for x in m.group(1).split("|")[1:]]
            if parts and all(parts):
                out.timers.append(Figure({p.group(1): float(p.group(2)) for p in parts}, number, ln.strip()[:500]))
            continue
        if _COMMS_HEADER.search(ln):
            in_comms, op = True, None
            out.comms = []  # a later summary replaces an earlier one (it is cumulative)
            continue
        if in_comms:
            r = _COMMS_ROW.match(ln)
            if r and op:
                g = r.groups()
                out.comms.append(CommRow(op, _bytes(g[0], g[1]), int(g[2]), float(g[3]), float(g[4]), float(g[5]),
                                         float(g[6]), number))
                continue
            o = _OP_NAME.match(ln.strip()) if ln.strip() else None
            if o:
                op = o.group(1)
                continue
            if ln.strip():
                in_comms = False
        m = _MEMORY.search(ln)
        if m:
            out.memory.append(Figure(dict(zip(("ma_gib", "max_ma_gib", "ca_gib", "max_ca_gib"),
                                              map(float, m.groups()))), number, ln.strip()[:500]))
            continue
        m = _TRAINER.search(ln)
        if m:
            metrics = {k: float(v) for k, v in _TRAINER_ITEM.findall(m.group(0))}
            out.trainer.append(Figure(metrics, number, ln.strip()[:500]))
            continue
        for key, pattern in _FLOPS.items():
            f = pattern.search(ln)
            if f:
                value = float(f.group(1))
                unit = f.group(2)
                if key.endswith("_seconds"):
                    value *= {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]
                else:
                    value *= {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}[unit]
                out.flops[key] = Figure(value, number, ln.strip()[:500])
        for key, pattern in _SETTINGS.items():
            s = pattern.search(ln)
            if s and key not in out.settings:
                value = next(v for v in s.groups() if v is not None)
                out.settings[key] = Figure(int(value), number, ln.strip()[:500])
    if binary:
        out.skipped.append(f"{binary} line(s) of binary content")
    return out
