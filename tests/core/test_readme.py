"""README.md is what a newcomer runs: every command it shows runs (or, for installs and the app, names things that
exist and parses), every output it quotes is what the command prints today, and the reference pages it links to
are current (docs/cli.md is what ``python3 -m zeroplanner.cli.reference`` prints; docs/json.md names keys the
commands really print).

Also the README's shape (issue 34): under 200 lines, a runnable command and its real output in its first 60 lines.
``python3 -m tests.core.test_readme`` rewrites the quoted outputs of README.md and docs/guide.md's ``$`` blocks
from the commands themselves (after a change that moves a number, then read the diff).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(text: str, kind: str) -> list[str]:
    """The bodies of the fenced blocks of one kind (``console``, ``bash``, ``python``)."""
    return [m.group(2) for m in FENCE.finditer(text) if m.group(1) == kind]


def console_runs(body: str) -> list[tuple[list[str], list[str]]]:
    """(argv after ``zeroplanner``, quoted output lines) per ``$ zeroplanner`` line of a console block."""
    runs: list[tuple[list[str], list[str]]] = []
    for line in body.rstrip("\n").splitlines():
        if line.startswith("$ "):
            argv = shlex.split(line[2:])
            assert argv[0] == "zeroplanner", line
            runs.append((argv[1:], []))
        else:
            runs[-1][1].append(line)
    return runs


def run_cli(argv: list[str]) -> tuple[int, list[str], str]:
    """The command in this process: (exit status, stdout lines, stderr)."""
    from zeroplanner.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse
            status = exc.code
    return int(status or 0), out.getvalue().splitlines(), err.getvalue()


def readme() -> str:
    return README.read_text(encoding="utf-8")


# -- shape ------------------------------------------------------------------------------------------------------
def test_readme_is_short_and_starts_with_a_real_run():
    lines = readme().splitlines()
    assert len(lines) < 200, len(lines)
    head = "\n".join(lines[:60])
    first = blocks(head + "\n```\n", "console")
    assert first, "no console block in the first 60 lines"
    argv, quoted = console_runs(first[0])[0]
    assert argv[0] == "recommend" and len(quoted) >= 5
    end = next(i for i, ln in enumerate(lines) if ln.startswith("$ zeroplanner recommend"))
    assert end + len(quoted) < 60, "the quoted output runs past line 60"


# -- every command shown runs and prints what is quoted ----------------------------------------------------------
def _all_console_runs(text: str) -> list[tuple[list[str], list[str]]]:
    return [run for body in blocks(text, "console") for run in console_runs(body)]


@pytest.mark.parametrize("doc", ["README.md", "docs/guide.md"])
def test_quoted_output_is_the_real_output(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `config -o ds_config.json` writes here, `check ds_config.json` reads it
    runs = _all_console_runs((ROOT / doc).read_text(encoding="utf-8"))
    assert len(runs) >= 2
    # `check` hands the config to DeepSpeed's own config class and quotes what it says (the `deepspeed` extra);
    # without DeepSpeed installed those runs print otherwise, so they are left out and the test says so
    library = importlib.util.find_spec("deepspeed") is not None
    left_out = []
    for argv, quoted in runs:
        if argv[0] == "check" and "--no-library-check" not in argv and not library:
            left_out.append(" ".join(argv))
            continue
        status, printed, err = run_cli(argv)
        assert status in (0, 1), (argv, err)  # README: 0 fits, 1 does not fit / has findings; never bad input
        assert printed == quoted, (argv, printed)
    if left_out:
        pytest.skip(f"DeepSpeed is not installed (pip install -e '.[deepspeed]'): not run: {left_out}")


def test_shell_commands_name_things_that_exist():
    """Each ``bash`` line: zeroplanner commands parse with the real parser, pip extras are declared in pyproject,
    files named exist, and the test command is the one `.ci/run` runs."""
    from zeroplanner.cli import build_parser

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    ci_last = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip()][-1].strip()
    seen = set()
    for body in blocks(readme(), "bash"):
        for line in body.splitlines():
            for part in (p.strip() for p in line.split("&&")):
                words = shlex.split(part)
                if words[:1] == ["zeroplanner"]:
                    build_parser().parse_args(words[1:])  # argparse exits 2 on anything it does not know
                    seen.add("zeroplanner")
                elif words[:2] == ["pip", "install"]:
                    for extra in re.findall(r"\[([\w,-]+)\]", part):
                        assert set(extra.split(",")) <= extras, part
                    seen.add("pip")
                elif words[:1] == ["bash"]:
                    assert (ROOT / words[1]).is_file(), part
                elif words[:2] == ["jupyter", "lab"]:
                    assert (ROOT / words[2]).is_file(), part
                    assert "jupyterlab" in " ".join(
                        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
                        ["notebook"]), "the notebook extra must bring JupyterLab"
                elif words[:3] == ["python3", "-m", "pytest"]:
                    assert part == ci_last, (part, ci_last)  # CI runs README's exact test command
                    seen.add("pytest")
    assert seen == {"zeroplanner", "pip", "pytest"}


def test_python_example_prints_what_it_says(capsys):
    """The Python API block runs; the ``# `` comment lines after its code are what it prints."""
    (body,) = blocks(readme(), "python")
    code = [ln for ln in body.splitlines() if not ln.startswith("# ")]
    said = [ln[2:] for ln in body.splitlines() if ln.startswith("# ")]
    exec(compile("\n".join(code), "README.md", "exec"), {})  # the project's own example, not user input
    assert capsys.readouterr().out.splitlines() == said


def test_links_resolve():
    for doc in (README, *sorted((ROOT / "docs").glob("*.md"))):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if "://" not in target:
                assert (doc.parent / target).exists(), (doc.name, target)


# -- the reference pages ---------------------------------------------------------------------------------------
def test_cli_reference_is_generated():
    from zeroplanner.cli.reference import markdown

    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == markdown(), \
        "docs/cli.md is stale: python3 -m zeroplanner.cli.reference > docs/cli.md"


def test_cli_reference_lists_every_option():
    """Every option of every subcommand's parser appears in docs/cli.md."""
    import argparse

    from zeroplanner.cli import build_parser

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert f"## `zeroplanner {name}`" in text
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and action.help is not argparse.SUPPRESS:
                    assert f"`{flag}" in text, (name, flag)


def _json_bullet(command: str) -> set[str]:
    text = (ROOT / "docs" / "json.md").read_text(encoding="utf-8")
    bullet = text.split(f"- `{command}`:", 1)[1].split("\n- `", 1)[0].split("\n\n", 1)[0]
    return set(re.findall(r"`([a-z_]+)`", bullet))


def _keys(obj) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


@pytest.mark.parametrize("command, argv", [
    ("estimate", ["estimate", "--json"]),
    ("recommend", ["recommend", "--json"]),
    ("deepspeed-estimate", ["deepspeed-estimate", "--params", "7e9", "--largest-layer-params", "3e7", "--json"]),
])
def test_json_contract_names_real_keys(command, argv):
    status, printed, err = run_cli(argv)
    assert status in (0, 1), err
    keys = _keys(json.loads("\n".join(printed)))
    named = _json_bullet(command)
    assert len(named) >= 5
    assert named <= keys, named - keys


def _rewrite(doc: Path) -> None:  # pragma: no cover - maintenance entry point
    import os
    import tempfile

    text = doc.read_text(encoding="utf-8")
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            for body in blocks(text, "console"):
                new = []
                for argv, _ in console_runs(body):
                    _, printed, _ = run_cli(argv)
                    new += ["$ " + shlex.join(["zeroplanner", *argv]), *printed]
                text = text.replace(body, "\n".join(new) + "\n", 1)
        finally:
            os.chdir(cwd)
    doc.write_text(text, encoding="utf-8")


if __name__ == "__main__":  # pragma: no cover
    for name in sys.argv[1:] or ["README.md"]:
        _rewrite(ROOT / name)
