"""Every formula on screen computes to the number beside it (issue 30, item 2).

What a workshop participant does with a calculator, done for every formula the explain panel
(:func:`zeroplanner.explain.explain_all`, :func:`~zeroplanner.explain.explanation_html`,
:func:`~zeroplanner.explain.explanation_markdown`), the report (:func:`zeroplanner.report.build_report`, HTML and
Markdown) and the tutorial (``zeroplanner.ui.tutorial``: each step's rendered HTML) display: the formula with the
scenario's numbers substituted is read back from the displayed LaTeX (numbers, units, ``\\times``, ``/``, ``+``,
``-``, parentheses, ``\\max``, ``\\min``), evaluated, and must equal the displayed result within display rounding.

Rounding is handled by interval arithmetic: a displayed number stands for every value that rounds to it (``1.034 s``
is [1.0335, 1.0345] s, ``57.8 ms`` is [57.75, 57.85] ms, an integer ``8`` is 8 +- 0.005, ``6.74\\times10^{9}``
is [6.735, 6.745] x 10^9); each ``= ...`` step of a substituted formula, evaluated over those intervals, must
overlap the displayed result's own interval. A formula that leaves out a term (the overlap_loss x min(comm,
compute) of exposed communication, issue 30) or shows numbers that do not give its result fails.

Coverage: the scenarios take every ZeRO stage, CPU and NVMe offload, optimizer offload at ZeRO-2, multi-node,
ZeRO++ (hpZ, qwZ, qgZ), Ulysses sequence parallelism (with ALST's checkpoint offload and tiled MLP / loss),
AutoTP, LoRA and QLoRA, no overlap_comm, fp32, a fixed MFU, a vision-language model and the paper accounting;
:func:`test_every_term_and_part_is_displayed_somewhere` checks that every term, every step-time quantity and every
part of a memory or step-time term the model can take was displayed, non-zero, by at least one scenario.
"""

from __future__ import annotations

import html
import math
import re
from functools import lru_cache

import pytest

from zeroplanner.explain import KEYS, explain_all, explanation_html, explanation_markdown
from zeroplanner.scenarios import build_scenario

SCENARIOS: dict[str, dict] = {
    "stage0": dict(stage=0),
    "stage1-no-overlap": dict(stage=1, overlap_comm=False, grad_accum=4),
    "stage1-overlap-fp32": dict(stage=1, precision="fp32", model="gpt2"),
    "stage2": dict(stage=2),
    "stage2-cpu-optimizer": dict(stage=2, offload_optimizer="cpu"),
    "stage1-cpu-optimizer-one-backward": dict(stage=1, offload_optimizer="cpu", micro_batch=8, grad_accum=1),
    "stage3-cpu-optimizer": dict(stage=3, offload_optimizer="cpu", model="llama-2-13b", grad_accum=4),
    "stage3-pageable-offload": dict(stage=3, offload_optimizer="cpu", offload_param="cpu", pin_memory=False,
                                    model="llama-2-13b", cpu_adam_threads_per_rank=8),
    "stage2-nvme-optimizer": dict(stage=2, offload_optimizer="nvme", model="llama-2-13b", gpus_per_node=4),
    "stage3-2-nodes": dict(model="llama-2-13b", nodes=2, stage=3),
    "stage3-no-overlap": dict(stage=3, overlap_comm=False, nodes=2),
    "stage3-cpu-optimizer-and-params": dict(stage=3, offload_optimizer="cpu", offload_param="cpu",
                                            model="qwen2.5-7b", micro_batch=4, checkpointing="selective"),
    "stage3-nvme": dict(stage=3, offload_optimizer="nvme", offload_param="nvme", model="llama-2-13b"),
    "zeropp-hpz-qwz-qgz": dict(model="llama-2-70b", stage=3, nodes=4, network="eth-100g",
                               zero_hpz_partition_size=8, zero_quantized_weights=True,
                               zero_quantized_gradients=True),
    "ulysses-alst": dict(model="llama-3-8b", stage=3, seq_len=65536, sequence_parallel_size=4, tiled_mlp=True,
                         tiled_loss=True, checkpoint_offload=True),
    "ulysses-2-nodes": dict(model="llama-3-8b", stage=2, seq_len=32768, sequence_parallel_size=16, nodes=2,
                            gpus_per_node=8),
    "autotp": dict(model="llama-2-13b", stage=1, autotp_size=2),
    "qlora-stage2": dict(stage=2, lora_rank=8, qlora=True),
    "qlora-stage3-offload": dict(stage=3, lora_rank=16, qlora=True, model="llama-2-13b", offload_optimizer="cpu",
                                 offload_param="cpu", bnb_4bit_quant_storage="bfloat16"),
    "lora-moe-2-nodes": dict(stage=3, lora_rank=16, model="mixtral-8x7b", nodes=2),
    "fixed-mfu": dict(stage=2, mfu=0.4, grad_accum=2),
    "vision": dict(model="qwen2.5-vl-7b", images_per_sample=2, stage=2, checkpointing="full"),
    "paper-accounting": dict(stage=3, nodes=2, accounting="paper"),
    "one-gpu": dict(stage=0, gpus_per_node=1, model="qwen2.5-0.5b"),
    "stage3-host-bound-small-model": dict(stage=3, model="gpt2", seq_len=512, gpus_per_node=2),
    "softcapped-logits": dict(model="gemma-2-9b", stage=2),
    "softcapped-tiled-loss": dict(model="gemma-2-9b", stage=3, seq_len=32768, sequence_parallel_size=4,
                                  tiled_loss=True),
}


@lru_cache(maxsize=None)
def scenario(name: str):
    kw = dict(SCENARIOS[name])
    accounting = kw.pop("accounting", None)
    s = build_scenario(**kw)
    if accounting:
        s = s.model_copy(update={"assumptions": s.assumptions.model_copy(update={"accounting": accounting})})
    return s


# --------------------------------------------------------------------------------------------------------------
# Reading displayed LaTeX numbers back: tokens, a small parser, interval arithmetic
# --------------------------------------------------------------------------------------------------------------
class Symbolic(ValueError):
    """The text holds a symbol, not only numbers: a symbolic formula, not a substituted one."""


UNITS = {"GiB": 2.0**30, "MiB": 2.0**20, "KiB": 2.0**10, "B": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}

_TOKEN = re.compile(r"""
    (?P<unit>\\,\\mathrm\{(?P<uname>[A-Za-z]+)\})
  | (?P<pow>10\^\{(?P<exp>-?\d+)\})
  | (?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?)
  | (?P<op>\\times|\\cdot|[-+/(),])
  | (?P<fn>\\max|\\min)
  | (?P<space>\s+|\\,|\\left|\\right|\{|\})
""", re.X)


def _literal(text: str) -> tuple[float, float]:
    """The interval of values a displayed number stands for: half a unit of its last decimal digit, for an integer
    half a unit of its third significant digit (it may be a %.3g mantissa or a %.4g byte count: "2", "3")."""
    mant, _, exp = text.partition("e")
    e = int(exp) if exp else 0
    x = float(text)
    if "." in mant:
        half = 0.5 * 10.0 ** (e - len(mant.split(".")[1]))
    else:
        digits = len(mant.lstrip("0")) or 1
        half = 0.5 * 10.0 ** (e + digits - 3)
    return (x - half, x + half)


def tokens(tex: str) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(tex):
        m = _TOKEN.match(tex, i)
        if not m:
            raise Symbolic(f"not a number at {tex[i:i + 20]!r} in {tex!r}")
        i = m.end()
        kind = m.lastgroup if m.lastgroup not in ("uname", "exp") else None
        for k in ("unit", "pow", "num", "op", "fn", "space"):
            if m.group(k) is not None:
                kind = k
                break
        if kind == "space":
            continue
        if kind == "unit":
            if m.group("uname") not in UNITS:
                raise Symbolic(f"unknown unit {m.group('uname')!r} in {tex!r}")
            out.append(("unit", m.group("uname")))
        elif kind == "pow":
            out.append(("pow", m.group("exp")))
        else:
            out.append((kind, m.group(kind)))
    return out


Interval = tuple[float, float]


def _mul(a: Interval, b: Interval) -> Interval:
    p = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return (min(p), max(p))


def _div(a: Interval, b: Interval) -> Interval:
    if b[0] <= 0.0 <= b[1]:
        return (-math.inf, math.inf)
    return _mul(a, (1.0 / b[1], 1.0 / b[0]))


class _Parser:
    """expr := term (('+'|'-') term)*; term := factor (('\\times'|'/') factor)*;
    factor := '-' factor | number [unit] | 10^{k} | '(' expr ')' | ('\\max'|'\\min') '(' expr (',' expr)* ')'."""

    def __init__(self, toks: list[tuple[str, str]], tex: str) -> None:
        self.t, self.i, self.tex = toks, 0, tex

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else (None, None)

    def take(self, value: str | None = None):
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise AssertionError(f"expected {value!r} at token {self.i} of {self.tex!r}, got {tok}")
        self.i += 1
        return tok

    def expr(self) -> Interval:
        x = self.term()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            y = self.term()
            x = (x[0] + y[0], x[1] + y[1]) if op == "+" else (x[0] - y[1], x[1] - y[0])
        return x

    def term(self) -> Interval:
        x = self.factor()
        while self.peek()[1] in (r"\times", r"\cdot", "/"):
            op = self.take()[1]
            y = self.factor()
            x = _div(x, y) if op == "/" else _mul(x, y)
        return x

    def factor(self) -> Interval:
        kind, value = self.peek()
        if value == "-":
            self.take()
            lo, hi = self.factor()
            return (-hi, lo)
        if kind == "num":
            self.take()
            x = _literal(value)
            if self.peek()[0] == "unit":
                u = UNITS[self.take()[1]]
                x = (x[0] * u, x[1] * u)
            return x
        if kind == "pow":
            self.take()
            return (10.0 ** int(value), 10.0 ** int(value))
        if value == "(":
            self.take()
            x = self.expr()
            self.take(")")
            return x
        if kind == "fn":
            self.take()
            self.take("(")
            args = [self.expr()]
            while self.peek()[1] == ",":
                self.take()
                args.append(self.expr())
            self.take(")")
            f = max if value == r"\max" else min
            return (f(a[0] for a in args), f(a[1] for a in args))
        raise AssertionError(f"unexpected token {value!r} in {self.tex!r}")


def interval(tex: str) -> Interval:
    """The interval of values the displayed numeric LaTeX ``tex`` can stand for. Raises :class:`Symbolic` when it
    holds anything but numbers, units, operators and max/min."""
    p = _Parser(tokens(tex), tex)
    x = p.expr()
    if p.i != len(p.t):
        raise AssertionError(f"trailing tokens {p.t[p.i:]} in {tex!r}")
    return x


def check_substituted(tex: str, where: str) -> int:
    """Check one displayed formula ``symbol = e_1 = ... = result``: every ``e_i`` read back from its numbers
    overlaps the result's rounding interval. Returns the number of steps checked."""
    pieces = tex.split(" = ")
    assert len(pieces) >= 2, (where, tex)
    result = interval(pieces[-1])
    slack = 1e-9 * max(abs(result[0]), abs(result[1])) + 1e-15
    for piece in pieces[1:-1]:
        lo, hi = interval(piece)
        assert lo <= result[1] + slack and hi >= result[0] - slack, (
            f"{where}: {piece!r} evaluates to [{lo:.6g}, {hi:.6g}] from the numbers shown, but the result shown is "
            f"{pieces[-1]!r} = [{result[0]:.6g}, {result[1]:.6g}]\n  formula: {tex}")
    return len(pieces) - 2


def test_the_checker_reads_numbers_units_and_rounding():
    lo, hi = interval(r"8\times\max(0,1.034\,\mathrm{s}-0.604\,\mathrm{s})")  # 8 +- 0.005 (a 3-digit integer)
    assert lo == pytest.approx(7.995 * (1.0335 - 0.6045)) and hi == pytest.approx(8.005 * (1.0345 - 0.6035))
    assert interval(r"6.74\times10^{9}/8") == pytest.approx((6.735e9 / 8.005, 6.745e9 / 7.995))
    assert interval(r"57.8\,\mathrm{ms}") == pytest.approx((0.05775, 0.05785))
    assert interval(r"12.55\,\mathrm{GiB}")[0] == pytest.approx(12.545 * 2**30)
    assert check_substituted(r"t = 8\times(0.5\,\mathrm{s}+0.25\,\mathrm{s}) = 6.000\,\mathrm{s}", "ok") == 1
    # the formula: 8 x max(0, 1.034 s - 0.604 s) is 3.44 s, not the 4.370 s shown
    with pytest.raises(AssertionError, match="evaluates to"):
        check_substituted(r"t_{comm} = 8\times\max(0,1.034\,\mathrm{s}-0.604\,\mathrm{s}) = 4.370\,\mathrm{s}", "x")
    with pytest.raises(Symbolic):
        interval(r"w\Psi_t/N_d")


# --------------------------------------------------------------------------------------------------------------
# What each surface displays
# --------------------------------------------------------------------------------------------------------------
def _explanation_formulas(e) -> tuple[list[str], list[str]]:
    """(symbolic formulas, substituted formulas) of one Explanation: the term's and each where-line's."""
    symbolic, numeric = [e.latex], [e.substituted]
    for d in getattr(e, "definitions", ()):
        symbolic.append(d.latex)
        numeric.append(d.substituted)
    return symbolic, numeric


def _check_blocks(blocks: list[str], symbolic: set[str], where: str) -> int:
    """Every displayed math block that is not one of the symbolic formulas is a substituted one and must compute
    to its result. Returns how many were checked."""
    checked = 0
    for block in blocks:
        if block in symbolic:
            continue
        check_substituted(block, f"{where}: {block[:60]}")
        checked += 1
    return checked


_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_CODE = re.compile(r"<code>(.*?)</code>", re.S)


@pytest.mark.parametrize("name", SCENARIOS)
def test_explain_panel_formulas_compute_to_the_numbers_shown(name):
    """explain_all (the panel's Explanation objects), their HTML (the panel and the tutorial render this) and their
    Markdown: every substituted formula re-evaluated from its displayed numbers."""
    s = scenario(name)
    for key, e in explain_all(s).items():
        symbolic, numeric = _explanation_formulas(e)
        for tex in numeric:
            check_substituted(tex, f"{name}/{key}")
        sym = set(symbolic)
        page = explanation_html(e)
        assert _check_blocks(_DISPLAY.findall(page), sym, f"{name}/{key} html") == len(numeric)
        md = explanation_markdown(e)
        assert _check_blocks(_DISPLAY.findall(md), sym, f"{name}/{key} markdown") == len(numeric)


REPORT_SCENARIOS = ["stage0", "stage2-cpu-optimizer", "stage3-2-nodes", "stage3-nvme", "ulysses-alst", "autotp",
                    "qlora-stage2", "zeropp-hpz-qwz-qgz", "stage1-no-overlap", "stage3-no-overlap",
                    "lora-moe-2-nodes", "fixed-mfu"]


@pytest.mark.parametrize("name", REPORT_SCENARIOS)
def test_report_formulas_compute_to_the_numbers_shown(name):
    """The report (HTML: each term's formulas in <code>; Markdown: $$ blocks) for the scenario it explains."""
    from zeroplanner.report import build_report, report_parts

    s = scenario(name)
    d = report_parts(s)
    symbolic: set[str] = set()
    expected = 0
    for e in d["explanations"].values():
        sym, num = _explanation_formulas(e)
        symbolic |= set(sym)
        expected += len(num)
    page = build_report(s)
    codes = [html.unescape(c) for c in _CODE.findall(page)]
    codes = [c for c in codes if " = " in c]
    assert _check_blocks(codes, symbolic, f"{name} report html") == expected
    md = build_report(s, "markdown")
    assert _check_blocks(_DISPLAY.findall(md), symbolic, f"{name} report markdown") == expected


TUTORIAL_SCENARIOS = ["stage2", "stage3-2-nodes", "ulysses-2-nodes", "qlora-stage2"]


@pytest.mark.parametrize("name", TUTORIAL_SCENARIOS)
def test_tutorial_formulas_compute_to_the_numbers_shown(name):
    """Every step of the tutorial (section 6 "comm" at each of its stage choices, section 5 at each offload
    variant), from its rendered HTML."""
    pytest.importorskip("ipywidgets")
    from zeroplanner.ui.tutorial import STEPS, Tutorial

    t = Tutorial(scenario(name))
    for key, _ in STEPS:
        step = t.step(key)
        knob_values = {"comm": ("stage", [0, 1, 2, 3]), "offload": ("variant", None),
                       "peak": ("checkpointing", ["none", "selective", "full"])}.get(key)
        settings = [None]
        if knob_values is not None:
            knob, values = knob_values
            values = values or [v for _, v in step.knobs[knob].options]
            settings = [(knob, v) for v in values]
        for setting in settings:
            if setting is not None:
                step.knobs[setting[0]].value = setting[1]
            symbolic: set[str] = set()
            expected = 0
            for e in step.explanations:
                sym, num = _explanation_formulas(e)
                symbolic |= set(sym)
                expected += len(num)
            checked = _check_blocks(_DISPLAY.findall(step.math.value), symbolic, f"{name} tutorial {key} {setting}")
            assert checked == expected, (key, setting)


# --------------------------------------------------------------------------------------------------------------
# Coverage: every term, every step-time quantity and every part was displayed by some scenario
# --------------------------------------------------------------------------------------------------------------
def test_every_term_and_part_is_displayed_somewhere():
    """Across the scenarios: every explained term is non-zero in some scenario; every part of every memory and
    step-time term (the memory terms' parts of costmodel/memory.py, the step-time quantities and their parts of
    costmodel/evaluate.py ``step_terms``) is displayed, non-zero, in some scenario's explanation."""
    import numpy as np

    from zeroplanner.costmodel import Candidates, evaluate, make_context
    from zeroplanner.costmodel.evaluate import REPORTED_APART, TIME_TERM_SYMBOLS, step_terms
    from zeroplanner.costmodel.memory import memory_term_parts

    nonzero_terms: set[str] = set()
    possible: set[tuple[str, str]] = set()
    shown: set[tuple[str, str]] = set()
    reported: set[str] = set()
    for name in SCENARIOS:
        s = scenario(name)
        ctx, cand = make_context(s), Candidates.from_scenario(s)
        steps = step_terms(ctx, cand)
        values = evaluate(ctx, cand)
        for key, tp in {**memory_term_parts(ctx, cand), **steps.terms}.items():
            if key in REPORTED_APART:  # parts of the step reported on their own: evaluate's number, no formula
                assert np.array_equal(steps.values[key], getattr(values, REPORTED_APART[key]), equal_nan=True)
                reported |= {key} if float(np.ravel(steps.values[key])[0]) else set()
                continue
            possible |= {(key, p.label) for p in tp.parts}
        for key, e in explain_all(s).items():
            if e.value:
                nonzero_terms.add(key)
            shown |= {(TIME_TERM_SYMBOLS.get(key, key), p.label) for p in e.parts if p.value}
            for d in e.definitions:
                shown |= {(d.name, p.label) for p in d.parts if p.value}
    assert nonzero_terms == set(KEYS)
    assert reported == set(REPORTED_APART)
    missing = sorted(possible - shown)
    assert not missing, f"never displayed non-zero: {missing}"
    # every step-time quantity (each one expression or more) was displayed as a term or a where-line
    assert {k for k, _ in possible if k in steps.terms} <= {k for k, _ in shown}


# --------------------------------------------------------------------------------------------------------------
# The expressions compute the step exactly as the plain numpy model did before them
# --------------------------------------------------------------------------------------------------------------
def _plain_numpy_step(ctx, cand, comm, comp):
    """The step composition as plain numpy, as costmodel/evaluate.py step_parts and compute.py
    optimizer_and_offload_terms wrote it before the step-time terms became expressions (commit 53d7cd6), with the
    offload parts priced since (DeepSpeed's gradient copies, pageable copies exposed, the per-rank host rates): the
    reference the expressions must equal bit for bit (tests/core/test_recommend_golden.py pins the planner's
    output on the same grounds)."""
    import numpy as np

    from zeroplanner.costmodel.activations import checkpoint_offload_bytes_per_micro
    from zeroplanner.costmodel.context import OPTIMIZER_BYTES_TOUCHED, data_parallel_degree, overlap_comm
    from zeroplanner.costmodel.offload import cpu_adam_params_per_second_per_rank, host_conversion_per_second_per_rank
    from zeroplanner.costmodel.steptime_constants import FITTED

    def hidden(work, other, loss):
        return np.maximum(0.0, work - other) + loss * np.minimum(work, other)

    c = ctx.scenario.cluster
    n = data_parallel_degree(ctx, cand).astype(np.float64)
    T, P = ctx.trainable, ctx.params
    st = cand.stage
    ga = cand.grad_accum.astype(np.float64)
    shard = np.where(st >= 1, T / n, T)
    touched = OPTIMIZER_BYTES_TOUCHED[ctx.scenario.training.optimizer] if ctx.mixed else 16.0
    off_opt = cand.offload_optimizer
    # offloaded: the rank's CPU-Adam and host conversion rates (costmodel/offload.py, tests/core/test_offload_host.py)
    r_cpu, r_cv = cpu_adam_params_per_second_per_rank(c), host_conversion_per_second_per_rank(c)
    optimizer = np.where(off_opt > 0, T / n / r_cpu + (T / n / r_cv if ctx.mixed else 0.0),
                         shard * touched / ctx.hbm_bytes_per_second)
    K = ctx.master_bytes + ctx.optimizer_state_bytes
    nvme_bps = c.nvme_gb_per_s * 1e9
    nvme_opt = np.where((off_opt == 2) & (st == 3), 2.0 * ctx.gpus_per_node * K * T / n / nvme_bps, 0.0)
    param_part = P * ctx.weight_bytes / n
    nvme = nvme_opt + np.where(cand.offload_param == 2, 2.0 * ga * ctx.gpus_per_node * param_part / nvme_bps, 0.0)
    pcie = ctx.pcie_bytes_per_second
    z = ctx.scenario.zero
    pageable = min(FITTED["pageable_copy_gb_per_s"] * 1e9, pcie)
    # the gradient copies DeepSpeed makes (tests/evidence/test_offload_copies.py): every micro-step (ZeRO-2 with
    # accumulation, ZeRO-3) and the fp32 partition once at the boundary
    pin_o, pin_p = z.offload_optimizer.pin_memory, z.offload_param.pin_memory
    grad_bw = pcie if pin_o else pageable
    w_g = ctx.grad_bytes
    per_micro = np.where((st == 2) & (ga > 1), (2.0 * ga - 1.0) * w_g * T / (n * ga * grad_bw),
                         np.where(st == 3, 2.0 * w_g * T / (n * grad_bw), 0.0))
    grad_copies = np.where(off_opt > 0, per_micro, 0.0)
    boundary = np.where((off_opt > 0) & (st >= 1), 4.0 * T / (n * grad_bw), 0.0)
    param_pcie = np.where(cand.offload_param > 0, 2.0 * param_part / (pcie if pin_p else pageable), 0.0)
    pinned = (grad_copies if pin_o else 0.0) + (param_pcie if pin_p else 0.0)
    unpinned = (0.0 if pin_o else grad_copies) + (0.0 if pin_p else param_pcie)
    # ZeRO-1/2 upload from DeepSpeed's host buffer (pinned with pin_memory); ZeRO-3's through a pageable temporary
    up_bw = np.where((st < 3) & pin_o, pcie, pageable)
    upload = np.where((off_opt > 0) & (cand.offload_param == 0), T * ctx.weight_bytes / n / up_bw, 0.0)

    loss = FITTED["overlap_loss"]
    overlap = overlap_comm(ctx, cand)
    fwd_c, bwd_c = comp["fwd_seconds_micro"], comp["bwd_seconds_micro"]
    bwd_comm = comm["bwd_seconds_micro"] + comm["reduce_seconds_micro"]
    fwd_e = np.where(overlap, hidden(comm["fwd_seconds_micro"], fwd_c, loss), comm["fwd_seconds_micro"])
    bwd_e = np.where(overlap, hidden(bwd_comm, bwd_c, loss), bwd_comm)
    micro_compute = fwd_c + bwd_c + comp["dequant_seconds_micro"]
    pcie_micro = hidden(pinned, micro_compute, loss) + unpinned
    a2a = comm["a2a_seconds_micro"]
    split = bool(np.any(cand.sp > 1))
    offloading = ctx.scenario.training.checkpoint_offload
    ckpt = checkpoint_offload_bytes_per_micro(ctx, cand) / pcie if offloading else a2a * 0.0
    gpu_micro = micro_compute + fwd_e + bwd_e + pcie_micro
    if split or offloading:
        gpu_micro = gpu_micro + a2a + ckpt
    fetch = np.maximum(0.0, np.where(st == 3, FITTED["zero3_fetch_seconds"] * 2.0 * ctx.hooked_modules, 0.0)
                       - gpu_micro)
    hooks = np.where((st >= 2) & (data_parallel_degree(ctx, cand) > 1),
                     FITTED["grad_hook_seconds"] * ctx.param_tensors, 0.0)
    micro = (fwd_e + bwd_e + a2a) if split else (fwd_e + bwd_e)
    collectives = comm["boundary_seconds"] + ga * (micro + comm["tp_seconds_micro"])
    host = ga * (fetch + hooks)
    boundary_exposed = np.where(st == 1, boundary, hidden(boundary, bwd_c, loss) if pin_o else boundary)
    offload = (ga * (pcie_micro + ckpt) if offloading else ga * pcie_micro) + boundary_exposed + upload + nvme
    step = comp["seconds"] + collectives + host + offload + optimizer
    return {"t_compute": comp["seconds"], "t_coll": collectives, "t_host": host, "t_comm": collectives + host,
            "t_offload": offload, "t_opt": optimizer, "t_step": step, "t_fetch": ga * fetch, "t_hooks": ga * hooks,
            "e_f": fwd_e, "e_b": bwd_e, "e_p": pcie_micro}


@pytest.mark.parametrize("name", SCENARIOS)
def test_step_terms_equal_the_plain_numpy_step_model_bit_for_bit(name):
    """Over a grid of candidates (every stage x offload x checkpointing x micro-batch x accumulation x nodes x
    overlap_comm setting) the step-time expressions give exactly the plain numpy model's numbers."""
    import numpy as np

    from zeroplanner.costmodel import Candidates, make_context
    from zeroplanner.costmodel.communication import communication_terms
    from zeroplanner.costmodel.compute import compute_terms
    from zeroplanner.costmodel.evaluate import step_terms

    s = scenario(name)
    z = s.zero
    cand = Candidates.build(
        stage=np.arange(4).reshape(4, 1, 1, 1, 1, 1, 1), offload_optimizer=np.arange(3).reshape(1, 3, 1, 1, 1, 1, 1),
        offload_param=np.arange(3).reshape(1, 1, 3, 1, 1, 1, 1),
        checkpointing=np.arange(3).reshape(1, 1, 1, 3, 1, 1, 1),
        micro_batch=np.array([1, 4]).reshape(1, 1, 1, 1, 2, 1, 1),
        grad_accum=np.array([1, 8]).reshape(1, 1, 1, 1, 1, 2, 1),
        nodes=s.cluster.nodes, hpz=z.zero_hpz_partition_size, qwz=int(z.zero_quantized_weights),
        qgz=int(z.zero_quantized_gradients), overlap=np.array([-1, 0, 1]).reshape(1, 1, 1, 1, 1, 1, 3),
        reduce_bucket=z.reduce_bucket_size, sp=s.cluster.sequence_parallel_size)
    ctx = make_context(s)
    comm, comp = communication_terms(ctx, cand), compute_terms(ctx, cand)
    values = step_terms(ctx, cand, comm, comp).values
    for key, ref in _plain_numpy_step(ctx, cand, comm, comp).items():
        assert np.array_equal(np.asarray(values[key]).view(np.int64), np.asarray(ref).view(np.int64)), (name, key)
