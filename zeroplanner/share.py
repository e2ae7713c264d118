"""Shareable scenarios: a :class:`~zeroplanner.specs.Scenario` to and from a URL query string and JSON.

A workshop teacher hands 40 people the same scenario with one link, e.g.
``http://127.0.0.1:8866/?model=llama-2-70b&nodes=4&network=ib-hdr``. The Voilà page reads its query string (Voilà
puts it in the kernel's environment as ``QUERY_STRING``; voila/handler.py, ``request_info``, Voilà 0.5.13) with
:func:`scenario_from_environment`.

Query keys are the CLI's scenario option names with underscores (``--gpus-per-node`` -> ``gpus_per_node``), see
:data:`SHARE_KEYS`; values use the CLI's units (GiB for memory, Gbit/s per node for the network) and the CLI's
grammar, :meth:`zeroplanner.inputs.Input.parse` (``params=7B``, ``model=Qwen/Qwen3-8B``). Every key is optional; a
missing key takes :func:`zeroplanner.scenarios.build_scenario`'s default (Llama-2-7B on one node of 8 A100-80GB,
InfiniBand HDR, ZeRO-2). Reading never executes anything: only ``urllib.parse``, at most :data:`MAX_QUERY_CHARS`
characters, each value type- and range-checked, then validated by the pydantic specs (Voilà's own ``template`` and
``theme`` arguments are skipped).

A link is read leniently (:func:`read_link`, :func:`scenario_from_query`): a key it cannot apply (unknown, given
twice, a bad value, a value the specs reject) is left out, the rest applied, and what was left out is named
(:class:`Ignored`, ``LinkScenario.note``); an unknown key is never used or stored, only its clipped name shown. The
strict readings (:func:`parse_query`, ``scenario_from_query(strict=True)``, :func:`scenario_from_environment`,
:func:`scenario_from_json`) refuse instead, with a :class:`ShareError` whose message names the key.

What a link can carry: a catalog model (``model=``) or a bare parameter count (``params=``, the Llama-shaped model
of :meth:`Architecture.from_parameter_count`); a catalog GPU with an optional memory override; a catalog network
with an optional per-node bandwidth override; and the CLI's training / ZeRO options. A model read from a HF
``config.json`` is **refused** by :func:`scenario_to_query` (its architecture does not fit in a link, and silently
sharing only its parameter count would change activations and FLOPs); ``approximate_model=True`` shares it as
``params=Ψ`` instead, knowingly. :func:`scenario_to_json` carries any scenario, HF-config models included, exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import ValidationError

from . import catalog
from .inputs import INPUTS, MAX_TEXT_CHARS, Input, InputError, input_for_error, shown_text
from .scenarios import build_scenario
from .specs import Architecture, Scenario

MAX_QUERY_CHARS = 2000
"""Longest query string accepted (a full scenario with every key is about 500 characters)."""
MAX_VALUE_CHARS = MAX_TEXT_CHARS
"""Longest single value accepted (:data:`zeroplanner.inputs.MAX_TEXT_CHARS`; the longest catalog name or hub id is
under 30 characters)."""
MAX_NOTED = 6
"""How many ignored keys a note names one by one (the rest are counted)."""
MAX_JSON_CHARS = 200_000
"""Largest JSON text :func:`scenario_from_json` reads (a full scenario with its sources is about 6 kB)."""
JSON_FORMAT = "zeroplanner-scenario"
JSON_VERSION = 1
IGNORED_QUERY_KEYS = ("template", "theme")
"""Voilà's own page arguments (voila/handler.py ``get_argument("template")`` / ``("theme")``); skipped, not refused."""


class ShareError(ValueError):
    """A query string or JSON text that cannot be turned into a scenario (or a scenario that cannot go into a
    link). ``key`` names the offending key (``"query"`` / ``"json"`` for the text as a whole)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.detail = message


class ShareWarning(UserWarning):
    """What :func:`scenario_from_query` ignored in a link (an unknown key, a bad value), as a Python warning: the
    note of :func:`read_link`, for callers that only take the scenario."""


@dataclass(frozen=True)
class Ignored:
    """One key of a link that was not applied: ``key`` (clipped to 40 printable characters) and ``reason`` (the
    message the strict reading raises, e.g. ``must be an integer in [1, 100000] (got 'abc')``)."""

    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key} ({self.reason})"


class LinkScenario(NamedTuple):
    """A link's scenario and what of the link was ignored (:func:`read_link`)."""

    scenario: Scenario
    ignored: tuple[Ignored, ...] = ()

    @property
    def note(self) -> str:
        """One line naming what was ignored ('' when the whole link was applied), e.g. ``Not used from the link:
        nodez (unknown key; did you mean nodes?). The rest of the link was applied.``"""
        return ignored_note(self.ignored)


def ignored_note(ignored: Iterable[Ignored]) -> str:
    """The line a page shows for the keys a link could not apply ('' for none)."""
    ignored = list(ignored)
    if not ignored:
        return ""
    named = "; ".join(str(i) for i in ignored[:MAX_NOTED])
    more = f"; and {len(ignored) - MAX_NOTED} more" if len(ignored) > MAX_NOTED else ""
    return f"Not used from the link: {named}{more}. The rest of the link was applied."


SHARE_KEYS: tuple[Input, ...] = INPUTS
"""Every key a link may carry, in the order :func:`scenario_to_query` writes them: the inputs of
:data:`zeroplanner.inputs.INPUTS` (a key is the CLI option's name with underscores; ``flash_attention``,
``contiguous_gradients`` and ``pin_memory`` are the CLI's ``--no-...`` flags, ``pin_memory`` sets both offload
blocks as the app does). Ranges and choices are the specs' own, in the input's unit."""

KEYS: dict[str, Input] = {k.name: k for k in SHARE_KEYS}
ALWAYS_WRITTEN = ("gpu", "gpus_per_node", "nodes", "network")
"""Keys :func:`scenario_to_query` writes even at their default value (with the model), so a link names the cluster
explicitly."""

_PRINTABLE_RE = re.compile(r"^[\x21-\x7e]*$")

# --------------------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------------------
_shown = shown_text


def _catalog_name(names: list[str], value: str) -> str | None:
    return {n.lower(): n for n in names}.get(value.strip().lower())


def coerce_value(key: str, value: Any) -> Any:
    """Type- and range-check one shared value (a query-string text, or a JSON scalar) and return it typed: the
    input's own grammar, :meth:`zeroplanner.inputs.Input.parse` (``params=7B``, ``model=Qwen/Qwen3-8B`` as on the
    CLI), whose limits on length and characters apply.

    Raises :class:`ShareError` naming ``key`` (unknown key, wrong type, out of range, unknown catalog name).
    """
    spec = KEYS.get(key)
    if spec is None:
        raise ShareError(_clip_key(key), f"unknown key; allowed keys: {', '.join(KEYS)}")
    try:
        return spec.parse(value)
    except InputError as exc:
        raise ShareError(key, exc.detail) from None


def _unknown_key(key: str) -> Ignored:
    import difflib

    close = difflib.get_close_matches(key.lower(), list(KEYS), n=1, cutoff=0.6) if len(key) <= 40 else []
    return Ignored(_clip_key(key), "unknown key" + (f"; did you mean {close[0]}?" if close else ""))


def _clip_key(key: str) -> str:
    return key if len(key) <= 40 and _PRINTABLE_RE.match(key) else repr(key[:40])


def format_value(key: str, value: Any) -> str:
    """The query-string text of a typed value: integers plainly, floats in Python's shortest round-trip form
    (an integral float as an integer), booleans as true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    return str(value)


# --------------------------------------------------------------------------------------------------------------
# Inputs <-> Scenario
# --------------------------------------------------------------------------------------------------------------
def parse_inputs(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Typed, checked inputs from (key, value) pairs; refuses repeated keys and ``model`` together with
    ``params``. Raises :class:`ShareError` (the strict reading; :func:`read_inputs` ignores and names instead)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in IGNORED_QUERY_KEYS:
            continue
        if key in out:
            raise ShareError(_clip_key(key), "given more than once")
        out[key] = coerce_value(key, value)
    if "model" in out and "params" in out:
        raise ShareError("params", "give either model or params, not both")
    return out


def read_inputs(pairs: Iterable[tuple[str, Any]]) -> tuple[dict[str, Any], tuple[Ignored, ...]]:
    """(inputs, ignored): :func:`parse_inputs` that applies what it can. An unknown key, a value of the wrong type
    or outside its range, a key given more than once (every copy) and ``params`` beside ``model`` are left out
    and named in ``ignored``; an unknown key is never used, stored or echoed beyond its clipped name."""
    pairs = [(k, v) for k, v in pairs if k not in IGNORED_QUERY_KEYS]
    counts: dict[str, int] = {}
    for key, _ in pairs:
        counts[key] = counts.get(key, 0) + 1
    out: dict[str, Any] = {}
    ignored: list[Ignored] = []
    repeated: set[str] = set()
    for key, value in pairs:
        if counts[key] > 1:
            if key not in repeated:
                repeated.add(key)
                ignored.append(Ignored(_clip_key(key), f"given {counts[key]} times"))
            continue
        if key not in KEYS:
            ignored.append(_unknown_key(key))
            continue
        try:
            out[key] = coerce_value(key, value)
        except ShareError as exc:
            ignored.append(Ignored(exc.key, exc.detail))
    if "model" in out and "params" in out:
        del out["params"]
        ignored.append(Ignored("params", "give either model or params, not both; the model was used"))
    return out, tuple(ignored)


def scenario_from_inputs(inputs: Mapping[str, Any]) -> Scenario:
    """Build the scenario of checked inputs (:func:`parse_inputs`) with ``build_scenario``. Raises
    :class:`ShareError` naming the key for values the specs reject (e.g. ``qlora`` without ``lora_rank``)."""
    try:
        return build_scenario(**inputs)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        key = input_for_error(tuple(err.get("loc", ())), msg, given=inputs) or "query"
        raise ShareError(key, msg) from None
    except (KeyError, ValueError) as exc:
        key = "params" if "params" in inputs else "model"
        raise ShareError(key, str(exc).strip("'\"")) from None


def scenario_from_inputs_leniently(inputs: Mapping[str, Any]) -> LinkScenario:
    """:func:`scenario_from_inputs` that leaves out a given input the specs reject (``qlora`` without
    ``lora_rank``, ``offload_param=cpu`` below stage 3) and names it, then builds the rest. Raises
    :class:`ShareError` only when a rejection names no given input."""
    inputs = dict(inputs)
    ignored: list[Ignored] = []
    while True:
        try:
            return LinkScenario(scenario_from_inputs(inputs), tuple(ignored))
        except ShareError as exc:
            if exc.key not in inputs:
                raise
            del inputs[exc.key]
            ignored.append(Ignored(exc.key, exc.detail))


def _comparable(scenario: Scenario) -> dict:
    """The scenario's content without labels (model/GPU/network names and sources) and with the network's
    per-node bandwidth in place of link rate x NIC count (the app and build_scenario split it differently)."""
    data = scenario.model_dump()
    for part in (data["model"], data["cluster"]["gpu"], data["cluster"]["network"]):
        part.pop("name", None)
        part.pop("source", None)
    net = data["cluster"]["network"]
    net["per_node_gbps"] = float(f"{net.pop('link_gbps') * net.pop('nics_per_node'):.12g}")
    return data


def _diff_paths(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in a.keys() | b.keys():
            out += _diff_paths(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return sorted(out)
    if isinstance(a, float) or isinstance(b, float):
        try:
            return [] if math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0) else [prefix]
        except (TypeError, ValueError):
            return [prefix]
    return [] if a == b else [prefix]


def _network_inputs(scenario: Scenario) -> dict[str, Any]:
    net = scenario.cluster.network
    per_node = net.link_gbps * net.nics_per_node
    names = catalog.network_names()
    exact = _catalog_name(names, net.name)
    # build_scenario keeps the preset's name; the app's bandwidth slider names it "<preset> at X Gb/s per node"
    candidates = [exact] if exact else [n for n in names if net.name.lower().startswith(n.lower() + " at ")]
    for name in candidates:
        preset = catalog.network(name)
        same = all(getattr(preset, f) == getattr(net, f) for f in ("kind", "efficiency", "latency_seconds"))
        if same:
            out: dict[str, Any] = {"network": name}
            if not math.isclose(per_node, preset.link_gbps * preset.nics_per_node, rel_tol=1e-12):
                out["inter_node_gbps"] = float(per_node)
            return out
    return {"network": None}


def scenario_inputs(scenario: Scenario, *, approximate_model: bool = False) -> tuple[dict[str, Any], list[str]]:
    """(inputs, unshared): the shareable inputs of ``scenario`` (keys of :data:`SHARE_KEYS`, typed) and the
    scenario fields a link cannot carry (dotted paths, e.g. ``"zero.offload_optimizer.pin_memory"``; empty when
    ``scenario_from_inputs(inputs)`` rebuilds the same scenario up to names and sources).

    Model: a catalog entry -> ``model``; an :meth:`Architecture.from_parameter_count` model -> ``params``; any
    other architecture (a HF ``config.json``) is listed in ``unshared`` as ``"model"`` unless
    ``approximate_model`` (then ``params`` = its exact Ψ, with the Llama-shaped architecture that implies, and
    the model is not listed).
    """
    arch = scenario.model
    inputs: dict[str, Any] = {}
    model_ok = True
    name = _catalog_name(catalog.model_names(), arch.name)
    if name is not None and catalog.model(name) == arch:
        inputs["model"] = name
    elif arch.parameter_count_override and Architecture.from_parameter_count(
            arch.parameter_count_override, name=arch.name) == arch:
        inputs["params"] = int(arch.parameter_count_override)
    else:
        model_ok = False
        if approximate_model:
            inputs["params"] = int(arch.parameter_count)
    for spec in SHARE_KEYS:
        if spec.key in ("model", "params", "network", "inter_node_gbps"):
            continue
        value = spec.read(scenario)
        if value is not None or spec.key == "gpu":
            inputs[spec.key] = int(value) if spec.kind == "int" else value
        if spec.key == "nodes":
            inputs.update(_network_inputs(scenario))  # after nodes, as SHARE_KEYS orders them

    unshared: list[str] = []
    if not model_ok and not approximate_model:
        unshared.append("model")
    if inputs["gpu"] is None or catalog.gpu(inputs["gpu"]) != scenario.cluster.gpu:
        unshared.append("cluster.gpu")
    if inputs["network"] is None:
        unshared.append("cluster.network")
    if unshared:
        inputs = {k: v for k, v in inputs.items() if v is not None}
        return inputs, unshared
    try:
        rebuilt = scenario_from_inputs(inputs)
    except ShareError as exc:  # pragma: no cover - the inputs come from a valid scenario
        return inputs, [exc.key]
    diff = _diff_paths(_comparable(scenario), _comparable(rebuilt))
    if not model_ok:
        diff = [d for d in diff if not d.startswith("model.")]
    return inputs, diff


@lru_cache(maxsize=1)
def _default_items() -> tuple[tuple[str, Any], ...]:
    inputs, _ = scenario_inputs(build_scenario())
    return tuple(inputs.items())


def _default_inputs() -> dict[str, Any]:
    """The inputs of ``build_scenario()`` (computed once; catalogs do not change while running)."""
    return dict(_default_items())


def inputs_to_query(inputs: Mapping[str, Any], *, full: bool = False) -> str:
    """Query string (no leading '?') of typed inputs in :data:`SHARE_KEYS` order. Keys at ``build_scenario``'s
    default are left out unless ``full`` or in :data:`ALWAYS_WRITTEN` (and the model / params always)."""
    defaults = _default_inputs()
    pairs = []
    for spec in SHARE_KEYS:
        if spec.name not in inputs:
            continue
        value = coerce_value(spec.name, inputs[spec.name])
        keep = full or spec.name in ("model", "params", *ALWAYS_WRITTEN) or defaults.get(spec.name) != value
        if keep:
            pairs.append((spec.name, format_value(spec.name, value)))
    return urlencode(pairs, safe=".-_")


def scenario_to_query(scenario: Scenario, *, full: bool = False, strict: bool = True,
                      approximate_model: bool = False) -> str:
    """The query string (no leading '?') that rebuilds ``scenario``, e.g.
    ``model=llama-2-70b&gpu=A100-80GB&gpus_per_node=8&nodes=4&network=ib-hdr``.

    ``strict`` (default): raises :class:`ShareError` naming the first field a link cannot carry (a HF-config model
    -> key ``model``, see the module docstring; a GPU or network not from the catalog; non-default settings with no
    key such as ``pin_memory``). ``strict=False`` leaves those out (the link then rebuilds an approximation).
    """
    inputs, unshared = scenario_inputs(scenario, approximate_model=approximate_model)
    if strict and unshared:
        field = unshared[0]
        if field == "model":
            raise ShareError("model", f"model {scenario.model.name!r} is neither a catalog model nor a bare "
                                      "parameter count (an architecture read from a HF config.json does not fit in "
                                      "a link); share the scenario as JSON instead (zeroplanner.share."
                                      "scenario_to_json), or its parameter count only (approximate_model=True)")
        raise ShareError(field, "this setting has no query key, so a link cannot carry it; share the JSON "
                                "(scenario_to_json) instead")
    return inputs_to_query(inputs, full=full)


def _query_pairs(query: str) -> list[tuple[str, str]]:
    """The (key, value) pairs of a query string; raises :class:`ShareError` for the text as a whole (not text,
    too long, malformed)."""
    if not isinstance(query, str):
        raise ShareError("query", f"must be text, got {type(query).__name__}")
    if len(query) > MAX_QUERY_CHARS:
        raise ShareError("query", f"is {len(query)} characters long; the limit is {MAX_QUERY_CHARS}")
    text = query.strip()
    if "://" in text:
        text = urlsplit(text).query
    text = text.removeprefix("?")
    if not text:
        return []
    try:
        return parse_qsl(text, keep_blank_values=True, strict_parsing=True, max_num_fields=len(SHARE_KEYS) + 4,
                         errors="strict")
    except UnicodeDecodeError:
        raise ShareError("query", "contains percent-escapes that are not UTF-8") from None
    except ValueError as exc:
        raise ShareError("query", f"malformed ({str(exc)[:80]}); expected key=value pairs joined by '&'") from None


def parse_query(query: str) -> dict[str, Any]:
    """Typed, checked inputs of a query string (with or without the leading '?'; a whole URL is accepted too),
    read strictly.

    Raises :class:`ShareError`: longer than :data:`MAX_QUERY_CHARS`, malformed, a repeated or unknown key, or a
    value of the wrong type / outside its range (the message names the key and the allowed values).
    :func:`read_query` reads the same text but ignores and names what it cannot apply.
    """
    return parse_inputs(_query_pairs(query))


def read_query(query: str) -> tuple[dict[str, Any], tuple[Ignored, ...]]:
    """(inputs, ignored) of a query string: :func:`read_inputs`. Raises :class:`ShareError` only for the text as
    a whole (not text, longer than :data:`MAX_QUERY_CHARS`, malformed)."""
    return read_inputs(_query_pairs(query))


def read_link(query: str) -> LinkScenario:
    """The scenario of a link and what of it was ignored: every key that can be applied is, and each unknown key,
    bad value or value the specs reject is left out and named (``LinkScenario.note``), e.g.
    ``read_link("model=llama-2-13b&nodez=4")`` is Llama-2-13B with the note ``nodez (unknown key; did you mean
    nodes?)``. Raises :class:`ShareError` only for the query as a whole (too long, malformed) or a rejection that
    names no key of the link."""
    inputs, ignored = read_query(query)
    built = scenario_from_inputs_leniently(inputs)
    return LinkScenario(built.scenario, ignored + built.ignored)


def scenario_from_query(query: str, *, strict: bool = False) -> Scenario:
    """The scenario a query string describes (missing keys take ``build_scenario``'s defaults); ``params=7B`` and
    ``model=Qwen/Qwen3-8B`` read as on the CLI (:meth:`zeroplanner.inputs.Input.parse`).

    A key that cannot be applied (unknown, a bad value, a value the specs reject such as ``qlora=true`` without
    ``lora_rank``) is left out and the rest applied (:func:`read_link`); what was left out is named in a
    :class:`ShareWarning` (``warnings.catch_warnings(record=True)`` collects it; :func:`read_link` returns it).
    Raises :class:`ShareError` for the query as a whole (too long, malformed). ``strict=True`` raises
    :class:`ShareError` naming the key instead of leaving anything out (see :func:`parse_query`).
    """
    if strict:
        return scenario_from_inputs(parse_query(query))
    link = read_link(query)
    if link.ignored:
        warnings.warn(link.note, ShareWarning, stacklevel=2)
    return link.scenario


# --------------------------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------------------------
def scenario_to_json(scenario: Scenario, *, indent: int | None = 2) -> str:
    """A JSON document carrying the whole scenario exactly (any model, HF-config architectures included)::

        {"format": "zeroplanner-scenario", "version": 1, "scenario": {...Scenario fields...},
         "query": "model=...&..."}   # "query" only when a link can carry the scenario too
    """
    doc: dict[str, Any] = {"format": JSON_FORMAT, "version": JSON_VERSION,
                           "scenario": scenario.model_dump(mode="json")}
    try:
        doc["query"] = scenario_to_query(scenario)
    except ShareError:
        pass
    return json.dumps(doc, indent=indent)


def scenario_from_json(text: str | bytes) -> Scenario:
    """Read :func:`scenario_to_json`'s document, or a flat object of query keys (``{"model": "llama-2-70b",
    "nodes": 4}``, typed JSON values or strings).

    Raises :class:`ShareError`: text longer than :data:`MAX_JSON_CHARS`, not JSON, not an object, an unknown
    format or version, or a field the specs reject (the key is the dotted field path, e.g.
    ``scenario.cluster.nodes``).
    """
    if isinstance(text, bytes):
        if len(text) > MAX_JSON_CHARS:
            raise ShareError("json", f"is {len(text)} bytes long; the limit is {MAX_JSON_CHARS}")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ShareError("json", "is not UTF-8 text") from None
    if not isinstance(text, str):
        raise ShareError("json", f"must be text, got {type(text).__name__}")
    if len(text) > MAX_JSON_CHARS:
        raise ShareError("json", f"is {len(text)} characters long; the limit is {MAX_JSON_CHARS}")
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ShareError("json", f"not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(doc, dict):
        raise ShareError("json", f"must be a JSON object, got {type(doc).__name__}")
    if "format" not in doc:
        return scenario_from_inputs(parse_inputs(doc.items()))
    if doc.get("format") != JSON_FORMAT:
        raise ShareError("format", f"must be {JSON_FORMAT!r} (got {_shown(doc.get('format'))})")
    if doc.get("version") != JSON_VERSION:
        raise ShareError("version", f"must be {JSON_VERSION} (got {_shown(doc.get('version'))})")
    unknown = set(doc) - {"format", "version", "scenario", "query"}
    if unknown:
        raise ShareError(_clip_key(sorted(map(str, unknown))[0]), "unknown key; allowed: format, version, "
                                                                  "scenario, query")
    try:
        return Scenario.model_validate(doc.get("scenario"))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in ("scenario", *err.get("loc", ())))
        raise ShareError(_clip_key(loc), str(err.get("msg", "invalid")).removeprefix("Value error, ")) from None


# --------------------------------------------------------------------------------------------------------------
# Voilà page environment and links
# --------------------------------------------------------------------------------------------------------------
def wait_for_voila_request() -> None:
    """In a pre-heated Voilà kernel, wait until a page request takes it and its request info (``QUERY_STRING``,
    ``SERVER_NAME``, ...) is in ``os.environ``.

    Voilà runs pooled kernels (``VoilaConfiguration.preheat_kernel``, which ``zeroplanner app`` uses) before any
    request, with ``VOILA_PREHEAT=True`` and no ``QUERY_STRING``; the request info arrives over Voilà's
    ``voila/query`` websocket once a page takes the kernel (``voila.utils.wait_for_request``, Voilà 0.5.13). Outside
    a pre-heated kernel (Jupyter, nbclient, a normal Voilà kernel) this returns at once.
    """
    if os.environ.get("VOILA_PREHEAT", "False") != "True" or "QUERY_STRING" in os.environ:
        return
    try:
        from voila.utils import wait_for_request
    except ImportError:  # pragma: no cover - VOILA_PREHEAT is only set by Voila
        return
    wait_for_request()


def _environment_query(environ: Mapping[str, str] | None) -> str:
    if environ is None:
        wait_for_voila_request()
    env = os.environ if environ is None else environ
    return env.get("QUERY_STRING", "") or ""


def scenario_from_environment(environ: Mapping[str, str] | None = None) -> Scenario | None:
    """The scenario of the page's query string, or None when the page was opened without one; read strictly.

    Voilà gives each page's kernel the request's ``QUERY_STRING`` in its environment (voila/handler.py,
    ``request_info``, Voilà 0.5.13); a pre-heated kernel first waits for it (:func:`wait_for_voila_request`).
    ``environ`` (a mapping) replaces ``os.environ`` for tests and then nothing waits. Raises
    :class:`ShareError` for a query that names no valid scenario (an unknown key, a bad value): a page that shows
    that error and opens the default. :func:`link_from_environment` applies what it can and names the rest.
    """
    query = _environment_query(environ)
    if not parse_query(query):
        return None
    return scenario_from_query(query, strict=True)


def link_from_environment(environ: Mapping[str, str] | None = None) -> LinkScenario | None:
    """:func:`read_link` of the page's query string (see :func:`scenario_from_environment`), or None when the page
    was opened without one (Voilà's own ``theme`` / ``template`` only). A link whose every key was ignored gives
    the default scenario and the note naming them. Raises :class:`ShareError` for the query as a whole."""
    query = _environment_query(environ)
    if not _query_pairs(query) or all(k in IGNORED_QUERY_KEYS for k, _ in _query_pairs(query)):
        return None
    return read_link(query)


def page_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The page's own URL without its query, or None outside Voilà.

    From the request info Voilà gives the kernel (CGI names, rfc3875: ``SERVER_NAME``, ``SERVER_PORT``,
    ``SCRIPT_NAME`` = the request path), with the scheme of ``VOILA_REQUEST_URL`` (http when absent); else
    ``VOILA_REQUEST_URL`` itself (in a pooled kernel it can belong to an earlier request, so it comes second).
    """
    env = os.environ if environ is None else environ
    request_url = env.get("VOILA_REQUEST_URL") or ""
    parts = urlsplit(request_url) if request_url else None
    host, port, path = env.get("SERVER_NAME"), env.get("SERVER_PORT"), env.get("SCRIPT_NAME")
    if host and path is not None:
        scheme = parts.scheme if parts is not None and parts.scheme in ("http", "https") else "http"
        if not re.match(r"^[A-Za-z0-9.\-\[\]:]+$", host) or (port and not port.isdigit()):
            return None
        netloc = f"{host}:{port}" if port else host
        return urlunsplit((scheme, netloc, path if path.startswith("/") else "/" + path, "", ""))
    if parts is None or parts.scheme not in ("http", "https"):
        return None
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def share_link(scenario: Scenario, base_url: str | None = None, *, strict: bool = False,
               environ: Mapping[str, str] | None = None) -> str:
    """``base_url?query`` for ``scenario``; ``base_url`` defaults to the page's URL (:func:`page_url`), else just
    ``?query`` (a relative link). ``strict=False`` (default) leaves out what a link cannot carry."""
    base = base_url if base_url is not None else (page_url(environ) or "")
    return f"{base}?{scenario_to_query(scenario, strict=strict, approximate_model=not strict)}"
