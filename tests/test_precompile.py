"""Compiled chunks saved once per machine (nrpt.core.precompile): found by nrpt's own key.

The key covers the graph-relevant config, a fingerprint of every object the chunk closes over,
the chunk's static settings, its inputs' structure, nrpt's source and the machine.  The default
suite checks the key (no compiler): a changed target parameter changes the fingerprint and the
config digest, the seed does not; an object from outside nrpt cannot be keyed; a user's
explorer, scheme, rule or adaptor gets no saved chunk; a given target is keyed by its values.
The compile suite saves a chunk, loads it in a second run (equal bit for bit: the same kernel;
equal to the plain loop to 1e-9), and checks that a changed target parameter misses the cache;
negative control: a key blind to that parameter loads the stale chunk, and the comparison with
the plain loop catches it.
"""

from __future__ import annotations

import pytest
import torch

from nrpt.core import precompile
from nrpt.core.loop import execute
from nrpt.run.build import build as _build
from nrpt.run.config import RunConfig
from nrpt.targets.protocol import load_target

BASE = dict(target="gaussian", target_options={"dim": 2, "std": 1.0}, chains=4, systems=2,
            explorer="rwmh", scheme="deo", figures=False, iterations=24, burn_in=0)


def build(cfg, **kw):
    return _build(cfg, allow_gate_bias=True, **kw)


def config(**changes) -> RunConfig:
    return RunConfig.from_dict({}, defaults={**BASE, **changes})


def roots(run) -> dict:
    return run.fused._roots()  # (the chunk's objects, as Fused keys them)


def test_the_key_covers_target_parameters_not_the_seed():
    a = build(config(fuse=True, compile=True))
    b = build(config(fuse=True, compile=True, seed=7))
    c = build(config(fuse=True, compile=True, target_options={"dim": 2, "std": 3.0}))
    fa, fb, fc = (precompile.fingerprint(roots(r)) for r in (a, b, c))
    assert fa == fb and fa != fc
    assert a.fused.precompile_config == b.fused.precompile_config
    assert a.fused.precompile_config != c.fused.precompile_config


def test_user_parts_get_no_saved_chunk_and_a_given_target_is_keyed_by_its_values():
    from nrpt.swap import Metropolis

    run = build(config(fuse=True, compile=True))
    assert run.fused.precompile_config is not None
    mine = build(config(fuse=True, compile=True), rule=Metropolis())
    assert mine.fused.precompile_config is None  # (torch.compile in every process)
    # a target object (the API passes the config's own, loaded): keyed by its fingerprint,
    # which sees a parameter the config does not name
    same = build(config(fuse=True, compile=True), target=load_target("gaussian", dim=2))
    other = build(config(fuse=True, compile=True), target=load_target("gaussian", dim=2,
                                                                       std=3.0))
    assert same.fused.precompile_config == other.fused.precompile_config
    assert precompile.fingerprint(roots(same)) == precompile.fingerprint(roots(run))
    assert precompile.fingerprint(roots(other)) != precompile.fingerprint(roots(run))


class Outside:  # (a class of this test module: not nrpt's)
    scale = 2.0


def test_an_object_from_outside_nrpt_cannot_be_keyed():
    run = build(config(fuse=True, compile=True))
    r = roots(run)
    precompile.fingerprint(r)
    r["density"].target.extra = Outside()
    with pytest.raises(precompile.Unkeyable, match="Outside"):
        precompile.fingerprint(r)
    r["density"].target.extra = lambda x: x  # a function of this module: its globals
    with pytest.raises(precompile.Unkeyable, match="function"):
        precompile.fingerprint(r)


def test_the_fingerprint_sees_a_changed_tensor_value():
    r = {"t": torch.zeros(3), "nested": {"a": [1.0, torch.ones(2, dtype=torch.float64)]}}
    before = precompile.fingerprint(r)
    assert precompile.fingerprint(r) == before
    r["nested"]["a"][1][0] = 1.0 + 2 ** -40
    assert precompile.fingerprint(r) != before


# ---------------------------------------------------------------------------- compiled
def _x(run):
    return run.engine.state.x


def _plain(**changes):
    run = build(config(fuse=False, **changes))
    execute(run)
    return run


@pytest.mark.compile
def test_a_saved_chunk_is_loaded_equal_and_a_changed_parameter_misses(tmp_path, monkeypatch):
    monkeypatch.setenv("NRPT_COMPILE_CACHE", str(tmp_path))
    monkeypatch.delenv("NRPT_PRECOMPILE", raising=False)
    first = build(config(fuse=True, compile=True))
    execute(first)
    assert first.fused.precompiled == "built" and first.fused.failed is None
    assert first.fused.chunks > 0
    again = build(config(fuse=True, compile=True))
    execute(again)
    assert again.fused.precompiled == "loaded"
    assert torch.equal(_x(first), _x(again))  # (the same kernel)
    torch.testing.assert_close(_x(again), _x(_plain()), rtol=1e-9, atol=1e-9)
    # another seed: the same chunk, its own draws
    seed = build(config(fuse=True, compile=True, seed=3))
    execute(seed)
    assert seed.fused.precompiled == "loaded"
    torch.testing.assert_close(_x(seed), _x(_plain(seed=3)), rtol=1e-9, atol=1e-9)

    wider = {"dim": 2, "std": 3.0}
    truth = _x(_plain(target_options=wider))
    # negative control: a key blind to the target's parameters (here: to everything) loads
    # the std-1 chunk
    saved = next(tmp_path.joinpath("aoti").glob("chunk-*.pt2")).stem.removeprefix("chunk-")
    real = precompile.key
    monkeypatch.setattr(precompile, "key", lambda *args: saved)
    stale = build(config(fuse=True, compile=True, target_options=wider))
    execute(stale)
    assert stale.fused.precompiled == "loaded"
    assert not torch.allclose(_x(stale), truth, rtol=1e-6, atol=1e-6)  # caught
    monkeypatch.setattr(precompile, "key", real)
    # the real key misses: a chunk of its own, equal to the plain loop
    fresh = build(config(fuse=True, compile=True, target_options=wider))
    execute(fresh)
    assert fresh.fused.precompiled == "built"
    torch.testing.assert_close(_x(fresh), truth, rtol=1e-9, atol=1e-9)
    assert len(list(tmp_path.joinpath("aoti").glob("chunk-*.pt2"))) == 2
