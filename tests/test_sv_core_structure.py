"""``Gate`` is one readable class (issue 34 item 3): its public methods live in ``sv_core/gate.py``
over composed state (no mixin bases), and no function in ``sv_core`` is a stub that only raises
``NotImplementedError``."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import sv_core
from sv_core.gate import Gate

SV_CORE = Path(sv_core.__file__).resolve().parent


def _only_raises_not_implemented(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    name = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(name, ast.Name) and name.id == "NotImplementedError"


def test_no_function_in_sv_core_only_raises_not_implemented():
    stubs = []
    for f in sorted(SV_CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _only_raises_not_implemented(node):
                stubs.append(f"{f.relative_to(SV_CORE)}:{node.lineno} {node.name}")
    assert not stubs, stubs


def test_gate_is_one_class_with_every_public_method_in_gate_py():
    assert Gate.__bases__ == (object,)
    gate_py = Path(inspect.getsourcefile(Gate)).resolve()
    assert gate_py == SV_CORE / "gate.py"
    for name, member in vars(Gate).items():
        fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if callable(fn) and not name.startswith("__"):
            assert Path(inspect.getsourcefile(fn)).resolve() == gate_py, name
    public = {n for n in dir(Gate) if not n.startswith("_")}
    assert public <= set(vars(Gate)), public - set(vars(Gate))  # nothing public is inherited
