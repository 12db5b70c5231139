"""``python -m kvoffload``: the same command line as the ``kvoffload`` script."""

import sys

from kvoffload.cli import main

sys.exit(main())
