"""The house's shape (issue 28): one stage table that every worker and generator is in, and no import circles."""
from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from build_rules import stage_table

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "build_rules"


def worker_files() -> set[str]:
    """The modules in build_rules/stages/: workers only (each has run(params)); helpers live elsewhere."""
    return {p.stem for p in (PACKAGE / "stages").glob("*.py") if p.stem != "__init__"}


def test_every_worker_module_has_a_row_and_every_row_a_worker():
    files = worker_files()
    named = stage_table.worker_modules()
    assert files - named == set(), "a module in build_rules/stages/ that no row of stage_table.STAGES runs"
    assert named - files == set(), "a row of stage_table.STAGES names a worker that build_rules/stages/ lacks"


@pytest.mark.parametrize("module", sorted(worker_files()))
def test_each_worker_has_run_and_no_version_of_its_own(module):
    source = (PACKAGE / "stages" / f"{module}.py").read_text()
    tree = ast.parse(source)
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "run" in functions, f"stages/{module}.py: a worker's entry point is run(params)"
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert "VERSION" not in assigned, f"stages/{module}.py: a task key's version lives in stage_table.py"


def test_every_generator_named_in_the_table_exists_and_every_row_makes_a_doit_creator():
    from build_rules import tasks
    for stage in stage_table.STAGES:
        for toolchain, where in stage.generators.items():
            module, function = where.split(":")
            assert callable(getattr(importlib.import_module(f"build_rules.tasks.{module}"), function)), where
        if stage.generators:
            creator = getattr(tasks, f"task_{stage.name}")
            assert creator.__doc__ == stage.doc and f"task_{stage.name}" in tasks.__all__
    listed = [n[len("task_"):] for n in tasks.__all__ if n.startswith("task_")]
    assert listed == [s.name for s in stage_table.STAGES if s.generators] + ["chips", "models"]


def test_keys_are_unique_and_each_names_its_toolchain():
    keys = [w.key for s in stage_table.STAGES for w in s.workers.values()]
    assert len(keys) == len(set(keys)) + 1  # evaluate_float's worker is evaluate's module under its own key only once
    for stage in stage_table.STAGES:
        for where, worker in stage.workers.items():
            assert worker.key.startswith("qairt-") == where.startswith("qairt"), (stage.name, where)
            assert worker.sdk or not where.startswith("qairt"), (stage.name, where)


def package_modules() -> dict[str, Path]:
    """build_rules' modules by dotted name (a package by its __init__.py), templates left out (they are copied)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        if "templates" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def package_imports(modules: dict[str, Path]):
    """Every import statement of build_rules (also inside functions), as (module, path, line, imported module,
    names): `import a.b` gives ("a.b", []), `from ..x import y, z` gives (the resolved "build_rules...x", ["y", "z"])."""
    for module, path in modules.items():
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield module, path, node.lineno, alias.name, []
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    b = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    prefix = ".".join(b + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                yield module, path, node.lineno, prefix, [a.name for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """build_rules' modules and the build_rules modules each imports (also inside functions), as
    /work/shared/tools/import_cycles.py reads them."""
    modules = package_modules()

    def resolve(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: set() for m in modules}
    for module, _, _, imported, names in package_imports(modules):
        for target in [imported] + [f"{imported}.{n}" for n in names]:
            found = resolve(target) if target.split(".")[0] == "build_rules" else None
            if found and found != module and found != "build_rules":
                edges[module].add(found)
    return edges


def top_level_names(path: Path) -> set[str] | None:
    """The names a module defines at its top level (also inside a top-level if/try), or None when it cannot be told
    from the source (a star import or a module __getattr__)."""
    names = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
                blocks += [h.body for h in getattr(node, "handlers", [])]
                if not all(visit(b) is not False for b in blocks):
                    return False
        return True
    if visit(ast.parse(path.read_text(), str(path)).body) is False or "__getattr__" in names:
        return None
    return names


def missing_imports() -> list[str]:
    """Each import of a build_rules module that does not exist, or of a name its module does not define: such an
    import fails only when its line runs (a relative import one level off inside a function, say)."""
    modules = package_modules()
    found = []
    for module, path, line, imported, names in package_imports(modules):
        if imported.split(".")[0] != "build_rules":
            continue
        where = f"{path.relative_to(ROOT)}:{line}"
        if imported not in modules:
            found.append(f"{where}: no module {imported}")
            continue
        defined = top_level_names(modules[imported])
        for name in names:
            if f"{imported}.{name}" not in modules and defined is not None and name not in defined:
                found.append(f"{where}: {imported} has no {name!r}")
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10000))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_build_rules_has_no_import_circles():
    found = cycles(import_graph())
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_missing_import_finder_finds_a_missing_module_and_a_missing_name(tmp_path, monkeypatch):
    package = tmp_path / "build_rules"
    (package / "stages" / "support").mkdir(parents=True)
    for init in (package, package / "stages", package / "stages" / "support"):
        (init / "__init__.py").write_text("")
    (package / "errors.py").write_text("AIMET_INSTALL = 'pip install aimet-onnx'\n")
    (package / "stages" / "support" / "ladder.py").write_text(
        "def f():\n    from ..errors import AIMET_INSTALL\n    from ...errors import AIMET_INSTALL, NOPE\n"
        "    from ... import errors, nothing\n    import build_rules.errors\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert missing_imports() == [
        "build_rules/stages/support/ladder.py:2: no module build_rules.stages.errors",
        "build_rules/stages/support/ladder.py:3: build_rules.errors has no 'NOPE'",
        "build_rules/stages/support/ladder.py:4: build_rules has no 'nothing'"]


def test_every_import_of_build_rules_names_a_module_and_a_name_that_exist():
    assert missing_imports() == []


def test_no_lower_layer_imports_the_stages_or_the_task_generators():
    """stages/ (workers) and tasks/ (generators) are the top layers: the shared modules below them never import
    them (dist code, the runner, hashing ...), so a worker can be read without the rest of the house."""
    # device/ holds the actions of the phone tasks (workers that run inside doit): they judge with the check stage
    upper = ("build_rules.stages", "build_rules.tasks", "build_rules.device")
    lower = [m for m in import_graph() if not m.startswith(upper) and m not in ("build_rules.tasks.summary",
                                                                                 "build_rules.stage_main")]
    graph = import_graph()
    reach = {m: sorted(t for t in graph[m] if t.startswith(upper)) for m in lower}
    assert {m: t for m, t in reach.items() if t} == {}


def test_docs_stage_table_is_made_from_the_stage_table():
    assert (ROOT / "docs/stages.md").read_text() == stage_table.markdown(), \
        "docs/stages.md is stale: python -m build_rules.stage_table > docs/stages.md"


def test_the_readme_is_an_entrance():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: reference belongs in docs/"


def test_every_link_of_the_readme_and_docs_leads_somewhere():
    """Files and #anchors (GitHub's heading slugs) of every relative link, outside code blocks."""
    import re

    def slug(heading):
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    anchors = {p: {slug(h) for h in re.findall(r"^#+ (.*)$", p.read_text(), re.M)} for p in pages}
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if link.startswith(("http", "mailto")):
                continue
            file, _, anchor = link.partition("#")
            target = (page.parent / file).resolve() if file else page
            if not target.exists() or (anchor and target.suffix == ".md" and anchor not in anchors.get(target, ())):
                broken.append(f"{page.relative_to(ROOT)}: {link}")
    assert broken == []


def test_pyproject_lists_every_package_a_wheel_needs():
    """setuptools installs the packages pyproject names: one left out (build_rules.device was) works in an editable
    checkout and breaks an installed tool."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "build_rules").rglob("__init__.py")
             if "templates" not in p.parts}
    assert found == listed


def test_nothing_reads_doits_stack_frames():
    """The reporter gets what it needs from doit's public pieces (doit.Globals.dep_manager, the tasks it is handed),
    not from its caller's locals: a frame read breaks silently when doit renames a local."""
    readers = [str(p.relative_to(ROOT)) for p in (ROOT / "build_rules").rglob("*.py")
               if any(s in p.read_text() for s in ("_getframe", "currentframe(", "f_locals", "f_back"))]
    assert readers == []
