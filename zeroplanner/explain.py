"""Every number explained: for each memory term and step-time component of a scenario, its formula (words and
LaTeX), the same formula with the scenario's numbers substituted, the result with its unit, and its source.

The numbers come from :mod:`zeroplanner.costmodel.explain_terms`: every value is the vectorised
:func:`~zeroplanner.costmodel.evaluate` at the scenario's candidate (the number the chart draws), and the memory,
host and communication-volume terms are the labelled parts of :mod:`zeroplanner.costmodel.terms`, whose
expressions this module renders as the formula and as the formula with numbers (the same strings computed them).
Titles, symbols, words and sources are :data:`zeroplanner.costmodel.terms.TERM_INFO`. Only the step-time terms'
formulas are still written here (:func:`_time_parts`), beside numbers taken from the model. Nothing here imports ipywidgets: :func:`explanation_html` returns HTML with ``$...$`` math
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
from .costmodel.terms import (
    SYMBOLS,
    TERM_INFO,
    TIME_SEGMENTS,
    input_names,
    is_sum,
    latex,
)
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
_TIME_SYMBOLS = {
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
    "shard": (r"\Psi_t/N_d", "parameters the GPU updates"),
}
"""Symbols of the step-time explanations' inputs (their formulas are written in :func:`_time_parts`); the memory
terms' symbols are :data:`zeroplanner.costmodel.terms.SYMBOLS`."""


def _symbol(k: str) -> tuple[str, str] | None:
    if k in _TIME_SYMBOLS:
        return _TIME_SYMBOLS[k]
    if k in SYMBOLS:
        return SYMBOLS[k].latex, SYMBOLS[k].meaning
    return None


def _quantities(tv: TermValues, keys: tuple[str, ...]) -> list[Quantity]:
    out = []
    for k in keys:
        sym = _symbol(k) if k in tv.inputs else None
        if sym is not None:
            out.append(Quantity(symbol=sym[0], value=float(tv.inputs[k]), unit=et.INPUT_UNITS.get(k, ""),
                                meaning=sym[1]))
    return out


def _input_keys(tv: TermValues) -> tuple[str, ...]:
    """The inputs of the parts' expressions, in order of first use (terms stated as expressions), else the
    step-time term's list."""
    if tv.key in et.EXPRESSION_TERMS:
        return tuple(dict.fromkeys(n for expr in tv.formulas.values() for n in input_names(expr)))
    return _INPUT_KEYS.get(tv.key, ())


def _number(tv: TermValues, name: str) -> str:
    """Input ``name`` of ``tv`` as LaTeX, formatted by its unit."""
    x = tv.inputs[name]
    unit = SYMBOLS[name].unit
    if unit == "bytes":
        return fmt_bytes(x)
    if unit.startswith("bytes/"):
        return _b(x)
    if unit == "fraction":
        return f"{x:.3g}"
    return fmt_count(x)


def _expression_parts(tv: TermValues) -> list[Part]:
    """Each part of a term stated as expressions (:mod:`zeroplanner.costmodel.terms`): its symbolic LaTeX and the
    same with the scenario's numbers, both from the expression that computed it."""
    out = []
    for label, expr in tv.formulas.items():
        sym, num = latex(expr), latex(expr, lambda n: _number(tv, n))
        if is_sum(expr):  # one addend of the term's sum: keep the part's own sum together
            sym, num = f"({sym})", f"({num})"
        out.append(Part(label=label, latex=sym, numbers=num, value=float(tv.parts[label])))
    return out


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
    return _table_parts(tv, table, fmt_seconds)


_INPUT_KEYS = {
    "compute": ("ga", "tokens_micro", "flops_token", "model_flops_token", "peak", "mfu"),
    "communication": ("ga", "N_d"),
    "offload": ("ga",),
    "optimizer": ("gpn", "Psi_t", "N_d", "cpu_rate", "touched", "hbm"),
    "step": (),
}
"""Inputs listed for the step-time terms (the others list the inputs of their parts' expressions)."""


def explain(scenario: Scenario, key: str) -> Explanation:
    """Explain one term of ``scenario``: keys of :data:`KEYS` (the six per-GPU memory terms of
    ``Estimate.per_gpu_bytes``, "host_memory", "communication_volume", "compute", "communication", "offload",
    "optimizer", "step"). Raises ``KeyError`` naming the known keys for any other key."""
    if key not in et.ALL_FUNCTIONS:
        raise KeyError(f"unknown term {key!r}; known: {', '.join(et.ALL_FUNCTIONS)}")
    tv = et.ALL_FUNCTIONS[key](scenario)
    info = TERM_INFO[key]
    title, symbol, category = info.title, info.symbol, info.category
    parts = _expression_parts(tv) if key in et.EXPRESSION_TERMS else _time_parts(tv)
    # zero parts are left out (a term that is offloaded or absent reads "= 0"), except for communication, where
    # max(0, communication - compute) = 0 is the lesson of overlap_comm
    shown = parts if key == "communication" else [p for p in parts if p.value != 0]
    if not shown:
        formula = symbol + " = 0"
        substituted = symbol + " = " + _fmt_value(tv.unit, 0.0)
    else:
        formula = symbol + " = " + " + ".join(p.latex for p in shown)
        substituted = symbol + " = " + " + ".join(p.numbers for p in shown)
        values = [_fmt_value(tv.unit, p.value) for p in shown]
        if len(shown) > 1 and values != [p.numbers for p in shown]:
            substituted += " = " + " + ".join(values)
        substituted += " = " + _fmt_value(tv.unit, tv.value)
    return Explanation(
        key=key, title=title, category=category, case=tv.case, value=float(tv.value), unit=tv.unit,
        display=_display(tv), words=info.words, latex=formula, substituted=substituted,
        inputs=_quantities(tv, _input_keys(tv)), parts=parts, source=info.source,
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
    by_key = {s.key: s for s in TIME_SEGMENTS}
    if segment not in by_key:
        raise KeyError(f"unknown time segment {segment!r}; known: {', '.join(by_key)}")
    return [explain(scenario, k) for k in by_key[segment].terms]


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
