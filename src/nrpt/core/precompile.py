"""A compiled chunk saved once per machine and loaded by a later process (AOTInductor).

``torch.compile``'s on-disk caches skip inductor's code generation and the C++ compile, not
Dynamo's trace of the chunk (seconds); torch's own ways of skipping the trace (caching
precompile, ``aot_compile``) drop the guards they cannot save, so a graph saved for one target
could run for another without a word (docs/benchmarks.md, issue 24).  Here the chunk is exported
once (``torch.export``, :func:`torch._inductor.aoti_compile_and_package`: a ``.pt2`` holding a
compiled shared library) and a later process loads it with torch's C++ loader (milliseconds:
no Dynamo, no inductor import).  Nothing of torch's guards is used: the artifact is found by
**nrpt's own key** (:func:`key`), which covers everything the chunk bakes in:

* the run's configuration relevant to the graph (:func:`config_digest`: the resolved config
  without the iteration counts, the seed and the output settings), set by
  :func:`nrpt.run.build.build` only where the explorer, scheme, rule and adaptors were built
  from the config (a user's object of those kinds takes ``torch.compile`` and its per-process
  trace; a target object is keyed by its fingerprint, below);
* a fingerprint of every object the chunk closes over (:func:`fingerprint`: the density,
  explorer, rule, scheme, path and online adaptors, walked attribute by attribute: types,
  Python numbers, every tensor's bytes, functions' code and closures); an object the walk
  cannot account for (a class or function from outside nrpt and torch) means no artifact;
* the chunk's static settings and the structure, shapes and dtypes of its inputs;
* the thread count (inductor bakes it into its CPU kernels), a GPU's generation;
* nrpt's source (every ``.py`` file of the installed package), torch's and Python's versions
  and the CPU's instruction sets.

The fingerprint is taken at the first chunk and again at every segment's start (not every
chunk: the walk costs about 0.3 ms on the headline); objects changed under the same chunk
settings (a value refitted between segments) turn the saved chunk off for the run
(``torch.compile`` takes over: such a key would never be hit again), a changed setting (a
tuned DEO_W window) is a key of its own.  A process that misses exports and compiles the
chunk (as long as inductor's cold compile) and then runs the artifact it saved, so every
process runs the same kernels.
``NRPT_PRECOMPILE=0`` turns it off (``torch.compile`` as before).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import types
from pathlib import Path

import torch

__all__ = ["enabled", "config_digest", "fingerprint", "Unkeyable", "source_digest",
           "machine_digest", "key", "Artifact", "folder", "CONFIG_IGNORED"]

#: config settings that do not enter the chunk's graph (the iteration counts, the seed: the
#: chunk's draws are its inputs, the output settings); anything the seed did to the objects
#: (a fitted reference) is in :func:`fingerprint`
CONFIG_IGNORED = frozenset({"iterations", "burn_in", "rounds", "seed", "out", "thin",
                            "checkpoint_every", "figures"})


def enabled() -> bool:
    """Whether compiled chunks use saved artifacts (``NRPT_PRECOMPILE`` not ``"0"``)."""
    return os.environ.get("NRPT_PRECOMPILE", "1") != "0"


def folder() -> Path:
    """Where artifacts live: ``aoti`` under the per-machine compile cache
    (:func:`nrpt.explorers.compiled.compile_cache`'s folder, found without importing
    inductor)."""
    now = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    env = os.environ.get("NRPT_COMPILE_CACHE")
    if env:
        base = Path(env).expanduser()
    elif now and "torchinductor_" not in os.path.basename(now):
        base = Path(now)
    else:
        base = Path.home() / ".cache" / "nrpt" / "compile"
    return base.absolute() / "aoti"


def config_digest(settings: dict) -> str:
    """The digest of a resolved config's settings (``RunConfig.to_dict()``) that enter the
    chunk's graph: all but :data:`CONFIG_IGNORED`."""
    kept = {k: v for k, v in settings.items() if k not in CONFIG_IGNORED}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=repr).encode()).hexdigest()


_SOURCE: str | None = None


def source_digest() -> str:
    """The digest of nrpt's source: every ``.py`` file of the imported package (once per
    process)."""
    global _SOURCE
    if _SOURCE is None:
        import nrpt

        root = Path(nrpt.__file__).parent
        h = hashlib.sha256()
        for p in sorted(root.rglob("*.py")):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
        _SOURCE = h.hexdigest()
    return _SOURCE


def machine_digest() -> str:
    """torch's and Python's versions, the machine and its vector instruction sets."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line
                    break
    except OSError:
        flags = platform.processor()
    parts = [torch.__version__, str(torch.version.git_version), sys.version, platform.machine(),
             torch.backends.cpu.get_cpu_capability(), flags]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class Unkeyable(Exception):
    """An object the chunk closes over that :func:`fingerprint` cannot account for."""


_TRUSTED = frozenset({"nrpt", "torch", "numpy", "builtins", "math", "operator", "_operator",
                      "functools", "_functools", "enum"})


def _trusted(module: str | None) -> bool:
    return module is not None and (module in _TRUSTED
                                   or module.startswith(("nrpt.", "torch.", "numpy.")))


def fingerprint(roots: dict, log: list | None = None) -> str:
    """The digest of everything reachable from ``roots`` (name -> object): the types, Python
    numbers and strings, tensors (dtype, shape, strides, device, bytes), NumPy arrays, and
    functions (their module, name and code, defaults and closures).  Raises
    :class:`Unkeyable` (naming the path) for an object of a class, or a function, from outside
    nrpt, torch, NumPy and Python's standard types: such an object's behaviour is not covered by
    the key.  ``log``: a list that gets ``(path, digest so far)`` for every object walked (to
    find what changed)."""
    h = hashlib.sha256()
    seen: dict[int, int] = {}
    keep: list = []  # (the walked objects stay alive: their ids stay unique)

    def put(*parts) -> None:
        for p in parts:
            h.update(str(p).encode())
            h.update(b"\x00")

    def walk(obj, path: str) -> None:
        _walk(obj, path)
        if log is not None:
            log.append((path, h.copy().hexdigest()[:12]))

    def _walk(obj, path: str) -> None:
        if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
            put(type(obj).__name__, repr(obj))
            return
        if isinstance(obj, (torch.dtype, torch.device, torch.Size, torch.layout)):
            put(type(obj).__name__, obj)
            return
        oid = id(obj)
        if oid in seen:
            put("ref", seen[oid])
            return
        seen[oid] = len(seen)
        keep.append(obj)
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            put("tensor", t.dtype, tuple(t.shape), t.stride(), t.device, obj.requires_grad)
            if t.layout != torch.strided:
                raise Unkeyable(f"{path}: a {t.layout} tensor")
            c = t.to("cpu").contiguous()
            if c.numel():
                h.update(c.view(-1).view(torch.uint8).numpy().tobytes())
            return
        if type(obj).__module__ == "numpy" or type(obj).__module__.startswith("numpy."):
            import numpy as np

            if isinstance(obj, np.ndarray):
                put("ndarray", obj.dtype, obj.shape)
                h.update(np.ascontiguousarray(obj).tobytes())
                return
            if isinstance(obj, np.generic):
                put("npscalar", obj.dtype, repr(obj.item()))
                return
            if isinstance(obj, np.ufunc):
                put("ufunc", obj.__name__)
                return
            raise Unkeyable(f"{path}: {type(obj).__name__}")
        if isinstance(obj, (list, tuple)):
            put(type(obj).__name__, len(obj))
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")
            return
        if isinstance(obj, dict):
            put("dict", len(obj))
            for k in sorted(obj, key=repr):
                put(repr(k))
                walk(obj[k], f"{path}[{k!r}]")
            return
        if isinstance(obj, (set, frozenset)):
            put(type(obj).__name__, sorted(repr(v) for v in obj))
            return
        if isinstance(obj, type):
            if not _trusted(obj.__module__):
                raise Unkeyable(f"{path}: class {obj.__module__}.{obj.__qualname__}")
            put("type", obj.__module__, obj.__qualname__)
            return
        if isinstance(obj, types.MethodType):
            put("method")
            walk(obj.__func__, f"{path}.__func__")
            walk(obj.__self__, f"{path}.__self__")
            return
        if isinstance(obj, types.FunctionType):
            mod = obj.__module__ or ""
            if not _trusted(mod):
                raise Unkeyable(f"{path}: function {mod}.{obj.__qualname__}")
            put("function", mod, obj.__qualname__)
            _code(obj.__code__)
            walk(obj.__defaults__, f"{path}.__defaults__")
            walk(obj.__kwdefaults__, f"{path}.__kwdefaults__")
            for i, cell in enumerate(obj.__closure__ or ()):
                try:
                    v = cell.cell_contents
                except ValueError:  # (an empty cell)
                    put("empty cell")
                    continue
                walk(v, f"{path}.<closure {obj.__code__.co_freevars[i]}>")
            return
        if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            self_ = getattr(obj, "__self__", None)
            if self_ is not None and not isinstance(self_, types.ModuleType):
                walk(self_, f"{path}.__self__")
            put("builtin", getattr(obj, "__module__", None), obj.__qualname__)
            return
        if isinstance(obj, types.ModuleType):
            put("module", obj.__name__)
            return
        if isinstance(obj, __import__("functools").partial):
            put("partial")
            walk(obj.func, f"{path}.func")
            walk(obj.args, f"{path}.args")
            walk(obj.keywords, f"{path}.keywords")
            return
        cls = type(obj)
        if not (cls.__module__ == "nrpt" or cls.__module__.startswith("nrpt.")) and \
                not isinstance(obj, __import__("enum").Enum):
            raise Unkeyable(f"{path}: an object of class {cls.__module__}.{cls.__qualname__}")
        put("object", cls.__module__, cls.__qualname__)
        if isinstance(obj, __import__("enum").Enum):
            put(obj.name)
            return
        state = dict(getattr(obj, "__dict__", {}))
        for klass in cls.__mro__:
            for s in getattr(klass, "__slots__", ()):
                if s not in ("__dict__", "__weakref__") and hasattr(obj, s):
                    state[s] = getattr(obj, s)
        for k in sorted(state):
            put(k)
            walk(state[k], f"{path}.{k}")

    def _code(code) -> None:
        put("code", code.co_name, code.co_code.hex(), code.co_names, code.co_varnames)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                _code(c)
            else:
                put(repr(c))

    for name in sorted(roots):
        put("root", name)
        walk(roots[name], name)
    return h.hexdigest()


def key(config: str, objects: str, static: dict, inputs) -> str:
    """The artifact's key: the config digest, the objects' fingerprint, the chunk's static
    settings, the inputs' structure (pytree spec, each leaf's dtype, shape, strides, device),
    nrpt's source and the machine."""
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten(inputs)
    shapes = [(str(t.dtype), tuple(t.shape), t.stride(), str(t.device))
              if isinstance(t, torch.Tensor) else repr(t) for t in leaves]
    text = json.dumps([config, objects, sorted((k, repr(v)) for k, v in static.items()),
                       str(spec), shapes, source_digest(), machine_digest()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class _Body(torch.nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, carry, inp):
        return self.body(carry, inp)


class Artifact:
    """A loaded ``.pt2``: called with the chunk's ``(carry, inputs)``, returns its outputs."""

    def __init__(self, path: Path):
        import torch.utils._pytree as pytree

        self.path = path
        self.loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
        in_spec, out_spec = self.loader.get_call_spec()
        self.in_spec = pytree.treespec_loads(in_spec)
        self.out_spec = pytree.treespec_loads(out_spec)

    def __call__(self, carry, inp):
        import torch.utils._pytree as pytree

        leaves, spec = pytree.tree_flatten(((carry, inp), {}))
        if spec != self.in_spec:  # (the key covers the structure: a bug if reached)
            raise RuntimeError(f"the precompiled chunk {self.path.name} was saved for inputs "
                               f"of another structure")
        out = self.loader.boxed_run([t for t in leaves if isinstance(t, torch.Tensor)])
        return pytree.tree_unflatten(out, self.out_spec)

    @staticmethod
    def build(path: Path, body, carry, inp, manifest: dict) -> Artifact:
        """Export ``body`` at ``(carry, inp)``, compile it with AOTInductor into ``path``
        (written under a temporary name, then renamed: a concurrent process never sees half
        a file) and load it."""
        import torch.utils._pytree as pytree

        path.parent.mkdir(parents=True, exist_ok=True)
        with torch.inference_mode(False):  # (export traces ordinary tensors)
            args = pytree.tree_map(
                lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (carry, inp))
            ep = torch.export.export(_Body(body), args, strict=False)
            tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.pt2")
            from torch._inductor import aoti_compile_and_package

            aoti_compile_and_package(ep, package_path=str(tmp))
        os.replace(tmp, path)
        path.with_suffix(".json").write_text(json.dumps(manifest, indent=1, default=repr))
        return Artifact(path)
