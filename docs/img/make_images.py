"""Write docs/img/planner.png and docs/img/tutorial.png from the real pages: ``zeroplanner app`` (Voilà) on
127.0.0.1, Debian Chromium through Playwright at 1440 x 900 (the size the one-view layout is built for).

    PYTHONPATH=. python3 docs/img/make_images.py [--width 1440 --height 900 --query 'model=llama-2-70b&nodes=4']
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.browserkit import CHROMIUM, CHROMIUM_ARGS, serve_app  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1440)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--query", default="", help="a share-link query string for the planner page")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--pages", default="planner,tutorial")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    pages = args.pages.split(",")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            if "planner" in pages:
                with serve_app(timeout=90.0) as server:
                    page = browser.new_page(viewport={"width": args.width, "height": args.height})
                    page.goto(server.url + (f"?{args.query}" if args.query else ""), timeout=120_000)
                    page.wait_for_selector(".zp-app .bqplot svg .bargroup rect", timeout=120_000)
                    page.wait_for_timeout(1500)
                    page.screenshot(path=str(args.out / "planner.png"))
                    print(args.out / "planner.png")
                    page.close()
            if "tutorial" in pages:
                with serve_app(["--page", "tutorial"], timeout=90.0) as server:
                    page = browser.new_page(viewport={"width": args.width, "height": args.height})
                    page.goto(server.url, timeout=120_000)
                    page.wait_for_selector(".zp-tutorial-step .zp-explain", timeout=120_000)
                    page.wait_for_timeout(3000)  # MathJax
                    page.screenshot(path=str(args.out / "tutorial.png"))
                    print(args.out / "tutorial.png")
                    page.close()
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
