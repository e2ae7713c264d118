"""The planner app (ipywidgets + bqplot). ``from zeroplanner.ui import PlannerApp; PlannerApp()``.

Needs the ``app`` extra (``pip install 'zeroplanner[app]'``); without it, importing this package raises an
``ImportError`` whose message is that install hint.
"""

from __future__ import annotations

try:
    import bqplot  # noqa: F401
    import ipywidgets  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"zeroplanner.ui needs the 'app' extra: pip install 'zeroplanner[app]' ({exc})") from None

from .app import PlannerApp
from .state import AppState, apply_changes, default_state, derive

__all__ = ["PlannerApp", "AppState", "apply_changes", "default_state", "derive"]
