"""Stan programs as nrpt targets: :func:`from_stan` (README "Stan models").

A state ``x`` ``[n, dim]`` is Stan's unconstrained parameter vector (``dim`` =
``num_params_r``, the order of :attr:`StanTarget.coordinate_names`).  The target is a
temperature-form target: ``energy = -(log density with the log-Jacobian of the constraining
transforms)``, Stan's full density (``propto=False``: constants kept), its gradient Stan's
reverse mode (``analytic_gradients = True``), all evaluated in one C++ loop over the batch by
nrpt's own bridge (:mod:`nrpt.targets.stan.build`; the program is compiled once and cached).
A state where Stan throws (a constraint violated, a NaN) has energy ``+inf`` and a zero
gradient.  :meth:`StanTarget.model_variables` gives the constrained parameters (and
transformed parameters; generated quantities with ``generated_quantities=True``) under Stan's
names and shapes, for ``posterior.nc``.  :meth:`StanTarget.nuts` runs Stan's own NUTS
(``hmc_nuts_diag_e_adapt``) on the same compiled model: the baseline of the benchmarks."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nrpt.targets._util import check_generator
from nrpt.targets.protocol import TargetError
from nrpt.targets.stan.build import StanCompileError, compile_model, load_module

__all__ = ["StanCompileError", "StanTarget", "bracket_name", "data_json", "from_stan",
           "program_text"]


def program_text(program: str | os.PathLike) -> tuple[str, str | None]:
    """``(program text, file stem or None)``: ``program`` is a path to a ``.stan`` file (an
    existing file, or any string ending in ``.stan`` without a newline) or the program text."""
    if isinstance(program, os.PathLike) or (
            isinstance(program, str) and "\n" not in program and "{" not in program):
        path = Path(program).expanduser()
        if not path.is_file():
            raise TargetError(f"from_stan: program={str(program)!r} is not a file (give a path "
                              f"to a .stan file or the program text itself)")
        return path.read_text(), path.stem
    if not isinstance(program, str):
        raise TargetError(f"from_stan: program must be a path to a .stan file or the program "
                          f"text; got {type(program).__name__}")
    return program, None


def _jsonable(value: Any, key: str) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "b":
            value = value.astype(np.int64)
        if value.dtype.kind not in "iuf":
            raise TargetError(f"from_stan: data[{key!r}] has dtype {value.dtype}; Stan data "
                              f"are ints and reals")
        return value.tolist()  # ints stay ints, floats stay floats
    if isinstance(value, (np.integer, bool, np.bool_)):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, key) for v in value]
    if isinstance(value, (int, float)):
        return value
    raise TargetError(f"from_stan: data[{key!r}] is a {type(value).__name__}; give numbers, "
                      f"lists or arrays")


def data_json(data: Any) -> tuple[str, str | None]:
    """``(Stan JSON text, path of the data file or None)`` of ``data``: ``None`` (no data), a
    dict, or a path to a JSON file (read as it is: its ints stay ints)."""
    if data is None:
        return "{}", None
    if isinstance(data, dict):
        return json.dumps({str(k): _jsonable(v, str(k)) for k, v in data.items()}), None
    if isinstance(data, (str, os.PathLike)):
        path = Path(data).expanduser()
        if not path.is_file():
            raise TargetError(f"from_stan: data={str(data)!r} is not a file (give a dict or a "
                              f"path to a JSON data file)")
        text = path.read_text()
        try:
            parsed = json.loads(text)
        except ValueError as e:
            raise TargetError(f"from_stan: the data file {path} is not JSON: {e}") from e
        if not isinstance(parsed, dict):
            raise TargetError(f"from_stan: the data file {path} holds a JSON "
                              f"{type(parsed).__name__}, not an object of named values")
        return text, str(path)
    raise TargetError(f"from_stan: data must be None, a dict or a path to a JSON file; got "
                      f"{type(data).__name__}")


def bracket_name(name: str) -> str:
    """Stan's flat name ``"theta.1.2"`` as ``"theta[1,2]"`` (a scalar's name unchanged)."""
    head, *idx = name.split(".")
    return f"{head}[{','.join(idx)}]" if idx else head


def from_stan(program: str | os.PathLike, data: Any = None, *, seed: int = 0,
              generated_quantities: bool = False) -> StanTarget:
    """An nrpt target for a Stan program (see the module docstring).

    Args:
        program: a path to a ``.stan`` file, or the program text.
        data: ``None``, a dict (arrays, lists, numbers: integer arrays stay ints) or a path to
            a JSON data file (posteriordb's format, CmdStan's).
        seed: the seed Stan's model constructor gets (programs that draw in transformed data).
        generated_quantities: include generated quantities in :meth:`StanTarget.model_variables`
            (and so in ``posterior.nc``); they are drawn from a generator seeded per call.

    Raises:
        StanCompileError: stanc or the C++ compiler refused the program (their message), or
            httpstan / a C++ compiler is missing.
        TargetError: the data do not fit the program (Stan's message).
    """
    return StanTarget(program, data, seed=seed, generated_quantities=generated_quantities)


class StanTarget:
    """A compiled Stan program with its data; build it with :func:`from_stan`."""

    analytic_gradients = True
    #: a Stan program is one density (prior and likelihood mixed, flat priors allowed), so a
    #: run that names no reference anneals it from a Gaussian fitted between rounds
    #: (:mod:`nrpt.paths.gaussian_reference`): exact at the hot end, proper where a tempered
    #: flat-prior density is not, and log Z absolute
    default_reference = "gaussian"
    #: what ``nrpt.sample(from_stan(...), rounds=N)`` uses when no explorer is chosen:
    #: gradient moves (Stan's reverse mode) with a per-slot dense/diagonal preconditioner, the
    #: combination that passed the badly scaled posteriordb models (docs/posteriordb.md):
    #: MALA, switched to HMC without a metric where slot 0 cannot enter a funnel's neck
    #: (``mala-hmc``: gp_pois_regr; MALA draw for draw where the check never fires,
    #: docs/gaussian_reference.md); and a ladder fitted to the barrier in both directions
    #: between rounds (chains = "auto" from 8, min_chains 2: about 1 + 2 Λ̂ chains; a
    #: posterior with a small barrier, e.g. low_dim_gauss_mix's Λ̂ ≈ 0.35, runs 2 chains
    #: instead of 10)
    default_settings = {"explorer": "mala-hmc", "precondition": "auto", "chains": "auto",
                        "min_chains": 2}

    def __init__(self, program, data=None, *, seed: int = 0,
                 generated_quantities: bool = False) -> None:
        self.program, stem = program_text(program)
        self.data_json, self.data_path = data_json(data)
        self.program_sha256 = hashlib.sha256(self.program.encode()).hexdigest()
        self.data_sha256 = hashlib.sha256(self.data_json.encode()).hexdigest()
        self.so_path, self.build_info = compile_model(self.program, stem)
        self._module = load_module(self.so_path)
        try:
            self._model = self._module.StanModel(self.data_json, int(seed))
        except ValueError as e:
            raise TargetError(f"from_stan: Stan could not build the model from the data: "
                              f"{e}") from e
        self.dim = int(self._model.dim)
        if self.dim < 1:
            raise TargetError("from_stan: the program has no parameters to sample")
        self.generated_quantities = bool(generated_quantities)
        self.model_name = self._model.name
        #: names the program and the data (resuming a run refuses a changed program or data)
        self.name = f"stan:{self.model_name}:{self.program_sha256[:12]}:{self.data_sha256[:12]}"
        self.coordinate_names = list(self._model.unconstrained_names())
        self._layout = self._variables(True, self.generated_quantities)
        self.model_dims: dict[str, list[str]] = {}
        self.model_coords: dict[str, list] = {}
        self._gq_calls = 0

    # ----------------------------------------------------------------------- names, shapes
    def _variables(self, tparams: bool, gqs: bool) -> list[tuple[str, tuple[int, ...]]]:
        names, dims = self._model.variables(tparams, gqs)
        flat = self._model.param_names(tparams, gqs)
        layout = [(n, tuple(int(d) for d in ds)) for n, ds in zip(names, dims, strict=True)]
        if sum(math.prod(s) for _, s in layout) != len(flat):  # (tuples: flat names instead)
            layout = [(n, ()) for n in flat]
        return layout

    @property
    def variables(self) -> dict[str, tuple[int, ...]]:
        """``{Stan variable: constrained shape}`` of :meth:`model_variables`' variables."""
        return dict(self._layout)

    @property
    def parameter_names(self) -> list[str]:
        """Stan's flat constrained parameter names (``"theta.1"``, ...), parameters only."""
        return list(self._model.param_names(False, False))

    # ----------------------------------------------------------------------- densities
    def _array(self, x, who: str) -> np.ndarray:
        if isinstance(x, torch.Tensor):
            a = x.detach().to(device="cpu", dtype=torch.float64).numpy()
        else:
            a = np.asarray(x, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != self.dim:
            raise ValueError(f"{who} expects x of shape [n, {self.dim}]; got {list(a.shape)}")
        return np.ascontiguousarray(a)

    @staticmethod
    def _out(a: np.ndarray, x) -> torch.Tensor:
        t = torch.from_numpy(np.asarray(a, dtype=np.float64))
        if isinstance(x, torch.Tensor):
            dtype = x.dtype if x.is_floating_point() else torch.float64
            return t.to(dtype=dtype, device=x.device)
        return t

    def log_density(self, x, *, jacobian: bool = True, propto: bool = False) -> np.ndarray:
        """Stan's log density at the unconstrained states ``x`` ``[n, dim]``, ``[n]`` numpy
        (``-inf`` where Stan throws)."""
        return self._model.log_density(self._array(x, "log_density"), jacobian, propto)

    def log_density_grad(self, x, *, jacobian: bool = True,
                         propto: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(log density [n], its gradient [n, dim])``, numpy."""
        return self._model.log_density_grad(self._array(x, "log_density_grad"), jacobian,
                                            propto)

    def energy(self, x) -> torch.Tensor:
        """``-(log density with Jacobian)`` ``[n]`` (``+inf`` where Stan throws)."""
        return self._out(-self._model.log_density(self._array(x, "energy"), True, False), x)

    def energy_and_grad(self, x) -> tuple[torch.Tensor, torch.Tensor]:
        """``(energy [n], its gradient [n, dim])`` in one pass of Stan's reverse mode."""
        lp, g = self._model.log_density_grad(self._array(x, "energy_and_grad"), True, False)
        return self._out(-lp, x), self._out(-g, x)

    def grad_energy(self, x) -> torch.Tensor:
        """Gradient of :meth:`energy`, ``[n, dim]``."""
        return self.energy_and_grad(x)[1]

    #: Stan's own number of tries for a random initial state (``stan::services::util::
    #: initialize``): each state is redrawn until its log density and gradient are finite
    INIT_TRIES = 100
    #: Stan's default init radius: ``uniform(-INIT_RADIUS, INIT_RADIUS)`` unconstrained
    INIT_RADIUS = 2.0

    def initial_states(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Stan's default inits: iid ``uniform(-2, 2)`` on the unconstrained space, each state
        redrawn (from ``generator``, up to :attr:`INIT_TRIES` draws in all, as Stan does) until
        its log density and gradient are finite; a state still bad after that is a
        :class:`TargetError` naming the model.  States finite at the first draw are the first
        draw (a redraw touches only the bad rows)."""
        g = check_generator(generator)
        n, r = int(n), self.INIT_RADIUS

        def draw(k: int) -> torch.Tensor:
            u = torch.rand(k, self.dim, generator=g, dtype=torch.float64, device=g.device)
            return 2.0 * r * u - r

        x = draw(n)
        bad = ~self._finite_at(x)
        for _ in range(self.INIT_TRIES - 1):
            if not bad.any():
                return x
            x[bad] = draw(int(bad.sum()))
            bad[bad.clone()] = ~self._finite_at(x[bad])
        if bad.any():
            lp, _ = self.log_density_grad(x[bad][:1])
            raise TargetError(
                f"from_stan: model {self.model_name!r}: {int(bad.sum())} of {n} initial "
                f"state(s) had no finite log density and gradient after {self.INIT_TRIES} "
                f"draws from uniform(-{r:g}, {r:g}) on the unconstrained space (Stan's own "
                f"init and number of tries; last log density {float(lp[0])}): the program's "
                f"density is -inf or NaN on most of that box; pass initial_states to the "
                f"engine or reparameterise the program")
        return x

    def _finite_at(self, x: torch.Tensor) -> torch.Tensor:
        """``[n]`` bool: the log density (plain evaluation, as :meth:`energy` computes it) and
        the log density and gradient of reverse mode are finite at ``x`` (Stan's test for an
        acceptable initial state: the two can differ, e.g. an ODE solver's step control)."""
        lp, g = self.log_density_grad(x)
        ok = np.isfinite(self.log_density(x)) & np.isfinite(lp) & np.isfinite(g).all(axis=1)
        return torch.from_numpy(ok).to(x.device)

    # ------------------------------------------------------------------ constrained values
    def write_array(self, x, *, transformed_parameters: bool = True,
                    generated_quantities: bool = False, seed: int = 0) -> np.ndarray:
        """Stan's constrained values at ``x``: ``[n, k]`` in the order of
        :meth:`constrained_names` (NaN rows where Stan throws)."""
        return self._model.write_array(self._array(x, "write_array"), transformed_parameters,
                                       generated_quantities, int(seed))

    def constrained_names(self, *, transformed_parameters: bool = True,
                          generated_quantities: bool = False,
                          brackets: bool = False) -> list[str]:
        """Stan's flat names of :meth:`write_array`'s columns: ``"theta.1.2"`` (Stan's own
        form), or with ``brackets=True`` ``"theta[1,2]"`` (posteriordb's and CmdStan-py's)."""
        names = self._model.param_names(transformed_parameters, generated_quantities)
        return [bracket_name(n) for n in names] if brackets else list(names)

    def model_variables(self, x) -> dict[str, np.ndarray]:
        """``{Stan variable: constrained values [n, *shape]}`` at ``x``: parameters, transformed
        parameters (and generated quantities when asked), in declaration order."""
        seed = self._gq_calls
        self._gq_calls += 1
        flat = self.write_array(x, transformed_parameters=True,
                                generated_quantities=self.generated_quantities, seed=seed)
        n = flat.shape[0]
        out, start = {}, 0
        for name, shape in self._layout:
            size = math.prod(shape)
            block = flat[:, start:start + size]
            start += size
            if shape:  # Stan's flat order is column-major
                block = block.reshape(n, *shape[::-1]).transpose(0, *range(len(shape), 0, -1))
            else:
                block = block.reshape(n)
            out[name] = np.ascontiguousarray(block)
        return out

    def unconstrain(self, values: dict[str, Any] | np.ndarray) -> np.ndarray:
        """Constrained parameter values -> unconstrained states ``[n, dim]``: a dict
        ``{parameter: [n, *shape]}`` or an array ``[n, k]`` in the order of
        :attr:`parameter_names`."""
        if isinstance(values, dict):
            layout = self._variables(False, False)
            missing = [nm for nm, _ in layout if nm not in values]
            if missing:
                raise ValueError(f"unconstrain: values for {missing} missing")
            cols = []
            for nm, shape in layout:
                v = np.asarray(values[nm], dtype=np.float64)
                v = v.reshape(-1, *shape) if shape else v.reshape(-1, 1)
                n = v.shape[0]
                cols.append(v.transpose(0, *range(len(shape), 0, -1)).reshape(n, -1)
                            if shape else v)
            arr = np.concatenate(cols, axis=1)
        else:
            arr = np.asarray(values, dtype=np.float64)
            if arr.ndim == 1:
                arr = arr[None]
        try:
            return self._model.unconstrain(np.ascontiguousarray(arr))
        except ValueError as e:
            raise ValueError(f"unconstrain: {e}") from e

    # ---------------------------------------------------------------------- Stan's NUTS
    def nuts(self, *, chains: int = 4, warmup: int = 1000, draws: int = 1000, seed: int = 1,
             max_depth: int = 10, delta: float = 0.8, thin: int = 1,
             max_seconds: float | None = None) -> dict[str, Any]:
        """Stan's NUTS (``hmc_nuts_diag_e_adapt``, Stan's defaults: random inits uniform(-2, 2)
        unconstrained, diagonal metric adapted in windows 75/25/50) on this model; chains run
        one after another, chain ``c`` with Stan's chain id ``c + 1`` and ``seed``.

        ``max_seconds``: a wall-time budget for the whole call, ``max_seconds / chains`` per
        chain; a chain out of time stops where it is (``"stopped"``), and every chain's draws
        are cut to the shortest chain's (none if one was still warming up).

        Returns ``{"draws": {column: [chains, draws]}, "names", "seconds": [per chain],
        "stopped": [per chain], "messages": [per chain]}``: the columns are the sampler's
        (``lp__`` (constants dropped), ``accept_stat__``, ``stepsize__``, ``treedepth__``,
        ``n_leapfrog__`` (gradient evaluations), ``divergent__``, ``energy__``) then Stan's
        constrained names (``theta.1``; :func:`bracket_name` gives ``theta[1]``)."""
        for k, v in (("chains", chains), ("draws", draws), ("thin", thin),
                     ("max_depth", max_depth)):
            if int(v) < 1:
                raise ValueError(f"nuts: {k} must be >= 1; got {v}")
        if int(warmup) < 0:
            raise ValueError(f"nuts: warmup must be >= 0; got {warmup}")
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"nuts: delta (target acceptance) must be in (0, 1); got {delta}")
        if max_seconds is not None and not float(max_seconds) > 0:
            raise ValueError(f"nuts: max_seconds must be > 0 or None; got {max_seconds}")
        per_chain = 0.0 if max_seconds is None else float(max_seconds) / int(chains)
        r = self._model.nuts(int(chains), int(warmup), int(draws), int(seed), int(max_depth),
                             float(delta), int(thin), per_chain)
        n = min(a.shape[0] for a in r["draws"])
        arr = np.stack([a[:n] for a in r["draws"]])  # [chains, draws, columns]
        names = list(r["names"])
        return {"names": names, "draws": {nm: arr[:, :, j] for j, nm in enumerate(names)},
                "seconds": list(r["seconds"]), "stopped": [bool(b) for b in r["stopped"]],
                "messages": [list(m) for m in r["messages"]]}

    def __repr__(self) -> str:
        return f"StanTarget({self.model_name!r}, dim={self.dim})"
