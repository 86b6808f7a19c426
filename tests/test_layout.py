"""The package layout the project promises (DEVELOPERS.md, docs/ARCHITECTURE.md), checked on the
source: imports go one way between the packages, no module imports another module's private name,
no import cycle between modules (function-level and ``TYPE_CHECKING`` imports included), and no
module grows past ~450 lines unless it is listed below with its reason (a shrinking list)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sv_core", "cohort", "models", "evaluation", "pipelines", "dashboards")

#: package -> the project packages it may import (pipelines wires everything together)
ALLOWED = {
    "sv_core": set(),
    "models": {"sv_core"},
    "evaluation": {"models", "sv_core", "cohort"},
    "cohort": {"sv_core"},
    "dashboards": {"sv_core", "cohort", "evaluation"},
    "pipelines": set(PACKAGES),
}

#: modules allowed past MAX_LINES, each with why (issue 24 tracks shrinking this list)
LONG_MODULES: dict[str, str] = {}
MAX_LINES = 450


def _modules():
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            yield f.relative_to(ROOT), ast.parse(f.read_text(), filename=str(f))


def _imports(rel: Path, tree: ast.AST):
    """(imported module, imported names) of every import in the file, function-level ones too."""
    here = list(rel.with_suffix("").parts)
    if here[-1] == "__init__":
        here = here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + (1 if rel.name == "__init__.py" else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod, [a.name for a in node.names]


def test_imports_go_one_way_between_packages():
    bad = []
    for rel, tree in _modules():
        pkg = rel.parts[0]
        for mod, _ in _imports(rel, tree):
            top = mod.split(".")[0]
            if top in PACKAGES and top != pkg and top not in ALLOWED[pkg]:
                bad.append(f"{rel}: imports {mod}")
    assert not bad, "imports against the layout:\n" + "\n".join(bad)


def _is_submodule(mod: str, name: str) -> bool:
    """``from pkg import _mod``: a private module of the package itself (a compiled one included)."""
    folder = ROOT.joinpath(*mod.split("."))
    return folder.is_dir() and (any(folder.glob(f"{name}.py")) or any(folder.glob(f"{name}.c")))


def test_no_module_imports_another_modules_private_name():
    bad = []
    for rel, tree in _modules():
        for mod, names in _imports(rel, tree):
            if mod.split(".")[0] not in PACKAGES:
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__") and not _is_submodule(mod, n):
                    bad.append(f"{rel}: from {mod} import {n}")
    assert not bad, "private names imported across modules (make them public where they live):\n" + "\n".join(bad)


def test_modules_stay_readable_in_length():
    long = {str(rel): len((ROOT / rel).read_text().splitlines()) for rel, _ in _modules()}
    over = {f: n for f, n in long.items() if n > MAX_LINES and f not in LONG_MODULES}
    assert not over, f"modules over {MAX_LINES} lines (split along their seams, or list with a reason): {over}"
    stale = [f for f in LONG_MODULES if long.get(f, 0) <= MAX_LINES]
    assert not stale, f"listed as long but no longer are (remove from LONG_MODULES): {stale}"


@pytest.mark.parametrize("text", ["from ._state import _Hidden", "from pipelines.runtime.runner import _x"])
def test_the_private_import_check_can_fail(text, tmp_path):
    rel = Path("sv_core/x.py")
    found = [n for _, names in _imports(rel, ast.parse(text)) for n in names if n.startswith("_")]
    assert found


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph(modules) -> dict[str, set[str]]:
    """module -> the project modules it imports (``from pkg import mod`` counts as importing
    ``pkg.mod`` when that is a module); every import, function-level ones included."""
    names = {_module_name(rel) for rel, _ in modules}
    edges: dict[str, set[str]] = {}
    for rel, tree in modules:
        here = _module_name(rel)
        out = edges.setdefault(here, set())
        for mod, imported in _imports(rel, tree):
            # ``from pkg import sub`` imports the module ``pkg.sub``; the package itself counts
            # only when a name that is not a module is taken from it
            subs = [f"{mod}.{n}" for n in imported if f"{mod}.{n}" in names]
            takes_names = not imported or len(subs) < len(imported)
            for target in ([mod] if takes_names else []) + subs:
                if target in names and target != here:
                    out.add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_modules():
    # the package facades (``__init__``) re-export their modules: an edge into a package's own
    # ``__init__`` from one of its modules is the facade, not a cycle of the code
    edges = _graph(list(_modules()))
    for m in edges:
        edges[m] = {t for t in edges[m] if not (t in PACKAGES and m.startswith(t + "."))}
    cycles = _cycles(edges)
    assert not cycles, "import cycles (move the shared piece down, or the caller up):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_cycle_check_can_fail():
    a = (Path("pipelines/a.py"), ast.parse("def f():\n    from .b import x\n"))
    b = (Path("pipelines/b.py"), ast.parse("from pipelines import a\n"))
    assert _cycles(_graph([a, b])) == [["pipelines.a", "pipelines.b"]]


#: the most parameters a function in ``pipelines/`` takes (issue 34: settings travel as one frozen
#: dataclass per study, never as 15 loose parameters or positional tuples)
MAX_PARAMETERS = 8


def _wide_functions(modules) -> list[str]:
    """``file:line name (n)`` of every function with more than MAX_PARAMETERS named parameters
    (positional, keyword and keyword-only; ``self``/``cls`` and ``*args``/``**kwargs`` not counted)."""
    out = []
    for rel, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                if len(names) > MAX_PARAMETERS:
                    out.append(f"{rel}:{node.lineno} {node.name} ({len(names)})")
    return out


def test_no_function_in_pipelines_takes_more_than_eight_parameters():
    wide = _wide_functions([(rel, tree) for rel, tree in _modules() if rel.parts[0] == "pipelines"])
    assert not wide, ("functions with more than 8 parameters (pass the study's settings dataclass, "
                      "pipelines/settings.py):\n" + "\n".join(wide))


def test_the_parameter_check_can_fail():
    wide = ast.parse("def f(a, b, c, d, e, f, g, h, *, i, **kw):\n    pass\n"
                     "class C:\n    def m(self, a, b, c, d, e, f, g, h):\n        pass\n")
    assert _wide_functions([(Path("pipelines/x.py"), wide)]) == ["pipelines/x.py:1 f (9)"]


#: the deletion subsystem (issue 34): the warehouse, forget and erasure (``pipelines/store``) and the
#: receipt log (``pipelines/receipts``) work without Prefect; they import neither Prefect nor the
#: rooms that wire it (``pipelines.runtime``, ``pipelines.flows``), not even inside a function
DELETION_ROOMS = ("pipelines/store", "pipelines/receipts")
PREFECT_SIDE = ("prefect", "prefect_dask", "pipelines.runtime", "pipelines.flows")


def _prefect_imports(modules) -> list[str]:
    bad = []
    for rel, tree in modules:
        if not str(rel).startswith(DELETION_ROOMS):
            continue
        for mod, _ in _imports(rel, tree):
            if mod == "prefect" or mod.startswith(tuple(p + "." for p in PREFECT_SIDE)) or mod in PREFECT_SIDE:
                bad.append(f"{rel}: imports {mod}")
    return bad


def test_the_deletion_subsystem_imports_no_prefect():
    assert not _prefect_imports(list(_modules()))


def test_the_deletion_room_check_can_fail():
    tree = ast.parse("def f():\n    from pipelines.runtime import runner\n")
    assert _prefect_imports([(Path("pipelines/store/x.py"), tree)]) == [
        "pipelines/store/x.py: imports pipelines.runtime"]


def _hand_written_result_files(modules) -> list[str]:
    """``file:line`` of every ``json.dump(…, file)`` and ``….write_text(json.dumps(…))`` in a module
    with a ``--json`` option: a command's result file is written by ``sv_core.jsonfile.write_json``
    (atomic, parent folders made), never by a copied block."""
    def is_json(f: ast.AST, name: str) -> bool:
        return (isinstance(f, ast.Attribute) and f.attr == name and isinstance(f.value, ast.Name)
                and f.value.id == "json")

    out = []
    for rel, tree in modules:
        nodes = list(ast.walk(tree))
        if not any(isinstance(n, ast.Constant) and n.value == "--json" for n in nodes):
            continue
        for n in nodes:
            if isinstance(n, ast.Call) and (is_json(n.func, "dump") or (
                    isinstance(n.func, ast.Attribute) and n.func.attr == "write_text" and n.args
                    and isinstance(n.args[0], ast.Call) and is_json(n.args[0].func, "dumps"))):
                out.append((str(rel), n.lineno))
    return [f"{f}:{line}" for f, line in sorted(out)]


def test_commands_write_their_result_files_through_one_writer():
    hand = _hand_written_result_files(_modules())
    assert not hand, "write the --json result with sv_core.jsonfile.write_json:\n" + "\n".join(hand)


def test_the_result_file_check_can_fail():
    tree = ast.parse('ap.add_argument("--json")\nwith open(p, "w") as f:\n    json.dump(r, f)\n'
                     'Path(p).write_text(json.dumps(r, indent=2))\nprint(json.dumps(r))\n')
    assert _hand_written_result_files([(Path("sv_core/x.py"), tree)]) == ["sv_core/x.py:3", "sv_core/x.py:4"]


#: a module docstring says what the module is for in a few lines; protocol detail goes to the function it
#: describes or to docs/ (issue 34)
MAX_DOCSTRING_LINES = 25
MAX_LONG_DOCSTRINGS = 10


def _long_docstrings(modules) -> list[str]:
    """``file (n lines)`` of every module whose docstring is over MAX_DOCSTRING_LINES lines."""
    out = []
    for rel, tree in modules:
        doc = ast.get_docstring(tree, clean=False)
        if doc and len(doc.splitlines()) > MAX_DOCSTRING_LINES:
            out.append(f"{rel} ({len(doc.splitlines())} lines)")
    return sorted(out)


def test_module_docstrings_read_in_a_minute():
    long = _long_docstrings(_modules())
    assert len(long) <= MAX_LONG_DOCSTRINGS, (
        f"{len(long)} modules have a docstring over {MAX_DOCSTRING_LINES} lines (at most {MAX_LONG_DOCSTRINGS}): say "
        "what the module is for in a few lines; move protocol detail to its function or docs/:\n" + "\n".join(long))


def test_the_docstring_check_can_fail():
    short, long = ast.parse('"""One line."""\n'), ast.parse('"""' + "line\n" * 30 + '"""\n')
    assert _long_docstrings([(Path("a.py"), short), (Path("b.py"), long)]) == ["b.py (30 lines)"]
