"""``python -m nrpt ...``: the command line (:func:`nrpt.run.cli.entry`)."""

import sys

from nrpt.run.cli import entry

sys.exit(entry())
