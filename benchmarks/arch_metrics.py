"""Architecture figures of issue 22, measured on a source tree: lines, top-level modules, the
longest functions, cyclomatic complexity (radon), modules that mention the two-leg reference /
the fused path / sharding, and mypy's error counts.

    python benchmarks/arch_metrics.py [SRC_DIR]     (default: src/nrpt of this checkout)
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

MENTIONS = {
    "two-leg reference": r"TwoLeg|two_leg|two-leg|fitted_reference|\[0::2\]|\[1::2\]",
    "fused path": r"\bfused\b|\bFused\b|observe_block|record_block|\bfuse\b",
    "sharding": r"shard|Shard|all_gather|world_size|is_distributed",
}


def functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def code_only(f: Path) -> str:
    """The module's code without docstrings, comments and import lines (mentions in prose or in
    an import of a module named after the concept do not count)."""
    tree = ast.parse(f.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            body[0].value.value = ""
    tree.body = [n for n in tree.body if not isinstance(n, ast.Import | ast.ImportFrom)]
    return ast.unparse(tree)


def main(src: Path) -> None:
    files = sorted(src.rglob("*.py"))
    lines = sum(len(f.read_text().splitlines()) for f in files)
    top = [f.name for f in src.glob("*.py")]
    print(f"src lines (wc -l): {lines} in {len(files)} files; top-level modules: {len(top)} "
          f"({', '.join(sorted(top))})")
    longest = []
    for f in files:
        for fn in functions(ast.parse(f.read_text())):
            longest.append((fn.end_lineno - fn.lineno + 1, f"{f.relative_to(src)}:{fn.name}"))
    longest.sort(reverse=True)
    print("longest functions:", "; ".join(f"{n} {w}" for n, w in longest[:5]))
    print(f"functions over 80 lines: {sum(n > 80 for n, _ in longest)}")
    try:
        from radon.complexity import cc_visit
        cc = []
        for f in files:
            for b in cc_visit(f.read_text()):
                cc.append((b.complexity, f"{f.relative_to(src)}:{b.name}"))
        cc.sort(reverse=True)
        print("highest cyclomatic complexity:", "; ".join(f"{c} {w}" for c, w in cc[:5]))
        print(f"blocks with complexity > 15: {sum(c > 15 for c, _ in cc)}")
    except ImportError:
        print("radon not installed: no complexity figures")
    for what, pat in MENTIONS.items():
        hits = [str(f.relative_to(src)) for f in files if re.search(pat, code_only(f))]
        print(f"modules mentioning the {what}: {len(hits)} ({', '.join(hits)})")
    core = ("roles.py", "rng.py", "scalars.py", "options.py", "core",  # and the old names:
            "engine.py", "loop.py", "fused.py", "distributed.py")
    for label, args in (("whole package", [str(src)]),
                        ("contracts + core", [str(src / m) for m in core if (src / m).exists()])):
        out = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports",
                              "--no-incremental", "--follow-imports=silent", *args],
                             capture_output=True, text=True).stdout
        m = re.search(r"Found (\d+) error", out)
        print(f"mypy errors, {label}: {m.group(1) if m else ('0' if 'Success' in out else '?')}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "src" / "nrpt")
