"""Imports point one way: each top-level package is one floor, and imports only the floors below it.

The floors, lowest first (docs/development.md, "The layout of the code"): a module may import its own
package and any package on a lower floor, never one on its floor or above::

    processes                   child processes, SIGTERM, forwarding old command names (imports nothing)
    cloud                       the storage layer: one interface, local and gs://
    format                      the lake's contract: layout, records, events, registry, inspect tools
    engine                      the Cython engine: board, search, batched driver, playouts
    inference                   evaluators: protocol, TensorFlow and OpenVINO backends, model loading
    selfplay, pipeline, model   the roles: the worker, the Beam job, the trainer (independent of each other)
    arena                       matches, GTP, the rating ladder
    operations                  launchers and deployment: loop, cluster, chaos audit, deploy, VM scripts
    testdata                    generators of test and benchmark data

Every import counts, including the lazy ones inside functions: a lazy import
that points up is still a cycle, only hidden.  There are no exceptions by
module: a module that does not fit its package's floor belongs in another.
"""
from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
FLOORS = (("processes",), ("cloud",), ("format",), ("engine",), ("inference",), ("selfplay", "pipeline", "model"), ("arena",),
          ("operations",), ("testdata",))
PACKAGES = tuple(package for floor in FLOORS for package in floor)


def floor(module: str) -> int:
    top = module.split(".")[0]
    return next(number for number, packages in enumerate(FLOORS) if top in packages)


def may_import(module: str, imported: str) -> bool:
    """Its own package, or any package on a lower floor."""
    return imported.split(".")[0] == module.split(".")[0] or floor(imported) < floor(module)


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


def test_no_import_points_up_or_sideways():
    wrong = []
    for module, path in project_modules():
        for line, imported in imported_modules(path, module):
            if not may_import(module, imported):
                wrong.append(f"{path.relative_to(REPO)}:{line}: {module} (floor {floor(module)}) imports "
                             f"{imported} (floor {floor(imported)})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_setup_builds_every_package_of_the_floors():
    """setup.py's package list is the floors' (a package missing there would not be installed)."""
    source = (REPO / "setup.py").read_text()
    listed = ast.literal_eval(source.split("PACKAGES = ", 1)[1].split("]", 1)[0] + "]")
    assert tuple(listed) == PACKAGES
    on_disk = {path.parent.name for path in REPO.glob("*/__init__.py")} - {"tests"}
    assert on_disk == set(PACKAGES)


def test_the_checker_sees_lazy_and_sideways_imports(tmp_path):
    """A lazy import inside a function is found, and a role importing another role is refused
    (the checker itself can fail)."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from selfplay import worker\n    import operations.loop\n")
    found = [name for _, name in imported_modules(source, "format.probe")]
    assert "operations.loop" in found and any(name.startswith("selfplay") for name in found)
    assert not may_import("format.probe", "operations.loop")
    assert not may_import("pipeline.shuffle", "model.sgd") and not may_import("model.train", "selfplay.worker")
    assert may_import("arena.match", "selfplay.worker") and may_import("model.sgd", "model.network")
    source.write_text("import tensorflow as tf\n# tf.data in a comment\nx = tf.data.Dataset\n")
    assert uses_of("tf.data", source) == [3]


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


def uses_of(attribute_chain: str, path: pathlib.Path) -> list[int]:
    """Lines where code (not a comment or docstring) spells ``attribute_chain``, e.g. ``tf.data``."""
    if path.suffix != ".py":
        return []
    head, _, tail = attribute_chain.partition(".")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == tail and isinstance(node.value, ast.Name) \
                and node.value.id == head:
            found.append(node.lineno)
    return found


def test_only_the_trainers_package_uses_the_tensorflow_data_api():
    """The input pipeline is the trainer's (model.tfdata); no other package reads shards with tf.data."""
    outside = [f"{path.relative_to(REPO)}:{line}" for module, path in project_modules()
               if not module.startswith("model.") for line in uses_of("tf.data", path)]
    assert not outside, outside


def test_format_imports_no_tensorflow_and_no_launcher():
    """format/ is the lake's contract: numpy and the standard library, never TensorFlow, Keras or the
    launchers' composition (which is operations.roles)."""
    wrong = []
    for module, path in project_modules():
        if not module.startswith("format"):
            continue
        for line, imported in imported_modules(path, module):
            if imported.split(".")[0] != "format" and imported.split(".")[0] != "cloud":
                wrong.append(f"{path.relative_to(REPO)}:{line}: {imported}")
        source = path.read_text()
        for node in ast.walk(ast.parse(source)) if path.suffix == ".py" else ():
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            wrong += [f"{path.relative_to(REPO)}:{node.lineno}: {name}" for name in names
                      if name.split(".")[0] in ("tensorflow", "keras")]
    assert not wrong, wrong
