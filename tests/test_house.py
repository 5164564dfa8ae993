"""The house's shape (issue 28): one stage table that every worker and generator is in, no import circles, and the
package's rooms in layers, each importing only the rooms below it (issue 46)."""
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
    lower = [m for m in import_graph() if not m.startswith(upper) and m != "build_rules.stage_main"]
    graph = import_graph()
    reach = {m: sorted(t for t in graph[m] if t.startswith(upper)) for m in lower}
    assert {m: t for m, t in reach.items() if t} == {}


# --- the rooms' layering (issue 46) -----------------------------------------------------------------------------
# A unit is a sub-package of build_rules (a room, or stages/, device/, tasks/, toolchains/) or a module at its root.
# The layers, lowest first: a unit imports only units on layers below its own (not one beside it on its layer). The
# README's map shows the same order; each room's __init__.py says what it may import.
LAYERS = (
    ("errors",),
    ("plumbing",),
    ("quantization",),
    ("configuration",),
    ("stage_table",),
    ("build_state",),
    ("measuring",),
    ("cache", "build_log", "journal"),  # the root's commands and doit's backend on the build state
    ("toolchains", "runner"),
    ("emulator",),
    ("bundles",),
    ("dist",),  # `python -m build_rules.dist`, and the bundle code the dist stage and `run` call
    ("doit_run",),
    ("stages", "device"),
    ("tasks",),
    ("__main__", "init_repo", "run_binary", "stage_main", "tuning"),  # entry points: nothing imports them
)

# Imports against the layers that the house had before it had rooms, by file and imported module, and why. A new one
# fails; one that is gone fails too, so that it leaves this list.
KNOWN_EXCEPTIONS = {
    ("build_rules/stages/dist.py", "build_rules.device.results"): "the bundle's index.json says what the phones "
                                                                   "measured with its binaries (issue 29)",
    ("build_rules/stages/report.py", "build_rules.device.results"): "the report's table of the phones' device checks "
                                                                     "(issue 29)",
    ("build_rules/device/device_check.py", "build_rules.stages.check"): "a phone's check judges as the check stage "
                                                                         "does (hooks_digest, its measurements)",
    ("build_rules/device/target.py", "build_rules.stages.qairt_check"): "the qairt check's layout conversion of a "
                                                                         "phone's outputs",
    ("build_rules/stages/support/diagnosis.py", "build_rules.tasks.diagnose"): "diagnose's sample count setting "
                                                                                "(SAMPLES_ENV), named by its task",
}


def excepted(path: str, imported: str, known) -> bool:
    """Whether a known exception covers this import: its module, or the package it is imported from (`from ..device
    import results` imports build_rules.device too)."""
    return (path, imported) in known or any(p == path and m.startswith(imported + ".") for p, m in known)


def unit_of(module: str) -> str | None:
    """The room (sub-package) or root module a module of build_rules belongs to; None for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def import_edges() -> list[tuple[str, int, str, str]]:
    """Every import of one build_rules module by another (also inside functions), as (file, line, importer, imported
    module), the imported module resolved as import_graph() resolves it."""
    modules = package_modules()

    def resolve(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = set()
    for module, path, line, imported, names in package_imports(modules):
        for target in [imported] + [f"{imported}.{n}" for n in names]:
            found = resolve(target) if target.split(".")[0] == "build_rules" else None
            if found and found != module and found != "build_rules":
                edges.add((str(path.relative_to(ROOT)), line, module, found))
    return sorted(edges)


def layering_problems(edges, layers=LAYERS, known=KNOWN_EXCEPTIONS) -> list[str]:
    """One line per import from a unit to a unit on its own layer or above (the file, the import, the rule), and per
    unit that no layer names."""
    layer = {unit: i for i, units in enumerate(layers) for unit in units}
    problems = []
    for path, line, importer, imported in edges:
        a, b = unit_of(importer), unit_of(imported)
        if a == b or excepted(path, imported, known):
            continue
        for unit in (a, b):
            if unit not in layer:
                problems.append(f"{path}:{line}: {unit} is on no layer: give it one in tests/test_house.py LAYERS "
                                "(and the README's map)")
        if a not in layer or b not in layer or layer[b] < layer[a]:
            continue
        where = "on the same layer" if layer[a] == layer[b] else "on a layer above"
        problems.append(f"{path}:{line}: {a} imports {imported}, which is {where} ({b}: layer {layer[b]}, "
                        f"{a}: layer {layer[a]}); a room imports only the rooms below it: "
                        f"{', '.join(u for units in layers[:layer[a]] for u in units)}")
    return sorted(set(problems))


def room_circles(edges, known=KNOWN_EXCEPTIONS) -> list[str]:
    """One line per circle among the units (rooms and root modules), each edge with an import that makes it."""
    graph, why = {}, {}
    for path, line, importer, imported in edges:
        a, b = unit_of(importer), unit_of(imported)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b and not excepted(path, imported, known):
            graph[a].add(b)
            why.setdefault((a, b), f"{path}:{line} imports {imported}")
    found = []
    for circle in cycles(graph):
        inside = set(circle)
        steps = [f"{a} -> {b} ({why[a, b]})" for a in circle for b in sorted(graph[a] & inside)]
        found.append(f"circle between {', '.join(circle)}: " + "; ".join(steps))
    return found


def test_every_room_and_root_module_is_on_one_layer():
    units = {unit_of(m) for m in package_modules()} - {None}
    listed = [unit for units_ in LAYERS for unit in units_]
    assert sorted(set(listed)) == sorted(listed), "a unit on two layers"
    assert sorted(units - set(listed)) == [], "rooms or root modules on no layer of LAYERS"
    assert sorted(set(listed) - units) == [], "LAYERS names rooms or root modules that are gone"


def test_no_room_imports_its_own_layer_or_one_above():
    assert layering_problems(import_edges()) == []


def test_no_circle_between_rooms():
    assert room_circles(import_edges()) == []


def test_each_known_exception_to_the_layers_is_still_there():
    imports = {(path, imported) for path, _, _, imported in import_edges()}
    assert sorted(set(KNOWN_EXCEPTIONS) - imports) == [], "gone: leave KNOWN_EXCEPTIONS"


def test_the_layering_check_names_the_file_the_import_and_the_rule():
    layers = (("errors",), ("plumbing",), ("emulator", "measuring"), ("tasks",))
    edges = [
        ("build_rules/plumbing/files.py", 3, "build_rules.plumbing.files", "build_rules.errors"),  # down: fine
        ("build_rules/plumbing/files.py", 7, "build_rules.plumbing.files", "build_rules.emulator.slots"),  # up
        ("build_rules/emulator/runs.py", 9, "build_rules.emulator.runs", "build_rules.measuring.gates"),  # beside
        ("build_rules/measuring/gates.py", 4, "build_rules.measuring.gates", "build_rules.emulator.runs"),
        ("build_rules/tasks/x.py", 2, "build_rules.tasks.x", "build_rules.newroom.y"),
    ]
    assert layering_problems(edges, layers, {}) == [
        "build_rules/emulator/runs.py:9: emulator imports build_rules.measuring.gates, which is on the same layer "
        "(measuring: layer 2, emulator: layer 2); a room imports only the rooms below it: errors, plumbing",
        "build_rules/measuring/gates.py:4: measuring imports build_rules.emulator.runs, which is on the same layer "
        "(emulator: layer 2, measuring: layer 2); a room imports only the rooms below it: errors, plumbing",
        "build_rules/plumbing/files.py:7: plumbing imports build_rules.emulator.slots, which is on a layer above "
        "(emulator: layer 2, plumbing: layer 1); a room imports only the rooms below it: errors",
        "build_rules/tasks/x.py:2: newroom is on no layer: give it one in tests/test_house.py LAYERS (and the "
        "README's map)"]
    known = {("build_rules/measuring/gates.py", "build_rules.emulator.runs"): "a reason"}
    assert len(layering_problems(edges, layers, known)) == 3
    assert room_circles(edges, {}) == [
        "circle between emulator, measuring: emulator -> measuring (build_rules/emulator/runs.py:9 imports "
        "build_rules.measuring.gates); measuring -> emulator (build_rules/measuring/gates.py:4 imports "
        "build_rules.emulator.runs)"]
    assert room_circles(edges, known) == []


def test_each_room_holds_a_docstring_that_says_what_it_may_import():
    """A room's __init__.py is its door sign: what it holds and what it may import, and nothing else (no re-exports:
    a module is imported from its room)."""
    old = ("stages", "tasks", "toolchains", "device")  # the packages from before the rooms, with code of their own
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        if init.parent.name in old:
            continue
        body = ast.parse(init.read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), init
        assert "May import:" in body[0].value.value, f"{init.relative_to(ROOT)}: say what the room may import"


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
