"""Layers: no module imports upward (issue 30, item 7). The core never imports the app or the CLI, the planner never
imports the CLI, the cost model never imports the planner.

Read statically from the ``ast`` of every module of ``zeroplanner/``: every ``import`` and ``from ... import``,
at module level, inside functions, under ``if TYPE_CHECKING:`` alike, and ``importlib.import_module("...")`` with a
constant name. ``tests/core/test_core_purity.py`` checks the other half at run time (importing the core and planning
loads no ipywidgets, bqplot or torch); this test also sees the imports a function makes only when it runs.

:data:`LAYERS` is the declared order, lowest first. A module may import modules of its own layer and of layers below
(a cycle inside one layer, ``specs`` <-> ``costmodel``, is allowed); importing a layer above is an upward import.
Every module must be in a layer: a new top-level module fails :func:`test_every_module_has_a_layer` until it is
declared here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "zeroplanner"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("units", "files", "specs", "catalog", "costmodel", "pitfalls", "scenarios", "inputs",
              "_measurements")),
    ("deepspeed", ("deepspeed",)),
    ("planner", ("planner", "advice", "explain")),  # zeroplanner/planner.py or the package zeroplanner/planner/
    ("services", ("share", "report", "runlog", "diagnose", "probe", "calibrate")),
    ("app", ("ui", "server", "pagejs")),
    ("cli", ("cli", "__main__")),  # "__main__": every `python -m zeroplanner.x` entry point is a command line
)
"""Layers, lowest first: (name, top-level modules or packages of ``zeroplanner``). The root package
(``zeroplanner/__init__.py``, the public API) sits above them all, and importing it from anywhere is allowed (``from
.. import __version__``: Python runs it before any submodule anyway)."""

APP_LIBRARIES = ("ipywidgets", "bqplot", "bqscales", "voila", "jupyter_server", "tornado", "websockets")
"""Libraries of the app layer: no module below it imports them."""

ALLOWED = {
    ("zeroplanner.share", "voila.utils"): "share.wait_for_voila_request waits for Voila's request info in a "
                                          "pre-heated kernel; imported only there, only under Voila",
}
"""(module, import) pairs below the app layer that are allowed anyway, each with its reason."""

RANK = {name: rank for rank, (name, _) in enumerate(LAYERS)}
TOP = len(LAYERS)  # the root package


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """The layer of a module name (``zeroplanner.costmodel.memory`` -> ``core``); None for one not declared, and
    ``"zeroplanner"`` for the root package."""
    parts = module.split(".")
    if parts == ["zeroplanner"]:
        return "zeroplanner"
    if parts[-1] == "__main__":
        return "cli"
    for name, members in LAYERS:
        if parts[1] in members:
            return name
    return None


def rank_of(module: str) -> int | None:
    layer = layer_of(module)
    return TOP if layer == "zeroplanner" else RANK.get(layer) if layer else None


def imports(path: Path, root: Path) -> list[tuple[str, int]]:
    """(imported module, line) of every import in the file: absolute names, relative ones resolved (``from ..cli
    import x`` in ``zeroplanner/planner/rank.py`` -> ``zeroplanner.cli``), ``from pkg import name`` as
    ``pkg.name`` when ``name`` is a module of ours (else ``pkg``)."""
    module = module_name(path, root)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for alias in node.names:
                sub = f"{name}.{alias.name}"
                ours = sub.startswith("zeroplanner.")
                is_module = ours and _exists(sub, root)
                out.append((sub if is_module else name, node.lineno))
        elif isinstance(node, ast.Call) and _is_import_call(node) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            out.append((node.args[0].value, node.lineno))
    return out


def _is_import_call(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (isinstance(f, ast.Name) and
                                                                             f.id in ("import_module", "__import__"))


def _exists(module: str, root: Path) -> bool:
    rel = Path(*module.split(".")[1:])
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def upward_imports(root: Path = ROOT) -> list[str]:
    """Every import of a module above its importer's layer, and every app library imported below the app
    layer, as ``file:line: importer (layer) imports target (layer)``."""
    problems = []
    app = RANK["app"]
    for path in modules(root):
        importer = module_name(path, root)
        mine = rank_of(importer)
        if mine is None:
            continue  # test_every_module_has_a_layer names it
        for target, line in imports(path, root):
            where = f"{path.relative_to(root.parent)}:{line}: {importer} ({layer_of(importer)})"
            top = target.split(".")[0]
            if top == "zeroplanner":
                theirs = rank_of(target)
                if theirs is not None and theirs > mine and theirs != TOP:
                    problems.append(f"{where} imports {target} ({layer_of(target)})")
            elif top in APP_LIBRARIES and mine < app and (importer, target) not in ALLOWED:
                problems.append(f"{where} imports {target} (an app library)")
    return problems


def test_no_module_imports_upward():
    problems = upward_imports()
    assert not problems, "upward imports (tests/core/test_layers.py LAYERS):\n" + "\n".join(problems)


def test_every_module_has_a_layer():
    missing = sorted({module_name(p, ROOT) for p in modules() if rank_of(module_name(p, ROOT)) is None})
    assert not missing, f"declare these modules' layer in tests/core/test_layers.py LAYERS: {missing}"


def test_the_planner_is_a_layer_whether_a_module_or_a_package():
    assert layer_of("zeroplanner.planner") == layer_of("zeroplanner.planner.rank") == "planner"
    assert RANK["core"] < RANK["planner"] < RANK["cli"] and RANK["core"] < RANK["app"]


# -- the checker itself: an upward import in a copy of the tree fails it -----------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "zeroplanner"
    for rel, text in {"__init__.py": "", "costmodel/__init__.py": "", "planner/__init__.py": "",
                      "cli/__init__.py": "", "ui/__init__.py": "", "inputs.py": "", "planner.py": "",
                      **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(("file", "text", "words"), [
    # the three directions of the issue: core -> app, planner -> CLI, cost model -> planner
    ("inputs.py", "def f():\n    from .ui import app\n", "zeroplanner.inputs (core) imports zeroplanner.ui (app)"),
    ("costmodel/memory.py", "import ipywidgets\n", "imports ipywidgets (an app library)"),
    ("deepspeed/emit.py", "def f():\n    import bqplot\n", "imports bqplot (an app library)"),
    ("planner/rank.py", "def f():\n    from ..cli import main\n",
     "zeroplanner.planner.rank (planner) imports zeroplanner.cli (cli)"),
    ("planner.py", "from zeroplanner.cli.common import fail\n",
     "zeroplanner.planner (planner) imports zeroplanner.cli.common (cli)"),
    ("costmodel/evaluate.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..planner import Plan\n",
     "zeroplanner.costmodel.evaluate (core) imports zeroplanner.planner (planner)"),
    ("costmodel/terms.py", "def f():\n    from .. import planner\n",
     "zeroplanner.costmodel.terms (core) imports zeroplanner.planner (planner)"),
    ("costmodel/compute.py", "import importlib\nP = importlib.import_module('zeroplanner.planner.search')\n",
     "zeroplanner.costmodel.compute (core) imports zeroplanner.planner.search (planner)"),
    ("specs.py", "def f():\n    from .server import voila_app\n", "imports zeroplanner.server (app)"),
])
def test_an_upward_import_fails_the_check(tmp_path, file, text, words):
    root = _tree(tmp_path, {file: text})
    problems = upward_imports(root)
    assert len(problems) == 1 and words in problems[0], problems


def test_downward_and_root_imports_pass_the_check(tmp_path):
    root = _tree(tmp_path, {
        "planner/rank.py": "from ..costmodel import memory\nfrom .. import inputs\n",
        "cli/plan.py": "def f():\n    from ..planner import plan\n    from ..ui import app\n",
        "costmodel/memory.py": "from ..specs import Scenario\nfrom .. import __version__\nimport numpy\n",
        "ui/app.py": "import ipywidgets\nfrom ..planner import plan\n",
        "specs.py": "def f():\n    from .costmodel import estimate\n",  # a cycle inside the core layer
    })
    assert upward_imports(root) == []
