"""Paths: the family of distributions over slots (ladders, the variational reference)."""

#: the references of :mod:`nrpt.paths.gaussian_reference` (one leg, no bridge), named in the
#: package itself so that checking or building a run need not import that module
#: (tests/test_import_cost.py)
GAUSSIAN_REFERENCES = ("gaussian", "gaussian-fixed")
