"""nrpt — non-reversible parallel tempering in PyTorch.

Vocabulary: a *slot* p = 0..P-1 is a rung of the ladder (slot 0 = the target); a *replica* is a
state that moves between slots; swaps exchange slots, never states.  See docs/architecture.md.
"""

from . import diagnostics, rng
from .api import Result, build_engine, resume, sample
from .config import RunConfig
from .engine import PTEngine
from .explorers import HMC, MALA, RWMH, make_explorer
from .explorers.slice import SliceSampler
from .paths import GeometricPath, TemperatureLadder, make_path
from .rounds import sample_adaptive
from .swap import (
                   ADJ,
                   APE,
                   DEO,
                   DEOW,
                   SEO,
                   AlwaysAccept,
                   FixedRate,
                   Metropolis,
                   make_rule,
                   make_scheme,
)
from .target import TargetError, load_target, validate_target

__version__ = "0.1.0"

__all__ = ["sample", "resume", "Result", "RunConfig", "PTEngine", "build_engine", "diagnostics",
           "rng", "RWMH", "MALA", "HMC", "SliceSampler", "sample_adaptive", "make_explorer",
           "GeometricPath", "TemperatureLadder",
           "make_path", "ADJ", "APE", "DEO", "DEOW", "SEO", "AlwaysAccept", "FixedRate",
           "Metropolis", "make_rule", "make_scheme", "TargetError", "load_target",
           "validate_target", "__version__"]
