"""Bad inputs of issue 26 that reach past the config: user targets validated on the first call
(dtype, in-place changes, generator use, a gradient where the explorer needs one), boolean CLI
words, NumPy / torch scalars, more than 32,767 chains, and the deep run folder's lock.  Each
case failed on the code before issue 26 (silently accepted, a traceback, or a crash)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nrpt
from nrpt.targets.protocol import TargetError, validate_target


# ------------------------------------------------------------------------------ targets
class Energy:
    """A Gaussian energy; ``how`` breaks it in one way."""

    dim = 2
    name = "broken"

    def __init__(self, how: str = "ok"):
        self.how = how

    def energy(self, x):
        u = 0.5 * (x ** 2).sum(-1)
        if self.how == "numpy":  # computed outside autograd: a zero gradient, silently
            return torch.from_numpy(0.5 * (x.detach().numpy() ** 2).sum(-1))
        if self.how == "detached-plus-zero":  # connected, but the gradient is 0
            return u.detach() + 0.0 * x.sum(-1)
        if self.how == "bool":
            return u > 1.0
        if self.how == "int":
            return u.long()
        if self.how == "complex":
            return u.to(torch.complex128)
        if self.how == "in-place":
            x.mul_(0.5)
            return 0.5 * (x ** 2).sum(-1)
        return u


class Flat:
    """A flat energy: its zero gradient is right (not refused)."""

    dim = 2

    def energy(self, x):
        return torch.zeros(x.shape[0], dtype=x.dtype) + 0.0 * x.sum(-1)


class Geometric:
    dim = 2

    def __init__(self, how: str = "ok"):
        self.how = how
        self._own = torch.Generator().manual_seed(1)

    def log_likelihood(self, x):
        return -0.5 * ((x - 1.0) ** 2).sum(-1)

    def reference_log_prob(self, x):
        return -0.5 * (x ** 2).sum(-1)

    def reference_sample(self, n, generator):
        if self.how == "global-rng":
            return torch.randn(n, self.dim, dtype=torch.float64)
        if self.how == "own-generator":
            return torch.randn(n, self.dim, generator=self._own, dtype=torch.float64)
        if self.how == "constant":
            return torch.zeros(n, self.dim, dtype=torch.float64)
        return torch.randn(n, self.dim, generator=generator, dtype=torch.float64)


TARGET_CASES = [
    # (target, explorer needing a gradient or None, message)
    (Energy("numpy"), "mala", "energy(x) is not connected to x in autograd"),
    (Energy("numpy"), "hmc", "explorer 'hmc' needs the gradient"),
    (Energy("numpy"), "sgd", "supply grad_energy"),
    (Energy("detached-plus-zero"), "mala", "is zero at every probe point"),
    (Energy("bool"), None, "real floating-point values"),
    (Energy("int"), None, "got dtype int64"),
    (Energy("complex"), None, "got dtype complex128"),
    (Energy("in-place"), None, "modified its input x in place"),
    (Geometric("global-rng"), None, "does not draw from its generator"),
    (Geometric("own-generator"), None, "does not draw from its generator"),
    (Geometric("constant"), None, "different seeds gave the same draws"),
]


@pytest.mark.parametrize("target, explorer, message", TARGET_CASES,
                         ids=[f"{getattr(t, 'how', '')}-{e}" for t, e, _ in TARGET_CASES])
def test_a_broken_target_is_refused_on_the_first_call(target, explorer, message):
    with pytest.raises(TargetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_target(target, gradient_for=explorer)


def test_good_targets_pass_and_a_flat_energy_keeps_its_zero_gradient():
    assert validate_target(Energy(), gradient_for="mala") == "temperature"
    assert validate_target(Flat(), gradient_for="mala") == "temperature"
    assert validate_target(Geometric(), gradient_for="hmc") == "geometric"
    # a NumPy energy is fine where no gradient is taken
    assert validate_target(Energy("numpy"), gradient_for=None) == "temperature"


def test_a_numpy_energy_with_mala_is_refused_before_sampling():
    """The issue's case: MALA on a NumPy energy ran as a random walk (same acceptance)."""
    with pytest.raises(TargetError, match="target Energy 'broken': energy"):
        nrpt.sample(Energy("numpy"), explorer="mala", chains=2, iterations=5)
    with pytest.raises(TargetError, match="real floating-point"):
        nrpt.sample(Energy("bool"), chains=2, iterations=5)


# ------------------------------------------------------------------------------ deep lock
DEEP = ["--dataset", "digits", "--chains", "2", "--epochs", "0.2", "--no-progress",
        "--pretrain-epochs", "0", "--batch-size", "64", "--strategy", "loop"]


def test_a_deep_run_folder_in_use_is_refused(tmp_path, capsys):
    """Two `nrpt deep --out D` both ran and mixed their files; a --resume ran beside a run.
    Now the run folder's lock (nrpt.run.folder.RunLock) is held from before cli.json is
    written: here another process's lock is stood in for by this process's own."""
    from nrpt.run import folder as rf
    from nrpt.run.cli import main

    out = tmp_path / "deep"
    out.mkdir()
    with rf.RunLock(out):
        assert main(["deep", *DEEP, "--out", str(out)]) == 2
        assert "is in use by another nrpt process" in capsys.readouterr().err
        assert not (out / "cli.json").exists()  # nothing written
    assert main(["deep", *DEEP, "--out", str(out)]) == 0  # free again: runs
    capsys.readouterr()
    with rf.RunLock(out):
        assert main(["deep", "--resume", str(out), "--no-progress"]) == 2
        assert "is in use by another nrpt process" in capsys.readouterr().err


def test_deep_fit_takes_the_lock(tmp_path):
    from nrpt.deep import fit
    from nrpt.run import folder as rf

    out = tmp_path / "fit"
    out.mkdir()
    x, y = torch.zeros(8, 3), torch.zeros(8, dtype=torch.long)
    with rf.RunLock(out), pytest.raises(rf.RunFolderBusy, match="in use"):
        fit(torch.nn.Linear(3, 2), (x, y), (x, y), chains=2, epochs=1, out=out, batch_size=4,
            pretrain_epochs=0, strategy="loop")
    assert not any(out.iterdir()) or [p.name for p in out.iterdir()] == [".nrpt.lock"]


# ------------------------------------------------------------------------------ many chains
def test_the_index_process_of_more_than_32767_slots_does_not_wrap(tmp_path):
    """int16 wrapped past 32,767 slots (index min -32768, no warning): int32 above."""
    from nrpt.recorders.draws import Draws, index_dtype

    assert index_dtype(32768) == np.int16 and index_dtype(32769) == np.int32
    P = 40000
    d = Draws(2, 1, P, 1, out_dir=tmp_path)
    slot_of = torch.arange(P - 1, -1, -1).reshape(1, P)
    d.initial(slot_of)
    assert d.index.dtype == np.int32 and int(d.index[0].min()) == 0
    assert int(d.index[0].max()) == P - 1


def test_a_run_of_40000_chains_finishes_with_an_exact_index(tmp_path):
    """`--chains 40000` crashed after 290 s (the exact round-trip prediction solved one sparse
    system per slot): now seconds, and the index process holds 0 .. P - 1."""
    P = 40000
    res = nrpt.sample("gaussian", chains=P, iterations=3, out=str(tmp_path / "run"),
                      figures=False, progress=False)
    index = np.load(tmp_path / "run" / "index.npy")
    assert index.dtype == np.int32 and index.shape == (4, 1, P)
    assert all(sorted(row) == list(range(P)) for row in index[:, 0, :])
    assert res.summary["predicted_round_trips_a5_per_1000"] is None  # too many slots to solve
    res = nrpt.resume(str(tmp_path / "run"), iterations=5, progress=False)
    index = np.load(tmp_path / "run" / "index.npy")
    assert index.dtype == np.int32 and index.shape == (6, 1, P)
    assert all(sorted(row) == list(range(P)) for row in index[:, 0, :])


# ------------------------------------------------------------------------------ deep settings
DEEP_BAD = [  # each was accepted (or an OverflowError traceback) before issue 26
    (dict(seed=-1), "seed must be an integer in [0, 2^64)"),
    (dict(lr=float("inf")), "lr must be a finite number > 0"),
    (dict(temperature=float("inf")), "temperature must be a finite number >= 0"),
    (dict(pretrain_epochs=float("inf")), "pretrain_epochs must be a finite number >= 0"),
    (dict(correction=float("nan")), "correction must be a finite number"),
    (dict(sa_scale=0.0), "sa_scale must be a finite number > 0"),  # was "step-size parameter a"
]


@pytest.mark.parametrize("kwargs, message", DEEP_BAD, ids=[str(k) for k, _ in DEEP_BAD])
def test_deep_settings_are_checked(kwargs, message):
    from nrpt.deep import DeepConfig

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")
                       .replace("^", r"\^").replace(")", r"\)")):
        DeepConfig(**kwargs)


def test_deep_settings_take_numpy_and_torch_scalars():
    from nrpt.deep import DeepConfig

    cfg = DeepConfig(chains=np.int64(3), lr_min=np.float32(0.01), epochs=torch.tensor(2.0))
    assert cfg.chains == 3 and type(cfg.chains) is int and cfg.lr_min == 0.01
    assert type(cfg.epochs) is float


def test_the_index_figure_of_more_than_32767_slots(tmp_path):
    """matplotlib's BoundaryNorm failed past 32,767 slots (OverflowError ... int16) in
    index_process.png: `nrpt run --chains 40000` then died after its run."""
    from nrpt.report import figures as plots

    P = 40000
    index = np.stack([np.roll(np.arange(P), k) for k in range(4)])[:, None, :]
    plots.save(plots.index_process(index), tmp_path / "index_process.png")
