"""The house rules of the architecture, checked: no import cycle between nrpt's modules, no
private name imported across modules, the layering (:data:`LAYER_RULES`), and every registered
name builds and runs."""

from __future__ import annotations

import ast
import functools
import math
from pathlib import Path

import pytest
import torch

import nrpt
from nrpt.run import registry
from nrpt.targets import Gaussian

SRC = Path(nrpt.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, mod: str | None = None) -> list[tuple[str, list[str]]]:
    """``(module imported, names)`` for every import in ``path`` (module or function level)."""
    tree = ast.parse(path.read_text())
    mod = mod or _module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def _graph(files: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the nrpt modules it imports (module level or inside a function); the real
    package's graph is parsed once per session (a fresh copy each call: tests add edges)."""
    if files is None:
        return {m: set(d) for m, d in _package_graph().items()}
    return _parse_graph(files)


@functools.lru_cache(maxsize=1)
def _package_graph() -> dict[str, set[str]]:
    return _parse_graph({_module_name(p): p for p in SRC.rglob("*.py")})


def _parse_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for target, names in _imports(path, mod):
            if not target.startswith("nrpt"):
                continue
            for name in names or [""]:
                sub = f"{target}.{name}" if name else target
                graph[mod].add(sub if sub in files else target)
    return graph


# ------------------------------------------------------------------------------ the layering
def _within(mod: str, *packages: str) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in packages)


#: everything below ``nrpt.run`` (the machine, the roles, the targets, the maths, the outputs)
BELOW_RUN = tuple(f"nrpt.{p}" for p in ("core", "explorers", "swap", "adapt", "recorders",
                                        "energy", "paths", "targets", "diagnostics", "report"))
#: the contracts: the bottom layer, importing nothing but each other (``nrpt.options``: the
#: option declarations, when that module exists)
CONTRACTS = ("nrpt.roles", "nrpt.rng", "nrpt.scalars", "nrpt.options")
#: leaves that import nothing of nrpt at all
LEAVES = ("nrpt.files",)

#: ``(rule, importer, imported)``: no module for which ``importer`` holds imports a module for
#: which ``imported`` holds (``imported`` never sees the package root ``nrpt``'s re-exports:
#: ``from nrpt import rng`` is an edge to ``nrpt.rng``)
LAYER_RULES = [
    ("nothing below nrpt.run imports nrpt.run",
     lambda m: _within(m, *BELOW_RUN), lambda d: _within(d, "nrpt.run")),
    ("the contracts import no implementation",
     lambda m: m in CONTRACTS, lambda d: _within(d, "nrpt") and d not in CONTRACTS),
    ("the leaves import nothing of nrpt",
     lambda m: m in LEAVES, lambda d: _within(d, "nrpt")),
    ("diagnostics is maths only (no core, report or run)",
     lambda m: _within(m, "nrpt.diagnostics"),
     lambda d: _within(d, "nrpt.core", "nrpt.report", "nrpt.run")),
    ("the core does not import the report",
     lambda m: _within(m, "nrpt.core"), lambda d: _within(d, "nrpt.report")),
]


def layer_violations(graph: dict[str, set[str]], rule: str) -> list[str]:
    """``"A imports B"`` for every edge of ``graph`` that breaks the named rule."""
    (importer, imported), = [(a, b) for name, a, b in LAYER_RULES if name == rule]
    return [f"{m} imports {d}" for m in sorted(graph) if importer(m)
            for d in sorted(graph[m]) if d != m and imported(d)]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles of a module graph, ignoring edges from a package to its own submodules and the
    package root ``nrpt`` (they only re-export: the usual Python layout, not a design cycle)."""
    def edge(m, d):
        return d != m and d in graph and d != "nrpt" and not d.startswith(m + ".")

    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m, stack):
        state[m] = 1
        for d in sorted(graph[m]):
            if not edge(m, d):
                continue
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state and m != "nrpt":
            visit(m, [m])
    return cycles


def private_imports(path: Path, mod: str | None = None) -> list[str]:
    return [f"{mod or _module_name(path)} imports {t}.{n}" for t, names in _imports(path, mod)
            if t.startswith("nrpt") for n in names if n.startswith("_") and n != "__version__"]


def test_no_import_cycles_between_modules():
    """Every import counts, module level or inside a function: a function-level import that
    keeps a cycle alive is still a cycle."""
    cycles = find_cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_private_names_imported_across_modules():
    bad = [line for p in SRC.rglob("*.py") for line in private_imports(p)]
    assert not bad, bad


RULES = [name for name, _, _ in LAYER_RULES]


@pytest.mark.parametrize("rule", RULES)
def test_the_layering_holds(rule):
    """Every import counts, module level or inside a function (a lazy import is still a
    dependency)."""
    bad = layer_violations(_graph(), rule)
    assert not bad, f"{rule}: " + "; ".join(bad)


def test_the_layers_named_exist():
    """A renamed package would make its rule pass vacuously: every layer named exists."""
    graph = _graph()
    for mod in (*BELOW_RUN, *LEAVES, "nrpt.run", *[c for c in CONTRACTS if c != "nrpt.options"]):
        assert mod in graph, mod


#: one edge per rule that breaks it (the negative controls)
BAD_EDGES = {
    "nothing below nrpt.run imports nrpt.run": ("nrpt.swap.rules", "nrpt.run.registry"),
    "the contracts import no implementation": ("nrpt.roles", "nrpt.explorers.base"),
    "the leaves import nothing of nrpt": ("nrpt.files", "nrpt.scalars"),
    "diagnostics is maths only (no core, report or run)": ("nrpt.diagnostics.ess",
                                                           "nrpt.core.engine"),
    "the core does not import the report": ("nrpt.core.loop", "nrpt.report.text"),
}


@pytest.mark.parametrize("rule", RULES)
def test_the_layering_checks_can_fail(rule):
    """Negative controls: the real graph plus one forbidden edge breaks the rule, naming the
    edge; the same edge in the allowed direction does not."""
    src, dst = BAD_EDGES[rule]
    graph = {m: set(d) for m, d in _graph().items()}
    graph.setdefault(src, set()).add(dst)
    assert layer_violations(graph, rule) == [f"{src} imports {dst}"]
    assert not layer_violations({dst: {src}, src: set()}, rule)


def test_a_function_level_import_breaks_the_layering(tmp_path):
    """Negative control through the parser: a lazy ``from nrpt.run import registry`` inside a
    function of a module below ``nrpt.run`` (relative or absolute) is found."""
    f = tmp_path / "lazy.py"
    f.write_text("def make(name):\n    from nrpt.run import registry\n"
                 "    from ..run.folder import open_fd\n    return registry, open_fd\n")
    graph = _graph({"nrpt.swap.lazy": f})
    assert layer_violations(graph, RULES[0]) == ["nrpt.swap.lazy imports nrpt.run",
                                                 "nrpt.swap.lazy imports nrpt.run.folder"]


def test_the_architecture_checks_can_fail(tmp_path):
    """Negative controls: a two-module cycle is found, and so is a private import."""
    assert find_cycles({"nrpt.a": {"nrpt.b"}, "nrpt.b": {"nrpt.a"}}) == [
        ["nrpt.a", "nrpt.b", "nrpt.a"]]
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from .api import _run\n")
    assert private_imports(f, "nrpt.x") == ["nrpt.x imports nrpt.api._run"]


# ------------------------------------------------------------------------------ the matrix
SG = registry.names("explorer", tag="sg")
EXACT = registry.names("explorer", tag="exact")
SCHEMES = [s for s in registry.names("scheme")]


def _options(explorer: str, scheme: str) -> dict:
    opts = {"chains": 4, "iterations": 24, "systems": 2, "seed": 1, "explorer": explorer,
            "scheme": scheme, "figures": False}
    if scheme == "deo-w":  # a window > 1 with exact Metropolis swaps is refused (biased)
        opts.update(window=2, swap_rule="always")
    return opts


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("explorer", EXACT)
def test_every_exact_explorer_and_scheme_builds_and_runs(explorer, scheme):
    res = nrpt.sample(Gaussian(torch.zeros(2), torch.eye(2)), **_options(explorer, scheme))
    assert res.samples.shape == (2, 22, 2)  # 24 - burn-in floor(0.1 x 24)
    assert res.index.shape == (25, 2, 4)
    assert all(math.isfinite(v) for v in torch.as_tensor(res.samples).flatten().tolist())


RULES_FOR = {"zero-temperature": ["deterministic"],
             "langevin": ["deterministic", "bias-corrected", "metropolis"]}


@pytest.mark.parametrize("explorer", SG)
def test_every_sg_explorer_and_rule_builds_and_runs(explorer):
    zero = "zero-temperature" in registry.entry("explorer", explorer).tags
    for rule in RULES_FOR["zero-temperature" if zero else "langevin"]:
        opts = _options(explorer, "deo")
        opts.update(swap_rule=rule, noise_sd=0.5)
        res = nrpt.sample(Gaussian(torch.zeros(2), torch.eye(2)), **opts)
        assert res.samples.shape == (2, 22, 2), (explorer, rule)


def test_registry_names_drive_the_errors():
    with pytest.raises(ValueError, match="explorer must be one of rwmh, mala"):
        nrpt.make_explorer("gibbs")  # (was "nuts", now registered)
    with pytest.raises(ValueError, match="scheme must be one of adj, seo, deo"):
        nrpt.make_scheme("zigzag")


def test_the_version_has_one_source():
    """pyproject.toml takes its version from nrpt.__version__ (it said 0.1.0 beside 0.2.0)."""
    import tomllib

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "nrpt.__version__"}
    assert nrpt.__version__.count(".") == 2
