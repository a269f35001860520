"""A compilation that cannot work falls back before inductor's compilation, and says why.

``torch.compile`` builds a frame's guards after its backend returned and checks them on the frame
it traced; a guard that fails there (a NumPy scalar in the target, under the loop's inference
mode) used to surface only after inductor's whole compilation (~70 s cold).  The backend
:func:`nrpt.explorers.compiled.deferred_inductor` runs inductor at the graph's first call,
after that check.  These tests replace inductor by a counting stub that runs Dynamo's graph
as it is, so they need no compiler and run in the default suite: the fallback is taken with
inductor never called (the path, not a time), and its warning names the attribute and the
fix.  Negative control: the same target holding a Python float reaches inductor (the stub),
runs compiled chunks and equals the plain loop.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nrpt.core.loop import execute
from nrpt.explorers.compiled import CompileWarning
from nrpt.run.build import build
from nrpt.run.config import RunConfig


class Banana:
    """x1 ~ N(0, 4), x2 | x1 ~ N(b (x1^2 - 4), 1); ``b`` as the user wrote it."""

    name = "banana"
    dim = 2

    def __init__(self, b):
        self.b = b

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., 0], x[..., 1]
        return x1 ** 2 / 8.0 + (x2 - self.b * (x1 ** 2 - 4.0)) ** 2 / 2.0


@pytest.fixture
def inductor_calls(monkeypatch):
    """Inductor replaced by Dynamo's graph run as it is; the list counts its compilations."""
    import warnings

    with warnings.catch_warnings():  # (torch's own deprecation notices at import)
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch._inductor.compile_fx as cfx

    calls: list = []

    def stub(gm, example_inputs, *args, **kwargs):
        calls.append(gm)
        return lambda *a: gm(*a)

    monkeypatch.setattr(cfx, "compile_fx", stub)
    torch._dynamo.reset()
    yield calls
    torch._dynamo.reset()


def run(b, iterations=32, **kw):
    cfg = RunConfig(target="banana", chains=4, systems=2, explorer="rwmh", iterations=iterations,
                    figures=False, burn_in=0, seed=3, **kw)
    r = build(cfg, target=Banana(b))
    execute(r)
    return r


def test_a_numpy_constant_falls_back_before_inductor_and_names_itself(inductor_calls):
    plain = run(np.float64(0.5), fuse=False)
    with pytest.warns(CompileWarning, match=r"compiled chunk failed \(target\.b is a NumPy "
                                            r"value.*make it a Python float or a torch tensor"):
        r = run(np.float64(0.5), fuse=True, compile=True)
    assert inductor_calls == []  # the fallback came before inductor's compilation
    assert r.fused.failed.startswith("target.b is a NumPy value")
    assert r.fused.describe()["compiled"] is False and r.fused.chunks > 0
    assert torch.equal(plain.engine.state.x, r.engine.state.x)  # eager chunks: bit for bit
    # the compiled explorer step (compile without fuse) falls back the same way
    with pytest.warns(CompileWarning, match=r"compiled rwmh step failed \(target\.b is a "
                                            r"NumPy value"):
        r = run(np.float64(0.5), iterations=8, fuse=False, compile=True)
    assert inductor_calls == [] and r.engine.explorer.failed.startswith("target.b is a NumPy")


def test_the_same_target_with_a_python_float_compiles(inductor_calls):
    """The negative control: nothing to fall back from, inductor (the stub) is reached, the
    chunks run compiled and give the plain loop's results."""
    import warnings

    plain = run(0.5, fuse=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        r = run(0.5, fuse=True, compile=True)
    assert inductor_calls  # compiled graphs reached the backend's compiler
    assert r.fused.failed is None and r.fused.describe()["compiled"] and r.fused.chunks > 0
    torch.testing.assert_close(r.engine.state.x, plain.engine.state.x, rtol=0, atol=1e-12)
    assert torch.equal(r.engine.slot_of, plain.engine.slot_of)


def test_why_failed_names_other_guards_and_errors():
    from nrpt.explorers.compiled import why_failed

    err = AssertionError("Guard failed on the same frame it was created. This is a bug - "
                         "please create an issue.Guard fail reason: 0/0: x.size() mismatch\nmore")
    assert why_failed(err) == ("a torch.compile guard fails on the frame it was traced from "
                               "(0/0: x.size() mismatch)")
    assert why_failed(RuntimeError("no compiler\ndetails")) == "RuntimeError: no compiler"


def test_compiled_code_is_cached_in_nrpts_per_machine_folder(monkeypatch, tmp_path):
    """torch's default (a folder under /tmp, which importing torch._dynamo writes into the
    environment) is replaced by ``$NRPT_COMPILE_CACHE`` (else ``~/.cache/nrpt/compile``); a
    folder the user chose is kept (the negative control)."""
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from nrpt.explorers.compiled import compile_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    monkeypatch.setenv("NRPT_COMPILE_CACHE", str(tmp_path / "nrpt"))
    assert compile_cache() == str(tmp_path / "nrpt")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "nrpt")
    monkeypatch.delenv("NRPT_COMPILE_CACHE")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert compile_cache() == str(tmp_path / ".cache" / "nrpt" / "compile")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("NRPT_COMPILE_CACHE", str(tmp_path / "nrpt"))
    assert compile_cache() == str(tmp_path / "mine")
