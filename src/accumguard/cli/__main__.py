"""``python -m accumguard.cli``: the same as the ``accumguard`` command."""

import sys

from accumguard.cli import main

sys.exit(main())
