"""``python -m zeroplanner.cli`` is the ``zeroplanner`` command."""

import sys

from . import main

sys.exit(main())
