"""Property-based fuzzing of the public entry points (issue 8): scenario construction, estimate/plan outputs and
the CLI. Fixed seed (derandomize) and bounded example counts so CI is deterministic; a failing example found once
becomes a plain regression test at the bottom of this file.

Config import/lint and the URL query parser have their own hypothesis suites (tests/core/test_lint.py,
tests/core/test_share.py).
"""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from zeroplanner import build_scenario, catalog, estimate, plan
from zeroplanner.cli import main

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

valid_kwargs = st.fixed_dictionaries({
    "model": st.sampled_from(catalog.model_names()),
    "gpu": st.sampled_from(catalog.gpu_names()),
    "network": st.sampled_from(catalog.network_names()),
    "gpus_per_node": st.sampled_from([1, 2, 4, 8]),
    "nodes": st.integers(1, 64),
    "stage": st.integers(0, 3),
    "precision": st.sampled_from(["bf16", "fp16", "fp32"]),
    "optimizer": st.sampled_from(["adamw", "adam", "sgd", "adam8bit"]),
    "micro_batch": st.integers(1, 16),
    "grad_accum": st.integers(1, 16),
    "seq_len": st.sampled_from([128, 512, 2048, 8192, 32768]),
    "checkpointing": st.sampled_from(["none", "selective", "full"]),
    "flash_attention": st.booleans(),
    "cpu_memory_gib": st.floats(16, 4096),
})


SIGNED = ("headroom_bytes", "headroom_fraction")
"""Fields that are negative when the step's peak exceeds GPU memory (the estimate of a setup that does not fit)."""


def _finite_non_negative(obj, path="estimate"):
    if isinstance(obj, dict):
        for k, v in obj.items():
            _finite_non_negative(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _finite_non_negative(v, f"{path}[{i}]")
    elif isinstance(obj, float):
        assert math.isfinite(obj), path
        assert obj >= 0 or path.endswith(SIGNED), path
    elif isinstance(obj, int) and not isinstance(obj, bool):
        assert obj >= 0 or path.endswith(SIGNED), path


@FUZZ
@given(kw=valid_kwargs, offload=st.sampled_from([("none", "none"), ("cpu", "none"), ("cpu", "cpu"), ("nvme", "nvme")]))
def test_valid_scenarios_give_finite_non_negative_numbers(kw, offload):
    if kw["stage"] == 0:
        offload = ("none", "none")
    elif kw["stage"] < 3:
        offload = (offload[0], "none")
    s = build_scenario(**kw, offload_optimizer=offload[0], offload_param=offload[1])
    e = estimate(s)
    _finite_non_negative(e.model_dump())
    assert e.step_seconds > 0 and e.tokens_per_second > 0
    p = plan(s)
    _finite_non_negative(p.estimate.model_dump())
    if p.fits:
        assert p.estimate.fits


bad_values = st.one_of(
    st.fixed_dictionaries({"micro_batch": st.integers(max_value=0)}),
    st.fixed_dictionaries({"grad_accum": st.integers(min_value=70_000)}),
    st.fixed_dictionaries({"seq_len": st.integers(max_value=0)}),
    st.fixed_dictionaries({"nodes": st.integers(max_value=0)}),
    st.fixed_dictionaries({"gpus_per_node": st.integers(min_value=65)}),
    st.fixed_dictionaries({"stage": st.integers(min_value=4) | st.integers(max_value=-1)}),
    st.fixed_dictionaries({"precision": st.text(min_size=1, max_size=8).filter(lambda x: x not in ("bf16", "fp16", "fp32"))}),
    st.fixed_dictionaries({"mfu": st.floats(min_value=1.01, max_value=1e9) | st.floats(max_value=0)}),
)


@FUZZ
@given(bad=bad_values)
def test_invalid_values_raise_validation_error_naming_the_field(bad):
    (field, _), = bad.items()
    with pytest.raises(ValidationError) as info:
        build_scenario(**bad)
    text = str(info.value)
    assert field in text


argv_options = st.lists(st.sampled_from([
    "--stage", "--nodes", "--micro-batch", "--grad-accum", "--seq-len", "--gpu", "--network", "--model",
    "--precision", "--offload-optimizer", "--offload-param", "--checkpointing", "--lora-rank", "--qlora",
    "--mfu", "--params", "--gpu-memory-gib", "--inter-node-gbps", "--cpu-memory-gib",
]), max_size=4)
argv_values = st.one_of(st.integers(-5, 100_000).map(str), st.sampled_from(
    ["bf16", "cpu", "nvme", "none", "full", "1e9", "nan", "inf", "-1", "A100-80GB", "eth-25g", "llama-2-7b", "",
     "0.5", "1e400", "x" * 300, "__import__('os')", "$(reboot)"]))


@FUZZ
@given(opts=argv_options, values=st.lists(argv_values, min_size=4, max_size=4),
       command=st.sampled_from(["estimate", "recommend"]))
@example(opts=["--mfu"], values=["nan", "", "", ""], command="estimate")
@example(opts=["--params"], values=["1e400", "", "", ""], command="estimate")
def test_cli_never_tracebacks(opts, values, command):
    argv = [command]
    for opt, val in zip(opts, values):
        argv += [opt] if opt == "--qlora" else [opt, val]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(argv + ["--json"])
        except SystemExit as exc:  # argparse's own errors
            rc = exc.code
    assert rc in (0, 1, 2), (argv, err.getvalue())
    if rc == 1:  # does not fit: still one JSON object that says so
        assert json.loads(out.getvalue())["fits"] is False
    if rc == 2:
        assert len(err.getvalue().strip().splitlines()) == 1
        assert "Traceback" not in err.getvalue()


# ---- regression tests from examples hypothesis found ------------------------------------------------------
def test_regression_mfu_nan_is_refused():
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as info:
        main(["estimate", "--mfu", "nan"])
    assert info.value.code == 2 and "--mfu" in err.getvalue()


def test_regression_huge_exponent_is_refused():
    """hypothesis found: --params 1e400 overflowed int(float(...)) into a traceback."""
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as info:
        main(["estimate", "--params", "1e400"])
    assert info.value.code == 2 and "--params" in err.getvalue()
