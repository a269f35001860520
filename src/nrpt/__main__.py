"""``python -m nrpt ...``: the command line (:mod:`nrpt.cli`)."""

import sys

from .cli import main

sys.exit(main())
