"""Deep posteriors: P network replicas tempered as one batched model, evaluated as a Bayesian
model average (docs/deep.md)::

    res = nrpt.deep.fit(model, train=(X, y), test=(X, y), method="deo-star", chains=4,
                        epochs=30, seed=0)
    res.summary["accuracy"], res.predict_proba(X_new)"""

from nrpt.deep.fitting import METHODS, DeepConfig, DeepResult, fit
from nrpt.deep.metrics import BMA, evaluate, reliability
from nrpt.deep.replicas import FunctionalNet, StrategyWarning

__all__ = ["fit", "DeepConfig", "DeepResult", "METHODS", "BMA", "evaluate", "reliability",
           "FunctionalNet", "StrategyWarning"]
