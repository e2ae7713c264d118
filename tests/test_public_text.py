"""User-facing text cites public sources only.

Everything the CLI, the app, the Voilà template, the reports, the docs, the benchmarks and the notebooks can show
(and the docstrings and comments of the package, which ``help()`` and the docs show) must name its sources so a
reader can look them up: DeepSpeed's docs and source, the ZeRO papers, public issue threads of named projects, or
the measured runs in docs/validation.md. Two kinds of reference point at nothing a reader can open, and are checked
here:

* a "seed" source (the article the project started from, ``../shared/seed``), in any spelling;
* this project's own tracker: "issue 33", "(issue #12)", "issues 3 and 4", "issue-17", "stop 37".

Uses of random-number seeds are not references and are left alone (see :data:`RNG_LINE_MARKERS` and
:data:`SEED`). A public project's issue is allowed when the project is named just before it ("DeepSpeed issue
#2928") or the line is a github.com link.

The last tests run the CLI in process on a multi-node scenario and a shipped config and check what it prints.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from zeroplanner.cli import main

ROOT = Path(__file__).resolve().parents[1]

SCANNED = ("zeroplanner", "docs", "README.md", "notebooks", "benchmarks", "scripts", "binder")
"""Paths whose tracked files are scanned (every text file under them; binaries are skipped)."""

BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".ico", ".pdf", ".gz", ".zip", ".whl", ".pyc"}

SEED = re.compile(r"\bseed(?:ed|s)?\b", re.IGNORECASE)
"""The word "seed" ("data_seed" and "manual_seed" never match: ``\\b`` needs a non-word character before it)."""

SEED_CODE_AFTER = re.compile(r"\s*(?:=|\+|\)|\}|\]|:\s*int\b)")
"""What follows a "seed" that is code naming a random seed, not prose: ``seed=``, ``seed = 0``, ``seed + 1``,
``f(seed)``, ``{... seed}``, ``seed: int``. (A prose "seed:" as in "(seed: 5e7 -> 2e8)" is still caught.)"""

RNG_LINE_MARKERS = ("manual_seed", "default_rng", "generator(", "random", "hypothesis")
"""A line with one of these (lower-cased) talks about random-number generation: torch's and numpy's seeding APIs,
"same random seed" in prose, hypothesis' ``@seed``. Its "seed" is not a reference."""

ISSUE = re.compile(r"\bissues?[\s_-]*#?\d+\b|\bstop\s+\d+\b", re.IGNORECASE)
"""A numbered issue ("issue 5", "issue #12", "issues 3 and 4", "issue-17", "Issue\\n33" across a line break) or a
numbered stop of this project's tracker."""

PUBLIC_PROJECTS = ("DeepSpeed", "DeepSpeedExamples", "nccl", "pytorch", "transformers", "peft", "accelerate", "voila",
                   "ipywidgets", "LlamaFactory", "LLaMA-Factory", "ms-swift", "BELLE", "bitsandbytes")
"""Projects whose issue numbers are public. An issue reference is allowed when one of them is named right before it
("DeepSpeed issue #2928", "nccl-tests issues 83", "DeepSpeed's issue 1302"), or when its line is a github.com link;
a name elsewhere on the line does not count (``/voila/...: issue 33`` is this project's issue)."""

PUBLIC_BEFORE = re.compile(r"\b(?:" + "|".join(map(re.escape, PUBLIC_PROJECTS)) + r")(?:-[\w.]+)?(?:'s)?\s*$",
                           re.IGNORECASE)


def tracked_files() -> list[Path]:
    """Tracked text files under :data:`SCANNED` (git ls-files; a walk of the same paths without git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *SCANNED], cwd=ROOT, capture_output=True, check=True,
                             text=True).stdout
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = []
    if not paths:  # not a git checkout (an sdist): walk the same paths
        for name in SCANNED:
            top = ROOT / name
            paths += [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        paths = [p for p in paths if "__pycache__" not in p.parts and not any(
            part.endswith(".egg-info") for part in p.parts)]
    return sorted(p for p in paths if p.is_file() and p.suffix.lower() not in BINARY_SUFFIXES)


def read_text(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\0" in text else text


def _is_rng_code(line: str, start: int, end: int) -> bool:
    """Whether the "seed" at ``line[start:end]`` is code, not a reference: followed by :data:`SEED_CODE_AFTER`, a
    quoted key (``"seed"``, quotes on both sides), an attribute (``torch.seed()``) or a right-hand side
    (``x = seed``)."""
    before, after = line[:start], line[end:]
    if before[-1:] in ('"', "'") and after[:1] == before[-1:]:
        return True
    return before.endswith(".") or before.rstrip().endswith("=") or bool(SEED_CODE_AFTER.match(after))


def seed_hits(text: str) -> list[tuple[int, str]]:
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        if any(marker in line.lower() for marker in RNG_LINE_MARKERS):
            continue
        if any(not _is_rng_code(line, m.start(), m.end()) for m in SEED.finditer(line)):
            hits.append((number, line.strip()))
    return hits


def issue_hits(text: str) -> list[tuple[int, str]]:
    """Numbered issue references, matched over the whole text (one may wrap), less the public projects' ones."""
    hits = []
    for m in ISSUE.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        lines = text[start:end if end >= 0 else len(text)]
        if "github.com" in lines.lower() or PUBLIC_BEFORE.search(text[start:m.start()]):
            continue
        hits.append((text.count("\n", 0, m.start()) + 1, " ".join(lines.split())))
    return hits


def test_the_patterns_catch_references_and_spare_rng_and_public_issues():
    prose = ("the seed article's threshold\n(seed: 5e7 -> 2e8 gave 2.1x)\nsee ../shared/seed/\nThe Seed table\n"
             'Rule(source="seed article: 5e7 -> 2e8")\n"Seeded from the article"')
    assert [n for n, _ in seed_hits(prose)] == [1, 2, 3, 4, 5, 6]
    assert seed_hits('torch.manual_seed(seed)\nseed: int = 0,\ngen.manual_seed(seed + 1)\n{"seed": 1}\n'
                     'run.get("seed", 1234)\nnp.random.seed(0)\nthe same model (same random seed,\n'
                     "rng = np.random.default_rng(seed)\ndef f(seed=0):\nx = seed\ndata_seed = 77\n"
                     '"micro_batch": micro_batch, "seed": seed}))\ntorch.seed()') == []
    assert [n for n, _ in issue_hits("a (issue 33).\nissues 3 and 4\nissue-17 target\nStop 37 said\nBefore (issue\n"
                                     "33), it\n(issue #12)")] == [1, 2, 3, 4, 5, 7]
    assert issue_hits("DeepSpeed issue #2928: ZeRO-3\nhttps://github.com/NVIDIA/nccl/issues/209\n"
                      "nccl-tests issues 83\ndeepspeedai/DeepSpeed#5678 (DeepSpeed #6914)\n"
                      "Ulysses all-to-alls one rank issues per forward\npublic issues; each\n"
                      "DeepSpeed's issue 1302") == []
    assert [n for n, _ in issue_hits("(``/voila/labextensions/x``, ``/logout``: issue 33, reproduced\n"
                                     "DeepSpeed config (issue 5)")] == [1, 2]


def test_shown_text_has_no_seed_or_project_issue_references():
    files = tracked_files()
    assert any(p.name == "lint.py" for p in files) and any(p.suffix == ".md" for p in files), files[:5]
    hits = []
    for path in files:
        text = read_text(path)
        if text is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        hits += [f"{rel}:{n}: seed reference: {line[:160]}" for n, line in seed_hits(text)]
        hits += [f"{rel}:{n}: project issue reference: {line[:160]}" for n, line in issue_hits(text)]
    assert not hits, ("text shown to users cites a non-public source (name a public source or state a rule of "
                      "thumb instead):\n" + "\n".join(hits))


def _cli(capsys, *argv: str) -> str:
    rc = main(list(argv))
    captured = capsys.readouterr()
    assert rc in (0, 1), (rc, captured.err)  # 0 fits / clean, 1 does not fit or has config errors
    return captured.out + captured.err


def _assert_public(out: str) -> None:
    assert out.strip()
    assert "seed" not in out.lower(), [line for line in out.splitlines() if "seed" in line.lower()]
    assert not issue_hits(out), issue_hits(out)


def test_recommend_output_cites_no_seed(capsys):
    """A 2-node run on 1 GbE: the communication-share warning (the 30% rule of thumb) and the advice are printed."""
    out = _cli(capsys, "recommend", "--model", "llama-2-13b", "--gpus-per-node", "8", "--nodes", "2",
               "--network", "eth-1g")
    assert "30%" in out
    _assert_public(out)


def test_check_output_cites_no_seed(capsys):
    """``zeroplanner check`` (the config linter) on a shipped config, raw DeepSpeed and the HF Trainer's way."""
    config = ROOT / "tests" / "data" / "ds-configs" / "lf_z3_offload.json"
    for extra in ([], ["--hf-trainer"]):
        out = _cli(capsys, "check", str(config), "--model", "llama-2-13b", "--nodes", "2", "--network", "eth-1g",
                   *extra)
        _assert_public(out)


def test_check_bucket_and_pinning_findings_cite_no_seed(capsys, tmp_path):
    """The two rules whose text used to cite the seed article: small buckets across nodes, offload unpinned."""
    config = tmp_path / "ds_config.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": '
                      '{"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}, '
                      '"zero_optimization": {"stage": 3, "reduce_bucket_size": 50000000, '
                      '"offload_optimizer": {"device": "cpu", "pin_memory": false}}}')
    out = _cli(capsys, "check", str(config), "--model", "llama-2-13b", "--nodes", "2", "--network", "eth-25g")
    assert "small_buckets_multinode" in out or "reduce_bucket_size = 50000000" in out, out
    assert "without pinned memory" in out, out
    _assert_public(out)


@pytest.mark.parametrize("fmt", ["html", "markdown"])
def test_report_cites_no_seed(fmt):
    from zeroplanner.report import build_report
    from zeroplanner.scenarios import build_scenario

    page = build_report(build_scenario(model="llama-2-13b", gpus_per_node=8, nodes=2, network="eth-1g"), fmt)
    _assert_public(page)
