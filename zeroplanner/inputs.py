"""The scenario's inputs, each declared once: :data:`INPUTS`.

One :class:`Input` row says what a user can set and how every front end spells it: the key (a
:func:`~zeroplanner.scenarios.build_scenario` keyword, a share-link key and an app control key), its name with
unit, where it lives in the :class:`~zeroplanner.specs.Scenario` (``path``), its kind, its CLI flag and help, its
widget, and its DeepSpeed / HF Trainer key where one exists. Bounds, choices and defaults are **read from the
pydantic field** at ``path`` (``Field(ge=..., le=...)``, ``Literal[...]``), never repeated here; the value is in the
input's unit and ``scale`` converts it (GiB -> bytes).

Generated from this table: ``build_scenario``'s keywords and defaults (:mod:`zeroplanner.scenarios`), the CLI's
scenario options (:func:`zeroplanner.cli.add_scenario_options`, :func:`~zeroplanner.cli.scenario_from_args`), the
share-link keys (:data:`zeroplanner.share.SHARE_KEYS`), the app's setters and widgets
(:data:`zeroplanner.ui.state.SETTERS`, :mod:`zeroplanner.ui.controls`), the tutorial's controls, and the
``zero_optimization`` alias tables of the DeepSpeed-config reader (:func:`zero_aliases`). The idea comes from
param/panel (declare a parameter once, derive widgets and URLs from it), pydantic-settings (fields become CLI
options) and DeepSpeed's ``runtime/zero/config.py`` (bound, alias and doc on one field).

How to add an input (one row)
-----------------------------
1. Give the spec a field with its bounds (``Field(default=..., ge=..., le=..., description=...)`` in
   :mod:`zeroplanner.specs`), and use it in the cost model.
2. Append one ``Input(...)`` to :data:`INPUTS`: ``key``, ``label`` (name with unit), ``path`` into the Scenario,
   ``group`` (CLI section) and ``help``; ``widget=Widget(...)`` if the app shows it, ``deepspeed=`` its
   DeepSpeed key (dotted, e.g. ``"zero_optimization.reduce_bucket_size"`` followed by its aliases).
   That is all: the CLI flag is ``--key-with-dashes`` (a bool with default True is ``--no-...``, a bool with
   default None both ``--x/--no-x``), the share key is ``key``, the app control key is ``key``.
3. Add the input's example value to ``EXAMPLES`` in ``tests/core/test_inputs.py`` (the test that walks this table
   fails until you do): it sets the input through the CLI, a share link and the app and compares the scenarios.
New rows go at the end (share links write keys in table order, and old links keep parsing).

Nothing here imports ipywidgets, bqplot or torch.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from . import catalog
from .specs import Architecture, Scenario
from .units import GIB

DEFAULT_MODEL = "llama-2-7b"
DEFAULT_GPU = "A100-80GB"
DEFAULT_NETWORK = "ib-hdr"

Kind = Literal["int", "float", "bool", "choice", "model", "gpu", "network"]
CATALOG_KINDS = ("model", "gpu", "network")


class InputError(ValueError):
    """A value outside an input's type or range; ``key`` names the input, the message the allowed values."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.detail = message


@dataclass(frozen=True)
class Widget:
    """How the app shows an input. ``kind``: ``dropdown``, ``checkbox``, ``int_slider``, ``float_slider``,
    ``log_slider``, ``int_text``, ``float_text``. ``low``/``high`` are the slider's *shown* range (the field's
    bounds stay the hard limits; text boxes use those); ``values`` maps widget values to input values where they
    differ (overlap_comm's "default"/"on"/"off"); ``labels`` are dropdown labels; ``scale`` is the input value
    of one widget unit (1e9: the size slider is in billions); ``key`` the control key when it is not the input's
    (``model_params_b``); ``section`` where the control sits. A ``log_slider`` moves over exponents of ``base``
    in steps of ``step`` (default 0.01): base 2, step 1 stops at 1, 2, 4, 8, ... (nodes, GPUs per node) while a
    value typed into its readout is kept as typed (3 nodes)."""

    kind: str
    description: str = ""
    section: str = "main"
    low: float | None = None
    high: float | None = None
    step: float | None = None
    fmt: str | None = None
    labels: tuple[tuple[str, Any], ...] = ()
    values: tuple[tuple[Any, Any], ...] = ()
    scale: float = 1.0
    key: str | None = None
    round_digits: int | None = None
    base: float = 10.0


def _get(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data[part] if isinstance(data, dict) else getattr(data, part)
    return data


def set_path(data: dict, path: str, value: Any) -> None:
    """Set ``value`` at a dotted path of a nested dict (a ``Scenario.model_dump()``)."""
    *head, last = path.split(".")
    node = data
    for part in head:
        node = node[part]
    node[last] = value


def _field(path: str) -> FieldInfo:
    """The pydantic FieldInfo at a dotted path into Scenario (sub-models followed through their annotations)."""
    model: type[BaseModel] = Scenario
    info: FieldInfo | None = None
    for part in path.split("."):
        info = model.model_fields[part]
        ann = info.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None  # type: ignore[assignment]
    assert info is not None
    return info


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# --------------------------------------------------------------------------------------------------------------
# Typed text -> value: the one grammar of every input (Input.parse), for the CLI, share links and the app
# --------------------------------------------------------------------------------------------------------------
MAX_TEXT_CHARS = 64
"""Longest value text :meth:`Input.parse` reads (the longest catalog name or hub id is under 30 characters)."""
COUNT_SUFFIXES = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
"""Suffixes of an integer input's text: ``7B`` = 7e9, ``500M``, ``1.5k`` (case-insensitive)."""
BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
              "off": False}
"""The words a yes/no input's text may be (case-insensitive)."""
SUGGESTED_NAMES = 5
"""How many catalog names an unknown model / GPU / network name suggests."""
_PRINTABLE_RE = re.compile(r"^[\x21-\x7e]*$")
_NUMBER_RE = re.compile(r"^([+-]?(?:[0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})(?:[eE][+-]?[0-9]{1,4})?)"
                        r"([kKmMbBgGtT]?)$")


def shown_text(value: Any) -> str:
    """A user's value for a message, clipped to 40 characters and quoted (hostile text is never echoed at length)."""
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:40] + "..." if len(text) > 40 else text)


def closest_names(value: str, names: list[str], n: int = SUGGESTED_NAMES) -> list[str]:
    """The ``n`` names of ``names`` closest to ``value``, spelled as in ``names`` (the catalog's "H200", never the
    lower-cased "h200"): first the names that contain ``value`` (case-insensitively), then by difflib's similarity
    ratio of the lower-cased strings (:func:`difflib.get_close_matches` with no cutoff, so there are always ``n``
    while the catalog holds that many)."""
    import difflib

    lowered: dict[str, str] = {}
    for name in names:
        lowered.setdefault(name.lower(), name)
    typed = value.lower()
    out = [lowered[k] for k in lowered if typed and typed in k][:n]
    for k in difflib.get_close_matches(typed, list(lowered), n=len(lowered), cutoff=0.0):
        if len(out) >= n:
            break
        if lowered[k] not in out:
            out.append(lowered[k])
    return out


def catalog_spellings(kind: str) -> tuple[list[str], dict[str, str]]:
    """(names, lookup) of a catalog kind: its names as the catalog spells them (for a model, its hub ids after them,
    :func:`zeroplanner.catalog.model_hub_ids`), and lower-cased name or hub id -> catalog name."""
    names = {"model": catalog.model_names, "gpu": catalog.gpu_names, "network": catalog.network_names}[kind]()
    lookup = {n.lower(): n for n in names}
    spelled = list(names)
    if kind == "model":
        hub = catalog.model_hub_ids()
        spelled += sorted(hub)
        for hub_id, name in hub.items():
            lookup.setdefault(hub_id.lower(), name)
    return spelled, lookup


def _decimal(value: Any, *, suffixes: bool) -> Decimal | None:
    """The exact number of a text (the grammar: digits, an optional point, sign and exponent, and for a count one
    of :data:`COUNT_SUFFIXES`) or a JSON number; None when it is neither (``nan``, ``0x10``, ``1_000``, a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    m = _NUMBER_RE.match(value)
    if m is None or (m.group(2) and not suffixes):
        return None
    number = Decimal(m.group(1))
    return number * COUNT_SUFFIXES[m.group(2).lower()] if m.group(2) else number


def parse_integer(value: Any, low: float | None, high: float | None, hint: str = "") -> int:
    """An integer in [low, high] from text (``7``, ``7e9``, ``7B``, ``1.5B``, ``500M``, ``2.0``) or a JSON number:
    the grammar of every integer input (:meth:`Input.parse`, and the CLI's own counts). Raises ``ValueError`` with
    the one message ``must be an integer in [low, high] (got '...')``."""
    bad = ValueError(f"must be an integer in [{_number(low)}, {_number(high)}] (got {shown_text(value)}){hint}")
    number = _decimal(value, suffixes=True)
    if number is None or (low is not None and number < low) or (high is not None and number > high) \
            or number != number.to_integral_value():
        raise bad
    return int(number)


def _check_text(key: str, value: Any) -> None:
    """The limits on any value text (length, characters) and on a JSON value (one scalar)."""
    if isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS:
            raise InputError(key, f"value is {len(value)} characters long; the limit is {MAX_TEXT_CHARS}")
        if not _PRINTABLE_RE.match(value):
            raise InputError(key, f"value {shown_text(value)} contains spaces, control or non-ASCII characters")
    elif value is None or isinstance(value, (list, dict, tuple, set)):
        raise InputError(key, f"must be a single value, got {type(value).__name__}")


@dataclass(frozen=True)
class Input:
    """One scenario input; everything not given is derived from ``key`` and the pydantic field at ``path``.

    ``key``: build_scenario keyword, share-link key, app control key, CLI ``--key-with-dashes``. ``label``: name
    with unit (app messages). ``kind``: int, float, bool, choice, or a catalog name (model, gpu, network).
    ``group`` / ``help``: the CLI's section and help. ``path``: the field in the Scenario (bounds, choices,
    default); ``scale``: field units per input unit (GIB for a GiB input of a bytes field). ``widget``: the app's
    control (None: none). ``deepspeed`` / ``hf``: the DeepSpeed config key (dotted; ``zero_optimization.*`` keys,
    first DeepSpeed's name then its aliases, make the config reader's alias tables) and the HF TrainingArguments
    field, where one exists. The ``*_fn`` hooks are for inputs that are not one plain field (a catalog entry, the
    per-node bandwidth, both offload blocks' pin_memory); ``app_implies`` what the app sets along with a
    non-default value, having no control for it (ZeRO++ -> stage 3).
    """

    key: str
    label: str
    kind: Kind
    group: str
    help: str = ""
    path: str | None = None
    scale: float = 1.0
    widget: Widget | None = None
    deepspeed: tuple[str, ...] = ()
    hf: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None  # only where no field holds them (params: from_parameter_count)
    default_value: Any = "<field>"  # only where build_scenario's default is not the field's (grad_accum)
    apply_fn: Callable[[dict, Any], None] | None = field(default=None, repr=False)
    read_fn: Callable[[Scenario], Any] | None = field(default=None, repr=False)
    shown_fn: Callable[[Scenario], Any] | None = field(default=None, repr=False)
    app_implies: tuple[tuple[str, Any], ...] = ()  # set together with a non-default value in the app
    text_hint: str = ""  # appended to the message of a bad value (params: "a count such as 7e9, 7B or 500M")

    # -- derived ----------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The share-link key (the CLI's option name with underscores)."""
        return self.key

    @property
    def field_info(self) -> FieldInfo | None:
        return _field(self.path) if self.path else None

    def _bound(self, *names: str) -> tuple[float | None, bool]:
        info = self.field_info
        for meta in info.metadata if info is not None else ():
            for n in names:
                value = getattr(meta, n, None)
                if value is not None:
                    return value / self.scale, n in ("gt", "lt")
        return None, False

    @property
    def low(self) -> float | None:
        return self.bounds[0] if self.bounds else self._bound("ge", "gt")[0]

    @property
    def high(self) -> float | None:
        return self.bounds[1] if self.bounds else self._bound("le", "lt")[0]

    @property
    def low_open(self) -> bool:
        return False if self.bounds else self._bound("ge", "gt")[1]

    @property
    def high_open(self) -> bool:
        return False if self.bounds else self._bound("le", "lt")[1]

    @property
    def range_text(self) -> str:
        """``[1, 100000]``, ``(0, 1]`` (an open end is a ``gt``/``lt`` bound)."""
        return (f"{'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}"
                f"{')' if self.high_open else ']'}")

    @property
    def choices(self) -> tuple[Any, ...]:
        """Allowed values of a ``choice`` input: the field's ``Literal`` arguments."""
        info = self.field_info
        if info is None:
            return ()
        args = [a for a in typing.get_args(info.annotation) if a is not type(None)]
        return tuple(args) if typing.get_origin(info.annotation) is Literal else ()

    @property
    def default(self) -> Any:
        """The value ``build_scenario`` uses when the input is not given (None: the spec's own default, e.g. no
        GPU memory override)."""
        if self.default_value != "<field>":
            return self.default_value
        info = self.field_info
        if info is None:
            return None
        value = info.get_default(call_default_factory=True)
        return value / self.scale if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and self.scale != 1 else value

    @property
    def nullable(self) -> bool:
        """Whether None is a value of its own (overlap_comm: DeepSpeed's default)."""
        info = self.field_info
        return info is not None and type(None) in typing.get_args(info.annotation) and self.kind == "bool"

    @property
    def cli_flag(self) -> str:
        """``--gpus-per-node``; a bool whose default is True is ``--no-...``."""
        flag = "--" + self.key.replace("_", "-")
        if self.kind == "bool" and self.default is True:
            return "--no-" + flag[2:]
        return flag

    @property
    def control_key(self) -> str | None:
        """The app's control key (None: the app has no control for it)."""
        if self.widget is None:
            return None
        return self.widget.key or self.key

    def in_range(self, number: float) -> bool:
        low, high = self.low, self.high
        ok_low = low is None or (number > low if self.low_open else number >= low)
        ok_high = high is None or (number < high if self.high_open else number <= high)
        return ok_low and ok_high

    # -- typed text -> value ------------------------------------------------------------------------------------
    def parse(self, value: Any) -> Any:
        """The input's value of a typed text (a CLI argument, a share-link value, a text typed into the app) or of
        a JSON scalar, in the input's unit; the one grammar every front end reads an input with.

        - int: ``4``, ``7e9``, ``7B`` / ``1.5B`` / ``500M`` / ``1k`` (:data:`COUNT_SUFFIXES`), ``2.0``; float:
          ``0.5``, ``1e-3``, ``.5``. Never ``nan``, ``inf``, ``0x10``, ``1_000``. The field's bounds are checked.
        - bool: ``true/false``, ``yes/no``, ``on/off``, ``1/0`` (:data:`BOOL_WORDS`); choice: one of
          :attr:`choices`, case-insensitive.
        - model / gpu / network: a catalog name, case-insensitive; a model also by the Hugging Face hub id of a
          catalog entry (``Qwen/Qwen3-8B``, :func:`zeroplanner.catalog.model_hub_ids`). Returns the catalog's
          spelling (``qwen3-8b``). Nothing is fetched: an id no catalog entry has is unknown.

        Text is at most :data:`MAX_TEXT_CHARS` printable ASCII characters (no spaces or control characters);
        nothing typed is executed or evaluated. Raises :class:`InputError` naming the input and the allowed values
        or range, e.g. ``nodes: must be an integer in [1, 100000] (got 'abc')``.
        """
        _check_text(self.key, value)
        kind = self.kind
        if kind in CATALOG_KINDS:
            if isinstance(value, str):
                spelled, lookup = catalog_spellings(kind)
                name = lookup.get(value.lower())
                if name is not None:
                    return name
                close = ", ".join(closest_names(value, spelled))
                raise InputError(self.key, f"unknown {kind} {shown_text(value)}; closest catalog names: {close}")
            raise InputError(self.key, f"must be a {kind} catalog name (got {shown_text(value)})")
        if kind == "choice":
            text = value.lower() if isinstance(value, str) else None
            if text not in self.choices:
                raise InputError(self.key, f"must be one of {', '.join(self.choices)} (got {shown_text(value)})")
            return text
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in BOOL_WORDS:
                return BOOL_WORDS[value.lower()]
            raise InputError(self.key, f"must be true or false (got {shown_text(value)})")
        hint = f"; {self.text_hint}" if self.text_hint else ""
        if kind == "int":
            exact = _decimal(value, suffixes=True)
            if exact is None or not self.in_range(exact) or exact != exact.to_integral_value():
                raise InputError(self.key, self._range_message("an integer", value, hint))
            return int(exact)
        exact = _decimal(value, suffixes=False)
        number = None if exact is None or not self.in_range(exact) else float(exact)
        if number is None or not math.isfinite(number) or not self.in_range(number):
            raise InputError(self.key, self._range_message("a number", value, hint))
        return number

    def _range_message(self, what: str, value: Any, hint: str) -> str:
        return f"must be {what} in {self.range_text} (got {shown_text(value)}){hint}"

    # -- scenario data ------------------------------------------------------------------------------------------
    def apply(self, data: dict, value: Any) -> None:
        """Write ``value`` (in the input's unit) into a ``Scenario.model_dump()`` dict."""
        if self.apply_fn is not None:
            self.apply_fn(data, value)
            return
        if value is None and not self.nullable:
            return
        if self.kind == "int":
            value = int(round(float(value) * self.scale))
        elif self.kind == "float":
            value = float(value) * self.scale
            info = self.field_info
            if info is not None and "int" in str(info.annotation):
                value = int(round(value))
        set_path(data, self.path, value)

    def read(self, scenario: Scenario) -> Any:
        """The input's value in ``scenario`` in the input's unit (None: not set, e.g. no GPU memory override)."""
        if self.read_fn is not None:
            return self.read_fn(scenario)
        value = _get(scenario, self.path)
        if value is None or isinstance(value, bool) or self.scale == 1:
            return value
        return value / self.scale

    def shown(self, scenario: Scenario) -> Any:
        """What the app's widget shows for ``scenario``, in widget units."""
        value = self.shown_fn(scenario) if self.shown_fn is not None else self.read(scenario)
        w = self.widget
        if w is None:
            return value
        for widget_value, input_value in w.values:
            if input_value == value:
                return widget_value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = value / w.scale
            if w.low is not None and w.kind.endswith("slider"):
                value = min(max(value, w.low), w.high)
            if w.round_digits is not None:
                value = round(value, w.round_digits) if w.round_digits else round(value)
        return value

    def from_widget(self, value: Any) -> Any:
        """The input value of a widget value."""
        w = self.widget
        if w is not None:
            for widget_value, input_value in w.values:
                if widget_value == value:
                    return input_value
            if w.scale != 1:
                return float(value) * w.scale
        return value


# --------------------------------------------------------------------------------------------------------------
# Inputs that are not one field
# --------------------------------------------------------------------------------------------------------------
def _apply_model(data: dict, value: str) -> None:
    data["model"] = catalog.model(value).model_dump()


def _apply_params(data: dict, value: Any) -> None:
    data["model"] = Architecture.from_parameter_count(int(round(float(value)))).model_dump()


def _apply_gpu(data: dict, value: str) -> None:
    data["cluster"]["gpu"] = catalog.gpu(value).model_dump()
    data["cluster"]["gpu_memory_bytes"] = None  # a GPU preset brings its own memory


def _apply_network(data: dict, value: str) -> None:
    data["cluster"]["network"] = catalog.network(value).model_dump()


def _apply_inter_node_gbps(data: dict, value: Any) -> None:
    """Per-node bandwidth: one NIC of that rate; the preset's kind, efficiency and latency stay."""
    if value is None:
        return
    data["cluster"]["network"].update(link_gbps=float(value), nics_per_node=1)


def _read_inter_node_gbps(s: Scenario) -> float:
    net = s.cluster.network
    return net.link_gbps * net.nics_per_node


def _apply_pin_memory(data: dict, value: Any) -> None:
    if value is None:
        return
    for block in ("offload_optimizer", "offload_param"):
        data["zero"][block]["pin_memory"] = bool(value)


def _read_pin_memory(s: Scenario) -> bool | None:
    """Both offload blocks' pin_memory when they agree (None otherwise: no one value carries it)."""
    a, b = s.zero.offload_optimizer.pin_memory, s.zero.offload_param.pin_memory
    return a if a == b else None


def _shown_compute_fraction(s: Scenario) -> float:
    """What the app's MFU slider shows while the user has not fixed it: the cost model's own fraction."""
    from .costmodel import estimate

    return round(estimate(s).achieved_fraction, 2)


def _shown_cpu_adam_node_rate(s: Scenario) -> float:
    """The node's CPU-Adam rate the cost model uses (given, or derived per rank x GPUs per node)."""
    from .costmodel.offload import cpu_adam_params_per_second_per_rank

    return cpu_adam_params_per_second_per_rank(s.cluster) * s.cluster.gpus_per_node


def _read_gpu_memory_gib(s: Scenario) -> float | None:
    return None if s.cluster.gpu_memory_bytes is None else s.cluster.gpu_memory_bytes / GIB


def _read_model(s: Scenario) -> str | None:
    names = {n.lower(): n for n in catalog.model_names()}
    return names.get(s.model.name.lower())


def _read_catalog(names: Callable[[], list[str]], attr: str) -> Callable[[Scenario], str | None]:
    def read(s: Scenario) -> str | None:
        return {n.lower(): n for n in names()}.get(_get(s, attr).lower())

    return read


_BUCKET = dict(kind="log_slider", section="zero", low=1e6, high=2e9)
_ZPP = (("zero.stage", 3),)  # ZeRO++ needs stage 3; the app has no stage control (the planner picks the stage)

INPUTS: tuple[Input, ...] = (
    # -- model (one of; --hf-config is a file, read by the CLI) --
    Input("model", "Model (catalog name)", "model", "model (one of)",
          f"catalog name (default {DEFAULT_MODEL}); see `zeroplanner models`", path="model",
          default_value=DEFAULT_MODEL, apply_fn=_apply_model, read_fn=_read_model,
          widget=Widget("dropdown", "Model")),
    Input("params", "Model size (parameters)", "int", "model (one of)", "a bare parameter count, e.g. 7e9 or 7B",
          path="model.parameter_count_override", bounds=(1_000_000, 10**15), default_value=None,
          text_hint="a count such as 7e9, 7B or 500M",
          apply_fn=_apply_params, read_fn=lambda s: s.model.parameter_count_override,
          shown_fn=lambda s: s.parameters,
          widget=Widget("log_slider", "Size (B params)", low=0.1, high=2000.0, scale=1e9, key="model_params_b")),
    # -- cluster --
    Input("gpu", "GPU (catalog name)", "gpu", "cluster", f"GPU catalog name (default {DEFAULT_GPU})",
          path="cluster.gpu", default_value=DEFAULT_GPU, apply_fn=_apply_gpu,
          read_fn=_read_catalog(catalog.gpu_names, "cluster.gpu.name"), widget=Widget("dropdown", "GPU")),
    Input("gpu_memory_gib", "GPU memory (GiB)", "float", "cluster", "override the GPU's memory, GiB",
          path="cluster.gpu_memory_bytes", scale=GIB, read_fn=_read_gpu_memory_gib,
          shown_fn=lambda s: s.cluster.memory_per_gpu_bytes / GIB,
          widget=Widget("float_slider", "GPU memory (GiB)", low=1, high=320, step=0.5, fmt=".1f", round_digits=1)),
    Input("gpus_per_node", "GPUs per node", "int", "cluster", "GPUs per node", path="cluster.gpus_per_node",
          widget=Widget("log_slider", "GPUs per node", low=1, high=16, base=2, step=1, fmt="d")),
    Input("nodes", "Nodes", "int", "cluster", "number of nodes", path="cluster.nodes",
          widget=Widget("log_slider", "Nodes", low=1, high=128, base=2, step=1, fmt="d")),
    Input("network", "Network (preset name)", "network", "cluster", f"network preset (default {DEFAULT_NETWORK})",
          path="cluster.network", default_value=DEFAULT_NETWORK, apply_fn=_apply_network,
          read_fn=_read_catalog(catalog.network_names, "cluster.network.name"),
          widget=Widget("dropdown", "Network")),
    Input("inter_node_gbps", "Inter-node bandwidth (Gbit/s per node)", "float", "cluster",
          "inter-node bandwidth per node in Gbit/s (overrides the preset's NICs)", path="cluster.network.link_gbps",
          default_value=None, apply_fn=_apply_inter_node_gbps, read_fn=_read_inter_node_gbps,
          widget=Widget("log_slider", "Network Gb/s / node", low=1.0, high=6400.0, fmt=".4g")),
    Input("cpu_memory_gib", "Host RAM per node (GiB)", "float", "cluster", "host RAM per node, GiB",
          path="cluster.cpu_memory_bytes", scale=GIB,
          widget=Widget("float_text", "Host RAM/node GiB", section="offload", round_digits=0)),
    # -- ZeRO --
    Input("stage", "ZeRO stage", "int", "ZeRO", "ZeRO stage", path="zero.stage",
          deepspeed=("zero_optimization.stage",)),
    Input("offload_optimizer", "Optimizer offload device", "choice", "ZeRO", "offload_optimizer device",
          path="zero.offload_optimizer.device", deepspeed=("zero_optimization.offload_optimizer.device",)),
    Input("offload_param", "Parameter offload device", "choice", "ZeRO", "offload_param device (stage 3)",
          path="zero.offload_param.device", deepspeed=("zero_optimization.offload_param.device",)),
    # -- training --
    Input("precision", "Precision", "choice", "training", "training precision", path="training.precision",
          deepspeed=("bf16.enabled", "fp16.enabled"), hf=("bf16", "fp16"),
          widget=Widget("dropdown", "Precision", section="training")),
    Input("optimizer", "Optimizer", "choice", "training", "optimizer", path="training.optimizer",
          deepspeed=("optimizer.type",), hf=("optim",),
          widget=Widget("dropdown", "Optimizer", section="training",
                        labels=(("AdamW", "adamw"), ("Adam", "adam"), ("SGD + momentum", "sgd"),
                                ("8-bit Adam", "adam8bit")))),
    Input("micro_batch", "Micro-batch per GPU (samples)", "int", "training", "samples per GPU per micro-step",
          path="training.micro_batch", deepspeed=("train_micro_batch_size_per_gpu",),
          hf=("per_device_train_batch_size",), widget=Widget("int_text", "Micro-batch / GPU", section="training")),
    Input("grad_accum", "Gradient accumulation steps", "int", "training", "micro-steps per optimizer step",
          path="training.grad_accum", default_value=8, deepspeed=("gradient_accumulation_steps",),
          hf=("gradient_accumulation_steps",),
          widget=Widget("int_text", "Gradient accumulation", section="training")),
    Input("seq_len", "Sequence length (tokens)", "int", "training", "tokens per sample", path="training.seq_len",
          widget=Widget("int_text", "Sequence length", section="training")),
    Input("checkpointing", "Activation checkpointing", "choice", "training", "activation checkpointing",
          path="training.checkpointing", deepspeed=("activation_checkpointing",), hf=("gradient_checkpointing",),
          widget=Widget("dropdown", "Activation ckpt", section="training")),
    Input("flash_attention", "Flash attention", "bool", "training", "no flash attention (O(s^2) scores)",
          path="training.flash_attention", widget=Widget("checkbox", "Flash attention", section="training")),
    Input("lora_rank", "LoRA rank (0 = full fine-tune)", "int", "training", "LoRA rank (0 = full fine-tune)",
          path="training.lora_rank", widget=Widget("int_text", "LoRA rank (0 = full)", section="lora")),
    Input("qlora", "QLoRA (4-bit base weights)", "bool", "training", "4-bit NF4 base weights (needs --lora-rank)",
          path="training.qlora", widget=Widget("checkbox", "QLoRA (4-bit base)", section="lora")),
    Input("mfu", "MFU (fraction of dense peak)", "float", "training",
          "fraction of the GPU's dense peak reached on the FLOPs executed, recomputation included "
          "(default: from GPU generation and GEMM size, fitted on measured runs); the reported mfu counts model FLOPs "
          "only, so it is lower with checkpointing",
          path="assumptions.mfu", shown_fn=_shown_compute_fraction,
          widget=Widget("float_slider", "MFU", section="training", low=0.05, high=0.8, step=0.01, fmt=".2f")),
    # -- DeepSpeed zero_optimization keys (DeepSpeed's names and aliases, deepspeed/runtime/zero/config.py) --
    Input("reduce_bucket_size", "reduce_bucket_size (elements)", "int", "ZeRO", "reduce bucket, elements",
          path="zero.reduce_bucket_size", deepspeed=("zero_optimization.reduce_bucket_size",),
          widget=Widget(**_BUCKET)),
    Input("allgather_bucket_size", "allgather_bucket_size (elements)", "int", "ZeRO", "all-gather bucket, elements",
          path="zero.allgather_bucket_size", deepspeed=("zero_optimization.allgather_bucket_size",),
          widget=Widget(**_BUCKET)),
    Input("stage3_prefetch_bucket_size", "stage3_prefetch_bucket_size (elements)", "int", "ZeRO",
          "ZeRO-3 prefetch bucket, elements", path="zero.stage3_prefetch_bucket_size",
          deepspeed=("zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.prefetch_bucket_size"),
          widget=Widget(**_BUCKET)),
    Input("overlap_comm", "overlap_comm", "bool", "ZeRO", "overlap communication with compute (default: "
          "DeepSpeed's, on at stage 3 only)", path="zero.overlap_comm",
          deepspeed=("zero_optimization.overlap_comm",),
          widget=Widget("dropdown", "overlap_comm", section="zero",
                        labels=(("DeepSpeed default", "default"), ("on", "on"), ("off", "off")),
                        values=(("default", None), ("on", True), ("off", False)))),
    Input("contiguous_gradients", "contiguous_gradients", "bool", "ZeRO", "no contiguous gradient buffer",
          path="zero.contiguous_gradients", deepspeed=("zero_optimization.contiguous_gradients",),
          widget=Widget("checkbox", "contiguous_gradients", section="zero")),
    Input("stage3_param_persistence_threshold", "stage3_param_persistence_threshold (elements)", "int", "ZeRO",
          "ZeRO-3: parameters below this stay unpartitioned, elements", path="zero.stage3_param_persistence_threshold",
          deepspeed=("zero_optimization.stage3_param_persistence_threshold",
                     "zero_optimization.param_persistence_threshold"),
          widget=Widget("int_text", "persistence thr.", section="zero")),
    Input("stage3_max_live_parameters", "stage3_max_live_parameters (elements)", "int", "ZeRO",
          "ZeRO-3: most gathered parameters at once, elements", path="zero.stage3_max_live_parameters",
          deepspeed=("zero_optimization.stage3_max_live_parameters", "zero_optimization.max_live_parameters"),
          widget=Widget("int_text", "max live params", section="zero")),
    Input("stage3_max_reuse_distance", "stage3_max_reuse_distance (elements)", "int", "ZeRO",
          "ZeRO-3: keep a parameter gathered if reused within this, elements", path="zero.stage3_max_reuse_distance",
          deepspeed=("zero_optimization.stage3_max_reuse_distance", "zero_optimization.max_reuse_distance"),
          widget=Widget("int_text", "max reuse distance", section="zero")),
    Input("zero_hpz_partition_size", "ZeRO++ hpZ partition size (GPUs)", "int", "ZeRO",
          "ZeRO++ hpZ: secondary parameter partition inside groups of N GPUs (stage 3)",
          path="zero.zero_hpz_partition_size", deepspeed=("zero_optimization.zero_hpz_partition_size",),
          app_implies=_ZPP, widget=Widget("int_text", "hpZ partition", section="zero")),
    Input("zero_quantized_weights", "ZeRO++ qwZ (quantized weights)", "bool", "ZeRO",
          "ZeRO++ qwZ: int8 weight all-gather (stage 3)", path="zero.zero_quantized_weights",
          deepspeed=("zero_optimization.zero_quantized_weights",), app_implies=_ZPP,
          widget=Widget("checkbox", "zero_quantized_weights (qwZ)", section="zero")),
    Input("zero_quantized_gradients", "ZeRO++ qgZ (quantized gradients)", "bool", "ZeRO",
          "ZeRO++ qgZ: int4 gradient reduce-scatter (stage 3)", path="zero.zero_quantized_gradients",
          deepspeed=("zero_optimization.zero_quantized_gradients",), app_implies=_ZPP,
          widget=Widget("checkbox", "zero_quantized_gradients (qgZ)", section="zero")),
    Input("pin_memory", "Pinned offload memory", "bool", "ZeRO", "pageable host memory for both offload blocks",
          path="zero.offload_optimizer.pin_memory", apply_fn=_apply_pin_memory, read_fn=_read_pin_memory,
          shown_fn=lambda s: s.zero.offload_optimizer.pin_memory,
          deepspeed=("zero_optimization.offload_optimizer.pin_memory", "zero_optimization.offload_param.pin_memory"),
          widget=Widget("checkbox", "Pinned offload memory", section="offload")),
    # -- vision-language models (their cost-model use: Scenario.trainable_parameters, Scenario.sequence_tokens) --
    Input("freeze_vision", "Freeze the vision tower", "bool", "training",
          "vision tower and projector frozen in a full fine-tune (ms-swift freeze_vit, LLaMA-Factory "
          "freeze_vision_tower); no effect on a text-only model", path="training.freeze_vision",
          widget=Widget("checkbox", "Freeze vision tower", section="training")),
    Input("images_per_sample", "Images per sample", "int", "training",
          "images in one training sample; each adds the model's vision tokens to the language model's sequence",
          path="training.images_per_sample", widget=Widget("int_text", "Images / sample", section="training")),
    # -- planner options (TrainingSpec: what the planner may change about the numerics of a step) --
    Input("allow_lossy_communication", "Allow lossy ZeRO++ communication", "bool", "ZeRO",
          "let the planner recommend ZeRO++ quantized collectives (int8 weights, int4 gradients; they change the "
          "numerics, arXiv 2306.10209); off: only if you set --zero-quantized-* yourself",
          path="training.allow_lossy_communication",
          widget=Widget("checkbox", "Allow lossy ZeRO++ (int8/int4)", section="zero")),
    # -- offload storage (its cost-model use: evaluate.fits_nvme against memory.nvme_parts) --
    Input("nvme_capacity_gib", "NVMe capacity per node (GiB)", "float", "cluster",
          "NVMe capacity per node for offload_* device nvme, GiB (default 4096, 4 TiB: less than the 15 TB of NVMe "
          "in an NVIDIA DGX A100; `zeroplanner probe` measures the free space)", path="cluster.nvme_bytes", scale=GIB,
          widget=Widget("float_text", "NVMe/node GiB", section="offload", round_digits=0)),
    Input("cpu_adam_params_per_second", "CPU-Adam updates per second per node", "float", "cluster",
          "DeepSpeedCPUAdam parameter updates per second measured on one node's host, for offload_optimizer (the "
          "node's ranks share it; default: each rank's threads (--cpu-adam-threads-per-rank) x the rate of one "
          "thread measured for zeroplanner, up to one process's published rate (docs/validation.md); "
          "`zeroplanner probe --benchmarks` measures yours)",
          path="cluster.cpu_adam_params_per_second", read_fn=lambda s: s.cluster.cpu_adam_params_per_second,
          shown_fn=_shown_cpu_adam_node_rate,
          widget=Widget("float_text", "CPU-Adam params/s/node", section="offload", round_digits=0)),
    Input("cpu_adam_threads_per_rank", "CPU-Adam threads per rank", "int", "cluster",
          "OpenMP threads of each rank's DeepSpeedCPUAdam and host copies (OMP_NUM_THREADS; default 1, what torchrun "
          "and accelerate launch set; deepspeed --bind_cores_to_rank gives cores / GPUs per node)",
          path="cluster.cpu_adam_threads_per_rank",
          widget=Widget("int_text", "CPU-Adam threads/rank", section="offload")),
    Input("host_cpu_cores_per_node", "Host CPU cores per node", "int", "cluster",
          "physical CPU cores of one node's host (default: not given, enough for every rank's CPU-Adam threads); "
          "with fewer cores than threads x GPUs per node each rank gets its share",
          path="cluster.host_cpu_cores_per_node", read_fn=lambda s: s.cluster.host_cpu_cores_per_node),
    # -- long context: Ulysses sequence parallelism and ALST (costmodel/ulysses.py) --
    Input("sequence_parallel_size", "Ulysses sequence-parallel degree (GPUs)", "int", "cluster",
          "Ulysses sequence-parallel degree: each sample's sequence split over this many GPUs (1 = none; must "
          "divide the heads and the world size)", path="cluster.sequence_parallel_size",
          deepspeed=("sequence_parallel_size",),
          widget=Widget("dropdown", "Sequence parallel", section="training",
                        labels=tuple((str(n), n) for n in (1, 2, 4, 8, 16, 32)))),
    Input("tiled_mlp", "TiledMLP", "bool", "training", "ALST TiledMLP: MLP computed over sequence tiles",
          path="training.tiled_mlp"),
    Input("tiled_loss", "Tiled loss", "bool", "training",
          "logits and loss computed in sequence chunks (no full [tokens, vocab] logits)",
          path="training.tiled_loss"),
    Input("checkpoint_offload", "Checkpoint offload to host", "bool", "training",
          "activation checkpoints kept in host RAM between forward and backward (needs checkpointing)",
          path="training.checkpoint_offload"),
    # -- QLoRA with ZeRO-3 (its cost-model use: costmodel.context.qlora_base_partitioned, memory.parameter_parts) --
    Input("bnb_4bit_quant_storage", "QLoRA 4-bit storage dtype", "choice", "training",
          "BitsAndBytesConfig bnb_4bit_quant_storage (set in your training script with the same torch_dtype): "
          "the training dtype lets ZeRO-3 shard the 4-bit base (PEFT's DeepSpeed guide); uint8, bitsandbytes' "
          "default, keeps it whole on every GPU", path="training.bnb_4bit_quant_storage",
          widget=Widget("dropdown", "4-bit storage (quant_storage)", section="lora")),
    # -- DeepSpeed AutoTP training (its cost-model use: costmodel/context.py shards, communication.py all-reduces) --
    Input("autotp_size", "AutoTP tensor-parallel degree (GPUs)", "int", "cluster",
          "DeepSpeed AutoTP training degree (tensor_parallel.autotp_size): each layer's linear weights split over "
          "this many GPUs of one node, ZeRO over world / autotp_size (1 = none; must divide gpus_per_node)",
          path="cluster.tensor_parallel_size", deepspeed=("tensor_parallel.autotp_size",),
          widget=Widget("dropdown", "AutoTP degree", section="training",
                        labels=tuple((str(n), n) for n in (1, 2, 4, 8)))),
)
"""Every scenario input, in the order share links write them (new inputs go at the end)."""

BY_KEY: dict[str, Input] = {i.key: i for i in INPUTS}
BY_CONTROL: dict[str, Input] = {i.control_key: i for i in INPUTS if i.control_key}

_EXTRA_FIELDS = {"parameter_count_override": "params"}


def field_inputs() -> dict[str, str]:
    """Spec field name -> input key, for naming the input of a pydantic error (the last field name of the
    error's location, or a field name its message mentions). Names two inputs share (``device``) are left out."""
    names: dict[str, list[str]] = {}
    for i in INPUTS:
        for name in {i.key, (i.path or "").split(".")[-1]} - {""}:
            names.setdefault(name, []).append(i.key)
    out = {name: keys[0] for name, keys in names.items() if len(set(keys)) == 1}
    out.update(_EXTRA_FIELDS)
    return out


def input_for_error(loc: tuple, message: str, given: typing.Iterable[str] = ()) -> str | None:
    """The input key a pydantic error is about: the innermost location part that names an input, else (a
    cross-field rule) the first input its message names (whole words; ``zero_quantized_*`` names the given
    inputs it covers), preferring inputs in ``given``. None when nothing matches."""
    fields = field_inputs()
    for part in reversed(loc):
        if str(part) in fields:
            return fields[str(part)]
    found = []
    for name, key in fields.items():
        if key in CATALOG_KINDS:
            continue  # "gpu", "model" are words of many messages
        m = re.search(rf"(?<![a-z0-9_]){re.escape(name)}(?![a-z0-9_])", message)
        if m:
            found.append((m.start(), key))
    given = set(given)
    for prefix in re.finditer(r"([a-z0-9_]+_)\*", message):
        found += [(prefix.start(), k) for k in given if k.startswith(prefix.group(1))]
    found.sort()
    preferred = [k for _, k in found if k in given]
    return preferred[0] if preferred else (found[0][1] if found else None)


def zero_aliases(kind: str) -> dict[str, str]:
    """``zero_optimization`` key -> ZeroSpec field of the ``kind`` ("int" / "bool") inputs that live directly on
    ZeroSpec (DeepSpeed's name and its aliases; the DeepSpeed-config reader's tables). ``stage`` is left out
    (the reader checks it first)."""
    out = {}
    for i in INPUTS:
        if i.kind != kind or not (i.path or "").startswith("zero.") or i.path.count(".") != 1 or i.key == "stage":
            continue
        for key in i.deepspeed:
            out[key.removeprefix("zero_optimization.")] = i.path.split(".")[1]
    return out


def stage3_only() -> tuple[str, ...]:
    """ZeroSpec fields DeepSpeed reads only at stage 3 (its ``stage3_*`` keys)."""
    return tuple(i.path.split(".")[1] for i in INPUTS if i.key.startswith("stage3_"))


def defaults() -> dict[str, Any]:
    """Input key -> ``build_scenario``'s default (None: the spec's own, or not set)."""
    return {i.key: i.default for i in INPUTS}


def scenario_data(model: Architecture, values: dict[str, Any]) -> dict:
    """The ``Scenario.model_dump()``-shaped dict of ``model`` and input values (defaults for the rest), not yet
    validated. The gpu and network come first (the other inputs change their copies)."""
    data: dict[str, Any] = {"model": model.model_dump(), "cluster": {}, "training": {}, "zero": {
        "offload_optimizer": {}, "offload_param": {}}, "assumptions": {}}
    merged = {**defaults(), **{k: v for k, v in values.items() if v is not None}}
    for i in INPUTS:
        if i.key in ("model", "params"):
            continue
        i.apply(data, merged[i.key])
    return data

