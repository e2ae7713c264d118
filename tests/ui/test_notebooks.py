"""Notebooks execute (nbclient, a real kernel), the planner page is the thin notebook the app serves, and the
serving settings (Voilà argv, binder's kernel culling) agree with each other."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from zeroplanner.cli import app as cli_app  # noqa: E402
from zeroplanner.server import (  # noqa: E402
    CULL_SETTINGS,
    PLANNER_NOTEBOOK_CELLS,
    SHARE_DIR,
    TEMPLATE,
    repo_notebook,
    voila_argv,
    voila_env,
)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path):
    nb = nbformat.read(str(path), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    if path.name == "planner.ipynb":
        last = nb.cells[-1]["outputs"]
        assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in last), \
            "the planner cell must display the PlannerApp widget"


def test_planner_notebook_is_thin_and_matches_the_packaged_copy():
    path = repo_notebook()
    assert path == ROOT / "notebooks" / "planner.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    cells = tuple((c.cell_type, c.source) for c in nb.cells)
    assert cells == PLANNER_NOTEBOOK_CELLS
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert code == ["from zeroplanner.ui import PlannerApp\n\nPlannerApp()"]


def test_fallback_notebook_is_written_when_the_repository_copy_is_absent(monkeypatch, tmp_path):
    monkeypatch.setattr(cli_app, "repo_notebook", lambda: tmp_path / "missing.ipynb")
    path = cli_app.notebook_path()
    nb = nbformat.read(str(path), as_version=4)
    assert tuple((c.cell_type, c.source) for c in nb.cells) == PLANNER_NOTEBOOK_CELLS


def test_voila_argv_binds_loopback_and_culls_idle_kernels():
    argv = voila_argv("nb.ipynb", port=9999)
    assert argv[0] == "nb.ipynb" and "--port=9999" in argv and "--no-browser" in argv
    assert "--Voila.ip=127.0.0.1" in argv and "--Voila.port_retries=0" in argv
    assert f"--VoilaConfiguration.template={TEMPLATE}" in argv
    assert "--VoilaConfiguration.show_tracebacks=False" in argv
    assert "--MappingKernelManager.cull_idle_timeout=600" in argv
    assert "--VoilaConfiguration.preheat_kernel=True" in argv
    assert "--no-browser" not in voila_argv("nb.ipynb", open_browser=True)
    with pytest.raises(ValueError, match="port"):
        voila_argv("nb.ipynb", port=70000)


def test_template_is_on_the_jupyter_path():
    env = voila_env({"JUPYTER_PATH": "/elsewhere"})
    assert env["JUPYTER_PATH"].split(":")[:2] == [str(SHARE_DIR), "/elsewhere"]
    template = SHARE_DIR / "voila" / "templates" / TEMPLATE
    assert json.loads((template / "conf.json").read_text())["base_template"] == "lab"
    assert "cdn.jsdelivr.net" in (template / "index.html.j2").read_text()  # the links it strips, named exactly


def test_binder_culls_idle_kernels_like_the_local_app():
    config = json.loads((ROOT / "binder" / "jupyter_config.json").read_text())
    assert config["MappingKernelManager"] == CULL_SETTINGS["MappingKernelManager"]
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    reqs = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    app_pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["app"]
    assert len(app_pins) == 5 and all("==" in pin for pin in app_pins)
    for pin in app_pins:  # binder serves the same tested set as `pip install -e ".[app]"`
        assert pin in reqs, pin
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "pip install --no-deps -e ." in post and "jupyter_config.json" in post


def _app_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroplanner")
    cli_app.register(parser.add_subparsers(dest="command"), None)
    return parser


def test_app_command_options():
    args = _app_parser().parse_args(["app", "--port", "8900", "--no-browser"])
    assert args.port == 8900 and args.no_browser and args.func is cli_app.run_app
    assert _app_parser().parse_args(["app"]).port == 8866


@pytest.mark.parametrize("bad", ["0", "70000", "http"])
def test_app_rejects_bad_port_with_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        _app_parser().parse_args(["app", "--port", bad])
    assert exc.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_app_is_registered_in_the_cli():
    from zeroplanner import cli

    assert cli_app in cli.COMMANDS
    assert cli.build_parser().parse_args(["app", "--no-browser"]).func is cli_app.run_app


def test_app_on_a_busy_port_is_a_one_line_error(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = _app_parser().parse_args(["app", "--port", str(port), "--no-browser"])
        assert cli_app.run_app(args) == 2
    err = capsys.readouterr().err
    assert f"--port {port}: already in use" in err and "Traceback" not in err


def test_app_page_option_serves_the_tutorial():
    """`zeroplanner app --page tutorial` serves notebooks/zero_tutorial.ipynb (workshops, issue 7)."""
    from zeroplanner.cli.app import page_path

    assert page_path("tutorial").name == "zero_tutorial.ipynb" and page_path("tutorial").is_file()
    assert page_path("planner").name == "planner.ipynb"
