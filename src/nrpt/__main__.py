"""``python -m nrpt ...``: the command line (:mod:`nrpt.run.cli`)."""

import sys

from nrpt.run.cli import main

sys.exit(main())
