"""PyMC models as nrpt targets: :func:`from_pymc` (described in docs/pymc.md).

A state ``x`` is the raveled value variables (after default transforms) concatenated in
``model.free_RVs`` order; :attr:`PyMCTarget.layout` gives ``(name, slice, shape)`` per block.
``path="prior"``: geometric path, ``reference_log_prob`` = the prior with log-Jacobians
(normalized: absolute ``log Z``), ``log_likelihood`` = the observed variables,
``reference_sample`` = forward sampling seeded from ``generator`` alone (refused with
``pm.Potential`` or a free variable depending on an observed one).  ``path="temperature"``:
``energy`` = minus the joint log density with Jacobian.  Gradients are PyTensor's
(``analytic_gradients = True``); functions are compiled once, vectorized over the batch or a
per-state loop (:attr:`PyMCTarget.vectorized`).  Computes in float64, returns tensors in the
input's dtype and device; not thread-safe."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import torch

from nrpt.targets._util import check_generator
from nrpt.targets.protocol import TargetError

__all__ = ["PyMCTarget", "PyMCPriorTarget", "PyMCTemperatureTarget", "from_pymc", "PATHS"]

#: the allowed values of ``from_pymc(path=...)``
PATHS = ("prior", "temperature")

_INSTALL = "pip install nrpt[pymc]"


def _import_pymc():
    """``(pymc, pytensor, pytensor.tensor)``, or an ImportError that says how to install."""
    try:
        pm = importlib.import_module("pymc")
        pytensor = importlib.import_module("pytensor")
        pt = importlib.import_module("pytensor.tensor")
    except ImportError as e:
        raise ImportError(f"nrpt.targets.from_pymc needs PyMC (>= 5.10), which is not "
                          f"installed: {_INSTALL}  (import failed: {e})") from e
    return pm, pytensor, pt


def _compile(pm, inputs, outputs, **kwargs):
    """``pm.compile`` without PyTensor's advisory that it found no BLAS to link (the models
    here are small; the advice is about speed of large matrix products, not correctness)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*could not link to a BLAS")
        return pm.compile(inputs, outputs, **kwargs)


def from_pymc(model, *, path: str = "prior", vectorize: bool | None = None) -> PyMCTarget:
    """An nrpt target for the PyMC model ``model`` (see the module docstring).

    Args:
        model: a ``pymc.Model`` with continuous free variables.
        path: ``"prior"`` (geometric path prior -> posterior, absolute ``log Z``) or
            ``"temperature"`` (temperature ladder on the joint density).
        vectorize: ``None`` (default) vectorizes the compiled graphs over the batch and falls
            back to a per-state loop if that fails; ``True`` requires vectorizing; ``False``
            uses the loop.
    """
    cls = {"prior": PyMCPriorTarget, "temperature": PyMCTemperatureTarget}.get(path, PyMCTarget)
    return cls(model, path=path, vectorize=vectorize)


def _to_numpy(x, dim: int, who: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        a = x.detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != dim:
        raise ValueError(f"{who} expects x of shape [n, {dim}]; got {list(a.shape)}")
    return np.ascontiguousarray(a)


def _to_torch(a: np.ndarray, x) -> torch.Tensor:
    t = torch.from_numpy(np.array(a, dtype=np.float64))  # a copy: results may be read-only
    if isinstance(x, torch.Tensor):
        dtype = x.dtype if x.is_floating_point() else torch.float64
        return t.to(dtype=dtype, device=x.device)
    return t


def _vectorized_or_loop(vectorize: bool | None, what: str, loop_name: str, fallback: str,
                        batched, loop):
    """``batched()``, or ``loop()`` where vectorizing is switched off (``vectorize=False``) or
    fails (``vectorize=None``: with a warning that ``fallback`` is done; ``vectorize=True``:
    a :class:`TargetError`)."""
    error = None
    if vectorize is not False:
        try:
            return batched()
        except Exception as e:  # noqa: BLE001 -- an op without a batched form: the loop
            error = e
            if vectorize:
                raise TargetError(f"from_pymc: the {what} could not be vectorized over a batch "
                                  f"({type(e).__name__}: {e}); use vectorize=None or False for "
                                  f"the {loop_name} loop") from e
    out = loop()
    if error is not None:
        warnings.warn(f"from_pymc: the {what} could not be vectorized ({type(error).__name__}: "
                      f"{error}); {fallback}", RuntimeWarning, stacklevel=5)
    return out


class _Batched:
    """A compiled function of a flat state vector, evaluated on a batch ``[n, dim]``; results
    ``[n, *core_shape]``.  Vectorized (one call; state-independent outputs broadcast) or a
    per-state loop; ``x0`` is evaluated once for shapes.  ``grad=True`` appends each scalar
    output's gradient, taken after vectorizing as the gradient of the batch's sum."""

    def __init__(self, pm, pt, flat, x0: np.ndarray, outputs, vectorize: bool | None,
                 what: str, grad: bool = False):
        outputs = list(outputs)
        if grad:
            outputs = outputs + [pt.grad(o, flat) for o in outputs]
        ndims = [o.type.ndim for o in outputs]
        n_values = len(outputs) // 2 if grad else len(outputs)

        def batched():
            return True, *self._compile_batched(pm, pt, flat, x0, outputs[:n_values], ndims,
                                                what, grad)

        def loop():
            fn = _compile(pm, [flat], outputs, on_unused_input="ignore")
            return False, fn, [np.shape(r) for r in fn(x0)]

        self.vectorized, self._fn, self.core_shapes = _vectorized_or_loop(
            vectorize, f"{what} graph", "per-state", "evaluating states one at a time",
            batched, loop)

    @staticmethod
    def _compile_batched(pm, pt, flat, x0, values, ndims, what, grad):
        """``(function of a batch [n, dim], the outputs' core shapes)``; checked on 2 states."""
        from pytensor.graph.replace import vectorize_graph

        xb = pt.matrix(f"{what}_batch", dtype="float64")
        outs = list(vectorize_graph(values, replace={flat: xb}))
        if grad:
            outs = outs + [pt.grad(o.sum(), xb) for o in outs]
        fn = _compile(pm, [xb], outs, on_unused_input="ignore")
        shapes = []
        for r, nd in zip(fn(np.stack([x0, x0])), ndims, strict=True):
            r = np.asarray(r)
            if r.ndim == nd + 1 and r.shape[0] != 2:
                raise ValueError(f"batch axis of length {r.shape[0]}, not 2")
            shapes.append(r.shape[1:] if r.ndim == nd + 1 else r.shape)
        return fn, shapes

    def __call__(self, a: np.ndarray) -> list[np.ndarray]:
        n = a.shape[0]
        if self.vectorized:
            res = self._fn(a)
            return [np.broadcast_to(np.asarray(r, dtype=np.float64), (n, *s))
                    for r, s in zip(res, self.core_shapes, strict=True)]
        out = [np.empty((n, *s)) for s in self.core_shapes]
        for i in range(n):
            for o, r in zip(out, self._fn(a[i]), strict=True):
                o[i] = r
        return out


def _toposort(outputs) -> list:
    try:
        from pytensor.graph.traversal import toposort
    except ImportError:  # pytensor < 2.32
        from pytensor.graph.basic import graph_inputs, io_toposort

        return io_toposort(list(graph_inputs(outputs)), list(outputs))
    return list(toposort(outputs))


def _vectorize_draws(pt, outputs, n, vect: dict | None = None, done: set | None = None) -> dict:
    """``{variable of the one-draw forward graph: its version batched over a leading axis n}``
    for every variable that depends on a random draw; symbolic random variables without a
    batched form are inlined.  Raises if some node has no batched form."""
    from pytensor.graph.replace import clone_replace, vectorize_graph
    from pytensor.tensor.random.op import RandomVariable

    vect = {} if vect is None else vect
    done = set() if done is None else done
    for node in _toposort(outputs):
        if node in done:
            continue
        done.add(node)
        ins = [vect.get(i, i) for i in node.inputs]
        batched = [i in vect for i in node.inputs]
        if isinstance(node.op, RandomVariable):
            outs = _batch_random_variable(pt, node, ins, batched, n)
        elif _is_symbolic_rv(node.op):
            try:
                if any(batched):
                    outs = vectorize_graph(list(node.outputs),
                                           dict(zip(node.inputs, ins, strict=True)))
                else:
                    outs = _resize_root(node, n)
            except Exception:  # noqa: BLE001 -- no batched form: inline its inner graph
                inner = clone_replace(list(node.op.inner_outputs),
                                      replace=dict(zip(node.op.inner_inputs, node.inputs,
                                                         strict=True)))
                _vectorize_draws(pt, inner, n, vect, done)
                outs = [vect.get(v, v) for v in inner]
        elif any(batched):  # this node alone: every input replaced (most by itself)
            outs = vectorize_graph(list(node.outputs), dict(zip(node.inputs, ins, strict=True)))
        else:
            continue
        for o, v in zip(node.outputs, outs, strict=True):
            vect[o] = v
    return vect


def _is_symbolic_rv(op) -> bool:
    try:
        from pymc.distributions.distribution import SymbolicRandomVariable
    except ImportError:
        return False
    return isinstance(op, SymbolicRandomVariable)


def _resize_root(node, n) -> list:
    """A root PyMC symbolic random variable (no random parent) drawn ``n`` times: its size
    expanded by a leading ``n`` (:func:`pymc.distributions.shape_utils.change_dist_size`);
    the outputs of the new node, in the order of ``node.outputs``."""
    from pymc.distributions.shape_utils import change_dist_size

    rv = node.outputs[node.op.default_output] if node.op.default_output is not None else None
    if rv is None:
        raise ValueError(f"{node.op} has no default output to resize")
    new = change_dist_size(rv, (n,), expand=True)
    if len(new.owner.outputs) != len(node.outputs):
        raise ValueError(f"resizing {node.op} changed its outputs")
    return list(new.owner.outputs)


def _batch_random_variable(pt, node, ins, batched, n) -> list:
    """The outputs of ``node`` redrawn once per row of a batch of ``n``: batched parameters padded
    to line row i up with draw i; size ``(n, *old size)``, none if a parameter is batched, else
    ``(n, *broadcast batch shape)``; same shared rng."""
    from pytensor.tensor.random.utils import compute_batch_shape
    from pytensor.tensor.type_other import NoneTypeT

    op = node.op
    rng, _size, *params = ins
    if batched[0] or batched[1]:
        raise ValueError(f"{op}: a random generator or size that depends on a random draw")
    old_params = op.dist_params(node)
    old_size = op.size_param(node)
    rv = node.outputs[op.default_output]
    batch_ndim = rv.type.ndim - op.ndim_supp
    new_params = []
    for p, old, b, core in zip(params, old_params, batched[2:], op.ndims_params, strict=True):
        if b:
            missing = batch_ndim - (old.type.ndim - core)
            if p.type.ndim != old.type.ndim + 1 or missing < 0:
                raise ValueError(f"{op}: a parameter with more than one batch axis")
            if missing:
                p = p.dimshuffle(0, *(["x"] * missing), *range(1, p.type.ndim))
        new_params.append(p)
    nvec = pt.atleast_1d(n).astype("int64")
    if not isinstance(old_size.type, NoneTypeT):
        size = pt.concatenate([nvec, pt.as_tensor_variable(old_size).astype("int64")])
    elif any(batched[2:]):
        size = old_size
    else:
        shape = compute_batch_shape(old_params, op.ndims_params)
        size = pt.concatenate([nvec, pt.as_tensor_variable(shape).astype("int64")])
    from pytensor.tensor.random.basic import DirichletRV

    if isinstance(op, DirichletRV):
        outs = _batched_dirichlet(pt, rng, size, new_params[0])
    else:
        outs = list(op.make_node(rng, size, *new_params).outputs)
    if outs[op.default_output].type.ndim != rv.type.ndim + 1:
        raise ValueError(f"{op}: the batched draw has no extra leading axis")
    return outs


def _batched_dirichlet(pt, rng, size, alpha) -> list:
    """``[next rng, Dirichlet(alpha) draws]`` for a batch, as ``softmax(log G)`` with
    ``log G_i = log Gamma(alpha_i + 1) + log(U_i) / alpha_i`` (exact; finite for small
    ``alpha_i``); one generator chained through both draws."""
    from pytensor.tensor.random.basic import gamma, uniform
    from pytensor.tensor.type_other import NoneTypeT

    if not isinstance(size.type, NoneTypeT):
        size = pt.concatenate([size, pt.as_tensor_variable(alpha.shape[-1:]).astype("int64")])
    else:
        size = alpha.shape
    g = gamma(alpha + 1.0, scale=1.0, size=size, rng=rng)
    u = uniform(0.0, 1.0, size=size, rng=g.owner.outputs[0])
    log_g = pt.log(g) + pt.log(u) / alpha
    log_g = log_g - pt.max(log_g, axis=-1, keepdims=True)
    w = pt.exp(log_g)
    w = w / pt.sum(w, axis=-1, keepdims=True)
    return [u.owner.outputs[0], w]


#: transforms that restrict a variable to part of its distribution's support (a forward draw of
#: the distribution is not a draw of the restricted prior, and maps to NaN where it breaks the
#: constraint)
CONSTRAINING_TRANSFORMS = ("Ordered", "SumTo1")


def _constraining_transform(model, rv) -> str | None:
    """The name of a constraining transform of ``rv`` (:data:`CONSTRAINING_TRANSFORMS`, alone
    or in a chain) that is not the distribution's own default, else None."""
    tr = model.rvs_to_transforms.get(rv)
    if tr is None:
        return None
    parts = list(getattr(tr, "transform_list", None) or [tr])
    try:
        from pymc.distributions.transforms import _default_transform

        default = _default_transform(rv.owner.op, rv)
    except Exception:  # noqa: BLE001 (an older PyMC: judge by the transform alone)
        default = None
    default_names = {type(t).__name__
                     for t in (getattr(default, "transform_list", None) or [default])}
    for t in parts:
        name = type(t).__name__
        if name in CONSTRAINING_TRANSFORMS and name not in default_names:
            return name.lower() if name == "Ordered" else name
    return None


def _check_arguments(pm, model, path: str) -> None:
    if not isinstance(model, pm.Model):
        raise TargetError(f"from_pymc expects a pymc.Model; got {type(model).__name__}")
    if path not in PATHS:
        raise TargetError(f"from_pymc: path must be one of {', '.join(map(repr, PATHS))} "
                          f"('prior': geometric path from the prior, needs a prior that "
                          f"forward sampling reproduces; 'temperature': temperature ladder "
                          f"on the joint density); got {path!r}")


def _dims_and_coords(model, free) -> tuple[dict[str, list[str]], dict[str, list]]:
    """The model's named dims of its free variables and deterministics, and its coordinates."""
    names = [rv.name for rv in free] + [d.name for d in model.deterministics]
    dims = {k: list(v) for k, v in model.named_vars_to_dims.items()
            if k in names and v is not None and len(v) > 0}
    return dims, {k: list(v) for k, v in model.coords.items() if v is not None}


def _layout(values, point) -> list[tuple[str, slice, tuple[int, ...]]]:
    """``(value variable name, its slice of the flat state, its shape)`` for each variable."""
    layout, start = [], 0
    for v in values:
        shape = tuple(int(s) for s in np.shape(point[v.name]))
        size = int(np.prod(shape, dtype=np.int64))
        layout.append((v.name, slice(start, start + size), shape))
        start += size
    return layout


class PyMCTarget:
    """A PyMC model as an nrpt target; build it with :func:`from_pymc`."""

    analytic_gradients = True

    def __init__(self, model, *, path: str = "prior", vectorize: bool | None = None) -> None:
        pm, _, pt = _import_pymc()
        _check_arguments(pm, model, path)
        self._pm, self._pt = pm, pt
        self.model = model
        self.path = path
        self._vectorize = vectorize
        self.name = f"pymc:{model.name or 'model'}"
        self._check_continuous()
        if path == "prior":
            self._check_prior_path()

        self._free = list(model.free_RVs)
        self._values = [model.rvs_to_values[rv] for rv in self._free]
        self._point = model.initial_point()
        self.layout: list[tuple[str, slice, tuple[int, ...]]] = _layout(self._values, self._point)
        self.dim = self.layout[-1][1].stop if self.layout else 0
        if self.dim < 1:
            raise TargetError("from_pymc: the model has no free variables to sample")
        #: PyMC's initial point as a flat state
        self._x0 = np.concatenate([np.ravel(self._point[v.name]) for v in self._values]
                                  ).astype(np.float64)
        self._fns: dict[str, _Batched] = {}
        self._cache: tuple[np.ndarray, list[np.ndarray]] | None = None
        self._sampler = None
        self._sampler_batched = False
        self._rngs: list = []
        if path == "prior":
            self.reference_is_normalized = True
            self._parts = [model.logp(vars=self._free, jacobian=True),
                           model.logp(vars=list(model.observed_RVs), jacobian=True)]
            self._build_sampler()  # compile now: a prior it cannot sample is refused here
        else:
            self._parts = [model.logp(jacobian=True)]
        self.model_dims, self.model_coords = _dims_and_coords(model, self._free)

    # ------------------------------------------------------------------------------- checks
    def _check_continuous(self) -> None:
        for rv in self.model.free_RVs:
            if not str(rv.type.dtype).startswith("float"):
                raise TargetError(
                    f"from_pymc: free variable {rv.name!r} is discrete ({rv.type.dtype}); "
                    f"nrpt's explorers move continuous unconstrained variables. Marginalize it "
                    f"out of the model (e.g. replace a component label by pm.NormalMixture / "
                    f"pm.Mixture, or sum a count variable out) or make it observed")

    def _check_prior_path(self) -> None:
        try:
            from pytensor.graph.traversal import ancestors
        except ImportError:  # pytensor < 2.32
            from pytensor.graph.basic import ancestors

        model = self.model
        if not model.observed_RVs:
            raise TargetError(
                "from_pymc: the model has no observed variables, so there is no likelihood to "
                "temper on the path from the prior; give a variable data with observed=... "
                "(or use path='temperature' to temper the joint density)")
        if model.potentials:
            names = ", ".join(repr(p.name) for p in model.potentials)
            raise TargetError(
                f"from_pymc: the model has pm.Potential term(s) {names}, which forward sampling "
                f"cannot reproduce, so the prior cannot be sampled exactly for path='prior'; "
                f"use path='temperature'")
        for rv in model.free_RVs:
            constraint = _constraining_transform(model, rv)
            if constraint is not None:
                raise TargetError(
                    f"from_pymc: free variable {rv.name!r} has the {constraint} transform, which "
                    f"restricts its prior to part of the distribution's support (the prior "
                    f"density is renormalized there), so PyMC cannot draw that prior exactly by "
                    f"forward sampling and path='prior' cannot start or refresh its reference; "
                    f"use path='temperature' (a temperature ladder on the joint density)")
            up = set(ancestors([rv]))
            hit = [o.name for o in model.observed_RVs if o in up]
            if hit:
                raise TargetError(
                    f"from_pymc: free variable {rv.name!r} depends on the observed variable "
                    f"{hit[0]!r}, so its prior is conditional on data and forward sampling "
                    f"cannot reproduce it exactly for path='prior'; use path='temperature'")

    # ------------------------------------------------------------------------------ compiling
    def _flat(self, outputs):
        """``(outputs as graphs of one flat state vector, that vector)``."""
        from pymc.pytensorf import join_nonshared_inputs

        outs, flat = join_nonshared_inputs(self._point, list(outputs), self._values)
        return list(outs), flat

    def _function(self, kind: str) -> _Batched:
        """The compiled batch function ``kind``: ``"logp"`` (the log-density parts, then their
        gradients) or ``"variables"`` (the constrained values); compiled on first use."""
        fn = self._fns.get(kind)
        if fn is not None:
            return fn
        if kind == "variables":
            wanted = list(self._free) + list(self.model.deterministics)
            outs, flat = self._flat(self.model.replace_rvs_by_values(wanted))
        else:
            outs, flat = self._flat(self._parts)
        fn = self._fns[kind] = _Batched(self._pm, self._pt, flat, self._x0, outs,
                                        self._vectorize, f"{self.path}-{kind}",
                                        grad=kind == "logp")
        return fn

    def _evaluate(self, x, who: str) -> list[np.ndarray]:
        """The log-density parts and their gradients at ``x``, in one call of the compiled
        function (PyTensor has deprecated the ``output_subset`` that gave values alone, and a
        second compiled function would double the compile time; docs/benchmarks.md, "Target
        kernels").  The last evaluation is kept, so the members asking for the parts one
        by one at the same states cost one call."""
        a = _to_numpy(x, self.dim, who)
        c = self._cache
        if c is not None and c[0].shape == a.shape and np.array_equal(c[0], a):
            return c[1]
        res = self._function("logp")(a)
        self._cache = (a.copy(), res)
        return res

    # ---------------------------------------------------------------- prior forward sampler
    def _forward_pieces(self) -> list:
        """The free variables' forward draws mapped through their transforms (one graph per
        free variable, in ``free_RVs`` order, each of its value variable's shape)."""
        pt = self._pt
        pieces = []
        for rv in self._free:
            tr = self.model.rvs_to_transforms.get(rv)
            val = rv if tr is None else tr.forward(rv, *rv.owner.inputs)
            pieces.append(pt.as_tensor_variable(val).astype("float64"))
        return pieces

    def _build_sampler(self) -> None:
        """Compile the prior sampler: vectorized (one call draws ``n``) if possible, else the
        per-draw function called in a loop; a prior it cannot sample is refused here."""
        self._sampler, self._sampler_batched, self._rngs = _vectorized_or_loop(
            self._vectorize, "prior sampler", "per-draw", "drawing one prior sample at a time",
            self._batched_sampler, self._loop_sampler)

    def _loop_sampler(self) -> tuple:
        pm, pt = self._pm, self._pt
        from pytensor.tensor.random.type import RandomGeneratorType

        pieces = [p.ravel() for p in self._forward_pieces()]
        flat = pt.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        try:
            fn = _compile(pm, [], flat, random_seed=0)
            rngs = [v for v in fn.get_shared() if isinstance(v.type, RandomGeneratorType)]
            draw = np.asarray(fn())
        except Exception as e:
            raise TargetError(
                f"from_pymc: the prior cannot be sampled exactly by forward sampling "
                f"({type(e).__name__}: {e}); use path='temperature'") from e
        if draw.shape != (self.dim,):
            raise TargetError(f"from_pymc: a forward draw has shape {list(draw.shape)}, not "
                              f"[{self.dim}]; use path='temperature'")
        draws = [draw] + [np.asarray(fn()) for _ in range(15)]
        if not all(np.isfinite(d).all() for d in draws):
            raise TargetError(
                "from_pymc: forward draws of the prior map to non-finite values of the "
                "unconstrained space (a transform or a constraint that forward sampling does not "
                "respect), so PyMC cannot draw this prior exactly for path='prior'; use "
                "path='temperature' (a temperature ladder on the joint density)")
        return fn, False, rngs

    def _batched_sampler(self) -> tuple:
        """The forward-sampling graph vectorized over a leading batch axis of symbolic length
        ``n``: every random variable gets the size ``(n, *its batch shape)`` -- a root's
        parameters are unbatched and broadcast over it, a downstream variable's batched
        parameters (a leading axis of length ``n``: draw i's parents) line up with it -- and
        every other op (the transforms' forward maps included) is vectorized by PyTensor's
        rules.  Checked by drawing batches of 2 and 3."""
        pm, pt = self._pm, self._pt
        from pytensor.tensor.random.type import RandomGeneratorType

        n = pt.lscalar("n_draws")
        pieces = self._forward_pieces()
        vect = _vectorize_draws(pt, pieces, n)
        flat = []
        for rv, p in zip(self._free, pieces, strict=True):
            b = vect.get(p)
            if b is None or b.type.ndim != p.type.ndim + 1:
                raise ValueError(f"the draw of {rv.name!r} has no batch axis")
            flat.append(b.reshape((n, -1)))
        out = pt.concatenate(flat, axis=1) if len(flat) > 1 else flat[0]
        fn = _compile(pm, [n], out, random_seed=0)
        for k in (2, 3):
            draw = np.asarray(fn(k))
            if draw.shape != (k, self.dim):
                raise ValueError(f"a batch of {k} draws has shape {list(draw.shape)}, not "
                                 f"[{k}, {self.dim}]")
            if not np.isfinite(draw).all():
                raise ValueError("a batched draw is not finite")
        return fn, True, [v for v in fn.get_shared() if isinstance(v.type, RandomGeneratorType)]

    # --------------------------------------------------------------------- model variables
    @property
    def vectorized(self) -> dict[str, bool]:
        """Which compiled functions so far run vectorized over the batch (else a loop):
        ``"sample"`` (the prior sampler, path='prior'), ``"logp"``, ``"variables"``."""
        out = {"sample": self._sampler_batched} if self._sampler is not None else {}
        out.update({k: f.vectorized for k, f in self._fns.items()})
        return out

    def model_variables(self, x) -> dict[str, np.ndarray]:
        """The constrained values of every free variable and ``pm.Deterministic`` at the
        states ``x`` ``[n, dim]`` (numpy or torch): ``{name: array [n, *shape]}``, free
        variables first in ``model.free_RVs`` order, then the deterministics."""
        a = _to_numpy(x, self.dim, "model_variables")
        res = self._function("variables")(a)
        names = [rv.name for rv in self._free] + [d.name for d in self.model.deterministics]
        return {k: np.array(v) for k, v in zip(names, res, strict=True)}

    def unravel(self, x) -> dict[str, np.ndarray]:
        """The states ``x`` ``[n, dim]`` split into the (unconstrained) value variables."""
        a = _to_numpy(x, self.dim, "unravel")
        return {name: a[:, sl].reshape(a.shape[0], *shape) for name, sl, shape in self.layout}

    def __repr__(self) -> str:
        return f"PyMCTarget({self.name!r}, path={self.path!r}, dim={self.dim})"


class PyMCPriorTarget(PyMCTarget):
    """``path="prior"``: the geometric form (prior reference, observed-data likelihood)."""

    def reference_log_prob(self, x) -> torch.Tensor:
        """The prior's log density on the unconstrained space (Jacobians included), ``[n]``."""
        return _to_torch(self._evaluate(x, "reference_log_prob")[0], x)

    def log_likelihood(self, x) -> torch.Tensor:
        """Sum of the observed variables' log densities, ``[n]``."""
        return _to_torch(self._evaluate(x, "log_likelihood")[1], x)

    def grad_reference_log_prob(self, x) -> torch.Tensor:
        """Gradient of :meth:`reference_log_prob`, ``[n, dim]``."""
        return _to_torch(self._evaluate(x, "grad_reference_log_prob")[2], x)

    def grad_log_likelihood(self, x) -> torch.Tensor:
        """Gradient of :meth:`log_likelihood`, ``[n, dim]``."""
        return _to_torch(self._evaluate(x, "grad_log_likelihood")[3], x)


    def reference_sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` exact iid prior draws on the unconstrained space, ``[n, dim]`` float64 on the
        generator's device; a function of ``generator`` only."""
        from pymc.pytensorf import reseed_rngs

        g = check_generator(generator)
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=g, device=g.device).item())
        n = int(n)
        reseed_rngs(self._rngs, seed)
        if self._sampler_batched:
            out = np.zeros((0, self.dim)) if n == 0 else np.array(self._sampler(n),
                                                                   dtype=np.float64)
        else:
            out = np.empty((n, self.dim))
            for i in range(n):
                out[i] = self._sampler()
        return torch.from_numpy(out).to(device=g.device)

    def initial_states(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Reference draws."""
        return self.reference_sample(n, generator)


class PyMCTemperatureTarget(PyMCTarget):
    """``path="temperature"``: the temperature form (energy = -joint log density)."""

    def energy(self, x) -> torch.Tensor:
        """``-(joint log density with Jacobian)``, ``[n]`` (path='temperature')."""
        return _to_torch(-self._evaluate(x, "energy")[0], x)

    def grad_energy(self, x) -> torch.Tensor:
        """Gradient of :meth:`energy`, ``[n, dim]`` (path='temperature')."""
        return _to_torch(-self._evaluate(x, "grad_energy")[1], x)


    #: its initial states are one point jittered: nrpt replaces them by independent
    #: overdispersed draws around the mode found from it (:mod:`nrpt.paths.starts`)
    starts = "point"

    def initial_point(self) -> torch.Tensor:
        """PyMC's initial point (the model's ``initval`` s) on the unconstrained space,
        ``[dim]``."""
        return torch.from_numpy(self._x0.copy())

    def initial_states(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """PyMC's initial point jittered by ``U(-1, 1)`` per coordinate (as PyMC's
        ``jitter+adapt_diag`` start; nrpt's runs start overdispersed instead, see
        ``starts``)."""
        g = check_generator(generator)
        base = torch.from_numpy(self._x0.copy()).to(g.device)
        u = torch.rand(int(n), self.dim, generator=g, dtype=torch.float64, device=g.device)
        return base + (2.0 * u - 1.0)
