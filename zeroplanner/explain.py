"""Every number explained: for each memory term and step-time component of a scenario, its formula (words and
LaTeX), the same formula with the scenario's numbers substituted, the result with its unit, and its source.

The numbers come from :mod:`zeroplanner.costmodel.explain_terms`: every value is the vectorised
:func:`~zeroplanner.costmodel.evaluate` at the scenario's candidate (the number the chart draws), and every term,
memory and step time alike, is the labelled parts of :mod:`zeroplanner.costmodel.terms` the cost model computed it
with; this module renders those expressions as the formula and as the formula with numbers (the same strings
computed them), and a step-time term's ``definitions`` (the quantities its formula uses that are defined by an
expression of their own: exposed collectives per micro-step, the GPU's micro-step, ...) as "where" lines rendered
the same way. No formula is written here. Addends that are exactly 0 at the scenario's candidate are left out of
both forms (:func:`zeroplanner.costmodel.terms.latex`'s ``zero``), as are parts that are 0. Titles, symbols,
words and sources are :data:`zeroplanner.costmodel.terms.TERM_INFO`. Nothing here imports ipywidgets:
:func:`explanation_html` returns HTML with ``$...$`` math for ``ipywidgets.HTMLMath`` (MathJax),
:func:`explanation_markdown` the same for a Markdown report.

Units: bytes are shown in GiB (2^30 bytes; MiB below 0.01 GiB), times in seconds (ms below 0.1 s), parameter
counts, FLOPs and rates as a x 10^k.
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


class Definition(BaseModel):
    """A quantity a step-time formula uses that is defined by an expression of its own (a "where" line): its
    :data:`~zeroplanner.costmodel.terms.SYMBOLS` name, LaTeX symbol, meaning, value in ``unit`` ("s", or the
    symbol's unit), ``display`` (as shown), ``latex`` (symbol = formula), ``substituted`` (the same with numbers
    and the result) and parts."""

    model_config = ConfigDict(frozen=True)

    name: str
    symbol: str
    meaning: str
    value: float
    unit: str
    display: str
    latex: str
    substituted: str
    parts: list[Part]


class Explanation(BaseModel):
    """A term explained. ``value`` is in ``unit`` ("bytes" or "seconds"); ``display`` is the value as shown
    (e.g. "12.55 GiB"). ``latex`` is the symbolic formula, ``substituted`` the same with numbers and the result;
    ``definitions`` the where-lines of a step-time term (empty for the others)."""

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
    definitions: list[Definition] = []


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
    """Bytes for people: "12.55 GiB", and "512.00 MiB" below 1 GiB (in GiB with two decimals, 12 MiB read "0.01 GiB",
    and a sum of MiB parts did not add up to it by hand)."""
    return _in_unit(x, GIB, (1 / GIB, ".2f", "GiB"), (2**-20, ".2f", "MiB"))


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


def _is_seconds(unit: str) -> bool:
    return unit in ("seconds", "s")


def _fmt_value_text(unit: str, x: float) -> str:
    """``x`` bytes (``unit`` "bytes"), seconds ("seconds", "s") or a count of ``unit`` (FLOP/token) for people."""
    if unit == "bytes":
        return fmt_bytes_text(x)
    if _is_seconds(unit):
        return fmt_seconds_text(x)
    return f"{x:.3g} {unit}"


def _fmt_value(unit: str, x: float) -> str:
    """``x`` in LaTeX: bytes and seconds with their unit, anything else as a count (a x 10^k)."""
    if unit == "bytes":
        return fmt_bytes(x)
    if _is_seconds(unit):
        return fmt_seconds(x)
    return fmt_count(x)


def _display(tv: TermValues) -> str:
    return _fmt_value_text(tv.unit, tv.value)


# --------------------------------------------------------------------------------------------------------------
# Formulas: rendered from the expressions that computed each part
# --------------------------------------------------------------------------------------------------------------
def _symbol(k: str) -> tuple[str, str] | None:
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


def _zero(tv: TermValues) -> Callable[[str], bool]:
    """Whether an input of ``tv`` is exactly 0 (its addends are then left out of the formula shown)."""
    return lambda name: tv.inputs.get(name, 1.0) == 0.0


def _shown_formulas(tv: TermValues) -> dict[str, str]:
    """The expressions of the parts of ``tv`` that are not 0."""
    return {label: expr for label, expr in tv.formulas.items() if tv.parts[label] != 0.0}


def _input_keys(tv: TermValues) -> tuple[str, ...]:
    """The inputs of the formulas shown (the term's and its where-lines'), in order of first use, without the
    quantities a where-line defines."""
    defined = {d.key for d in tv.definitions}
    names = [n for t in (tv, *tv.definitions) for expr in _shown_formulas(t).values()
             for n in input_names(expr, _zero(t))]
    return tuple(n for n in dict.fromkeys(names) if n not in defined)


def _number(tv: TermValues, name: str) -> str:
    """Input ``name`` of ``tv`` as LaTeX, formatted by its unit."""
    x = tv.inputs[name]
    unit = SYMBOLS[name].unit
    if unit == "bytes":
        return fmt_bytes(x)
    if unit == "s":
        return fmt_seconds(x)
    if unit.startswith("bytes/") and unit != "bytes/s":
        return _b(x)
    if unit == "fraction":
        return f"{x:.3g}"
    return fmt_count(x)


def _expression_parts(tv: TermValues) -> list[Part]:
    """Each part of a term (:mod:`zeroplanner.costmodel.terms`): its symbolic LaTeX and the same with the
    scenario's numbers, both from the expression that computed it, without its addends that are 0; a part that is
    a sum is in parentheses (one addend of the term's sum: its own sum kept together)."""
    out = []
    zero = _zero(tv)
    for label, expr in tv.formulas.items():
        sym, num = latex(expr, zero=zero), latex(expr, lambda n: _number(tv, n), zero)
        if is_sum(expr, zero):
            sym, num = f"({sym})", f"({num})"
        out.append(Part(label=label, latex=sym, numbers=num, value=float(tv.parts[label])))
    return out


def _alone(text: str) -> str:
    """A part shown alone needs no parentheses around its sum."""
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0 and i < len(text) - 1:
                return text
        return text[1:-1]
    return text


def _equation(symbol: str, unit: str, value: float, parts: list[Part]) -> tuple[str, str]:
    """(symbol = formula, symbol = numbers [= the parts' values] = result) of the parts that are not 0."""
    shown = [p for p in parts if p.value != 0]
    if not shown:
        return symbol + " = 0", symbol + " = " + _fmt_value(unit, 0.0)
    if len(shown) == 1:
        p = shown[0]
        result = _fmt_value(unit, value)
        numbers = "" if _alone(p.numbers) == result else f" = {_alone(p.numbers)}"
        return f"{symbol} = {_alone(p.latex)}", f"{symbol}{numbers} = {result}"
    formula = symbol + " = " + " + ".join(p.latex for p in shown)
    substituted = symbol + " = " + " + ".join(p.numbers for p in shown)
    values = [_fmt_value(unit, p.value) for p in shown]
    if len(shown) > 1 and values != [p.numbers for p in shown]:
        substituted += " = " + " + ".join(values)
    return formula, substituted + " = " + _fmt_value(unit, value)


def _definition(d: TermValues) -> Definition:
    sym = SYMBOLS[d.key]
    parts = _expression_parts(d)
    formula, substituted = _equation(sym.latex, d.unit, d.value, parts)
    return Definition(name=d.key, symbol=sym.latex, meaning=sym.meaning, value=float(d.value), unit=d.unit,
                      display=_fmt_value_text(d.unit, d.value), latex=formula, substituted=substituted, parts=parts)


def explain(scenario: Scenario, key: str) -> Explanation:
    """Explain one term of ``scenario``: keys of :data:`KEYS` (the six per-GPU memory terms of
    ``Estimate.per_gpu_bytes``, "host_memory", "communication_volume", "compute", "communication", "offload",
    "optimizer", "step"). Raises ``KeyError`` naming the known keys for any other key."""
    if key not in et.ALL_FUNCTIONS:
        raise KeyError(f"unknown term {key!r}; known: {', '.join(et.ALL_FUNCTIONS)}")
    tv = et.ALL_FUNCTIONS[key](scenario)
    info = TERM_INFO[key]
    parts = _expression_parts(tv)
    # zero parts are left out (a term that is offloaded or absent reads "= 0"); within a part, max(0, comm -
    # compute) stays even where it is 0 (the lesson of overlap_comm)
    formula, substituted = _equation(info.symbol, tv.unit, tv.value, parts)
    return Explanation(
        key=key, title=info.title, category=info.category, case=tv.case, value=float(tv.value), unit=tv.unit,
        display=_display(tv), words=info.words, latex=formula, substituted=substituted,
        inputs=_quantities(tv, _input_keys(tv)), parts=parts, source=info.source,
        definitions=[_definition(d) for d in tv.definitions],
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
    if q.unit == "parameters/s":
        return f"{q.value / 1e9:.4g} x 10^9 parameters/s"
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
    where = ""
    if e.definitions:
        where = "<div class='zp-explain-where'><div class='zp-muted'>where</div>" + "".join(
            f"<div class='zp-explain-formula zp-explain-def' data-name='{esc(d.name)}'>$${d.latex}$$</div>"
            f"<div class='zp-explain-numbers zp-explain-def'>$${d.substituted}$$</div>" for d in e.definitions
        ) + "</div>"
    return (
        f"<div class='zp-explain' data-key='{esc(e.key)}' data-value='{e.value!r}'>{head}"
        f"<div>{esc(e.words)}</div>"
        f"<div class='zp-explain-formula'>$${e.latex}$$</div>"
        f"<div class='zp-explain-numbers'>$${e.substituted}$$</div>{where}"
        f"<details><summary>Inputs and parts</summary><table class='zp-explain-inputs'>{rows}</table>"
        f"<ul>{parts}</ul></details>"
        f"<div class='zp-muted'>Unit: {esc('GiB (2^30 bytes)' if e.unit == 'bytes' else 'seconds per step')}. "
        f"Source: {esc(e.source)}</div></div>"
    )


def formula_lines(e: Explanation) -> list[str]:
    """The formulas of ``e`` as Markdown lines (``$$`` math, blank lines between): the term's formula and its
    numbers, then each where-line's."""
    lines = [f"$${e.latex}$$", "", f"$${e.substituted}$$", ""]
    if e.definitions:
        lines += ["where", ""]
        for d in e.definitions:
            lines += [f"$${d.latex}$$", "", f"$${d.substituted}$$", ""]
    return lines


def explanation_markdown(e: Explanation) -> str:
    """Markdown (with ``$$`` math) for a report."""
    lines = [f"**{e.title}: {e.display}** — {e.words}", "", *formula_lines(e), f"*Source:* {e.source}", ""]
    return "\n".join(lines)


Formatter = Callable[[Explanation], str]
