"""The page's inline event handlers, and the Content-Security-Policy that allows exactly them.

The planner page (``zeroplanner app``, binder) shows HTML that the kernel builds (ipywidgets ``HTML`` widgets set
``innerHTML``). Everything user-typed in that HTML goes through ``html.escape``, but one missed escape would let a
crafted link or config run script in a visitor's page: an ``<img src=x onerror=...>`` in ``innerHTML`` runs its
handler (a ``<script>`` element inserted that way does not). The page's Content-Security-Policy therefore allows
inline event-handler attributes only when their text is one of the handlers below, by hash (CSP Level 3
``script-src-attr`` with ``'unsafe-hashes'``, W3C Content Security Policy Level 3, sections 6.1.11 and 8.3; Chromium
implements both). Any other ``on...=`` attribute on the page is refused by the browser (a
``securitypolicyviolation`` event, nothing runs).

The handlers take everything they act on from the page (``this.dataset.url``, the preview's textarea), so their
text is constant and one hash per handler covers every page.

Pure stdlib: the server (:mod:`zeroplanner.server.voila_app`) imports it without ipywidgets; the app
(:mod:`zeroplanner.ui.app`) builds its buttons from it.
"""

from __future__ import annotations

import base64
import hashlib

PREVIEW_TEXT_JS = "this.closest('.zp-config-box').querySelector('.zp-config textarea').value"
"""Browser-side expression for the text the config preview shows (what Download and Copy take)."""

DOWNLOAD_CONFIG_JS = f"this.href='data:application/json;charset=utf-8,'+encodeURIComponent({PREVIEW_TEXT_JS})"
"""``onclick`` of the config preview's Download link: a ``data:`` URI of the preview's text, made on click."""

COPY_CONFIG_JS = (
    f"navigator.clipboard.writeText({PREVIEW_TEXT_JS}).then(()=>{{this.textContent='Copied'}},"
    "()=>{this.textContent='Copy failed: select the text below'})"
)
"""``onclick`` of the config preview's Copy button (the clipboard API)."""

COPY_LINK_JS = (
    "navigator.clipboard.writeText(this.dataset.url).then(()=>{this.textContent='Link copied'},"
    "()=>{this.textContent='Copy failed'})"
)
"""``onclick`` of the Copy link buttons: the link is the button's ``data-url`` attribute (HTML-escaped there)."""

INLINE_HANDLERS: tuple[str, ...] = (DOWNLOAD_CONFIG_JS, COPY_CONFIG_JS, COPY_LINK_JS)
"""Every inline event handler the page's HTML carries (a test scans :mod:`zeroplanner.ui` for others)."""


def handler_hash(js: str) -> str:
    """CSP hash source of an inline handler's text: ``'sha256-<base64 of SHA-256 of its UTF-8 bytes>'`` (CSP Level 3,
    section 8.3, "Does a source list allow all inline behavior": the hash is over the attribute's value as the
    browser reads it, i.e. after HTML unescaping)."""
    digest = hashlib.sha256(js.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def content_security_policy() -> str:
    """The planner page's ``Content-Security-Policy`` header value.

    - ``script-src-attr 'unsafe-hashes' <hashes>``: inline event handlers only if they are :data:`INLINE_HANDLERS`.
    - ``object-src 'none'``: no plugins (``<object>``/``<embed>``).
    - ``base-uri 'none'``: an injected ``<base>`` cannot redirect the page's relative script URLs.
    - ``form-action 'self'``, ``frame-ancestors 'self'`` (jupyter_server's own default, kept).
    Inline ``<script>`` elements stay allowed: Voilà's template writes its page configuration and progress calls as
    inline scripts (``voila/templates/lab/index.html.j2``), and ``innerHTML`` never runs a ``<script>``.
    """
    hashes = " ".join(handler_hash(js) for js in INLINE_HANDLERS)
    return "; ".join([
        f"script-src-attr 'unsafe-hashes' {hashes}",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'self'",
    ])


__all__ = ["COPY_CONFIG_JS", "COPY_LINK_JS", "DOWNLOAD_CONFIG_JS", "INLINE_HANDLERS", "PREVIEW_TEXT_JS",
           "content_security_policy", "handler_hash"]
