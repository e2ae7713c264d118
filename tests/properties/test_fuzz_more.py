"""Property-based tests that complete issue 8's item 3 beside tests/properties/test_fuzz.py (scenarios, estimate/plan, CLI),
tests/core/test_lint.py (lint over JSON-shaped garbage) and tests/core/test_share.py (arbitrary query text):

* config import as TEXT (what a user pastes or a file holds): arbitrary text and bytes, oversized text, deep
  nesting -> only :class:`zeroplanner.deepspeed.ConfigError`, one line, naming the limit; generated valid configs
  round-trip and price to finite, non-negative numbers;
* the URL query parser per key: a hostile value for a known key is refused naming THAT key by the strict reading,
  and left out and named by a link (the rest applied); generated valid queries give finite, non-negative estimates;
* the app (widget level, no browser): a 10 MB paste, deeply nested JSON and hostile query strings are refused (or,
  one key of a link, left out) with a message and the app keeps working (a later control change recomputes the config); arbitrary control values never
  raise out of the app.

Fixed seed (``derandomize=True``) and bounded example counts, as in tests/properties/test_fuzz.py.
"""

from __future__ import annotations

import html
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from zeroplanner import build_scenario, estimate
from zeroplanner.specs import hardware_precision
from zeroplanner.deepspeed import (
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    ConfigError,
    from_deepspeed_config,
    load_config_text,
    to_deepspeed_config,
)
from zeroplanner.deepspeed.lint import lint
from zeroplanner.share import KEYS, MAX_QUERY_CHARS, ShareError, read_link, scenario_from_query
from tests.properties.test_fuzz import _finite_non_negative, valid_kwargs

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
TEN_MB = 10_000_000


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text
    return text


# ---- config import as text ---------------------------------------------------------------------------------
@FUZZ
@given(text=st.one_of(st.text(max_size=400), st.binary(max_size=400).map(bytes),
                      st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                                   lambda inner: st.lists(inner, max_size=3)
                                   | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                                   max_leaves=12).map(json.dumps)))
def test_any_text_is_read_or_refused_with_config_error(text):
    try:
        config, findings = load_config_text(text)
    except ConfigError as exc:
        _one_line(exc)
        return
    assert isinstance(config, dict)
    try:
        scenario, more = from_deepspeed_config(text)
    except ConfigError as exc:
        _one_line(exc)
        return
    except ValidationError as exc:  # a value the specs refuse: pydantic names the field
        assert exc.errors() and all(err["loc"] for err in exc.errors())
        return
    assert all(f.severity in ("error", "warning", "info") for f in [*findings, *more, *lint(config, scenario)])
    _finite_non_negative(estimate(scenario).model_dump())


@FUZZ
@given(depth=st.integers(MAX_DEPTH + 1, 20_000), opener=st.sampled_from(["[", '{"a":']))
def test_deep_nesting_is_refused_before_parsing(depth, opener):
    closer = "]" if opener == "[" else "}"
    text = '{"x":' + opener * depth + "1" + closer * depth + "}"
    with pytest.raises(ConfigError, match=f"deeper than {MAX_DEPTH} levels"):
        load_config_text(text)
    with pytest.raises(ConfigError, match=f"deeper than {MAX_DEPTH} levels"):
        from_deepspeed_config(text)


def test_nesting_at_the_limit_is_read():
    text = '{"x":' + "[" * (MAX_DEPTH - 1) + "1" + "]" * (MAX_DEPTH - 1) + "}"
    config, _ = load_config_text(text)
    assert "x" in config


def test_deep_dict_is_refused_and_lint_survives_it():
    """A dict built in Python (not text) nested far past the limit: from_deepspeed_config refuses it by depth and
    lint neither recurses into a RecursionError nor raises."""
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["zero_optimization"] = {}
        node = node["zero_optimization"]
    with pytest.raises(ConfigError, match="deeper"):
        from_deepspeed_config(deep)
    findings = lint(deep)
    assert all(f.severity in ("error", "warning", "info") for f in findings)


@pytest.mark.parametrize("size", [MAX_CONFIG_BYTES + 1, TEN_MB])
def test_oversized_text_is_refused_naming_the_limit(size):
    head, tail = '{"train_batch_size": 8, "pad": "', '"}'
    text = head + "x" * (size - len(head) - len(tail)) + tail
    assert len(text.encode()) == size
    for given_text in (text, text.encode()):
        with pytest.raises(ConfigError, match=f"limit.*{MAX_CONFIG_BYTES}|{MAX_CONFIG_BYTES}.*limit") as info:
            load_config_text(given_text)
        _one_line(info.value)


def test_multibyte_text_is_measured_in_bytes():
    """Under the limit in characters, over it in UTF-8 bytes (2 bytes per character)."""
    text = '{"pad": "' + "\u00e9" * (MAX_CONFIG_BYTES // 2 + 10) + '"}'
    assert len(text) < MAX_CONFIG_BYTES
    with pytest.raises(ConfigError, match="limit"):
        load_config_text(text)


@FUZZ
@given(kw=valid_kwargs, mode=st.sampled_from(["deepspeed", "hf_trainer"]))
def test_generated_configs_read_back_to_their_scenario(kw, mode):
    """Valid input never fails: the config written for a valid scenario reads back to it (the documented round
    trip) and prices to finite, non-negative numbers."""
    s = build_scenario(**kw)
    text = json.dumps(to_deepspeed_config(s, mode=mode), indent=2)
    back, findings = from_deepspeed_config(text, base=s, mode=mode)
    if mode == "deepspeed":
        # the config carries the precision the GPU runs (fp16 for bf16 on a V100: hardware_precision)
        assert back == s.model_copy(update={"training": s.training.model_copy(
            update={"precision": hardware_precision(s)})})
    assert not [f for f in findings if f.severity == "error"]
    _finite_non_negative(estimate(back).model_dump())


# ---- query strings, key by key -----------------------------------------------------------------------------
hostile_values = st.one_of(
    st.sampled_from(["", "nan", "inf", "-inf", "1e400", "-1", "0x10", "__import__('os').system('id')", "$(reboot)",
                     "`id`", "<script>alert(1)</script>", "../../etc/passwd", "%00", "%0A", "true;false", "None",
                     "{}", "[]", "9" * 80, "1_000", "\u202e", "ｌｌａｍａ"]),
    st.text(min_size=1, max_size=40),
)


@FUZZ
@given(key=st.sampled_from(sorted(KEYS)), value=hostile_values)
def test_a_bad_value_for_a_known_key_is_refused_naming_that_key(key, value):
    from urllib.parse import quote

    query = f"{key}={quote(value, safe='')}"
    try:
        s = scenario_from_query(query, strict=True)
    except ShareError as exc:
        assert exc.key in (key, "query") or key in str(exc), (query, str(exc))
        assert len(str(exc)) < 1200
        try:  # a link leaves that key out and names it (or refuses the query as a whole, as strictly)
            link = read_link(query)
        except ShareError as whole:
            assert whole.key == "query" == exc.key
            return
        assert [i.key for i in link.ignored] == [key] and len(link.note) < 1200, (query, link.ignored)
        assert link.scenario == build_scenario()
        return
    _finite_non_negative(estimate(s).model_dump())  # the value happened to be valid
    assert read_link(query) == (s, ())


@FUZZ
@given(name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True).filter(
    lambda k: k not in KEYS and k not in ("template", "theme")))
def test_unknown_keys_are_refused_by_name(name):
    with pytest.raises(ShareError) as info:
        scenario_from_query(f"{name}=1", strict=True)
    assert info.value.key == name[:80] or name[:40] in str(info.value)
    link = read_link(f"{name}=1&nodes=2")  # a link: never used, named, the rest applied
    assert link.scenario == build_scenario(nodes=2) and [i.key for i in link.ignored] == [name]


@FUZZ
@given(kw=valid_kwargs)
def test_valid_queries_give_finite_estimates(kw):
    from zeroplanner.share import scenario_to_query

    s = build_scenario(**kw)
    query = scenario_to_query(s, strict=False)
    assert len(query) <= MAX_QUERY_CHARS
    back = scenario_from_query(query)
    e = estimate(back)
    _finite_non_negative(e.model_dump())
    assert math.isfinite(e.step_seconds) and e.step_seconds > 0


# ---- the app, widget level (no browser) --------------------------------------------------------------------
ipywidgets = pytest.importorskip("ipywidgets")
pytest.importorskip("bqplot")


@pytest.fixture(scope="module")
def app():
    from zeroplanner.ui import PlannerApp
    from zeroplanner.ui.state import default_state

    return PlannerApp(state=default_state(), debounce_seconds=0)


def _still_works(app) -> None:
    """A control change after the refusal recomputes: the config preview shows the new node count's batch."""
    before = app.config_area.value
    nodes = 3 if app.state.scenario.cluster.nodes != 3 else 5
    app.set(nodes=nodes)
    assert app.state.scenario.cluster.nodes == nodes
    assert app.config_area.value != before
    micro, accum = app.view.plan.choice.micro_batch, app.view.plan.choice.grad_accum
    gpus = app.state.scenario.cluster.gpus_per_node * nodes
    assert f'"train_batch_size": {micro * accum * gpus},' in app.config_area.value  # DeepSpeed's batch rule


def test_app_refuses_a_10_mb_paste_and_keeps_working(app):
    state = app.state
    text = '{"train_batch_size": 8, "pad": "' + "x" * TEN_MB + '"}'
    assert app.load_config(text) == []
    assert "Cannot read this config" in app.paste_findings.value and str(MAX_CONFIG_BYTES) in app.paste_findings.value
    assert app.state == state
    _still_works(app)


def test_app_refuses_deeply_nested_json_and_keeps_working(app):
    state = app.state
    assert app.load_config('{"zero_optimization":' + "[" * 100_000 + "]" * 100_000 + "}") == []
    assert f"deeper than {MAX_DEPTH} levels" in app.paste_findings.value
    assert app.state == state
    _still_works(app)


@pytest.mark.parametrize("query,key", [
    ("nodes=-1", "nodes"),
    ("evil=1", "evil"),
    ("model=__import__('os').system('id')", "model"),
    ("gpu=<script>alert(1)</script>", "gpu"),
    ("a" * (MAX_QUERY_CHARS + 1), "query"),
])
def test_app_opened_with_a_hostile_query_shows_why_and_opens_the_default(monkeypatch, query, key):
    from zeroplanner.ui import PlannerApp
    from zeroplanner.ui.state import default_state

    monkeypatch.setenv("QUERY_STRING", query)
    monkeypatch.delenv("VOILA_PREHEAT", raising=False)
    app = PlannerApp(debounce_seconds=0)
    shown = html.unescape(app.message.value)
    # the one key left out and named (the rest of the link, here nothing, applied), or the whole query refused
    said = "The link's scenario was not used" if key == "query" else f"Not used from the link: {key}"
    assert said in shown and key in shown
    assert "<script>" not in app.message.value  # escaped, not injected
    assert app.state == default_state()
    _still_works(app)


control_values = st.fixed_dictionaries({}, optional={
    "nodes": st.integers(-10, 10_000) | st.text(max_size=5),
    "gpus_per_node": st.integers(-2, 100),
    "micro_batch": st.integers(-2, 100_000),
    "seq_len": st.integers(-5, 10**7),
    "network": st.sampled_from(["ib-hdr", "eth-25g", "nope", ""]),
    "model": st.sampled_from(["llama-2-7b", "llama-2-70b", "(custom size)", "gpt-5"]),
    "mfu": st.floats(allow_nan=True, allow_infinity=True),
})


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                                   HealthCheck.function_scoped_fixture])
@given(changes=control_values)
def test_arbitrary_control_values_never_raise_out_of_the_app(app, changes):
    """Whatever the controls send: either a new valid view with finite, non-negative numbers, or a message that the
    setup is not valid (the charts keep the last valid setup)."""
    try:
        app.set(**changes)
    except Exception as exc:  # pragma: no cover - the property under test
        pytest.fail(f"app.set({changes!r}) raised {type(exc).__name__}: {exc}")
    if app.message.value:
        assert "Not a valid setup" in app.message.value, app.message.value  # never "Internal error"
    _finite_non_negative(app.view.plan.estimate.model_dump())
    from zeroplanner.ui.state import default_state

    d = default_state()
    reset = {"nodes": d.scenario.cluster.nodes, "gpus_per_node": d.scenario.cluster.gpus_per_node,
             "micro_batch": d.scenario.training.micro_batch, "seq_len": d.scenario.training.seq_len,
             "network": d.network_name, "model": d.model_name, "mfu": d.scenario.assumptions.mfu}
    app.set(**{k: v for k, v in reset.items() if k in changes})
    assert not app.message.value, app.message.value
