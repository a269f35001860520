"""Deep posteriors: P network replicas tempered as one batched model, evaluated as a Bayesian
model average (docs/deep.md).

    res = nrpt.deep.fit(model, train=(X, y), test=(X, y), method="deo-star", chains=4,
                        epochs=30, seed=0)
    res.summary["accuracy"], res.predict_proba(X_new)

Submodules: :mod:`~nrpt.deep.replicas` (stacked evaluation, strategies),
:mod:`~nrpt.deep.energy` (the network posterior as an energy target), :mod:`~nrpt.deep.fitting`
(pretraining, the main run, the run folder), :mod:`~nrpt.deep.methods` (the methods, a table of
builders), :mod:`~nrpt.deep.config` (the settings and their rules),
:mod:`~nrpt.deep.recorders` (collection), :mod:`~nrpt.deep.metrics` (BMA metrics),
:mod:`~nrpt.deep.data`, :mod:`~nrpt.deep.models`, :mod:`~nrpt.deep.swag`.
"""

from nrpt.deep.fitting import METHODS, DeepConfig, DeepResult, fit
from nrpt.deep.metrics import BMA, evaluate, reliability
from nrpt.deep.replicas import FunctionalNet, StrategyWarning

__all__ = ["fit", "DeepConfig", "DeepResult", "METHODS", "BMA", "evaluate", "reliability",
           "FunctionalNet", "StrategyWarning"]
