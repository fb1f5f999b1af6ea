"""A griffe extension for the API pages (mkdocs.yml's mkdocstrings options): methods written with fastcore's `@patch`
shown on their class.

A long class is written in short notebook cells: its core in one, further methods in the next cells with fastcore's
`@patch` (`def load(self: Transformers): ...`), which adds them to the class when the module runs. griffe reads code
without running it, so it sees module-level functions instead (and fastcore leaves the module name `None`): the API
page would lose the methods. This moves each one under the class its first parameter names, as a method (a
`classmethod` with `@patch(cls_method=True)`, a property with `as_prop=True`).
"""
from __future__ import annotations

import ast

import griffe


def _patch_call(decorator) -> ast.expr | None:
    "The decorator's expression if it is fastcore's `patch` (`@patch`, `@patch(...)`, `@fastcore.basics.patch`)."
    node = ast.parse(str(decorator.value), mode="eval").body
    target = node.func if isinstance(node, ast.Call) else node
    name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
    return node if name in ("patch", "patch_to") else None


def _labels(node: ast.expr) -> set[str]:
    kw = {k.arg: getattr(k.value, "value", None) for k in getattr(node, "keywords", [])}
    return {"classmethod"} if kw.get("cls_method") else {"property"} if kw.get("as_prop") else set()


class FastcorePatch(griffe.Extension):
    "Move each `@patch` function of a module under the module's class that its first parameter is annotated with."

    def on_module_members(self, *, mod: griffe.Module, **kwargs) -> None:
        for name, fn in list(mod.members.items()):
            if fn.is_alias or not fn.is_function or not fn.parameters: continue
            calls = [c for c in map(_patch_call, fn.decorators) if c is not None]
            ann = fn.parameters[0].annotation
            cls = mod.members.get(str(ann).strip("'\"")) if calls and ann is not None else None
            if cls is None or cls.is_alias or not cls.is_class: continue
            mod.del_member(name)
            fn.labels |= _labels(calls[0])
            cls.set_member(name, fn)
