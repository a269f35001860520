"""The eager chunk's lean form (``Fused._lean_body``: no online adaptor, Metropolis swaps, a
scheme whose masks depend on no state) gives every number of the chunk it replaces
(``Fused._body``) bit for bit: each chunk of a run is computed both ways from the same carry and
inputs and every output and carried tensor compared with ``torch.equal``, with the swap
bookkeeping on NumPy views (small states on the CPU) and on tensors (``NUMPY_SWAPS_MAX = 0``,
as on a GPU).  Negative control: the lean form fed the next iteration's swap uniforms differs in
the same comparison, either way.
"""

from __future__ import annotations

import pytest
import torch

from nrpt.core import fused as fused_mod
from nrpt.core.loop import execute
from nrpt.run.build import build
from nrpt.run.config import RunConfig

CASES = {
    # temperature ladder, DEO, the default watched slots gathered per chunk
    "rwmh-deo": dict(target="twenty-five-modes", chains=6, systems=3, explorer="rwmh",
                     scheme="deo"),
    # geometric path: the reference slot refreshed every iteration; SEO's coins
    "mala-seo-reference": dict(target="geometric-bimodal", chains=5, systems=2,
                               explorer="mala", scheme="seo"),
    # two explorer steps an iteration (explore's sums), HMC
    "hmc-deo-n2": dict(target="twenty-five-modes", chains=4, systems=2, explorer="hmc",
                       scheme="deo", n_explore=2, leapfrog_steps=3),
    # past SHIFT_MATRIX_MAX slots (the permutation by swap_source, verdicts as booleans) and
    # chunks too large to gather the watched positions per chunk
    "rwmh-65-chains-u32": dict(target="twenty-five-modes", chains=65, systems=4,
                               explorer="rwmh", scheme="deo", fuse=32),
    # a dense preconditioner per slot after the first round (gathered by the flat slot map)
    "mala-deo-dense-metric": dict(target="twenty-five-modes", chains=5, systems=2,
                                  explorer="mala", scheme="deo", precondition="dense",
                                  rounds=7),
    # one chain pair only
    "rwmh-two-chains": dict(target="twenty-five-modes", chains=2, systems=2, explorer="rwmh",
                            scheme="deo"),
}


def _flat(tree, prefix=""):
    """``{path: tensor}`` of a nested dict / tuple / ReplicaState of tensors."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, tuple | list):
        items = enumerate(tree)
    else:  # a ReplicaState
        items = vars(tree).items()
    out = {}
    for k, v in items:
        out.update(_flat(v, f"{prefix}/{k}"))
    return out


def _tally(seen: dict, got, want) -> None:
    """Count a chunk in ``seen["chunks"]`` and add to ``seen["differ"]`` the paths where the
    chunk's ``got`` (carry, outputs) and ``want`` differ in dtype, shape or any bit."""
    a, b = _flat(got), _flat(want)
    assert a.keys() == b.keys()
    seen["chunks"] += 1
    seen["differ"] += [k for k in a if not (a[k].dtype == b[k].dtype and
                                            a[k].shape == b[k].shape and
                                            torch.equal(a[k], b[k]))]


@pytest.fixture(params=["numpy", "torch"])
def ops(request, monkeypatch):
    """The lean chunk's swap bookkeeping on NumPy views (the default here) or on tensors."""
    if request.param == "torch":
        monkeypatch.setattr(fused_mod, "NUMPY_SWAPS_MAX", 0)
    return request.param


def _checked_run(cfg: dict, iterations: int, shift_uniforms: bool = False) -> tuple[int, list]:
    """Run ``cfg`` fused; every chunk computed by the lean and the plain body (the lean one's
    result taken); returns (chunks compared, the keys that differed)."""
    run = build(RunConfig.from_dict({}, defaults=dict(cfg, iterations=iterations,
                                                      figures=False,
                                                      fuse=cfg.get("fuse", True))))
    f = run.fused
    assert f is not None and not f.online
    made = {"lean": 0, "metric": 0}
    lean_body = f._lean_body

    def counting(U, plain):
        made["lean"] += 1
        made["metric"] += f.engine.metric is not None
        return lean_body(U, plain)

    f._lean_body = counting
    seen = {"chunks": 0, "differ": []}
    function = f._function

    def both(U, compiled):
        fn = function(U, compiled)
        plain = f._body(U)

        def run_both(carry, inp):
            lean_inp = inp
            if shift_uniforms:
                lean_inp = dict(inp, uniforms=inp["uniforms"].roll(1, 0))
            new, out = fn(carry, lean_inp)
            _tally(seen, (new, out), plain(carry, inp))
            return new, out

        return run_both

    f._function = both
    execute(run)
    assert made["lean"] > 0, "the lean body was not used"
    assert made["metric"] > 0 or "precondition" not in cfg, "no chunk had a metric"
    return seen["chunks"], seen["differ"]


@pytest.mark.parametrize("name", list(CASES))
def test_lean_chunk_is_the_plain_chunk(name, ops):
    chunks, differ = _checked_run(CASES[name], 150)
    assert chunks >= 3
    assert differ == [], differ


def test_lean_chunk_ops_namespace(monkeypatch):
    # the bookkeeping runs on NumPy views up to NUMPY_SWAPS_MAX replicas on the CPU, else on
    # the tensors (the fixture's "torch" case is the GPU's path)
    seen = []
    real = fused_mod._NUMPY.array

    def spy(t):
        seen.append(True)
        return real(t)

    monkeypatch.setattr(fused_mod, "_NUMPY", fused_mod._NUMPY._replace(array=spy))
    _checked_run(CASES["rwmh-deo"], 20)
    assert seen
    seen.clear()
    monkeypatch.setattr(fused_mod, "NUMPY_SWAPS_MAX", 17)  # (3 systems x 6 chains = 18)
    _checked_run(CASES["rwmh-deo"], 20)
    assert not seen
    # ... and on states of at most NUMPY_STATE_MAX numbers (R P dim: 18 x 2 = 36 here)
    monkeypatch.setattr(fused_mod, "NUMPY_SWAPS_MAX", 4096)
    monkeypatch.setattr(fused_mod, "NUMPY_STATE_MAX", 35)
    _checked_run(CASES["rwmh-deo"], 20)
    assert not seen
    monkeypatch.setattr(fused_mod, "NUMPY_STATE_MAX", 36)
    _checked_run(CASES["rwmh-deo"], 20)
    assert seen


def test_lean_chunk_comparison_has_power(ops):
    # the lean body fed the wrong iteration's uniforms: its verdicts differ
    _, differ = _checked_run(CASES["rwmh-deo"], 150, shift_uniforms=True)
    assert any("decision" in k or "accepted" in k for k in differ), differ


def test_lean_chunk_needs_a_state_free_scheme():
    # DEO_W with a window > 1 gates on the swaps made: no block_active, the plain chunk runs
    from nrpt.swap.schemes import DEOW, SEO

    pairs = fused_mod.adjacent_pairs(2, 5, "cpu")
    assert fused_mod.block_active(DEOW(3), pairs, {"odd": torch.tensor([True, False])},
                                  2) is None
    odd = torch.tensor([True, False, False])
    got = fused_mod.block_active(DEOW(1), pairs, {"odd": odd}, 3)
    want = torch.stack([DEOW(1).block_phase(pairs, {"odd": odd}, u, {})[0] for u in range(3)])
    assert torch.equal(got, want)
    coins = torch.tensor([[[True], [False]], [[False], [False]]])
    got = fused_mod.block_active(SEO(), pairs, {"coins": coins}, 2)
    want = torch.stack([SEO().block_phase(pairs, {"coins": coins}, u, {})[0] for u in range(2)])
    assert torch.equal(got, want)

    class Mine(SEO):  # overrides block_phase only: its block_active is not trusted
        def block_phase(self, pairs, inputs, u, state):
            return super().block_phase(pairs, inputs, u, state)

    assert fused_mod.block_active(Mine(), pairs, {"coins": coins}, 2) is None


def test_lean_chunk_checks_its_steps_took_every_draw():
    # the chunk's draws are replayed by one cursor: a plan with a draw no step takes (as if a
    # step's draws depended on the state) is caught at the chunk's end (one iteration here: a
    # longer chunk's next step would take the stray draw first and most likely fail on its
    # shape before that)
    run = build(RunConfig.from_dict({}, defaults=dict(CASES["rwmh-deo"], iterations=16,
                                                      figures=False, fuse=True)))
    execute(run)
    f = run.fused
    U = 1
    with torch.inference_mode():
        f._function(U, False)(f._carry(), f._inputs(run.engine.k, U))  # as planned: fine
        f.plan = [*f.plan, f.plan[-1]]
        f._fns = {}
        with pytest.raises(RuntimeError, match="took .* of its"):
            f._function(U, False)(f._carry(), f._inputs(run.engine.k, U))
