"""tests/data: every file there names its source in its folder's README, and, where the project's shared material
is beside the checkout (``../shared/``, absent from a user's clone), each copy is still byte-for-byte that file."""

from __future__ import annotations

import pytest

from tests.helpers import DATA, DS_CONFIGS, HF_CONFIGS

ROOT = DATA.parents[1]
FOLDERS = [HF_CONFIGS, DS_CONFIGS]


def _files(folder):
    return sorted(p for p in folder.iterdir() if p.name != "README.md")


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_data_file_is_named_in_its_readme(folder):
    readme = (folder / "README.md").read_text(encoding="utf-8")
    files = _files(folder)
    assert files
    assert [p.name for p in files if p.name not in readme] == []


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_copies_match_shared_when_present(folder):
    shared = next((r / "shared" / folder.name for r in (ROOT.parent, ROOT.parents[1])
                   if (r / "shared" / folder.name).is_dir()), None)
    if shared is None:
        pytest.skip("no ../shared beside the checkout (a user's clone): tests/data is the only copy")
    for p in _files(folder):
        assert p.read_bytes() == (shared / p.name).read_bytes(), p.name
