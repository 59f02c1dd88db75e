"""python/gnl/_native.pyi against the built gnl._native module (DESIGN.md: CI checks the stub).

Every name in the stub exists in the module and every public name of the module is in the
stub; for classes, their public methods and properties match (kind and parameter names).
Type aliases of the stub (``X = tuple[...]``) exist only for type checkers and are exempt.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import gnl
from gnl import _native

STUB = Path(gnl.__file__).with_name("_native.pyi")


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    out = set()
    for d in fn.decorator_list:
        if isinstance(d, ast.Name):
            out.add(d.id)
        elif isinstance(d, ast.Attribute):
            out.add(d.attr)
    return out


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


class Stub:
    def __init__(self, tree: ast.Module) -> None:
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.constants: set[str] = set()
        self.aliases: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                ann = ast.unparse(node.annotation)
                if "TypeAlias" in ann:
                    self.aliases.add(node.target.id)
                else:
                    self.constants.add(node.target.id)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.aliases.add(t.id)
            elif type(node).__name__ == "TypeAlias":  # `type X = ...` (3.12+)
                self.aliases.add(node.name.id)  # type: ignore[attr-defined]

    def names(self) -> set[str]:
        return set(self.functions) | set(self.classes) | self.constants


@pytest.fixture(scope="module")
def stub() -> Stub:
    return Stub(ast.parse(STUB.read_text(), filename=str(STUB)))


def _public(obj: ModuleType | type) -> set[str]:
    return {n for n in vars(obj) if not n.startswith("_")}


def _runtime_params(obj: Any) -> list[str] | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        else:
            out.append(p.name)
    return out


def test_stub_exists_and_parses(stub: Stub) -> None:
    assert STUB.is_file()
    assert stub.names(), "the stub declares nothing"


def test_every_stub_name_exists_in_the_module(stub: Stub) -> None:
    missing = sorted(n for n in stub.names() if not hasattr(_native, n))
    assert not missing, f"in the stub but not in gnl._native: {missing}"


def test_every_public_module_name_is_in_the_stub(stub: Stub) -> None:
    extra = sorted(_public(_native) - stub.names())
    assert not extra, f"in gnl._native but not in the stub: {extra}"
    if hasattr(_native, "__all__"):
        assert set(_native.__all__) == stub.names()


def test_kinds_match(stub: Stub) -> None:
    for name in stub.functions:
        assert callable(getattr(_native, name)) and not isinstance(getattr(_native, name), type), (
            name
        )
    for name in stub.classes:
        assert isinstance(getattr(_native, name), type), name
    for name in stub.constants:
        value = getattr(_native, name)
        assert not callable(value), name


def test_function_parameters_match(stub: Stub) -> None:
    for name, fn in stub.functions.items():
        runtime = _runtime_params(getattr(_native, name))
        if runtime is not None:
            assert runtime == _params(fn), name


def test_class_members_match(stub: Stub) -> None:
    for cname, cdef in stub.classes.items():
        cls = getattr(_native, cname)
        methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        properties: set[str] = set()
        for node in cdef.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if "property" in _decorators(node):
                    properties.add(node.name)
                elif "setter" in _decorators(node) or "deleter" in _decorators(node):
                    continue
                else:
                    methods[node.name] = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                properties.add(node.target.id)
        public_stub = {m for m in methods if not m.startswith("_")} | properties
        public_runtime = _public(cls)
        assert public_stub == public_runtime, (
            f"{cname}: stub-only {sorted(public_stub - public_runtime)}, "
            f"module-only {sorted(public_runtime - public_stub)}"
        )
        for prop in properties:
            attr = inspect.getattr_static(cls, prop)
            assert inspect.isdatadescriptor(attr), f"{cname}.{prop} is a property in the stub"
        for mname, mdef in methods.items():
            if mname.startswith("_") and mname != "__new__":
                continue
            if mname == "__new__":
                assert "__new__" in vars(cls), f"{cname} has no constructor"
                runtime = _runtime_params(cls)
                if runtime is not None:
                    assert runtime == _params(mdef)[1:], f"{cname}.__new__"
                continue
            attr = inspect.getattr_static(cls, mname)
            assert callable(attr) and not inspect.isdatadescriptor(attr), (
                f"{cname}.{mname} is a method"
            )
            runtime = _runtime_params(getattr(cls, mname))
            if runtime is not None:
                assert runtime == _params(mdef), f"{cname}.{mname}: {runtime} != {_params(mdef)}"


def test_classes_without_new_in_the_stub_cannot_be_built(stub: Stub) -> None:
    for cname, cdef in stub.classes.items():
        declares_init = any(
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name in ("__new__", "__init__")
            for n in cdef.body
        )
        if not declares_init:
            with pytest.raises(TypeError):
                getattr(_native, cname)()
