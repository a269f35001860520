"""``posterior.nc``: a run's draws and diagnostics in ArviZ's InferenceData netCDF layout,
written with h5netcdf alone, in the layout xarray writes (``xarray.open_dataset(..., group=)``
and ``arviz.from_netcdf`` read it; importing xarray and pandas to write it cost more than the
writing).  ``chain`` = PT system, ``draw`` = slot-0 draw.

Groups: ``posterior`` (one variable per model variable ``[chain, draw, *var_shape]`` with the
model-variable hook of :mod:`nrpt.targets.protocol`, written block by block; unnamed dims
``<name>_dim_<i>``; else ``x`` ``[chain, draw, x_dim]``); ``unconstrained_posterior`` (hook
targets: ``x``); ``sample_stats`` (per draw: ``path_energy``, ``slot0_replica``,
``target_swap_accepted``, cumulative ``restarts`` / ``round_trips``; per chain:
``log_normalizer`` with ``_se`` / ``_forward`` / ``_reverse``, ``barrier``); ``constant_data``
(per-slot and per-pair tables, dims ``system`` / ``slot`` / ``pair``).  NaN only where the
summary has ``null`` or a table means "undefined" (attribute ``nan_means``); infinities kept."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import numpy as np

from nrpt.recorders.draws import index_dtype
from nrpt.roles import RowMap
from nrpt.targets.protocol import capabilities

__all__ = ["write_inference_data", "index_statistics", "DRAW_BLOCK_BYTES"]

#: the size of one block of draws converted and written at a time (bytes of unconstrained x)
DRAW_BLOCK_BYTES = 8 * 2 ** 20
#: the target size of one compressed netCDF chunk of a model variable (bytes)
_CHUNK_BYTES = 2 ** 20
#: rows of the index process read at a time (bytes of int64 work arrays, about)
_INDEX_BLOCK_BYTES = 8 * 2 ** 20


# ------------------------------------------------------------------------------ index process
def index_statistics(index: np.ndarray, rows: np.ndarray, first: int = 0) -> dict[str, np.ndarray]:
    """Statistics of ``index`` ``[K + 1, R, P]`` at the increasing ``rows``, read in blocks.

    Returns ``[R, len(rows)]`` arrays ``slot0_replica``, ``target_swap_accepted`` (it differs
    from the row before) and ``restarts`` / ``round_trips`` counted in rows ``first + 1 .. row``
    by the state machine of :class:`nrpt.diagnostics.RoundTripTracker` run from row 0."""
    rows = np.asarray(rows, dtype=np.int64)
    K1, R, P = index.shape
    m = len(rows)
    out = {"slot0_replica": np.zeros((R, m), dtype=index_dtype(P)),
           "target_swap_accepted": np.zeros((R, m), dtype=bool),
           "restarts": np.zeros((R, m), dtype=np.int64),
           "round_trips": np.zeros((R, m), dtype=np.int64)}
    if m == 0:
        return out
    if rows[0] < 1 or rows[-1] >= K1 or first < 0 or first > rows[0]:
        raise ValueError(f"index rows must lie in 1 .. {K1 - 1} after first = {first}; got "
                         f"{rows[0]} .. {rows[-1]}")
    top = P - 1
    last = np.zeros((R, P), dtype=np.int8)        # last end visited: 0 none, 1 slot 0, 2 top
    seen_top = np.zeros((R, P), dtype=bool)       # the top visited at some row so far
    counts = np.zeros((2, R), dtype=np.int64)     # restarts, round trips before this block
    base = np.zeros((2, R), dtype=np.int64)       # the counts at row ``first``
    prev_occupant = None
    block = max(1, _INDEX_BLOCK_BYTES // (8 * R * P))
    end = int(rows[-1]) + 1
    j = 0  # the next draw row to fill
    for a in range(0, end, block):
        b = min(a + block, end)
        slots = np.asarray(index[a:b], dtype=np.int64)            # [m, R, P]
        ev = np.where(slots == 0, 1, np.where(slots == top, 2, 0)).astype(np.int8)
        n = b - a
        # the last end visit strictly before each row (forward fill, seeded by the carry)
        pos = np.where(ev > 0, np.arange(n)[:, None, None], -1)
        pos = np.maximum.accumulate(pos, axis=0)
        filled = np.where(pos >= 0, np.take_along_axis(ev, np.maximum(pos, 0), 0), last)
        before = np.concatenate([last[None], filled[:-1]], 0)
        tops = np.logical_or.accumulate(ev == 2, axis=0) | seen_top
        top_before = np.concatenate([seen_top[None], tops[:-1]], 0)
        restart = (ev == 1) & (before == 2)
        trip = (ev == 2) & (before == 1) & top_before
        if a == 0:  # row 0 is the initial state, not an iteration
            restart[0] = trip[0] = False
        per_row = np.stack([restart.sum(-1), trip.sum(-1)], 0)    # [2, m, R]
        cum = counts[:, None, :] + np.cumsum(per_row, axis=1)     # counts through each row
        if a <= first < b:
            base = cum[:, first - a].copy()
        occupant = np.argmin(slots, axis=-1).astype(index_dtype(P))  # [m, R]: slot 0 is the min
        hi = int(np.searchsorted(rows, b))  # the draws whose rows lie in this block
        if hi > j:
            t = rows[j:hi] - a
            # the occupant one row earlier (row a - 1 is the previous block's last; rows >= 1,
            # so t = 0 only when a > 0 and prev_occupant is set)
            shifted = occupant if prev_occupant is None else np.concatenate(
                [prev_occupant[None], occupant])
            earlier = shifted[t if prev_occupant is not None else t - 1]
            out["slot0_replica"][:, j:hi] = occupant[t].T
            out["target_swap_accepted"][:, j:hi] = (occupant[t] != earlier).T
            out["restarts"][:, j:hi] = (cum[0, t] - base[0]).T
            out["round_trips"][:, j:hi] = (cum[1, t] - base[1]).T
            j = hi
        counts = cum[:, -1]
        last, seen_top, prev_occupant = filled[-1], tops[-1], occupant[-1]
    return out


# ------------------------------------------------------------------------------ helpers
def _per_chain(value, R: int) -> tuple[np.ndarray, bool]:
    """A per-system summary field (a scalar when R = 1, else a list; None = undefined) as a
    float array ``[R]`` with NaN for None; and whether any was None."""
    vals = value if isinstance(value, list) else [value] * (1 if R == 1 else R)
    arr = np.array([np.nan if v is None else float(v) for v in vals], dtype=float)
    return arr, any(v is None for v in vals)


def _group_attrs(extra: dict | None = None) -> dict[str, str]:
    from nrpt import __version__

    attrs = {"created_at": datetime.datetime.now(datetime.UTC).isoformat(),
             "inference_library": "nrpt", "inference_library_version": str(__version__)}
    attrs.update(extra or {})
    return attrs


class _Dataset:
    """One group of the file as xarray would write it: ``data`` ``{name: (dims, values,
    attrs)}``, ``coords`` ``{dim: values}`` (a coordinate variable per dimension), ``attrs``."""

    def __init__(self, data: dict | None = None, coords: dict | None = None,
                 attrs: dict | None = None) -> None:
        self.data = dict(data or {})
        self.coords = {k: np.asarray(v) for k, v in (coords or {}).items()}
        self.attrs = dict(attrs or {})

    def write(self, group) -> None:
        """Into the h5netcdf group ``group``: dimensions, coordinate variables, variables
        (numbers gzip-compressed, floats with a NaN ``_FillValue`` and bools as int8 with
        ``dtype = "bool"``, as xarray encodes them)."""
        sizes = {d: len(c) for d, c in self.coords.items()}
        for dims, v, _ in self.data.values():
            sizes.update({d: n for d, n in zip(dims, np.shape(v), strict=True)
                          if d not in sizes})
        for k, v in self.attrs.items():
            group.attrs[k] = v
        group.dimensions = sizes
        for name, c in self.coords.items():
            _variable(group, name, (name,), c, {})
        for name, (dims, v, attrs) in self.data.items():
            _variable(group, name, tuple(dims), np.asarray(v), attrs or {})


def _variable(group, name: str, dims: tuple, v: np.ndarray, attrs: dict) -> None:
    import h5py

    if v.dtype.kind in "USO":  # text coordinates: variable-length strings
        var = group.create_variable(name, dims, dtype=h5py.string_dtype(),
                                    data=v.astype(str).astype(object))
    else:
        extra: dict[str, Any] = {"compression": "gzip"} if v.size else {}
        if v.dtype.kind == "b":
            v, attrs = v.astype(np.int8), {**attrs, "dtype": "bool"}
        if v.dtype.kind in "fc":
            extra["fillvalue"] = np.array(np.nan, dtype=v.dtype)
        var = group.create_variable(name, dims, dtype=v.dtype, data=v, **extra)
    for k, a in attrs.items():
        var.attrs[k] = a


class _NetCDF:
    """What :func:`_posterior_groups` and the others build groups with (xarray's name)."""

    Dataset = _Dataset


def _model_values(target, x: np.ndarray) -> dict:
    """The hook on a block of states; its own errors become ValueErrors that name it (the
    run's other outputs are still written: see :func:`nrpt.run.api._write_outputs`)."""
    try:
        return target.model_variables(x)
    except Exception as err:  # noqa: BLE001 -- any failure of user code, reported
        raise ValueError(f"target.model_variables failed: {type(err).__name__}: {err}") \
            from err


def _model_layout(target, x0: np.ndarray) -> dict[str, dict[str, Any]]:
    """Each model variable's dims, coordinates, shape and dtype, from the hook applied to one
    state (``x0`` ``[1, dim]``) and the target's ``model_dims`` / ``model_coords`` (values of
    the protocol, read here); refuses dims / coords that do not fit the values."""
    values = _model_values(target, x0)
    dims_of = dict(getattr(target, "model_dims", None) or {})
    coords_of = dict(getattr(target, "model_coords", None) or {})
    layout = {name: _variable_layout(name, np.asarray(v), x0.shape[0], dims_of, coords_of)
              for name, v in values.items()}
    if not layout:
        raise ValueError("model_variables returned no variables")
    return layout


def _variable_layout(name: str, v: np.ndarray, n: int, dims_of: dict,
                     coords_of: dict) -> dict[str, Any]:
    """One model variable's layout from its values ``v`` ``[n, *shape]`` of ``n`` states."""
    if v.ndim < 1 or v.shape[0] != n:
        raise ValueError(f"model_variables: {name!r} has shape {v.shape}; expected "
                         f"[{n}, *shape] for {n} states")
    shape = tuple(int(s) for s in v.shape[1:])
    dims = list(dims_of.get(name) or [f"{name}_dim_{i}" for i in range(len(shape))])
    if len(dims) != len(shape):
        raise ValueError(f"model_dims: {name!r} names {len(dims)} dims {dims} but its "
                         f"values have shape {shape}")
    if name in ("chain", "draw") or {"chain", "draw"} & set(dims):
        raise ValueError(f"model variable {name!r}: 'chain' and 'draw' are reserved")
    coords = {}
    for d, size in zip(dims, shape, strict=True):
        c = coords_of.get(d)
        c = np.arange(size) if c is None else np.asarray(list(c))
        if len(c) != size:
            raise ValueError(f"model_coords: dim {d!r} of {name!r} has {len(c)} "
                             f"coordinates but size {size}")
        coords[d] = c
    return {"dims": dims, "shape": shape, "dtype": v.dtype, "coords": coords}


def _create(group, name: str, dims, shape, dtype, n: int):
    """A gzip-compressed ``[chain, draw, *shape]`` variable of ``n`` draws per chain, chunked
    to about :data:`_CHUNK_BYTES`."""
    per_draw = int(np.prod(shape, dtype=np.int64)) * max(dtype.itemsize, 1)
    chunks = (1, max(1, min(n, _CHUNK_BYTES // max(per_draw, 1))), *[max(1, s) for s in shape])
    return group.create_variable(name, ("chain", "draw", *dims), dtype=dtype,
                                 compression="gzip", chunks=chunks)


def _write_draws(tmp: Path, target, x: np.ndarray, layout: dict | None) -> None:
    """Write the draws into the groups that already hold their coordinates, one block of
    draws of one system at a time: the unconstrained ``x`` (in ``posterior``, or in
    ``unconstrained_posterior`` when ``layout`` -- the model variables -- is given) and the
    hook's values of each block."""
    import h5netcdf

    R, n, dim = x.shape
    layout = layout or {}
    # a block holds the unconstrained rows and every model variable's values of its draws
    # (a per-observation Deterministic can be far larger than the state)
    per_draw = 8 * max(dim, 1) + sum(
        int(np.prod(spec["shape"], dtype=np.int64)) * max(spec["dtype"].itemsize, 1)
        for spec in layout.values())
    block = max(1, DRAW_BLOCK_BYTES // per_draw)
    with h5netcdf.File(tmp, "a") as f:
        flat = _create(f["unconstrained_posterior" if layout else "posterior"], "x",
                       ("x_dim",), (dim,), np.dtype(x.dtype), n)
        handles = {name: _model_variable(f["posterior"], name, spec, n)
                   for name, spec in layout.items()}
        for r in range(R):
            for a in range(0, n, block):
                xb = np.array(x[r, a:a + block])
                flat[r, a:a + len(xb)] = xb
                if handles:
                    _write_model_block(handles, layout, target, xb, r, a)


def _model_variable(group, name: str, spec: dict, n: int):
    """The file variable of one model variable (netCDF has no bool: int8 with a ``dtype``
    attribute that xarray decodes back to bool)."""
    boolean = spec["dtype"].kind == "b"
    handle = _create(group, name, spec["dims"], spec["shape"],
                     np.dtype(np.int8) if boolean else spec["dtype"], n)
    if boolean:
        handle.attrs["dtype"] = "bool"
    return handle


def _write_model_block(handles: dict, layout: dict, target, xb: np.ndarray, r: int,
                       a: int) -> None:
    """The hook's values of the block ``xb`` of system ``r`` from draw ``a`` on, checked
    against ``layout`` and written."""
    values = _model_values(target, xb.astype(np.float64, copy=False))
    missing = set(handles) - set(values)
    if missing:
        raise ValueError(f"model_variables: {sorted(missing)} missing from a block of draws")
    for name, spec in layout.items():
        v = np.asarray(values[name])
        if v.shape[1:] != spec["shape"] or v.shape[0] != len(xb):
            raise ValueError(f"model_variables: {name!r} changed shape to {v.shape} (was "
                             f"[n, {spec['shape']}])")
        handles[name][r, a:a + len(v)] = v.astype(np.int8) if v.dtype.kind == "b" else v


# ------------------------------------------------------------------------------ the file
def write_inference_data(path: str | Path, *, samples: np.ndarray, energies: np.ndarray,
                         recorders: dict, engine, summary: dict, index: np.ndarray | None = None,
                         first: int = 0, thin: int = 1, target=None,
                         row_map: RowMap | None = None) -> str | None:
    """Write ``posterior.nc`` (the layout of the module docstring); returns its file name, or
    None when xarray / h5netcdf are not installed (``pip install nrpt[arviz]``).

    ``samples`` ``[n, dim]`` / ``[R, n, dim]`` and ``energies`` are the slot-0 draws of the
    iterations from ``first`` on (``first`` a multiple of ``thin`` or the run's sample start),
    ``index`` the index process of the whole run ``[K + 1, R, P]`` (None: no index-process
    statistics), ``target`` the run's target (default ``engine.target``); ``row_map``: the run's
    map of engine rows to systems where they differ (``Run.facts["row_map"]``), which splits the
    per-system summary values (``posterior_parts``) and notes the index process
    (``index_note``)."""
    try:
        import h5netcdf
    except ImportError:
        return None
    xr = _NetCDF
    from nrpt.files import atomic_path

    target = engine.target if target is None else target
    x = np.asarray(samples) if not isinstance(samples, np.ndarray) else samples
    e = np.asarray(energies, dtype=float)
    if x.ndim == 2:  # one system: [n, dim] -> [1, n, dim]
        x, e = x[None], e[None]
    R, n = x.shape[:2]
    chain, draw = np.arange(R), np.arange(n)
    nrpt_attrs = {"nrpt_" + k: str(summary.get(k)) for k in (
        "target", "path", "chains", "explorer", "scheme", "window", "rule", "statistics_from",
        "log_normalizer", "log_normalizer_kind", "barrier")}
    layout, groups = _posterior_groups(xr, target, x, chain, draw)
    groups["sample_stats"] = _sample_stats(xr, e, chain, draw, summary, index, first, thin, R,
                                           n, row_map)
    groups["constant_data"] = _constant_data(xr, recorders, engine, nrpt_attrs)
    with atomic_path(path) as tmp:
        with h5netcdf.File(tmp, "w") as f:
            for k, v in nrpt_attrs.items():
                f.attrs[k] = v
            for name, ds in groups.items():
                ds.write(f.create_group(name))
        _write_draws(tmp, target, x, layout)
    return Path(path).name


def _posterior_groups(xr, target, x: np.ndarray, chain, draw) -> tuple[dict | None, dict]:
    """The model variables' layout (None without the hook) and the posterior group(s) with
    their coordinates and attrs only: the draws themselves are written block by block
    afterwards (:func:`_write_draws`), so no group holds all of them in memory at once."""
    flat = xr.Dataset(coords={"chain": chain, "draw": draw, "x_dim": np.arange(x.shape[2])},
                      attrs=_group_attrs())
    if not capabilities(target).has("model_variables"):
        return None, {"posterior": flat}
    layout = _model_layout(target, np.array(x[0, :1], dtype=np.float64))
    coords = {"chain": chain, "draw": draw}
    for spec in layout.values():
        for d, c in spec["coords"].items():
            if d in coords and not np.array_equal(coords[d], c):
                raise ValueError(f"model_coords: dim {d!r} has two sets of coordinates")
            coords[d] = c
    posterior = xr.Dataset(coords=coords, attrs=_group_attrs(
        {"nrpt_parameterization": "the model's constrained variables "
         "(target.model_variables); the sampler's unconstrained draws are in the group "
         "unconstrained_posterior"}))
    return layout, {"posterior": posterior, "unconstrained_posterior": flat}


def _sample_stats(xr, e, chain, draw, summary, index, first, thin, R, n, row_map):
    data: dict[str, Any] = {"path_energy": (("chain", "draw"), e, {
        "description": "the tempered energy V of the slot-0 state (as drawn; never altered)"})}
    if index is not None and n:
        first = int(first)
        start = first // thin
        rows = (start + np.arange(1, n + 1)) * thin
        st = index_statistics(index, rows, first)
        data["slot0_replica"] = (("chain", "draw"), st["slot0_replica"], {
            "description": "the replica at slot 0 (the target) after the draw's iteration"})
        data["target_swap_accepted"] = (("chain", "draw"), st["target_swap_accepted"], {
            "description": "a swap involving slot 0 was accepted in the draw's iteration "
                           "(the slot-0 replica changed)"})
        if row_map is not None:
            for key in ("slot0_replica", "target_swap_accepted"):
                data[key][2]["note"] = row_map.index_note
        for key, what in (("restarts", "restarts (reference to target)"),
                          ("round_trips", "round trips (Syed et al.)")):
            data[key] = (("chain", "draw"), st[key], {
                "description": f"cumulative {what} of the system, counted from iteration "
                               f"{first} (the start of the sampled segment) through the draw",
                "counted_from_iteration": first})
    notes = {
        "log_normalizer": "log Z (or log ratio, see log_normalizer_kind) by the geometric "
                          "bridge between neighbouring slots",
        "log_normalizer_se": "batch-means standard error of log_normalizer",
        "log_normalizer_forward": "forward stepping-stone half (aimed at Z)",
        "log_normalizer_reverse": "reverse stepping-stone half (aimed at 1/Z)",
        "barrier": "global communication barrier Λ̂ = sum of the pair rejection rates"}
    for key, text in notes.items():
        if key not in summary:
            continue
        parts = [("", summary[key], "")] if row_map is None else \
            row_map.posterior_parts(summary[key], R)
        for suffix, value, leg in parts:
            vals, undefined = _per_chain(value, R)
            attrs = {"description": text + leg, "source": f"summary.json: {key}"}
            if key.startswith("log_normalizer"):
                attrs["kind"] = str(summary.get("log_normalizer_kind"))
            if undefined:
                attrs["nan_means"] = ("undefined: summary.json reports null for this system "
                                      "(a non-finite estimate)")
            data[key + suffix] = (("chain",), vals, attrs)
    return xr.Dataset(data, coords={"chain": chain, "draw": draw}, attrs=_group_attrs())


def _constant_data(xr, recorders, engine, nrpt_attrs):
    def np_(t):
        return t.detach().cpu().double().numpy()

    swaps = recorders["swaps"]
    table = {"schedule": (["system", "slot"], np_(engine.schedule), None),
             "step_size": (["system", "slot"], np_(engine.step_size), None),
             "swap_acceptance": (["system", "pair"], np_(swaps.acceptance()),
                                 "the pair was never attempted (acceptance undefined)"),
             "explorer_acceptance": (["system", "slot"], np_(swaps.explorer_acceptance()),
                                     None)}
    if "log_z" in recorders:
        table["log_normalizer_per_slot"] = (["system", "slot"], np_(
            recorders["log_z"].estimate()["per_slot"]), "a non-finite estimate (undefined)")
    if "slot_energies" in recorders:
        table["local_barrier_method_i"] = (["system", "slot"], np.asarray(
            recorders["slot_energies"].local_barrier(), dtype=float),
            "undefined at that slot (a non-finite estimate)")
    data = {}
    for key, (dims, v, why) in table.items():
        # written as they are: an infinite value stays infinite (a stochastic-gradient run's
        # schedule holds inf where the summary reports noise temperature 0), NaN is the
        # recorder's own "undefined" and is explained
        attrs = {"nan_means": why or "undefined"} if np.isnan(v).any() else {}
        data[key] = (dims, v, attrs)
    sizes = {d: v.shape[i] for dims, v, _ in table.values() for i, d in enumerate(dims)}
    return xr.Dataset(data, coords={d: np.arange(s) for d, s in sizes.items()},
                      attrs=_group_attrs(nrpt_attrs))
