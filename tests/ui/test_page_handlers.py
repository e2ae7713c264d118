"""The page's inline handlers are exactly those its Content-Security-Policy allows (issue 33, item 1).

The CSP (``zeroplanner.pagejs.content_security_policy``) allows inline event handlers by hash only; a handler the
app writes that is not in ``INLINE_HANDLERS`` would be refused by the browser (its button would do nothing). That
the hashes are right is checked in Chromium (tests/browser/test_browser.py: Copy link, Download and Copy work under
the policy; tests/browser/test_browser_injection.py: another handler is refused).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from zeroplanner.pagejs import INLINE_HANDLERS, content_security_policy, handler_hash

ROOT = Path(__file__).resolve().parents[2]
HANDLER_ATTR = re.compile(r"""\bon([a-z]+)=\\?["']""")
HANDLER_VALUE = re.compile(r'\bon[a-z]+="([^"]*)"')


def test_only_the_app_writes_inline_handlers_and_only_from_pagejs():
    """A source scan: every ``on<event>=`` attribute in the package's Python and templates is in ui/app.py and
    takes its text from a :mod:`zeroplanner.pagejs` constant."""
    found = {}
    for path in [*(ROOT / "zeroplanner").rglob("*.py"), *(ROOT / "zeroplanner").rglob("*.j2")]:
        if path.name == "pagejs.py":
            continue
        for line in path.read_text().splitlines():
            if HANDLER_ATTR.search(line):
                found.setdefault(path.relative_to(ROOT).as_posix(), []).append(line.strip())
    assert set(found) == {"zeroplanner/ui/app.py"}, found
    for line in found["zeroplanner/ui/app.py"]:
        assert re.search(r"html\.escape\((DOWNLOAD_CONFIG_JS|COPY_CONFIG_JS|COPY_LINK_JS)\)", line), line


def test_the_handlers_the_app_shows_are_the_allowed_ones(monkeypatch):
    from zeroplanner.ui import PlannerApp

    monkeypatch.delenv("QUERY_STRING", raising=False)
    monkeypatch.delenv("VOILA_PREHEAT", raising=False)
    app = PlannerApp(debounce_seconds=0)
    shown = app.share_link.value + app.config_actions.value
    handlers = [html.unescape(v) for v in HANDLER_VALUE.findall(shown)]
    assert len(handlers) == 3, shown  # Copy link, Download, Copy
    assert set(handlers) <= set(INLINE_HANDLERS)
    assert "data-url=" in app.share_link.value  # the link travels in an attribute, not in the handler text


def test_policy_lists_one_hash_per_handler_and_binder_sends_the_same():
    policy = content_security_policy()
    for js in INLINE_HANDLERS:
        assert handler_hash(js) in policy
    assert policy.startswith("script-src-attr 'unsafe-hashes' ")
    assert "object-src 'none'" in policy and "base-uri 'none'" in policy
    binder = json.loads((ROOT / "binder" / "jupyter_config.json").read_text())
    assert binder["ServerApp"]["tornado_settings"]["headers"]["Content-Security-Policy"] == policy
    assert binder["VoilaConfiguration"]["allow_theme_override"] == "NO"
    assert binder["VoilaConfiguration"]["allow_template_override"] == "NO"


def test_handler_hash_is_base64_sha256_of_the_text():
    # CSP Level 3 section 8.3 example form: 'sha256-' + base64(SHA-256(UTF-8 source)); the empty string's SHA-256
    # is e3b0c442...b855 (FIPS 180-4 test vector), base64 47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=
    assert handler_hash("") == "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
