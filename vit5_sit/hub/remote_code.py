"""The code a model folder carries: self-contained modules assembled from the package's own source.

diffusers loads a custom pipeline and custom components from ``.py`` files inside the model folder
(``DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)``), in a Python that need not have
vit5-sit. Those files are not a second, hand-kept copy of the model: `assemble` writes them at export time
from the modules of this package, so they are whatever the package is when the folder is written.

`assemble(roots)` starts from a few top-level definitions (``("vit5_sit.hub.components", "Vit5SitScheduler")``)
and copies, verbatim, every top-level definition of the package that they use, and those that these use in turn
(a function, a class, a constant; found by name through the modules' imports, the package's lazy exports
included). Each definition keeps its source text; the package's own import statements are dropped (the names
they bring are defined in the same file, under the same names) and the third-party ones kept (torch, numpy,
diffusers, PIL, the standard library). The definitions come in an order where whatever a definition needs when
the module is imported (a base class, a decorator, a default value) is defined before it.

Rules that keep a copy faithful, checked here (an export fails with the reason rather than write a module that
would not run): two package modules may not bring different definitions under one name into the same file; a
name a copied definition uses must resolve to a definition (not to a module attribute that only exists at run
time); ``import vit5_sit...`` as a module object is not supported. Annotations are not followed (every package
module has ``from __future__ import annotations``: they are never evaluated). Optional third-party imports
(`LAZY_IMPORTS`) become functions that import on first call, so that a module does not need them to load.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
from dataclasses import dataclass, field

PACKAGE = "vit5_sit"
# Third-party modules imported only when first used (a function of the same name that imports on call):
# torchdiffeq serves the adaptive ODE solvers alone, and the folder must load with diffusers and torch only.
LAZY_IMPORTS = ("torchdiffeq",)


class RemoteCodeError(RuntimeError):
    """The package's source cannot be assembled into a self-contained module; the message says where."""


@dataclass
class _Module:
    name: str
    lines: list[str]
    defs: dict[str, ast.stmt] = field(default_factory=dict)           # top-level name -> its statement
    package_imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)
    external: dict[str, ast.stmt] = field(default_factory=dict)       # local name -> third-party import
    is_package: bool = False


_CACHE: dict[str, _Module] = {}


def _is_package_module(name: str | None) -> bool:
    return name is not None and (name == PACKAGE or name.startswith(PACKAGE + "."))


def _absolute(module: _Module, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    base = module.name if module.is_package else module.name.rpartition(".")[0]
    return importlib.util.resolve_name("." * node.level + (node.module or ""), base)


def _parse(name: str) -> _Module:
    if name in _CACHE:
        return _CACHE[name]
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise RemoteCodeError(f"{name}: no Python source found")
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source)
    module = _Module(name, source.splitlines(), is_package=spec.submodule_search_locations is not None)
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            module.defs[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        module.defs[node.id] = stmt
    for node in ast.walk(tree):  # imports anywhere: top level, TYPE_CHECKING blocks, function bodies
        if isinstance(node, ast.ImportFrom):
            source_module = _absolute(module, node)
            if source_module == "__future__":
                continue
            for alias in node.names:
                local = alias.asname or alias.name
                if _is_package_module(source_module):
                    module.package_imports.setdefault(local, (source_module, alias.name))
                elif node in tree.body:
                    module.external.setdefault(local, node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_package_module(alias.name):
                    module.package_imports.setdefault((alias.asname or alias.name).split(".")[0],
                                                      (alias.name, "<module>"))
                elif node in tree.body:
                    module.external.setdefault(alias.asname or alias.name.split(".")[0], node)
    _CACHE[name] = module
    return module


def _resolve(module_name: str, name: str, seen: tuple = ()) -> tuple[str, str]:
    """The (module, name) that defines what ``from module_name import name`` brings in."""
    if name == "<module>" or (module_name, name) in seen:
        raise RemoteCodeError(f"{module_name}: `import {module_name}` as a module object cannot be copied; "
                              "import the names it uses instead")
    module = _parse(module_name)
    if name in module.defs:
        return module_name, name
    if name in module.package_imports:
        return _resolve(*module.package_imports[name], seen=(*seen, (module_name, name)))
    if module.is_package:  # a submodule, or a lazy export (PEP 562 __getattr__)
        obj = getattr(importlib.import_module(module_name), name, None)
        owner, own_name = getattr(obj, "__module__", None), getattr(obj, "__name__", None)
        if _is_package_module(owner) and own_name and own_name in _parse(owner).defs:
            return owner, own_name
    raise RemoteCodeError(f"{module_name}.{name}: not a top-level definition of the package")


class _Names(ast.NodeVisitor):
    """Names a statement reads, annotations left out (they are strings under `from __future__ import annotations`)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id not in self.names:
            self.names.append(node.id)

    def visit_arg(self, node: ast.arg) -> None:
        pass

    def _function(self, node) -> None:
        for n in (*node.decorator_list, *node.args.defaults, *[d for d in node.args.kw_defaults if d], *node.body):
            self.visit(n)

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)


def _used_names(stmt: ast.stmt) -> list[str]:
    visitor = _Names()
    visitor.visit(stmt)
    return visitor.names


def _source(module: _Module, stmt: ast.stmt) -> str:
    """The statement's text (decorators included), with the package's own imports inside it made ``pass``."""
    first = min([stmt.lineno, *[d.lineno for d in getattr(stmt, "decorator_list", [])]])
    lines = module.lines[first - 1:stmt.end_lineno]
    for node in ast.walk(stmt):
        if isinstance(node, ast.ImportFrom) and (node.level or _is_package_module(node.module)) or (
                isinstance(node, ast.Import) and any(_is_package_module(a.name) for a in node.names)):
            start, end = node.lineno - first, node.end_lineno - first
            indent = lines[start][:len(lines[start]) - len(lines[start].lstrip())]
            lines[start:end + 1] = [indent + "pass  # (an import of vit5_sit: defined in this module)"] + [
                None] * (end - start)
    return "\n".join(line for line in lines if line is not None)


def _external_source(module: _Module, stmt: ast.stmt, local: str) -> tuple[str, str]:
    """(key, text) of a third-party import; optional ones (`LAZY_IMPORTS`) as a function that imports on call."""
    text = "\n".join(module.lines[stmt.lineno - 1:stmt.end_lineno])
    root = (stmt.module if isinstance(stmt, ast.ImportFrom) else stmt.names[0].name).split(".")[0]
    if root in LAZY_IMPORTS:
        if not isinstance(stmt, ast.ImportFrom):
            raise RemoteCodeError(f"{module.name}: `{text}`: an optional import must be `from {root} import NAME`")
        name = next(a.name for a in stmt.names if (a.asname or a.name) == local)
        return local, (f"def {local}(*args, **kwargs):  # {root}: imported on first use, an optional dependency\n"
                       f"    import importlib\n\n"
                       f"    try:\n"
                       f"        module = importlib.import_module({stmt.module!r})\n"
                       f"    except ImportError:\n"
                       f"        raise ImportError({local!r} + ' needs {root}, which is not installed (the adaptive '\n"
                       f"                          'solvers such as dopri5 use it): pip install {root}') from None\n"
                       f"    return getattr(module, {name!r})(*args, **kwargs)")
    return text, text


def assemble(roots: list[tuple[str, str]], header: str = "") -> str:
    """One self-contained module holding the definitions ``roots`` (``(module, name)`` pairs) and everything of
    the package they use (see the module docstring)."""
    order: list[tuple[str, str] | tuple[str, str, str]] = []   # (module, name) definitions; aliases as 3-tuples
    defined: dict[str, tuple[str, str]] = {}                   # emitted name -> (module, name)
    externals: dict[str, str] = {}                             # key -> import text
    external_names: dict[str, str] = {}                        # bound name -> key
    visiting: set[tuple[str, str]] = set()

    def bind(name: str, what: tuple[str, str], origin: str) -> None:
        if defined.get(name, what) != what:
            raise RemoteCodeError(f"{origin}: the name {name} means {'.'.join(defined[name])} elsewhere in the same "
                                  "generated module; rename one of them in the package")
        defined[name] = what

    def visit(key: tuple[str, str]) -> None:
        if key in visiting or any(item[:2] == key for item in order if len(item) == 2):
            return
        visiting.add(key)
        module = _parse(key[0])
        stmt = module.defs[key[1]]
        local = None  # the names the statement binds itself: walked once, when first needed
        for name in _used_names(stmt):
            if name in module.defs and module.defs[name] is not stmt:
                visit((key[0], name))
            elif name in module.package_imports:
                target = _resolve(*module.package_imports[name])
                visit(target)
                if target[1] != name:  # `from x import a as b`: b = a
                    bind(name, target, f"{key[0]}.{key[1]}")
                    if (name, *target) not in order:
                        order.append((name, *target))
            elif name in module.external:
                text_key, text = _external_source(module, module.external[name], name)
                if external_names.get(name, text_key) != text_key:
                    raise RemoteCodeError(f"{key[0]}: `{text}` binds {name}, which another module imports "
                                          f"differently (`{externals[external_names[name]]}`)")
                external_names[name] = text_key
                externals[text_key] = text
            elif not hasattr(builtins, name):
                if local is None:
                    local = _local_names(stmt)
                if name not in local:
                    raise RemoteCodeError(f"{key[0]}.{key[1]} uses {name}, which is neither defined nor imported there")
        for name in _bound_names(module, stmt):
            bind(name, key, f"{key[0]}.{key[1]}")
        order.append(key)
        visiting.discard(key)

    for root in roots:
        visit(_resolve(*root))
    parts = [header.rstrip() + "\n" if header else "", "from __future__ import annotations\n",
             *[text + "\n" for text in externals.values()]]
    current = None
    for item in order:
        if len(item) == 3:
            parts.append(f"\n{item[0]} = {item[2]}\n")
            continue
        module = _parse(item[0])
        if item[0] != current:
            current = item[0]
            parts.append(f"\n\n# ---- from {current} {'-' * max(0, 100 - len(current))}\n")
        parts.append("\n\n" + _source(module, module.defs[item[1]]) + "\n")
    code = "".join(parts)
    compile(code, "<assembled>", "exec")  # a syntax error here is a bug of this module: fail at export
    return code


def _bound_names(module: _Module, stmt: ast.stmt) -> list[str]:
    return [name for name, s in module.defs.items() if s is stmt]


def _local_names(stmt: ast.stmt) -> set[str]:
    """Names bound inside a statement (arguments, assignments, loop and with targets, comprehension variables,
    nested definitions, except-as names, imports): the reads of these are not the module's names."""
    names: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node is not stmt:
            names.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
    return names
