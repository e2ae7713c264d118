"""Every number explained: for each memory term and step-time component of a scenario, its formula (words and
LaTeX), the same formula with the scenario's numbers substituted, the result with its unit, and its source.

The numbers come from :mod:`zeroplanner.costmodel.explain_terms`, which evaluates the cost model's own context
and functions term by term (tests check each value equals :func:`zeroplanner.costmodel.estimate`'s); this module
only writes them down. Nothing here imports ipywidgets: :func:`explanation_html` returns HTML with ``$...$`` math
for ``ipywidgets.HTMLMath`` (MathJax), :func:`explanation_markdown` the same for a Markdown report.

Units: bytes are shown in GiB (2^30 bytes; MiB below 0.01 GiB), times in seconds (ms below 0.1 s), parameter
counts as a x 10^k.
"""

from __future__ import annotations

import html
import math
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict

from .costmodel import explain_terms as et
from .costmodel.explain_terms import TermValues
from .specs import Scenario
from .units import GIB

Category = Literal["memory", "host", "communication", "time"]


class Quantity(BaseModel):
    """One input of a formula: its symbol (LaTeX), value, unit and meaning."""

    model_config = ConfigDict(frozen=True)

    symbol: str
    value: float
    unit: str
    meaning: str


class Part(BaseModel):
    """One addend of a formula: label, symbolic LaTeX, LaTeX with numbers, value (bytes or seconds)."""

    model_config = ConfigDict(frozen=True)

    label: str
    latex: str
    numbers: str
    value: float


class Explanation(BaseModel):
    """A term explained. ``value`` is in ``unit`` ("bytes" or "seconds"); ``display`` is the value as shown
    (e.g. "12.55 GiB"). ``latex`` is the symbolic formula, ``substituted`` the same with numbers and the result."""

    model_config = ConfigDict(frozen=True)

    key: str
    title: str
    category: Category
    case: str
    value: float
    unit: str
    display: str
    words: str
    latex: str
    substituted: str
    inputs: list[Quantity]
    parts: list[Part]
    source: str


# --------------------------------------------------------------------------------------------------------------
# Number formatting (LaTeX)
# --------------------------------------------------------------------------------------------------------------
def fmt_count(x: float) -> str:
    """A count in LaTeX: 6.74\\times10^{9} for >= 10^4, else the plain number (3 significant digits)."""
    if x == 0:
        return "0"
    if abs(x) >= 1e4:
        exp = int(math.floor(math.log10(abs(x))))
        mant = x / 10**exp
        if round(mant, 2) >= 10:
            mant, exp = mant / 10, exp + 1
        return rf"{mant:.3g}\times10^{{{exp}}}"
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.3g}"


def _in_unit(x: float, threshold: float, large: tuple[float, str, str], small: tuple[float, str, str]) -> str:
    """``x`` as "number unit": in ``large`` when ``|x| >= threshold`` or ``x == 0``, else in ``small``; each unit is
    (units per base unit, format spec, name), e.g. (2**-30, ".2f", "GiB") for bytes."""
    per_base, spec, name = large if abs(x) >= threshold or x == 0 else small
    return f"{x * per_base:{spec}} {name}"


def _latex_unit(text: str) -> str:
    """LaTeX of a "number unit" text: "12.55 GiB" -> 12.55\\,\\mathrm{GiB}."""
    number, unit = text.split()
    return rf"{number}\,\mathrm{{{unit}}}"


def fmt_bytes_text(x: float) -> str:
    """Bytes for people: "12.55 GiB" (MiB below 0.01 GiB)."""
    return _in_unit(x, 0.01 * GIB, (1 / GIB, ".2f", "GiB"), (2**-20, ".2f", "MiB"))


def fmt_bytes(x: float) -> str:
    """Bytes in LaTeX: 12.55\\,\\mathrm{GiB}."""
    return _latex_unit(fmt_bytes_text(x))


def fmt_seconds_text(x: float) -> str:
    """Seconds for people: "1.234 s" (ms below 0.1 s)."""
    return _in_unit(x, 0.1, (1, ".3f", "s"), (1e3, ".3g", "ms"))


def fmt_seconds(x: float) -> str:
    """Seconds in LaTeX: 1.234\\,\\mathrm{s}."""
    return _latex_unit(fmt_seconds_text(x))


def _b(x: float) -> str:
    """Bytes per element (2, 4, 0.516)."""
    return f"{x:.4g}"


def _fmt_value_text(unit: str, x: float) -> str:
    """``x`` bytes (``unit`` "bytes") or seconds (any other unit) for people."""
    return fmt_bytes_text(x) if unit == "bytes" else fmt_seconds_text(x)


def _display(tv: TermValues) -> str:
    return _fmt_value_text(tv.unit, tv.value)


def _fmt_value(tv_unit: str, x: float) -> str:
    return _latex_unit(_fmt_value_text(tv_unit, x))


def _table_parts(tv: TermValues, table: dict[str, tuple[str, str]], fmt: Callable[[float], str]) -> list[Part]:
    """One :class:`Part` per entry of ``tv.parts``, its (symbolic, numeric) LaTeX from ``table``; a label the table
    lacks shows as text, its value formatted by ``fmt``."""
    out = []
    for label, value in tv.parts.items():
        sym, num = table.get(label, (rf"\text{{{label}}}", fmt(value)))
        out.append(Part(label=label, latex=sym, numbers=num, value=float(value)))
    return out


# --------------------------------------------------------------------------------------------------------------
# Formulas per term
# --------------------------------------------------------------------------------------------------------------
_SYMBOLS = {
    "Psi": (r"\Psi", "parameters of the model (per tensor-parallel rank)"),
    "Psi_t": (r"\Psi_t", "trainable parameters"),
    "Psi_f": (r"\Psi_f", "frozen parameters (LoRA base)"),
    "Psi_persist": (r"\Psi_{pers}", "stage-3 persistent parameters (below stage3_param_persistence_threshold)"),
    "N_d": (r"N_d", "data-parallel degree (GPUs that share the ZeRO partitions)"),
    "w": (r"w", "bytes per working-precision element"),
    "w_f": (r"w_f", "bytes per frozen-base element (NF4 for QLoRA)"),
    "K": (r"K", "bytes per parameter of fp32 master weights + optimizer states"),
    "master": (r"m", "bytes per parameter of fp32 master weights"),
    "opt_state": (r"k", "bytes per parameter of optimizer states"),
    "hpz": (r"h_{pz}", "zero_hpz_partition_size"),
    "L": (r"L", "layers"),
    "s": (r"s", "sequence length"),
    "b": (r"b", "micro-batch"),
    "h": (r"h", "hidden size"),
    "V": (r"V", "vocabulary"),
    "a_b": (r"a", "bytes per activation element"),
    "layer": (r"A_{layer}", "bytes one layer saves for backward"),
    "t": (r"t", "tensor-parallel degree"),
    "bucket": (r"B", "reduce bucket, elements"),
    "overlap": (r"o", "2 with overlap_comm (double buffering), else 1"),
    "copies": (r"o", "reduce-bucket copies"),
    "live": (r"B_{live}", "stage3_max_live_parameters"),
    "largest": (r"\Psi_{max}", "parameters of the largest module"),
    "prefetch": (r"B_{pf}", "stage3_prefetch_bucket_size"),
    "kept": (r"K", "parameters kept gathered from forward into backward: min(B_live, stage3_max_reuse_distance, Ψ)"),
    "context": (r"C", "CUDA context + workspaces"),
    "frag": (r"f", "allocator fragmentation fraction"),
    "live_bytes": (r"M_{live}", "the other five terms together"),
    "ga": (r"GA", "gradient accumulation steps"),
    "tokens_micro": (r"b\,s", "tokens per micro-batch"),
    "flops_token": (r"F_{tok}", "executed FLOPs per token (incl. recompute)"),
    "model_flops_token": (r"F_{model}", "model FLOPs per token"),
    "peak": (r"P_{peak}", "dense peak FLOP/s"),
    "mfu": (r"\mathrm{MFU}", "model FLOP utilisation assumption"),
    "gpn": (r"g", "GPUs per node"),
    "cpu_rate": (r"R_{cpu}", "CPU-Adam parameter updates per second per node"),
    "touched": (r"\beta", "HBM bytes touched per parameter by the optimizer step"),
    "hbm": (r"BW_{HBM}", "HBM bandwidth, bytes/s"),
    "d_head": (r"d_{head}", "attention head dimension"),
    "shard": (r"\Psi_t/N_d", "parameters the GPU updates"),
    "frac": (r"\tfrac{N_d-1}{N_d}", "ring factor"),
}
_INPUT_UNITS = {**et.INPUT_UNITS, "copies": "x", "total": "s"}


def _quantities(tv: TermValues, keys: tuple[str, ...]) -> list[Quantity]:
    out = []
    for k in keys:
        if k in tv.inputs and k in _SYMBOLS:
            sym, meaning = _SYMBOLS[k]
            out.append(Quantity(symbol=sym, value=float(tv.inputs[k]), unit=_INPUT_UNITS.get(k, ""), meaning=meaning))
    return out


def _memory_parts(tv: TermValues) -> list[Part]:
    """Symbolic and numeric LaTeX for each part of a memory (or host) term."""
    i = tv.inputs
    n = fmt_count(i.get("N_d", 1))
    P, T, F = (fmt_count(i.get(k, 0)) for k in ("Psi", "Psi_t", "Psi_f"))
    w, wf = _b(i.get("w", 0)), _b(i.get("w_f", 0))
    table: dict[str, tuple[str, str]] = {}
    if tv.key == "parameters":
        pers = fmt_count(i["Psi_persist"])
        stage3_frozen = tv.case == "stage3"
        table = {
            "frozen base": ((r"w_f\Psi_f/N_d", rf"{wf}\times{F}/{n}") if stage3_frozen
                            else (r"w_f\Psi_f", rf"{wf}\times{F}")),
            "trainable": ((r"w\Psi_t/N_d", rf"{w}\times{T}/{n}") if tv.case.startswith("stage3")
                          else (r"w\Psi_t", rf"{w}\times{T}")),
            "persistent": ((r"w\Psi_{pers}", rf"{w}\times{pers}") if tv.case == "stage3_offload"
                           else (r"w\Psi_{pers}(1-1/N_d)", rf"{w}\times{pers}\times(1-1/{n})")),
            "partition": (r"w\Psi/N_d", rf"{w}\times{P}/{n}"),
            "hpZ secondary copy": (r"w\Psi/h_{pz}", rf"{w}\times{P}/{fmt_count(i['hpz'])}"),
        }
    elif tv.key == "gradients":
        table = {
            "working-precision gradients": ((r"w\Psi_t/N_d", rf"{w}\times{T}/{n}") if "partitioned" in tv.case
                                            else (r"w\Psi_t", rf"{w}\times{T}")),
            "fp32 copies (mixed-precision wrapper)": (r"4\Psi_t", rf"4\times{T}"),
            "accumulated working-precision gradients": (r"w\Psi_t", rf"{w}\times{T}"),
            "working-precision gradient partition": (r"w\Psi_t/N_d", rf"{w}\times{T}/{n}"),
            "fp32 gradient partition": (r"4\Psi_t/N_d", rf"4\times{T}/{n}"),
        }
    elif tv.key == "optimizer_states":
        sh = "/N_d" if tv.case == "partitioned" else ""
        shn = f"/{n}" if tv.case == "partitioned" else ""
        table = {
            "fp32 master weights": (rf"m\Psi_t{sh}", rf"{_b(i['master'])}\times{T}{shn}"),
            "optimizer states": (rf"k\Psi_t{sh}", rf"{_b(i['opt_state'])}\times{T}{shn}"),
        }
    elif tv.key == "activations":
        a, s, b, h, V, L = (fmt_count(i[k]) for k in ("a_b", "s", "b", "h", "V", "L"))
        minus = (r" - a\,s\,b\,h", rf" - {a}\times{s}\times{b}\times{h}") if i["shared"] else ("", "")
        rot = ((r" + 2a\,s\,b\,d_{head}", rf" + 2\times{a}\times{s}\times{b}\times{fmt_count(i['d_head'])}")
               if i["rotary"] else ("", ""))
        table = {
            "layer inputs + one layer recomputed": (r"L\,a\,s\,b\,h + A_{layer}" + minus[0],
                                                    rf"{L}\times{a}\times{s}\times{b}\times{h} + "
                                                    rf"{fmt_bytes(i['layer'])}" + minus[1]),
            "saved layer activations": (r"L\,A_{layer}", rf"{L}\times{fmt_bytes(i['layer'])}"),
            "final norm + lm_head inputs": (r"M_{final}", fmt_bytes(tv.parts.get("final norm + lm_head inputs", 0))),
            "token ids, labels, rotary tables": (r"16\,s\,b" + rot[0], rf"16\times{s}\times{b}" + rot[1]),
            "logits + fp32 log-softmax": (r"(a+4)\,s\,b\,V/t",
                                          rf"({a}+4)\times{s}\times{b}\times{V}/{fmt_count(i['t'])}"),
        }
    elif tv.key == "buffers":
        B = fmt_count(i.get("bucket", 0))
        o = fmt_count(i.get("overlap", 1))
        if tv.case == "stage0":
            table = {"all-reduce bucket": (r"w\min(5\times10^{8},\Psi_t)", rf"{w}\times{B}")}
        elif tv.case == "stage12":
            table = {"reduce bucket": (r"w\,B\,o", rf"{w}\times{B}\times{o}"),
                     "offload staging buffer": (r"w\Psi_{max}", rf"{w}\times{fmt_count(i.get('largest', 0))}")}
        else:
            live = min(i["live"], max(i["largest"] + i["prefetch"], i["kept"]), i["Psi"])
            table = {
                "gathered live parameters": (r"w\min(B_{live},\max(\Psi_{max}+B_{pf},K),\Psi)",
                                             rf"{w}\times{fmt_count(live)}"),
                "largest module's gradient": (r"w\Psi_{max}", rf"{w}\times{fmt_count(i['largest'])}"),
                "reduce bucket": (r"w\,B\,o", rf"{w}\times{B}\times{fmt_count(i['copies'])}"),
            }
    elif tv.key == "overhead":
        table = {"CUDA context": (r"C", fmt_bytes(i["context"])),
                 "allocator fragmentation": (r"f\,M_{live}", rf"{i['frag']:.3g}\times{fmt_bytes(i['live_bytes'])}")}
    elif tv.key == "host_memory":
        g, K = fmt_count(i["gpn"]), _b(i["K"])
        table = {
            "optimizer states + fp32 master": (r"g\,K\Psi_t/N_d", rf"{g}\times{K}\times{T}/{n}"),
            "pinned NVMe swap buffers (optimizer)": (r"g\cdot4\cdot\min(10^9,\Psi_t/N_d)K",
                                                     rf"{g}\times4\times\min(10^9,{T}/{n})\times{K}"),
            "fp32 gradients": (r"4g\Psi_t/N_d", rf"4\times{g}\times{T}/{n}"),
            "16-bit host copies": (r"g\,w\Psi_t/N_d", rf"{g}\times{w}\times{T}/{n}"),
            "16-bit staging buffer": (r"g\,w\Psi_{max}", rf"{g}\times{w}\times{fmt_count(i['largest'])}"),
            "parameter partition": (r"g\,w\Psi/N_d", rf"{g}\times{w}\times{P}/{n}"),
            "pinned NVMe swap buffers (parameters)": (r"g\cdot5\cdot10^8\,w", rf"{g}\times5\times10^{{8}}\times{w}"),
        }
    return _table_parts(tv, table, fmt_bytes)


def _time_parts(tv: TermValues) -> list[Part]:
    i = tv.inputs
    if tv.key == "compute":
        ga = fmt_count(i["ga"])
        rate = rf"{i['peak'] / 1e12:.4g}\times10^{{12}}\times{i['mfu']:.3g}"
        sym = r"GA\,b\,s\,F_{tok}/(P_{peak}\,\mathrm{MFU})"
        num = rf"{ga}\times{fmt_count(i['tokens_micro'])}\times{fmt_count(i['flops_token'])}/({rate})"
        return [Part(label="compute", latex=sym, numbers=num, value=tv.value)]
    if tv.key == "communication":
        ga = fmt_count(i["ga"])
        if tv.case == "overlap":
            fwd = (r"GA\max(0,t^{comm}_{fwd}-t^{comp}_{fwd})",
                   rf"{ga}\times\max(0,{fmt_seconds(i['fwd_comm'])}-{fmt_seconds(i['fwd_compute'])})")
            bwd = (r"GA\max(0,t^{comm}_{bwd}-t^{comp}_{bwd})",
                   rf"{ga}\times\max(0,{fmt_seconds(i['bwd_comm'])}-{fmt_seconds(i['bwd_compute'])})")
        else:
            fwd = (r"GA\,t^{comm}_{fwd}", rf"{ga}\times{fmt_seconds(i['fwd_comm'])}")
            bwd = (r"GA\,t^{comm}_{bwd}", rf"{ga}\times{fmt_seconds(i['bwd_comm'])}")
        table = {"step boundary": (r"t_{boundary}", fmt_seconds(i["boundary"])), "forward (exposed)": fwd,
                 "backward (exposed)": bwd}
    elif tv.key == "offload":
        ga = fmt_count(i["ga"])
        table = {"PCIe (exposed)": (r"GA\max(0,t_{pcie}-t_{micro})",
                                    rf"{ga}\times\max(0,{fmt_seconds(i['pcie_micro'])}-"
                                    rf"{fmt_seconds(i['micro_compute'])})"),
                 "parameter upload": (r"t_{upload}", fmt_seconds(i["pcie_boundary"])),
                 "NVMe": (r"t_{nvme}", fmt_seconds(i["nvme"]))}
    elif tv.key == "optimizer":
        if tv.case == "cpu":
            table = {"optimizer step": (r"g\,\Psi_t/(N_d\,R_{cpu})", rf"{fmt_count(i['gpn'])}\times"
                                        rf"{fmt_count(i['Psi_t'])}/({fmt_count(i['N_d'])}\times"
                                        rf"{fmt_count(i['cpu_rate'])})")}
        else:
            table = {"optimizer step": (r"\beta\,\Psi_t/(N_d\,BW_{HBM})" if i["shard"] != i["Psi_t"]
                                        else r"\beta\,\Psi_t/BW_{HBM}",
                                        rf"{_b(i['touched'])}\times{fmt_count(i['shard'])}/({fmt_count(i['hbm'])})")}
    elif tv.key == "step":
        table = {k: (rf"t_{{{k}}}", fmt_seconds(v)) for k, v in tv.parts.items()}
    elif tv.key == "communication_volume":
        frac = r"\tfrac{N_d-1}{N_d}"
        fr = rf"\tfrac{{{fmt_count(i['N_d'])}-1}}{{{fmt_count(i['N_d'])}}}"
        table = {"all-reduce": (rf"2{frac}S_{{ar}}", rf"2\times{fr}\times{fmt_bytes(i['size all_reduce'])}"),
                 "reduce-scatter": (rf"{frac}S_{{rs}}", rf"{fr}\times{fmt_bytes(i['size reduce_scatter'])}"),
                 "all-gather": (rf"{frac}S_{{ag}}", rf"{fr}\times{fmt_bytes(i['size all_gather'])}")}
        return _table_parts(tv, table, fmt_bytes)
    return _table_parts(tv, table, fmt_seconds)


_TITLES = {
    "parameters": ("Parameters", r"M_{params}", "memory"),
    "gradients": ("Gradients", r"M_{grads}", "memory"),
    "optimizer_states": ("Optimizer states", r"M_{opt}", "memory"),
    "activations": ("Activations", r"M_{act}", "memory"),
    "buffers": ("Buffers", r"M_{buf}", "memory"),
    "overhead": ("Overhead", r"M_{ovh}", "memory"),
    "host_memory": ("Host RAM per node", r"M_{host}", "host"),
    "communication_volume": ("Bytes sent per GPU per step", r"V_{comm}", "communication"),
    "compute": ("Compute time", r"t_{compute}", "time"),
    "communication": ("Exposed communication time", r"t_{comm}", "time"),
    "offload": ("Exposed offload time", r"t_{offload}", "time"),
    "optimizer": ("Optimizer step time", r"t_{optimizer}", "time"),
    "step": ("Step time", r"t_{step}", "time"),
}

_WORDS = {
    "parameters": "Working copy of the weights each GPU holds: all of them below ZeRO-3, its 1/N_d partition "
                  "(+ small persistent tensors) at ZeRO-3.",
    "gradients": "Gradients each GPU holds at the step's gradient peak: working precision, plus the fp32 copy "
                 "DeepSpeed hands to the optimizer; partitioned over N_d from ZeRO-2 (ZeRO-1 as measured).",
    "optimizer_states": "fp32 master weights and optimizer states (Adam: momentum + variance); partitioned over "
                        "N_d from ZeRO-1; moved to the host with offload_optimizer.",
    "activations": "Tensors saved for backward for one micro-batch, from the architecture; with full "
                   "checkpointing only each layer's input plus one layer being recomputed.",
    "buffers": "Communication buckets and the ZeRO-3 working set of gathered parameters.",
    "overhead": "CUDA context and workspaces, plus caching-allocator fragmentation on the live bytes.",
    "host_memory": "Host RAM each node needs for what is offloaded, summed over its GPUs.",
    "communication_volume": "Bytes each GPU sends per optimizer step in ring collectives.",
    "compute": "Executed FLOPs of the step divided by the achieved rate (peak x MFU).",
    "communication": "Collective time that compute does not hide: step-boundary collectives, and with "
                     "overlap_comm only what exceeds the forward/backward compute of each micro-step.",
    "offload": "PCIe traffic to and from the host that compute does not hide, the boundary upload, NVMe swapping.",
    "optimizer": "The optimizer step: memory-bound on the GPU (roofline), or DeepSpeed CPU-Adam on the host.",
    "step": "Step time = compute + exposed communication + exposed offload + optimizer step.",
}

_SOURCES = {
    "host_memory": "zeroplanner/costmodel/memory.py host_and_nvme_bytes; DeepSpeed offload_config.py defaults "
                   "(buffer_count, buffer_size, sub_group_size); host extras measured (docs/validation.md)",
    "communication_volume": "ZeRO paper (arXiv 1910.02054) Sec. 7: 2Ψ for DP and ZeRO-1/2, 3Ψ for ZeRO-3; what "
                            "DeepSpeed 0.19.8 sends (zeroplanner/costmodel/communication.py)",
    "compute": "PaLM (arXiv 2204.02311) App. B: 6N + 12LHQT FLOPs per token; recompute: Korthikanti et al. "
               "(arXiv 2205.05198) Sec. 5; MFU assumption (Assumptions.mfu); zeroplanner/costmodel/compute.py",
    "communication": "alpha-beta ring model (Hockney 1994) with NCCL's latency model (src/graph/tuning.cc) and "
                     "busbw (nccl-tests PERFORMANCE.md); overlap as in DeepSpeed stage_1_and_2.py / stage3.py; "
                     "zeroplanner/costmodel/communication.py and evaluate.py",
    "offload": "PCIe and NVMe bandwidths from the GPU and cluster specs; zeroplanner/costmodel/compute.py "
               "optimizer_and_offload_terms",
    "optimizer": "GPU: roofline (Williams et al., CACM 2009) with OPTIMIZER_BYTES_TOUCHED; CPU: DeepSpeed "
                 "CPU-Adam rate ClusterSpec.cpu_adam_params_per_second (calibration); "
                 "zeroplanner/costmodel/compute.py",
    "step": "zeroplanner/costmodel/evaluate.py evaluate",
}

_INPUT_KEYS = {
    "parameters": ("Psi", "Psi_t", "Psi_f", "w", "w_f", "N_d", "Psi_persist", "hpz"),
    "gradients": ("Psi_t", "w", "N_d", "ga"),
    "optimizer_states": ("Psi_t", "master", "opt_state", "N_d"),
    "activations": ("L", "s", "b", "h", "V", "a_b", "layer", "t", "d_head"),
    "buffers": ("w", "bucket", "overlap", "copies", "live", "largest", "prefetch", "kept", "Psi"),
    "overhead": ("context", "frag", "live_bytes"),
    "host_memory": ("gpn", "Psi_t", "Psi", "K", "N_d", "w", "largest"),
    "communication_volume": ("N_d", "Psi_t", "Psi", "w", "ga"),
    "compute": ("ga", "tokens_micro", "flops_token", "model_flops_token", "peak", "mfu"),
    "communication": ("ga", "N_d"),
    "offload": ("ga",),
    "optimizer": ("gpn", "Psi_t", "N_d", "cpu_rate", "touched", "hbm"),
    "step": (),
}


def _source(key: str, scenario: Scenario) -> str:
    if key in et.MEMORY_FUNCTIONS:
        from .costmodel.evaluate import _TERM_DOCS  # the estimate's own term sources

        return _TERM_DOCS[key][2]
    return _SOURCES[key]


def explain(scenario: Scenario, key: str) -> Explanation:
    """Explain one term of ``scenario``: keys of :data:`KEYS` (the six per-GPU memory terms of
    ``Estimate.per_gpu_bytes``, "host_memory", "communication_volume", "compute", "communication", "offload",
    "optimizer", "step"). Raises ``KeyError`` naming the known keys for any other key."""
    if key not in et.ALL_FUNCTIONS:
        raise KeyError(f"unknown term {key!r}; known: {', '.join(et.ALL_FUNCTIONS)}")
    tv = et.ALL_FUNCTIONS[key](scenario)
    title, symbol, category = _TITLES[key]
    parts = _time_parts(tv) if tv.unit == "seconds" or key == "communication_volume" else _memory_parts(tv)
    # zero parts are left out (a term that is offloaded or absent reads "= 0"), except for communication, where
    # max(0, communication - compute) = 0 is the lesson of overlap_comm
    shown = parts if key == "communication" else [p for p in parts if p.value != 0]
    if not shown:
        latex = symbol + " = 0"
        substituted = symbol + " = " + _fmt_value(tv.unit, 0.0)
    else:
        latex = symbol + " = " + " + ".join(p.latex for p in shown)
        substituted = symbol + " = " + " + ".join(p.numbers for p in shown)
        values = [_fmt_value(tv.unit, p.value) for p in shown]
        if len(shown) > 1 and values != [p.numbers for p in shown]:
            substituted += " = " + " + ".join(values)
        substituted += " = " + _fmt_value(tv.unit, tv.value)
    return Explanation(
        key=key, title=title, category=category, case=tv.case, value=float(tv.value), unit=tv.unit,
        display=_display(tv), words=_WORDS[key], latex=latex, substituted=substituted,
        inputs=_quantities(tv, _INPUT_KEYS[key]), parts=parts, source=_source(key, scenario),
    )


KEYS: tuple[str, ...] = tuple(et.ALL_FUNCTIONS)
MEMORY_KEYS: tuple[str, ...] = tuple(et.MEMORY_FUNCTIONS)
TIME_KEYS: tuple[str, ...] = ("compute", "communication", "offload", "optimizer")


def explain_all(scenario: Scenario) -> dict[str, Explanation]:
    """Every term of :data:`KEYS` explained."""
    return {k: explain(scenario, k) for k in KEYS}


def explain_time_segment(scenario: Scenario, segment: str) -> list[Explanation]:
    """Explanations behind one segment of the app's step-time chart (``zeroplanner.ui.state.TIME_PARTS`` keys):
    "compute", "communication", or "offload" (offload + optimizer step, which that chart stacks together)."""
    if segment == "offload":
        return [explain(scenario, "offload"), explain(scenario, "optimizer")]
    return [explain(scenario, segment)]


def _fmt_quantity(q: Quantity) -> str:
    if q.unit == "bytes":
        return fmt_bytes_text(q.value)
    if q.unit in ("s",):
        return fmt_seconds_text(q.value)
    if q.unit == "FLOP/s":
        return f"{q.value / 1e12:.4g} TFLOP/s"
    if q.unit == "bytes/s":
        return f"{q.value / 1e9:.4g} GB/s"
    number = f"{q.value:,.0f}" if abs(q.value) >= 1e4 else f"{q.value:.4g}"
    return f"{number} {q.unit}".strip()


def explanation_html(e: Explanation, *, heading: bool = True) -> str:
    """HTML for ``ipywidgets.HTMLMath``: title and value, words, the formula and the substituted numbers as display
    math, the inputs table and the source. Values are escaped; math is between ``$$``."""
    esc = html.escape
    rows = "".join(
        f"<tr><td>${q.symbol}$</td><td>{esc(_fmt_quantity(q))}</td><td>{esc(q.meaning)}</td></tr>"
        for q in e.inputs
    )
    parts = "".join(f"<li>{esc(p.label)}: {esc(_fmt_value_text(e.unit, p.value))}</li>" for p in e.parts)
    head = (f"<div class='zp-explain-title'><b>{esc(e.title)}</b>: <b class='zp-explain-value'>"
            f"{esc(e.display)}</b></div>") if heading else ""
    return (
        f"<div class='zp-explain' data-key='{esc(e.key)}' data-value='{e.value!r}'>{head}"
        f"<div>{esc(e.words)}</div>"
        f"<div class='zp-explain-formula'>$${e.latex}$$</div>"
        f"<div class='zp-explain-numbers'>$${e.substituted}$$</div>"
        f"<details><summary>Inputs and parts</summary><table class='zp-explain-inputs'>{rows}</table>"
        f"<ul>{parts}</ul></details>"
        f"<div class='zp-muted'>Unit: {esc('GiB (2^30 bytes)' if e.unit == 'bytes' else 'seconds per step')}. "
        f"Source: {esc(e.source)}</div></div>"
    )


def explanation_markdown(e: Explanation) -> str:
    """Markdown (with ``$$`` math) for a report."""
    lines = [f"**{e.title}: {e.display}** — {e.words}", "", f"$${e.latex}$$", "", f"$${e.substituted}$$", "",
             f"*Source:* {e.source}", ""]
    return "\n".join(lines)


Formatter = Callable[[Explanation], str]
