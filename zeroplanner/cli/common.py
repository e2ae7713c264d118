"""What every subcommand shares: the one-line usage error (exit 2), the scenario options generated from the input
table (:mod:`zeroplanner.inputs`) and reading them back into a Scenario, JSON output."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from pydantic import ValidationError

from ..files import InputFileError, read_regular_file, read_regular_file_tail
from ..inputs import BY_KEY, CATALOG_KINDS, INPUTS, Input, InputError, input_for_error, parse_integer
from ..scenarios import build_scenario
from ..specs import Scenario

MAX_INPUT_FILE_BYTES = 1_000_000
"""Largest JSON file (HF config, probe output) the CLI reads, in bytes: real config.json files are a few KB (the
same 1 MB as :data:`zeroplanner.catalog.hfconfig.MAX_CONFIG_BYTES`)."""


class UsageError(Exception):
    """A user error; printed as one line and exit status 2."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option


def fail(option: str, message: str) -> None:
    """Raise the one-line usage error (exit status 2)."""
    raise UsageError(option, message)


class _Parser(argparse.ArgumentParser):
    # argparse takes "-7e9" or "-7B" for an option (its matcher knows only -7 and -.7), so "--params -7e9" said
    # "expected one argument"; with these matched as negative numbers the option's own range message says why
    _NEGATIVE = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[kKmMbBgGtT]?$")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = self._NEGATIVE

    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        self.exit(2, f"zeroplanner: error: {message}\n")


def _positive_int(name: str, low: int = 1, high: int = 10**7, hint: str = ""):
    """argparse type of a count that is not a scenario input (``deepspeed-estimate --params``): the integer grammar
    of every input, :func:`zeroplanner.inputs.parse_integer` (``7B``, ``7e9``, ``500M``)."""
    def parse(text: str) -> int:
        try:
            return parse_integer(text, low, high, hint)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{name} {exc}") from None

    return parse


def _input_type(inp: Input):
    """argparse type of an input: its one grammar, :meth:`zeroplanner.inputs.Input.parse` (the share links' and
    the app's too), its bounds the spec field's, in the input's unit; a bad value is ``--flag <why>``."""
    def parse(text: str) -> Any:
        try:
            return inp.parse(text)
        except InputError as exc:
            raise argparse.ArgumentTypeError(f"{inp.cli_flag} {exc.detail}") from None

    parse.__name__ = inp.key
    return parse


def _input_help(inp: Input) -> str:
    default = inp.default
    text = inp.help
    if inp.kind in ("int", "float") and inp.low is not None:
        text += f"; {inp.range_text}"
    if default is not None and inp.kind != "bool" and inp.kind not in CATALOG_KINDS and "default" not in text:
        text += f" (default {default:g})" if isinstance(default, float) else f" (default {default})"
    return text


def add_scenario_options(p: argparse.ArgumentParser) -> None:
    """The scenario options shared by every scenario command, one per input of :data:`zeroplanner.inputs.INPUTS`
    (defaults: Llama-2-7B, 1 node x 8 A100-80GB), plus ``--hf-config`` and ``--cluster-from`` (files)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for inp in INPUTS:
        if inp.group not in groups:
            groups[inp.group] = p.add_argument_group(inp.group)
            if inp.group == "model (one of)":
                groups[inp.group].add_argument("--hf-config", default=None, metavar="PATH",
                                               help="a Hugging Face config.json")
        g = groups[inp.group]
        if inp.kind == "bool":
            if inp.nullable:
                g.add_argument(inp.cli_flag, dest=inp.key, action=argparse.BooleanOptionalAction, default=None,
                               help=inp.help)
            else:
                g.add_argument(inp.cli_flag, dest=inp.key, action="store_false" if inp.default else "store_true",
                               default=None, help=inp.help)
        elif inp.kind == "choice":
            g.add_argument(inp.cli_flag, dest=inp.key, type=_input_type(inp), choices=inp.choices, default=None,
                           help=_input_help(inp))
        elif inp.kind in CATALOG_KINDS:
            g.add_argument(inp.cli_flag, dest=inp.key, default=None, help=inp.help)
        else:
            g.add_argument(inp.cli_flag, dest=inp.key, type=_input_type(inp), default=None, help=_input_help(inp))
    groups["cluster"].add_argument("--cluster-from", default=None, metavar="PROBE_JSON",
                                   help="cluster from `zeroplanner probe --json`")


def _option(key: str | None, args: argparse.Namespace, hf: Any) -> str:
    """The CLI flag of an input key (a model error names the model source that was given)."""
    if key in (None, "model", "params"):
        return "--hf-config" if hf is not None else "--params" if args.params is not None else "--model"
    return BY_KEY[key].cli_flag


def read_input_file(option: str, path: str, max_bytes: int, *, limit_note: str = "") -> bytes:
    """The bytes of the file ``path`` the user gave to ``option`` (``--hf-config``, ``--cluster-from``, ``CONFIG``,
    ``--config``, ``--accelerate-config``): the one reader of a user path in the CLI. Only a regular file of at most
    ``max_bytes`` bytes is read (:func:`zeroplanner.files.read_regular_file`: a directory, FIFO, device or socket is
    refused before it is opened, so nothing blocks); anything else raises :class:`UsageError`, one line naming the
    option, the path and what it is, e.g. ``--hf-config: 'models/' is a directory, not a regular file`` (exit 2).
    For ``--hf-config``, a directory that holds a ``config.json`` (a hub snapshot) gets the hint to pass that file."""
    try:
        return read_regular_file(path, max_bytes, option, limit_note=limit_note)
    except InputFileError as exc:
        raise _file_usage_error(option, path, exc) from None


def read_input_file_tail(option: str, path: str, max_bytes: int) -> tuple[bytes, int]:
    """:func:`read_input_file` for a file whose end matters (a training log): (its last ``max_bytes`` bytes, how
    many bytes before them were skipped), :func:`zeroplanner.files.read_regular_file_tail`; the same refusals and
    the same one-line :class:`UsageError`."""
    try:
        return read_regular_file_tail(path, max_bytes, option)
    except InputFileError as exc:
        raise _file_usage_error(option, path, exc) from None


def _file_usage_error(option: str, path: str, exc: InputFileError) -> UsageError:
    import os

    hint = ""
    inside = os.path.join(path, "config.json")
    if option == "--hf-config" and exc.problem.startswith("is a directory") and os.path.isfile(inside):
        hint = f"; pass the file inside it: {inside}"
    return UsageError(option, f"{path!r} {exc.problem}{hint}")


MAX_JSON_DEPTH = 20
"""Deepest nesting of a ``--cluster-from`` file, checked before parsing (a probe result nests a few levels; the HF
config.json reader's limit is 20 too)."""


def _read_json_file(option: str, path: str) -> Any:
    """The JSON value in the file ``path`` given to ``option`` (``--cluster-from``; ``--hf-config`` goes through
    :func:`_read_hf_config`), read by
    :func:`read_input_file` (a regular file of at most :data:`MAX_INPUT_FILE_BYTES`); text that is not JSON
    raises :class:`UsageError` naming the option and the path (one line, exit status 2)."""
    from ..files import nesting_over

    raw = read_input_file(option, path, MAX_INPUT_FILE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(option, f"{path!r} is not valid JSON ({exc})")
    # refused before parsing, like the other JSON readers of user text (json.loads recurses once per level)
    if nesting_over(text, MAX_JSON_DEPTH):
        fail(option, f"{path!r} is nested deeper than {MAX_JSON_DEPTH} levels, which no probe result is")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail(option, f"{path!r} is not valid JSON ({exc})")


def _read_hf_config(option: str, path: str) -> dict:
    """An HF config.json given to ``option``: the bytes by :func:`read_input_file` (a regular file only), the
    content by :func:`zeroplanner.catalog.hfconfig.read_hf_config_bytes`, the one config.json reader the planner
    page's upload and paste box use too (its size, nesting and structure limits, its messages); its refusal is one
    :class:`UsageError` line naming the option (exit status 2)."""
    from ..catalog.hfconfig import MAX_CONFIG_BYTES, read_hf_config_bytes

    raw = read_input_file(option, path, MAX_CONFIG_BYTES)
    try:
        return read_hf_config_bytes(raw, path)
    except ValueError as exc:
        fail(option, str(exc))


_LISTING = {"model": "`zeroplanner models` lists all, `--json` with their hub ids",
            "gpu": "`zeroplanner gpus` lists all", "network": "`zeroplanner networks` lists all"}


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """Build the Scenario from parsed scenario options; raises UsageError naming the option."""
    hf = None
    if args.hf_config is not None:
        hf = _read_hf_config("--hf-config", args.hf_config)  # a dict: read_hf_config_bytes refuses anything else
        from ..catalog.hfconfig import name_from_path

        named = hf.get("_name_or_path")
        if not (isinstance(named, str) and named.strip()) and name_from_path(args.hf_config):
            hf = {**hf, "_name_or_path": name_from_path(args.hf_config)}  # the model is named after its file
    for inp in INPUTS:
        value = getattr(args, inp.key, None)
        if inp.kind in CATALOG_KINDS and value is not None:
            # checked by the input's grammar (a catalog name or, for a model, a catalog entry's hub id) but kept as
            # typed: inputs_json's ``given`` shows the hub id the user typed
            try:
                inp.parse(value)
            except InputError as exc:
                fail(inp.cli_flag, f"{exc.detail} ({_LISTING[inp.kind]})")
    values = {inp.key: getattr(args, inp.key, None) for inp in INPUTS}
    values = {k: v for k, v in values.items() if v is not None}
    try:
        scenario = build_scenario(hf_config=hf, **values)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        loc = tuple(err["loc"])
        key = input_for_error(loc, msg, given=values)
        if key is not None or not loc:
            fail(_option(key, args, hf), msg)
        # a field no option sets: one of the model's (an Architecture built from --params / --hf-config, or the
        # scenario's model block) is the model source's fault; any other is named by its place in the scenario,
        # never as an option that does not exist
        field = ".".join(str(part) for part in loc)
        got = f" (got {err['input']!r})" if isinstance(err.get("input"), (int, float, str)) else ""
        if exc.title == "Architecture" or loc[0] == "model":
            fail(_option(None, args, hf), f"the model's {field.removeprefix('model.')}: {msg}{got}")
        fail(f"scenario field {field}", f"{msg}{got}")
    except (ValueError, KeyError) as exc:
        fail(_option(None, args, hf), str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
    if getattr(args, "cluster_from", None):
        data = _read_json_file("--cluster-from", args.cluster_from)
        from ..probe import cluster_changes, cluster_from_probe

        try:
            cluster = cluster_from_probe(data, scenario.cluster)
            _changes, notes = cluster_changes(data, scenario.cluster)
        except (ValueError, TypeError, KeyError) as exc:
            fail("--cluster-from", str(exc))
        for note in notes:  # what the probe changed (and left as given), on stderr so --json stays one object
            sys.stderr.write(f"zeroplanner: --cluster-from: {note}\n")
        scenario = scenario.model_copy(update={"cluster": cluster})
    if scenario.cluster.sequence_parallel_size > 1:  # DeepSpeed's Ulysses rules (world size, heads)
        from ..deepspeed.read import ulysses_problem

        problem = ulysses_problem(scenario, scenario.cluster.sequence_parallel_size)
        if problem is not None:
            fail(BY_KEY["sequence_parallel_size"].cli_flag, problem)
    return scenario


EXIT_FITS = 0
"""Exit status: the configuration fits (``check``: and the config has no error findings)."""
EXIT_DOES_NOT_FIT = 1
"""Exit status: it does not fit GPU memory, host RAM or NVMe (``estimate``, ``config``: the scenario as given;
``recommend``, ``config --recommend``: no candidate fits; ``check``: the config does not fit or has errors)."""
EXIT_BAD_INPUT = 2
"""Exit status: bad input, one line on stderr naming the option or file (:class:`UsageError`)."""

EXIT_STATUSES_HELP = ("exit status: 0 fits, 1 does not fit (check: or the config has errors), 2 bad input "
                      "(one line naming the option)")
"""The epilog every scenario command's --help prints."""


def given_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """Input key -> value of the scenario options given on the command line (an option left out is None in the
    parsed args: every scenario option's argparse default is None, see :func:`add_scenario_options`)."""
    return {i.key: getattr(args, i.key) for i in INPUTS if getattr(args, i.key, None) is not None}


def advice_json(p) -> dict:
    """A plan's assumptions and advice (:class:`zeroplanner.planner.Plan`), under the JSON keys ``recommend`` and
    ``config --recommend`` share."""
    return {"assumptions": p.assumptions,
            "cluster_advice": p.cluster_advice.model_dump() if p.cluster_advice else None,
            "method_advice": [m.model_dump() for m in p.method_advice]}


def advice_text(p) -> str:
    """A plan's assumptions and advice, one line each: what ``recommend`` prints right after its verdict."""
    return "".join(f"{a}\n" for a in p.assumptions) + "".join(f"advice: {a}\n" for a in p.advice)


def model_source(args: argparse.Namespace) -> str:
    """Where the priced model came from: ``--hf-config``, ``--params``, ``--model`` or ``default``."""
    if getattr(args, "hf_config", None):
        return "--hf-config"
    if getattr(args, "params", None) is not None:
        return "--params"
    if getattr(args, "model", None):
        return "--model"
    return "default"


def inputs_json(args: argparse.Namespace, scenario: Scenario) -> dict:
    """The resolved inputs a command used (JSON ``inputs``): ``resolved`` every input of the table read back from
    ``scenario`` in the input's unit (None: not set, e.g. no GPU-memory override), ``given`` the options typed on
    the command line as parsed (a hub id stays as typed; ``resolved.model`` is the catalog name), ``model`` and
    ``parameters`` the model priced and ``model_from`` where it came from, ``cluster_from`` the probe file,
    ``priced_precision`` the precision the run is priced in (fp16 for bf16 on a GPU without bf16:
    :func:`zeroplanner.specs.hardware_precision`)."""
    from ..specs import hardware_precision

    return {
        "resolved": {i.key: i.read(scenario) for i in INPUTS},
        "priced_precision": hardware_precision(scenario),
        "given": given_inputs(args),
        "model": scenario.model.name,
        "parameters": scenario.parameters,
        "model_from": model_source(args),
        "cluster_from": getattr(args, "cluster_from", None),
    }


def _emit(args: argparse.Namespace, obj: dict, text: str) -> None:
    if args.json:
        sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    else:
        sys.stdout.write(text.rstrip() + "\n")


def estimate_json(est) -> dict:
    """The CLI's estimate object (documented contract): see README "JSON output"."""
    d = est.model_dump()
    d["per_gpu_bytes"] = est.per_gpu_bytes.model_dump()
    return d
