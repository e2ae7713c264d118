"""The config.json upload's size limit, as the page checks it before sending (issue 33, item 4), without a browser.

The page's script (zeroplanner/server/share/voila/templates/zeroplanner/index.html.j2) reads the limit from the
``data-zp-max-bytes`` element the app puts beside its "Upload config.json" widget and refuses a larger file with
the app's own message for an oversized config.json. Here: that element carries
``zeroplanner.catalog.hfconfig.MAX_CONFIG_BYTES`` (the CLI's ``--hf-config`` reader's limit), it sits in the same
box as the upload widget, and the script builds the same sentence the app shows. The browser side (a 12 MB file
refused, the page's connection kept, a real config.json loaded) is tests/browser/test_browser_session.py.
"""

from __future__ import annotations

import html
import re

import pytest

pytest.importorskip("ipywidgets")

from zeroplanner.catalog.hfconfig import MAX_CONFIG_BYTES, too_large_message  # noqa: E402
from zeroplanner.server import SHARE_DIR, TEMPLATE  # noqa: E402
from zeroplanner.ui import PlannerApp  # noqa: E402

SCRIPT = (SHARE_DIR / "voila" / "templates" / TEMPLATE / "index.html.j2").read_text()


@pytest.fixture(scope="module")
def app():
    return PlannerApp()


def test_the_page_carries_the_python_limit_beside_the_upload(app):
    found = re.findall(r"data-zp-max-bytes='(\d+)'", app.hf_limit.value)
    assert found == [str(MAX_CONFIG_BYTES)]
    assert MAX_CONFIG_BYTES == 1_000_000
    assert app.hf_limit.layout.display == "none"  # an element for the script, not shown
    accordion = app.extras[-1]  # "Your model: HF config.json" is its first panel, filled when first opened
    accordion.selected_index = 0
    box = accordion.children[0].children[0]
    assert app.hf_upload in box.children
    assert "zp-hf" in box._dom_classes and app.hf_limit in box.children and app.hf_message in box.children
    assert "zp-upload" in app.hf_upload._dom_classes and "zp-hf-message" in app.hf_message._dom_classes


def test_the_script_reads_that_limit_and_says_what_the_app_says(app):
    for hook in ("data-zp-max-bytes", '".zp-hf"', '".zp-hf-message"', '".zp-app .zp-upload"'):
        assert hook in SCRIPT, hook
    size = MAX_CONFIG_BYTES + 1
    assert app.load_hf_config(b"x" * size, "big.json") is None
    said = html.unescape(re.sub(r"<[^>]+>", "", app.hf_message.value))
    # the CLI's --hf-config size error (one reader, one message: catalog.hfconfig.too_large_message)
    assert said == (f"Cannot use big.json: {too_large_message('big.json', size)}. "
                    "The planner keeps the last valid setup.")
    assert too_large_message("big.json", size) == f"'big.json' is {size} bytes; the limit is {MAX_CONFIG_BYTES} bytes"
    # the script's sentence, piece by piece (the name quoted as repr quotes it, sizes in plain digits: String())
    for piece in ('"Cannot use "', "\" '\" + name + \"' is \" + String(file.size) + \" bytes; the limit is \" + "
                  "String(limit) +", '" bytes. The planner keeps the last valid setup."', "slice(0, 120)"):
        assert piece in SCRIPT, piece


def test_a_file_at_the_limit_still_reaches_the_reader(app):
    """The browser refuses only files over the limit; one of exactly MAX_CONFIG_BYTES goes to the reader, which
    then judges its content (here: not JSON), not its size."""
    app.load_hf_config(b"x" * MAX_CONFIG_BYTES, "edge.json")
    assert "the limit is" not in app.hf_message.value and "not valid JSON" in app.hf_message.value
    assert "size > limit" in SCRIPT  # strictly larger, as load_hf_config's len(raw) > HF_LIMIT

