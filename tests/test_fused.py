"""The fused loop (nrpt.core.fused) computes what the plain loop computes.

Eager chunks call the same code as the plain step (explorer, sweep_exchange, refresh_top, the
adaptors' observe_block, the recorders' record_block), so the engine's state, the permutation and
the round trips are equal bit for bit; recorders' block forms may regroup floating-point sums
(1e-12).  Compiled chunks round some last bits differently (1e-9, the same decisions); they are
in the slow suite, one small one here.  Negative controls: a chunk fed the wrong draws, or a
run with another seed, differs.
"""

from __future__ import annotations

import pytest
import torch

from nrpt.core.fused import Fused, why_not
from nrpt.core.loop import execute
from nrpt.run.build import build as _build
from nrpt.run.config import RunConfig
from nrpt.run.sgpt import HEADLINE

CONFIGS = {
    "rwmh-deo": dict(target="twenty-five-modes", chains=6, systems=3, explorer="rwmh",
                     scheme="deo", figures=False),
    "mala-deo-w": dict(target="geometric-bimodal", chains=5, systems=2, explorer="mala",
                       scheme="deo-w", window=3, figures=False),
    "hmc-seo-n2": dict(target="twenty-five-modes", chains=4, systems=2, explorer="hmc",
                       scheme="seo", n_explore=2, leapfrog_steps=3, figures=False),
    "headline-sgd": dict(HEADLINE),
    # DEO for a tuning segment, then DEO_W(W*) (engine.set_scheme at the segment's end)
    "rwmh-auto-window": dict(target="twenty-five-modes", chains=6, systems=2, explorer="rwmh",
                             scheme="deo-w", window="auto", window_tune=40, figures=False),
}


def build(cfg, **kw):
    """:func:`nrpt.run.build.build` past the refusal of DEO_W with exact Metropolis swaps (biased):
    these tests compare the fused and plain loops of one configuration, not its samples."""
    return _build(cfg, allow_gate_bias=True, **kw)


def config(name: str, iterations: int, **changes) -> RunConfig:
    d = dict(CONFIGS[name], iterations=iterations, **changes)
    return RunConfig.from_dict({}, defaults=d)


def outcome(run) -> dict:
    eng = run.engine
    rec = run.recorders
    out = {"x": eng.state.x, "v": eng.state.v, "slot_of": eng.slot_of, "k": eng.k,
           "schedule": eng.schedule, "step_size": eng.step_size, **eng.params,
           "trips": torch.stack(list(rec["round_trips"].counts().values())),
           "attempts": rec["swaps"].attempts, "swaps": rec["swaps"].swaps,
           "accept_sum": rec["swaps"].accept_sum, "explore": rec["swaps"].explore_sum,
           "spread_mean": rec["spread"].mean}
    if "log_z" in rec:
        out["log_z"] = rec["log_z"].estimate()["log_normalizer"]
    if "trace" in rec:
        out["trace_C"] = torch.stack(rec["trace"].C) if rec["trace"].C else torch.zeros(0)
        out["trace_table"] = torch.stack(rec["trace"].table)
    return out


def _same_as_plain(plain, other_run, name, n) -> None:
    """``other_run``'s outcome equals ``plain``'s (bit for bit where :data:`BITWISE`, else to
    1e-12); negative control: another seed differs in the same comparison."""
    a, b = outcome(plain), outcome(other_run)
    assert a.keys() == b.keys()
    for key in a:
        if key in BITWISE:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key
        else:
            torch.testing.assert_close(b[key], a[key], rtol=1e-12, atol=1e-12, msg=key)
    other = build(config(name, n, seed=1))
    execute(other)
    assert not torch.equal(outcome(other)["x"], a["x"])


def plain_and_fused(name: str, iterations: int, **changes):
    plain = build(config(name, iterations, fuse=False, **changes))
    assert plain.fused is None
    execute(plain)
    fused = build(config(name, iterations, fuse=True, **changes))
    execute(fused)
    return plain, fused


BITWISE = ("x", "v", "slot_of", "k", "schedule", "step_size", "C", "trips", "attempts",
           "swaps", "trace_C", "trace_table")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_eager_chunks_equal_the_plain_loop(name):
    n = 120 if name != "headline-sgd" else 200
    plain, fused = plain_and_fused(name, n)
    assert fused.fused is not None and fused.fused.chunks >= n // 8 - 2
    _same_as_plain(plain, fused, name, n)


def test_chunk_fed_other_draws_differs():
    """The chunk consumes the keyed draws: shifting them by one iteration changes the run."""
    run = build(config("rwmh-deo", 64, fuse=True))
    f = run.fused
    orig = f._inputs

    def shifted(k0, U):
        return orig(k0 + 1, U)

    f._inputs = shifted
    execute(run)
    plain = build(config("rwmh-deo", 64))
    execute(plain)
    assert not torch.equal(run.engine.state.x, plain.engine.state.x)


def test_chunks_avoid_checkpoints_callbacks_and_segment_ends():
    run = build(config("rwmh-deo", 100, fuse=True))
    f = run.fused
    assert f.chunk_at(0, 100, (5000, 256)) == 8
    assert f.chunk_at(4, 100, (5000, 256)) == 0  # not aligned
    assert f.chunk_at(96, 100, (5000, 256)) == 0  # would run past the segment's end
    assert f.chunk_at(248, 1000, (5000, 256)) == 8  # ends at 256: the callback sees it
    assert f.chunk_at(8, 100, (12, 0)) == 0  # a checkpoint at 12 falls inside
    assert f.chunk_at(8, 100, (16, 0)) == 8


def test_resume_from_a_checkpoint_is_exact(tmp_path):
    from nrpt.run.folder import read_checkpoint

    whole = build(config("headline-sgd", 160, fuse=True))
    execute(whole)
    part = build(config("headline-sgd", 160, fuse=True), out=tmp_path)

    def stop(engine):
        if engine.k >= 96:
            raise KeyboardInterrupt

    first = execute(part, out=tmp_path, checkpoint_every=40, callback=stop)
    assert first.interrupted
    again = build(config("headline-sgd", 160, fuse=True), out=tmp_path, resume=True)
    execute(again, out=tmp_path, resume=read_checkpoint(tmp_path)[0])
    a, b = outcome(whole), outcome(again)
    for key in BITWISE:
        if key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key


def test_a_chunk_length_from_the_config_and_the_cli():
    assert build(config("rwmh-deo", 32, fuse=16)).fused.unroll == 16
    assert build(config("rwmh-deo", 32, fuse=True)).fused.unroll == 8
    assert build(config("rwmh-deo", 32, fuse=False)).fused is None
    run = build(config("rwmh-deo", 32, fuse=True, burn_in=0))
    execute(run)
    assert run.fused.describe() == {"chunk": 8, "chunks": 4, "compiled": False}
    run = build(config("rwmh-deo", 32, fuse=True))  # a warm-up of 3 = floor(0.1 x 32), then 29
    execute(run)
    assert run.fused.describe() == {"chunk": 8, "chunks": 3, "compiled": False}
    from nrpt.run.config import known_options

    _fuse = known_options()["fuse"].parse  # the --fuse flag's parser, declared with fuse
    assert _fuse("true") is True and _fuse("16") == 16 and _fuse("no") is False
    assert _fuse("auto") == "auto"


def test_auto_is_the_default_and_runs_eager_chunks_where_they_run():
    """fuse = "auto" (the default): eager chunks where why_not allows; the plain loop for
    compile = true (its compiled explorer step), schemes the chunk does not run, explorers
    that do not declare compilable, and user recorders without their own record_block."""
    from nrpt.roles import RecorderBase

    run = build(config("rwmh-deo", 32))
    assert run.fused is not None and not run.fused.compile and run.fused.ragged
    assert run.fused.unroll == 128  # (a small state: R P dim = 36)
    assert run.engine.__class__.__name__ == "PTEngine"
    assert build(config("rwmh-deo", 32, compile=True)).fused is None
    adj = build(RunConfig(target="twenty-five-modes", chains=4, explorer="rwmh", scheme="adj",
                          iterations=10, figures=False))
    assert adj.fused is None  # (no error: auto falls back)
    sl = build(RunConfig(target="twenty-five-modes", explorer="slice", iterations=10,
                         figures=False, fuse="auto"))
    assert sl.fused is None

    class Mine(RecorderBase):  # reads what the plain loop hands it, one iteration at a time
        name = "mine"

        def record(self, it):
            self.last = it.state.x.sum()

    class MineBlock(Mine):
        def record_block(self, block):
            self.blocks = getattr(self, "blocks", 0) + 1

    from nrpt.core.fused import auto

    run = build(config("rwmh-deo", 32, fuse=False))
    assert auto(run)
    run.recorders["mine"] = Mine()
    assert not auto(run)  # a user recorder written for the plain loop: not fused
    run.recorders["mine"] = MineBlock()
    assert auto(run)


def test_why_not_names_the_reason():
    run = build(RunConfig(target="twenty-five-modes", chains=4, explorer="rwmh", scheme="adj",
                          iterations=10, figures=False))
    assert "scheme 'adj'" in why_not(run)
    with pytest.raises(ValueError, match="scheme 'adj'"):
        Fused(run)
    with pytest.raises(ValueError, match="fuse = true cannot run"):
        build(RunConfig(target="twenty-five-modes", chains=4, explorer="rwmh", scheme="adj",
                        iterations=10, figures=False, fuse=True))
    with pytest.raises(ValueError, match="fuse is for explorers"):
        build(RunConfig(target="twenty-five-modes", explorer="slice", fuse=True,
                        iterations=10, figures=False))


def _compiled_matches(name: str, n: int):
    plain = build(config(name, n, fuse=False))
    execute(plain)
    comp = build(config(name, n, fuse=True, compile=True))
    execute(comp)
    assert comp.fused.failed is None and comp.fused.chunks > 0
    a, b = outcome(plain), outcome(comp)
    assert torch.equal(a["slot_of"], b["slot_of"]) and torch.equal(a["trips"], b["trips"])
    assert torch.equal(a["swaps"], b["swaps"])
    for key in ("x", "v", "log_z", "accept_sum", "step_size", "C"):
        if key in a:
            torch.testing.assert_close(b[key], a[key], rtol=1e-9, atol=1e-9, msg=key)
    return comp


@pytest.mark.compile
@pytest.mark.parametrize("saved", ["1", "0"])
def test_compiled_chunks_match_the_plain_loop(saved, monkeypatch):
    # "1": nrpt's saved chunk (AOTInductor, nrpt.core.precompile); "0": torch.compile
    monkeypatch.setenv("NRPT_PRECOMPILE", saved)
    comp = _compiled_matches("rwmh-deo", 48)
    assert (comp.fused.precompiled in ("built", "loaded")) == (saved == "1")


CONFIGS["mala-analytic"] = dict(target="twenty-five-modes", chains=5, systems=2,
                               explorer="mala", scheme="deo-w", window=3, figures=False)


@pytest.mark.compile
def test_a_chunk_torch_compile_cannot_take_falls_back_to_eager_chunks():
    """MALA on a target without analytic gradients calls torch.autograd.grad, which one graph
    (fullgraph) cannot hold: a CompileWarning, then eager chunks, equal to the plain loop."""
    from nrpt.explorers.compiled import CompileWarning

    plain = build(config("mala-deo-w", 32))
    execute(plain)
    comp = build(config("mala-deo-w", 32, fuse=True, compile=True))
    with pytest.warns(CompileWarning, match="autograd"):
        execute(comp)
    assert comp.fused.failed and comp.fused.describe()["compiled"] is False
    assert comp.fused.chunks > 0
    assert torch.equal(outcome(plain)["x"], outcome(comp)["x"])


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.parametrize("name", ["mala-analytic", "headline-sgd"])
def test_compiled_chunks_match_the_plain_loop_slow(name):
    # SGD at large constant learning rates is chaotic: a last-bit difference grows until a
    # deterministic swap decision flips (1e-12 after one chunk, 1e-4 after two), so the headline is
    # compared over its first chunks
    _compiled_matches(name, 48 if name != "headline-sgd" else 16)


def test_float32_rounds_equal_the_plain_loop():
    """Adaptors read the swap and explorer sums between rounds: the block forms must add in
    the plain loop's order in float32 too (a float32 cumsum accumulates in float64)."""
    kw = dict(dtype="float32", rounds=6)
    base = dict(CONFIGS["rwmh-deo"])
    plain = build(RunConfig.from_dict({}, defaults=dict(base, **kw)))
    execute(plain)
    fused = build(RunConfig.from_dict({}, defaults=dict(base, fuse=True, **kw)))
    execute(fused)
    assert fused.fused.chunks > 0
    a, b = outcome(plain), outcome(fused)
    for key in ("x", "schedule", "step_size", "swaps", "accept_sum", "explore"):
        assert torch.equal(a[key], b[key]), key


def test_a_failing_chunk_names_its_iterations_and_keeps_the_state():
    from nrpt.core.loop import RunError

    run = build(config("rwmh-deo", 64, fuse=True, burn_in=0))
    f = run.fused
    body = f._body

    def failing(U, **kw):
        inner = body(U, **kw)

        def fn(carry, inp):
            if run.engine.k == 8:
                raise ValueError("boom")
            return inner(carry, inp)

        return fn

    f._body = failing
    f._lean_body = lambda U, plain: plain  # (the eager chunk's fast form would bypass it)
    with pytest.raises(RunError, match=r"iterations 9-16 \(a fused chunk.*boom"):
        execute(run)
    assert run.engine.k == 8  # the chunk's results were never taken

    run = build(config("rwmh-deo", 64, fuse=True, burn_in=0))

    def dry_run_fails():
        raise ValueError("dry")

    run.fused._record_plan = dry_run_fails
    with pytest.raises(RunError, match="iteration 1 failed: ValueError: dry"):
        execute(run)


class _Capture:
    """Records, per iteration, what recorders read: the per-slot explorer statistics and the
    positions at every slot (``it.slot_x``); fed by the plain loop or, through
    ``IterationBlock.iteration``, by the chunks."""

    name = "capture"

    def __init__(self, P):
        self.slots, self.rows = list(range(P)), []

    def start_segment(self, reset, length=0):
        pass

    def record(self, it):
        self.rows.append((it.explore_accept.clone(), it.nonfinite.clone(),
                          it.slot_x(self.slots).clone(), it.slot_of.clone()))

    def segment_row(self):
        return {}

    def state_dict(self):
        return {}


def _captured(name, n, fuse, **changes):
    run = build(config(name, n, fuse=fuse, **changes))
    cap = _Capture(run.engine.P)
    run.recorders["capture"] = cap
    run.engine.watch(cap.slots)
    if run.fused is not None:
        run.fused.recorders.append(cap)
    execute(run)
    assert len(cap.rows) == n
    return cap.rows


@pytest.mark.parametrize("name", ["rwmh-deo", "headline-sgd", "hmc-seo-n2"])
def test_chunk_gathers_per_block_equal_per_iteration(name, monkeypatch):
    """A chunk gathers the per-slot explorer statistics once per chunk where no adaptor reads
    the iteration (rwmh-deo, hmc-seo-n2; headline-sgd's adaptors read them every iteration),
    and the watched positions from its stacked states on small states
    (``fused.BLOCK_GATHER``; 0: every iteration): the plain loop's numbers bit for bit either
    way.  Negative control: another seed's rows differ."""
    import nrpt.core.fused as fused_mod

    n = 48
    plain = _captured(name, n, False)
    block = _captured(name, n, True)
    monkeypatch.setattr(fused_mod, "BLOCK_GATHER", 0)
    per_it = _captured(name, n, True)
    for got in (block, per_it):
        for a, b in zip(plain, got, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    other = _captured(name, n, True, seed=3)
    assert not all(torch.equal(a[2], b[2]) for a, b in zip(plain, other, strict=True))


def test_auto_chunk_length_follows_the_state_size():
    """``fuse = "auto"``: 128-iteration eager chunks for small states, down to 8 (the draws of
    a chunk, ``U R P dim`` numbers of a kind, stay within AUTO_ELEMENTS)."""
    from nrpt.core.fused import AUTO_ELEMENTS, auto_unroll

    class E:
        def __init__(self, R, P, dim):
            self.R, self.P, self.dim = R, P, dim

    assert auto_unroll(E(1, 16, 2)) == 128
    assert auto_unroll(E(32, 8, 2)) == 128  # mix25: 512 numbers a step
    assert auto_unroll(E(32, 8, 4)) == 128
    assert auto_unroll(E(1, 16, 128)) == 128
    assert auto_unroll(E(1, 16, 1000)) == 128  # 2^21 numbers a kind
    assert auto_unroll(E(1, 16, 10_000)) == 16  # 2.6e6 numbers a kind
    assert auto_unroll(E(1, 16, 10**5)) == 8  # past the bound: the shortest chunk
    for size in (1, 100, 1000, 1024, 1025, 5000, 2**15, 2**15 + 1, 10**6):
        U = auto_unroll(E(1, 1, size))
        assert 8 <= U <= 128 and (U == 8 or U * size <= AUTO_ELEMENTS)


def test_ragged_chunks_end_at_multiples_the_end_and_boundaries():
    run = build(config("rwmh-deo", 100))  # auto: ragged chunks of up to 128
    f = run.fused
    assert f.chunk_at(0, 1000, (5000, 256)) == 128
    assert f.chunk_at(4, 1000, (5000, 256)) == 124  # to the next multiple of 128
    assert f.chunk_at(96, 100, (5000, 256)) == 4  # to the segment's end
    assert f.chunk_at(250, 1000, (5000, 256)) == 6  # the callback at 256 sees its iteration
    assert f.chunk_at(8, 100, (12, 0)) == 4  # a checkpoint at 12
    assert f.chunk_at(99, 100, (12, 0)) == 1
    with pytest.raises(ValueError, match="eager only"):
        Fused(run, unroll=8, compile=True, ragged=True)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_auto_chunks_equal_the_plain_loop(name):
    """The default (ragged eager chunks of up to 128 on small states): the plain loop's
    numbers bit for bit, with a warm-up segment (burn-in 10 %) whose end falls inside a
    chunk's span, checkpoints every 24 iterations and a callback.  Negative control: another
    seed differs."""
    n = 150
    plain = build(config(name, n, fuse=False))
    execute(plain)
    auto = build(config(name, n))
    assert auto.fused is not None and auto.fused.ragged and auto.fused.unroll == 128
    ticks = []
    execute(auto, checkpoint_every=24, callback=lambda eng: ticks.append(eng.k))
    assert auto.fused.chunks >= 7 and ticks
    _same_as_plain(plain, auto, name, n)


def test_auto_chunks_resume_exactly(tmp_path):
    from nrpt.run.folder import read_checkpoint

    whole = build(config("headline-sgd", 600))
    execute(whole)
    part = build(config("headline-sgd", 600), out=tmp_path)

    def stop(engine):
        if engine.k >= 96:  # (at the callback of iteration 256)
            raise KeyboardInterrupt

    first = execute(part, out=tmp_path, checkpoint_every=40, callback=stop)
    assert first.interrupted and part.engine.k == 256
    again = build(config("headline-sgd", 600), out=tmp_path, resume=True)
    ck = read_checkpoint(tmp_path)[0]
    assert ck["engine"]["k"] == 256  # (the checkpoint written at the interrupt)
    execute(again, out=tmp_path, resume=ck)
    assert again.engine.k == 600
    a, b = outcome(whole), outcome(again)
    for key in BITWISE:
        if key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key


def test_large_state_chunks_take_unstacked_draws_and_equal_the_plain_loop():
    """On a state too large for one block of draws (``rng.block_length(R P dim) < U``), an
    eager chunk takes each iteration's draws as made, unstacked: the plain loop's numbers bit
    for bit (MALA: normal and uniform draws, the gradient cache).  Negative control: another
    seed differs."""
    from nrpt import rng

    base = dict(target="gaussian", target_options={"dim": 1100}, chains=8, explorer="mala",
                scheme="deo", figures=False, iterations=40, burn_in=0)
    assert rng.block_length(8 * 1100) < 8
    runs = {}
    for name, fuse in (("plain", False), ("8", True), ("16", 16)):
        run = build(RunConfig.from_dict({}, defaults={**base, "fuse": fuse}))
        execute(run)
        runs[name] = run
    assert runs["8"].fused.chunks == 5 and runs["16"].fused.chunks == 2
    for name in ("8", "16"):
        assert torch.equal(runs[name].engine.state.x, runs["plain"].engine.state.x)
        assert torch.equal(runs[name].recorders["swaps"].explore_sum,
                           runs["plain"].recorders["swaps"].explore_sum)
    other = build(RunConfig.from_dict({}, defaults={**base, "fuse": True, "seed": 4}))
    execute(other)
    assert not torch.equal(other.engine.state.x, runs["plain"].engine.state.x)
