"""``python -m zeroplanner.cli`` is the ``zeroplanner`` command."""

from . import entry

entry()
