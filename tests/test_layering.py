"""Imports point one way: storage <- format <- roles <- orchestration.

The layers, lowest first (a module may import its own layer and the ones
below, never one above)::

    0  cloud.{base,local,gcs,storage}     the storage layer: one interface, local and gs://
    1  format.*                           the lake's contract: layout, records, events, registry
    2  selfplay.*                          the engine, search, worker, GTP, matches
    3  pipeline.* (the Beam job), model.*  the roles that build on the engine (endstate labels)
    4  pipeline.loop, pipeline.cluster     orchestration: run the roles as processes
    5  testdata.*, cloud.deploy            generators of test and benchmark data; the deployment
                                           tool (its `status` reads the lake and the trainer's lease)

Every import counts, including the lazy ones inside functions: a lazy import
that points up is still a cycle, only hidden.  ``pipeline`` and ``model`` do
not import each other.
"""
from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("cloud", "format", "selfplay", "pipeline", "model", "testdata")
ORCHESTRATION = ("pipeline.loop", "pipeline.cluster")
TOP = ("cloud.deploy",)


def layer(module: str) -> int:
    if module in ORCHESTRATION:
        return 4
    if any(module == top or module.startswith(top + ".") for top in TOP):
        return 5
    top = module.split(".")[0]
    return {"cloud": 0, "format": 1, "selfplay": 2, "pipeline": 3, "model": 3, "testdata": 5}[top]


def project_modules():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")) + sorted((REPO / package).rglob("*.pyx")):
            relative = path.relative_to(REPO).with_suffix("")
            yield ".".join(relative.parts).removesuffix(".__init__"), path


def imported_modules(path: pathlib.Path, module: str):
    """(line, imported module) for every project import in a file, lazy ones included."""
    source = path.read_text()
    if path.suffix == ".pyx":
        # Cython: read the plain Python import statements line by line.
        for number, line in enumerate(source.splitlines(), 1):
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from", "cimport") and words[1].split(".")[0] in PACKAGES:
                yield number, words[1]
            elif len(words) >= 4 and words[0] == "from" and words[2] == "cimport" and \
                    words[1].split(".")[0] in PACKAGES:
                yield number, words[1]
        return
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                # "from format import layout" imports the module format.layout.
                candidate = f"{node.module}.{alias.name}"
                yield node.lineno, candidate if _is_module(candidate) else node.module


def _is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or base.with_suffix(".pyx").exists() or (base / "__init__.py").exists()


def test_no_import_points_up():
    upward = []
    for module, path in project_modules():
        for line, imported in imported_modules(path, module):
            if layer(imported) > layer(module):
                upward.append(f"{path.relative_to(REPO)}:{line}: {module} (layer {layer(module)}) imports "
                              f"{imported} (layer {layer(imported)})")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_the_beam_job_and_the_trainer_do_not_import_each_other():
    crossing = []
    for module, path in project_modules():
        if module in ORCHESTRATION:
            continue
        top = module.split(".")[0]
        other = {"pipeline": "model", "model": "pipeline"}.get(top)
        for line, imported in imported_modules(path, module):
            if other and imported.split(".")[0] == other:
                crossing.append(f"{path.relative_to(REPO)}:{line}: {module} imports {imported}")
    assert not crossing, "\n".join(crossing)


def test_the_checker_sees_lazy_imports(tmp_path):
    """A lazy import inside a function is found (the checker itself can fail)."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from selfplay import coords\n    import pipeline.loop\n")
    found = [name for _, name in imported_modules(source, "format.probe")]
    assert "pipeline.loop" in found and any(name.startswith("selfplay") for name in found)
    assert layer("pipeline.loop") > layer("format.probe")


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (strongly connected
    components of more than one module; Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, edges = work[-1]
            step = next((m for m in edges if m in graph), None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return cycles


def test_no_modules_import_each_other_even_lazily_or_within_a_layer():
    # Layers only say that imports point down; two modules of one layer could still import each other
    # (the follower and the shuffle job once did, one of them through an import inside a function).
    graph = {module: {imported for _, imported in imported_modules(path, module) if imported != module}
             for module, path in project_modules()}
    assert not import_cycles(graph), f"modules that import each other: {import_cycles(graph)}"


def test_the_cycle_finder_finds_a_cycle_through_a_third_module():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
