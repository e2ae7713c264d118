"""A self-contained report of one scenario: the recommendation, the charts (inline SVG drawn here, no plotting
library and no network), every term explained, and the DeepSpeed config.

``build_report(scenario)`` returns an HTML page (one file, opens offline in any browser); ``fmt="markdown"``
returns Markdown with the charts as ``data:image/svg+xml`` images. :func:`report_data_uri` wraps it for a download
link. Nothing here imports ipywidgets.
"""

from __future__ import annotations

import base64
import html
import json
from importlib import metadata
from typing import Any, Literal, Sequence

from .advice import sentence
from .costmodel.terms import MEMORY_SEGMENTS, TIME_SEGMENTS, segment_value
from .explain import explain_all, fmt_bytes_text, fmt_seconds_text, formula_lines
from .specs import Scenario
from .units import GIB

Format = Literal["html", "markdown"]

TERM_SERIES = tuple((s.key, s.label, s.colour) for s in MEMORY_SEGMENTS)
"""Memory chart segments (Estimate.per_gpu_bytes keys), bottom to top, with the app's names and colours
(``costmodel.terms.MEMORY_SEGMENTS``)."""
TIME_SERIES = tuple((s.key, s.label, s.colour) for s in TIME_SEGMENTS)
"""Step-time chart segments (``costmodel.terms.TIME_SEGMENTS``)."""

_MEMORY_COLOURS = {s.key: s.colour for s in MEMORY_SEGMENTS}
TIMELINE_SERIES: tuple[tuple[str, str, str], ...] = (
    ("parameters", "Parameters", _MEMORY_COLOURS.get("parameters", "#4c78a8")),
    ("optimizer_states", "Optimizer states", _MEMORY_COLOURS.get("optimizer_states", "#e45756")),
    ("gradients", "Gradients", _MEMORY_COLOURS.get("gradients", "#f58518")),
    ("activations", "Activations", _MEMORY_COLOURS.get("activations", "#72b7b2")),
    ("logits", "Logits and loss", "#eeca3b"),
    ("buffers", "Buffers", _MEMORY_COLOURS.get("buffers", "#54a24b")),
    ("temporaries", "Temporaries", "#ff9da6"),
    ("offloaded", "Offloaded (CPU ranks)", "#9d755d"),
    ("runtime", "Runtime (CUDA, NCCL, allocator)", _MEMORY_COLOURS.get("overhead", "#b279a2")),
)
"""Terms of a step-timeline point (``costmodel.timeline.TIMELINE_TERMS``' keys of ``TimelinePoint.bytes``), bottom
to top, with their on-screen names and colours (the memory chart's colour where the term is one of its segments).
The app's "Memory over one step" chart and the report's timeline use the same."""

PHASE_SHORT = {"forward": "fwd", "loss forward": "loss fwd", "loss backward": "loss bwd", "backward": "bwd",
               "optimizer step": "opt step"}
"""Short names of the step's phases (``costmodel.timeline.PHASES``) for tick text."""


def timeline_ticks(points: Sequence[Any]) -> list[str]:
    """One short, distinct tick text per timeline point (``TimelinePoint``: ``phase``, ``label``): the phase's
    short name and the point's place in it, e.g. 'fwd 1/4', 'loss bwd', 'bwd start', 'opt step'."""
    import re

    out: list[str] = []
    for p in points:
        text = PHASE_SHORT.get(p.phase, p.phase)
        part = re.search(r"\d+/\d+", p.label)
        if part:
            text += " " + part.group(0)
        elif p.phase == "backward" and "start" in p.label:
            text += " start"
        elif p.phase == "backward" and "end" in p.label:
            text += " end"
        base, k = text, 2
        while text in out:
            text, k = f"{base} ({k})", k + 1
        out.append(text)
    return out


# --------------------------------------------------------------------------------------------------------------
# SVG
# --------------------------------------------------------------------------------------------------------------
def _nice_top(x: float) -> float:
    import math

    if not math.isfinite(x) or x <= 0:
        return 1.0
    k = math.floor(math.log10(x))
    for m in (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        if m * 10**k >= x:
            return m * 10**k
    return 10.0 ** (k + 1)


def svg_stacked_bars(title: str, labels: Sequence[str], series: Sequence[tuple[str, str, Sequence[float]]],
                     y_label: str, *, line: tuple[str, float] | None = None, notes: Sequence[str] = (),
                     width: int = 820, height: int = 380) -> str:
    """A stacked bar chart as an SVG document.

    labels: one per bar; series: (name, colour, values per bar), stacked in order; line: (name, y) drawn across
    the chart (e.g. the GPU's memory); notes: text over each bar ("fits", "OOM", tokens/s). Values in y units.
    Raises ValueError if a series' length differs from the labels'.
    """
    n = len(labels)
    for name, _, values in series:
        if len(values) != n:
            raise ValueError(f"series {name!r} has {len(values)} values for {n} bars")
    left, right, top, bottom = 70, 20, 40, 110
    pw, ph = width - left - right, height - top - bottom
    totals = [sum(float(v[i]) for _, _, v in series) for i in range(n)]
    ymax = _nice_top(max([*totals, line[1] if line else 0.0, 1e-12]) * 1.15)
    y = lambda v: top + ph - ph * (v / ymax)  # noqa: E731
    esc = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12" role="img" '
           f'aria-label="{esc(title)}">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{esc(title)}</text>']
    for i in range(6):
        v = ymax * i / 5
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    out.append(f'<text transform="translate(16,{top + ph / 2}) rotate(-90)" text-anchor="middle">{esc(y_label)}</text>')
    slot = pw / max(n, 1)
    bar = slot * 0.6
    for i, label in enumerate(labels):
        x = left + slot * i + (slot - bar) / 2
        base = 0.0
        for name, colour, values in series:
            v = float(values[i])
            if v > 0:
                out.append(f'<rect class="bar" x="{x:.1f}" y="{y(base + v):.1f}" width="{bar:.1f}" '
                           f'height="{max(y(base) - y(base + v), 0.5):.1f}" fill="{colour}">'
                           f'<title>{esc(label)}: {esc(name)} {v:.3g}</title></rect>')
            base += v
        if i < len(notes) and notes[i]:
            out.append(f'<text x="{x + bar / 2:.1f}" y="{y(min(base, ymax)) - 5:.1f}" text-anchor="middle" '
                       f'font-weight="bold">{esc(notes[i])}</text>')
        cx, cy = x + bar / 2, top + ph + 12
        out.append(f'<text x="{cx:.1f}" y="{cy:.1f}" text-anchor="end" transform="rotate(-30 {cx:.1f} {cy:.1f})">'
                   f'{esc(label)}</text>')
    if line is not None:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(line[1]):.1f}" y2="{y(line[1]):.1f}" '
                   f'stroke="#c62828" stroke-width="2" stroke-dasharray="6 4"/>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="#333"/>')
    out.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#333"/>')
    # the legend: one row above the plot; what does not fit in it continues in rows under the tick labels
    lx, ly = left + 8, top - 14
    legend = [(name, colour) for name, colour, _ in series] + ([(line[0], "#c62828")] if line else [])
    for name, colour in legend:
        step = 24 + 7 * len(name)
        if lx + step > width - right + 20 and lx > left + 8:
            lx, ly = left + 8, (top + ph + 72 if ly < top else ly + 16)
        out.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{lx + 14}" y="{ly + 9}">{esc(name)}</text>')
        lx += step
    out.append("</svg>")
    return "".join(out)


def svg_data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


# --------------------------------------------------------------------------------------------------------------
# Report content
# --------------------------------------------------------------------------------------------------------------
def _variants(p: Any) -> list[tuple[str, Any]]:
    out = []
    if p.fits and p.choice is not None:
        out.append(("Recommended", p.estimate))
    out += [(v.label, v.estimate) for v in p.variants]
    return out


def memory_chart(p: Any, scenario: Scenario) -> str:
    """SVG: per-GPU memory (GiB) of the recommendation and every variant, stacked by term, GPU memory as a line."""
    rows = _variants(p)
    labels = [label for label, _ in rows]
    series = [(s.label, s.colour, [segment_value(e, s) / GIB for _, e in rows]) for s in MEMORY_SEGMENTS]
    notes = ["fits" if e.fits_gpu else "OOM" for _, e in rows]
    return svg_stacked_bars("Memory per GPU (GiB)", labels, series, "GiB per GPU",
                            line=("GPU memory", scenario.cluster.memory_per_gpu_bytes / GIB), notes=notes)


def time_chart(p: Any) -> str:
    """SVG: step time (s) of the recommendation and every variant, split into compute, exposed communication and
    offload + optimizer; tokens/s over the bars that fit."""
    rows = _variants(p)
    labels = [label for label, _ in rows]
    series = [(s.label, s.colour, [segment_value(e, s) for _, e in rows]) for s in TIME_SEGMENTS]
    notes = [f"{e.tokens_per_second / 1e3:.3g}k tok/s" if e.fits else "OOM" for _, e in rows]
    return svg_stacked_bars("Step time (s) and tokens/s", labels, series, "seconds per step", notes=notes)


def step_peak_line(e: Any) -> str:
    """The headroom line of one estimate: ``Estimate.step_peak.verdict()`` (peak, its phase, headroom in GiB and %,
    "risky" when the headroom is below the model's error); "" when the estimate has no step timeline."""
    peak = getattr(e, "step_peak", None)
    return peak.verdict() if peak is not None else ""


def step_chart(e: Any, variant: str, scenario: Scenario) -> str:
    """SVG: memory per GPU over one training step of ``e`` (an ``Estimate``; GiB), one bar per timeline point
    stacked by term (:data:`TIMELINE_SERIES`), the GPU's memory as a line and "peak" over the peak point. "" when
    the estimate has no step timeline."""
    peak = getattr(e, "step_peak", None)
    if peak is None or not peak.timeline:
        return ""
    points = peak.timeline
    ticks = timeline_ticks(points)
    used = [(key, name, colour) for key, name, colour in TIMELINE_SERIES if any(p.bytes.get(key, 0) for p in points)]
    series = [(name, colour, [p.bytes.get(key, 0) / GIB for p in points]) for key, name, colour in used]
    at = _peak_index(points, peak.phase)
    notes = ["peak" if i == at else "" for i in range(len(points))]
    title = f"Memory over one step, {variant}: peak {peak.bytes / GIB:.1f} GiB in the {peak.phase}"
    return svg_stacked_bars(title, ticks, series, "GiB per GPU",
                            line=("GPU memory", scenario.cluster.memory_per_gpu_bytes / GIB), notes=notes)


def _peak_index(points: Sequence[Any], phase: str) -> int:
    """Index of the step's peak point: the largest total in the peak's phase (the first of equal ones)."""
    if not points:
        return -1
    candidates = [i for i, p in enumerate(points) if p.phase == phase] or list(range(len(points)))
    return max(candidates, key=lambda i: (points[i].total, -i))


def phase_peaks(e: Any) -> list[tuple[str, float]]:
    """(phase, its largest point in GiB per GPU) for each phase of ``e``'s step timeline, in step order."""
    peak = getattr(e, "step_peak", None)
    out: dict[str, float] = {}
    for p in (peak.timeline if peak is not None else ()):
        out[p.phase] = max(out.get(p.phase, 0.0), p.total / GIB)
    return list(out.items())


def _scenario_rows(s: Scenario) -> list[tuple[str, str]]:
    c, t, z = s.cluster, s.training, s.zero
    net = c.network
    return [
        ("Model", f"{s.model.name} (Ψ = {s.parameters:,} parameters; trainable {s.trainable_parameters:,})"),
        ("GPUs", f"{c.nodes} node(s) x {c.gpus_per_node} {c.gpu.name} "
                 f"({fmt_bytes_text(c.memory_per_gpu_bytes)} each); data-parallel degree {c.data_parallel_degree}"),
        ("Network", f"{net.name}: {net.link_gbps * net.nics_per_node:.4g} Gbit/s per node"),
        ("Host RAM per node", fmt_bytes_text(c.cpu_memory_bytes)),
        ("Training", f"{t.precision}, {t.optimizer}, micro-batch {t.micro_batch} x gradient accumulation "
                     f"{t.grad_accum}, sequence {t.seq_len}, {t.checkpointing} activation checkpointing, flash "
                     f"attention {'on' if t.flash_attention else 'off'}"
                     + (f", LoRA rank {t.lora_rank}" if t.lora_rank else "") + (", QLoRA" if t.qlora else "")),
        ("Requested ZeRO", f"stage {z.stage}, offload_optimizer {z.offload_optimizer.device}, offload_param "
                           f"{z.offload_param.device}"),
        ("Compute efficiency", f"{s.assumptions.mfu:.2f} of the dense peak (fixed by the user)"
         if s.assumptions.mfu is not None else "from GPU generation and GEMM size (costmodel/compute.py)"),
    ]


def _version() -> str:
    try:
        return metadata.version("zeroplanner")
    except metadata.PackageNotFoundError:  # pragma: no cover - always installed in this repository
        return "unknown"


def report_parts(scenario: Scenario) -> dict[str, Any]:
    """Everything the report shows, as data: plan, charts (SVG text), explanations, host RAM and NVMe per node by
    part (``storage``: :func:`~zeroplanner.costmodel.explain_terms.offload_storage`), config text, link query."""
    from .costmodel.explain_terms import offload_storage
    from .planner import plan
    from .share import ShareError, scenario_to_query

    p = plan(scenario)
    config_text, config_error = "", None
    try:
        from .deepspeed import to_deepspeed_config

        config_text = json.dumps(to_deepspeed_config(p.scenario), indent=2) if p.fits else ""
        if not p.fits:
            config_error = "No configuration fits, so there is no config."
    except (ValueError, KeyError, TypeError) as exc:
        config_error = str(exc)
    try:
        query = scenario_to_query(scenario, strict=False, approximate_model=True)
    except ShareError:  # pragma: no cover - non-strict never refuses
        query = ""
    return {
        "plan": p,
        "choice": p.choice.label if p.fits and p.choice is not None else None,
        "memory_svg": memory_chart(p, scenario),
        "time_svg": time_chart(p),
        "step_svg": step_chart(p.estimate, "recommended" if p.fits else "as requested", p.scenario if p.fits
                               else scenario),
        "step_peak": step_peak_line(p.estimate),
        "phase_peaks": phase_peaks(p.estimate),
        "explanations": explain_all(p.scenario if p.fits else scenario),
        "storage": offload_storage(p.scenario if p.fits else scenario),
        "config_text": config_text,
        "config_error": config_error,
        "query": query,
        "scenario_rows": _scenario_rows(scenario),
    }


def build_report(scenario: Scenario, fmt: Format = "html", *, title: str = "ZeRO plan", link: str | None = None) -> str:
    """The report of ``scenario`` as one self-contained HTML page (``fmt="html"``) or Markdown document.

    ``link``: the shareable URL to print (default: the query string alone). Raises ValueError for another fmt.
    """
    if fmt not in ("html", "markdown"):
        raise ValueError(f"fmt must be 'html' or 'markdown' (got {fmt!r})")
    d = report_parts(scenario)
    return _html(d, title, link) if fmt == "html" else _markdown(d, title, link)


def _numbers_line(e: Any, storage: dict) -> str:
    host, nvme = storage["host_memory"], storage["nvme"]
    host_text = (f"host RAM {fmt_bytes_text(host['required_bytes'])} per node (incl. x{host['safety_factor']:g} "
                 "headroom)" if host["required_bytes"] else "no host RAM for offload")
    nvme_text = f", NVMe {fmt_bytes_text(nvme['required_bytes'])} per node" if nvme["required_bytes"] else ""
    return (f"{fmt_bytes_text(e.per_gpu_bytes.total)} per GPU, {host_text}{nvme_text}, "
            f"step {fmt_seconds_text(e.step_seconds)}, {e.tokens_per_second:,.0f} tokens/s, "
            f"{e.tflops_per_gpu:.0f} TFLOP/s per GPU")


def _storage_rows(storage: dict) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(heading, figure text, [(part, bytes text)]) for host RAM and NVMe per node, where offload needs them."""
    rows = []
    for key, name, limit, word in (("host_memory", "Host RAM per node", "available_bytes", "available"),
                                   ("nvme", "NVMe per node", "capacity_bytes", "capacity")):
        d = storage[key]
        if d["required_bytes"]:
            figure = (f"{fmt_bytes_text(d['required_bytes'])} needed of {fmt_bytes_text(d[limit])} {word} "
                      f"({'fits' if d['fits'] else 'does NOT fit'})")
            rows.append((name, figure, [(label, fmt_bytes_text(v)) for label, v in d["parts_bytes"].items()]))
    return rows


def _html(d: dict, title: str, link: str | None) -> str:
    esc = html.escape
    p = d["plan"]
    link_text = link or ("?" + d["query"])
    head = (f"<h2>Recommendation: {esc(d['choice'])}</h2><p>{esc(_numbers_line(p.estimate, d['storage']))}</p>"
            if d["choice"]
            else "<h2>Nothing fits</h2><p>No ZeRO stage or offload choice fits this model on this cluster.</p>")
    head += "".join(f"<p class='assume'>{esc(sentence(a))}</p>" for a in p.assumptions)
    head += "".join(f"<p class='advice'><b>Advice:</b> {esc(a)}</p>" for a in p.advice)
    if d["step_peak"]:
        head += f"<p class='step-peak'><b>Over one step:</b> {esc(d['step_peak'])}</p>"
    phases = "".join(f"<tr><td>{esc(ph)}</td><td class='num'>{g:.1f} GiB</td></tr>" for ph, g in d["phase_peaks"])
    step = (f"<figure class=\"chart step\">{d['step_svg']}</figure>"
            f"<table class='step-phases'><tr><th>phase</th><th>largest point (GiB per GPU)</th></tr>{phases}</table>"
            if d["step_svg"] else "")
    reasons = "".join(f"<li>{esc(r)}</li>" for r in p.reasons)
    warnings = "".join(f"<li>{esc(w)}</li>" for w in p.warnings)
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in d["scenario_rows"])
    terms = []
    for e in d["explanations"].values():
        parts = "".join(f"<li>{esc(pt.label)}: {esc(fmt_bytes_text(pt.value) if e.unit == 'bytes' else fmt_seconds_text(pt.value))}</li>"
                        for pt in e.parts if pt.value)
        where = "".join(f"<br><code>{esc(d.latex)}</code><br><code>{esc(d.substituted)}</code>"
                        for d in e.definitions)
        where = f"<div class='where'>where{where}</div>" if where else ""
        terms.append(f"<tr><td><b>{esc(e.title)}</b></td><td class='num'>{esc(e.display)}</td><td>{esc(e.words)}"
                     f"<br><code>{esc(e.latex)}</code><br><code>{esc(e.substituted)}</code>{where}"
                     f"{'<ul>' + parts + '</ul>' if parts else ''}<div class='src'>Source: {esc(e.source)}</div>"
                     "</td></tr>")
    storage = "".join(f"<tr><td><b>{esc(name)}</b></td><td class='num'>{esc(figure)}</td><td><ul>"
                      + "".join(f"<li>{esc(label)}: {esc(v)}</li>" for label, v in parts) + "</ul></td></tr>"
                      for name, figure, parts in _storage_rows(d["storage"]))
    config = (f"<pre class='config'>{esc(d['config_text'])}</pre>" if d["config_text"]
              else f"<p>{esc(d['config_error'] or '')}</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: sans-serif; max-width: 1000px; margin: 24px auto; color: #222; line-height: 1.4; }}
h1 {{ margin-bottom: 0; }} .muted, .src {{ color: #666; font-size: 12px; }}
table {{ border-collapse: collapse; width: 100%; }} th, td {{ text-align: left; vertical-align: top; padding: 4px 8px;
border-bottom: 1px solid #ddd; }} td.num {{ white-space: nowrap; font-weight: bold; }}
code {{ font-size: 12px; color: #333; }} pre.config {{ background: #f5f5f5; padding: 10px; overflow-x: auto; }}
figure {{ margin: 12px 0; }} .warn li {{ color: #8a5a00; }}
</style></head><body>
<h1>{esc(title)}</h1>
<p class="muted">zeroplanner {esc(_version())}; DeepSpeed {esc(p.estimate.deepspeed_version)} accounting;
GiB = 2<sup>30</sup> bytes. Shareable link: <code class="link">{esc(link_text)}</code></p>
<h2>Scenario</h2><table class="scenario">{rows}</table>
{head}
<ul>{reasons}</ul>{'<h3>Warnings</h3><ul class="warn">' + warnings + '</ul>' if warnings else ''}
<h2>Charts</h2>
<figure class="chart memory">{d['memory_svg']}</figure>
<figure class="chart time">{d['time_svg']}</figure>
{step}
<h2>Every number explained ({'recommended configuration' if d['choice'] else 'requested configuration'})</h2>
<table class="terms">{''.join(terms)}</table>
{'<h2>Host RAM and NVMe per node</h2><table class="storage">' + storage + '</table>' if storage else ''}
<h2>DeepSpeed config</h2>
{config}
</body></html>
"""


def _markdown(d: dict, title: str, link: str | None) -> str:
    p = d["plan"]
    lines = [f"# {title}", "", f"zeroplanner {_version()}; DeepSpeed {p.estimate.deepspeed_version} accounting; "
             "GiB = 2^30 bytes.", "", f"Shareable link: `{link or '?' + d['query']}`", "", "## Scenario", "",
             "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in d["scenario_rows"]]
    lines += [""]
    if d["choice"]:
        lines += [f"## Recommendation: {d['choice']}", "", _numbers_line(p.estimate, d["storage"]), ""]
    else:
        lines += ["## Nothing fits", "", "No ZeRO stage or offload choice fits this model on this cluster.", ""]
    lines += [x for a in p.assumptions for x in (sentence(a), "")]
    lines += [x for a in p.advice for x in (f"**Advice:** {a}", "")]
    if d["step_peak"]:
        lines += [f"**Over one step:** {d['step_peak']}", ""]
    lines += [f"- {r}" for r in p.reasons]
    if p.warnings:
        lines += ["", "### Warnings", ""] + [f"- {w}" for w in p.warnings]
    lines += ["", "## Charts", "", f"![Memory per GPU]({svg_data_uri(d['memory_svg'])})", "",
              f"![Step time]({svg_data_uri(d['time_svg'])})", ""]
    if d["step_svg"]:
        lines += [f"![Memory over one step]({svg_data_uri(d['step_svg'])})", "",
                  "| phase | largest point (GiB per GPU) |", "|---|---|"]
        lines += [f"| {ph} | {g:.1f} |" for ph, g in d["phase_peaks"]] + [""]
    lines += ["## Every number explained", ""]
    for e in d["explanations"].values():
        lines += [f"**{e.title}: {e.display}**. {e.words}", "", *formula_lines(e), f"*Source:* {e.source}", ""]
    storage = _storage_rows(d["storage"])
    if storage:
        lines += ["## Host RAM and NVMe per node", ""]
        for name, figure, parts in storage:
            lines += [f"**{name}: {figure}**", ""] + [f"- {label}: {v}" for label, v in parts] + [""]
    lines += ["## DeepSpeed config", ""]
    lines += (["```json", d["config_text"], "```"] if d["config_text"] else [d["config_error"] or ""])
    return "\n".join(lines) + "\n"


def report_data_uri(scenario: Scenario, fmt: Format = "html", *, link: str | None = None) -> str:
    """``data:`` URI of the report, for a download link that needs no server round trip."""
    text = build_report(scenario, fmt, link=link)
    mime = "text/html" if fmt == "html" else "text/markdown"
    return f"data:{mime};charset=utf-8;base64,{base64.b64encode(text.encode('utf-8')).decode('ascii')}"
