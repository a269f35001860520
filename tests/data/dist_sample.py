"""A worker for tests/test_distributed.py: ``python dist_sample.py OPTIONS_JSON`` runs
``nrpt.sample`` on the minibatch mixture-mean model (a data target, so minibatch and
control-variate energies can be checked across processes)."""

import json
import os
import sys

import nrpt
from nrpt.targets.minibatch import MixtureMeanModel

opts = json.loads(sys.argv[1])
fail = opts.pop("fail_rank", None)
if fail is not None and os.environ.get("RANK") == str(fail):
    raise SystemExit("rank failed on purpose")
res = nrpt.sample(MixtureMeanModel(n_data=200, data_seed=0), **opts)
sys.exit(130 if res.summary.get("interrupted") else 0)
