"""nrpt — non-reversible parallel tempering in PyTorch.

Vocabulary: a *slot* p = 0..P-1 is a rung of the ladder (slot 0 = the target); a *replica* is a
state that moves between slots; swaps exchange slots, never states.  Read :mod:`nrpt.roles`
first (the contracts), then docs/architecture.md.
"""

import gc as _gc

# The imports below (torch's above all: ~1300 modules) make a few hundred thousand objects that live
# until exit; with the cyclic collector on, its full passes walk the growing heap again and again
# while they load (~0.1 s CPU of the ~1.1 s; docs/benchmarks.md, stop 38 lane proc2).  It is off for
# the imports only, and back on after them (left off if the importer had turned it off).
_collecting = _gc.isenabled()
_gc.disable()
try:
    from nrpt import diagnostics, rng, roles
    from nrpt.core.engine import PTEngine
    from nrpt.core.loop import Plan, Segment, execute
    from nrpt.explorers import HMC, MALA, RWMH
    from nrpt.explorers.slice import SliceSampler
    from nrpt.paths.ladders import GeometricPath, TemperatureLadder, make_path
    from nrpt.report.health import SamplingWarning
    from nrpt.run import registry
    from nrpt.run.api import Result, figures, resume, run_config, sample
    from nrpt.run.build import build
    from nrpt.run.config import RunConfig
    from nrpt.run.registry import make_explorer, make_rule, make_scheme
    from nrpt.swap import (
        ADJ,
        APE,
        DEO,
        DEOW,
        SEO,
        AlwaysAccept,
        FixedRate,
        Metropolis,
        NoSwap,
    )
    from nrpt.targets.protocol import TargetError, load_target, validate_target
finally:
    if _collecting:
        _gc.enable()
    del _collecting

__version__ = "0.2.0"


def __getattr__(name: str):
    """``nrpt.testing`` on first use (a sampling run does not need it at import)."""
    if name == "testing":
        import importlib

        return importlib.import_module("nrpt.testing")
    raise AttributeError(f"module 'nrpt' has no attribute {name!r}")


def sample_adaptive(target="geometric-gaussian-path", *, rounds: int = 10, **options) -> Result:
    """Adaptive NRPT (Syed et al. 2021) in ``rounds`` rounds of doubling length: the same as
    ``nrpt.sample(target, rounds=rounds, ...)`` (whose explorer then defaults to slice)."""
    return sample(target, rounds=rounds, **options)


__all__ = ["sample", "resume", "figures", "run_config", "sample_adaptive", "Result", "RunConfig",
           "PTEngine", "build", "Plan", "Segment", "execute", "diagnostics", "registry", "rng",
           "roles", "testing", "RWMH", "MALA", "HMC", "SliceSampler", "make_explorer",
           "GeometricPath", "TemperatureLadder", "make_path", "ADJ", "APE", "DEO", "DEOW", "SEO",
           "NoSwap", "AlwaysAccept", "FixedRate", "Metropolis", "make_rule", "make_scheme",
           "SamplingWarning", "TargetError", "load_target", "validate_target", "__version__"]
