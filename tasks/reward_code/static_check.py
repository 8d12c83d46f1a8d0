"""The first check of reward code: what its source may say, decided from the syntax tree before anything runs.

An allowlist, not a denylist: every node type the tree holds must be among `_ALLOWED_NODES` (plain functions,
control flow, expressions, comprehensions; no classes, `with`, `global`, `async`, `yield`, `del`), every import
among `ALLOWED_MODULES`, and no name may be a builtin that reaches outside the function (`open`, `eval`,
`getattr`...) or a dunder. No attribute may start with `_` (`().__class__.__subclasses__()` is the classic way
out), nor be one of the introspection attributes that lead to frames and their globals (`gi_frame`, `f_back`...)
or a format method (`"{0.__class__}".format(x)` reads attributes the tree does not show).

This check is one layer: the sandbox runs the function with only `SAFE_BUILTINS` and module stand-ins that hold
no submodule, under process limits, so what the check misses still cannot reach files, the network or the caller.
"""

from __future__ import annotations

import ast

from tasks.reward_code.errors import StaticCheckError

# The modules reward code may import: pure computation, nothing that reaches the system.
ALLOWED_MODULES = frozenset({"math", "re"})
# The function the source must define, and how many positional parameters it takes.
FUNCTION_NAME = "reward"
PARAMETERS = 3
# Longer sources are refused unread.
MAX_SOURCE_CHARS = 20_000

# The builtins the function can call at all: the sandbox gives it these and no others.
SAFE_BUILTINS = frozenset(
    {
        "abs", "all", "any", "bool", "chr", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "int",
        "isinstance", "len", "list", "map", "max", "min", "ord", "pow", "range", "repr", "reversed", "round", "set",
        "sorted", "str", "sum", "tuple", "zip", "ArithmeticError", "Exception", "IndexError", "KeyError",
        "LookupError", "TypeError", "ValueError", "ZeroDivisionError",
    }
)  # fmt: skip
# Builtins named here are refused with a reason rather than left to fail as an unknown name at run time.
_FORBIDDEN_NAMES = frozenset(
    {
        "open", "eval", "exec", "compile", "getattr", "setattr", "delattr", "hasattr", "globals", "locals", "vars",
        "dir", "input", "breakpoint", "help", "exit", "quit", "memoryview", "type", "object", "super", "print",
        "classmethod", "staticmethod", "property", "id",
    }
)  # fmt: skip
_FORBIDDEN_ATTRIBUTES = frozenset({"format", "format_map", "mro"})
# Attributes of generators, coroutines, frames, tracebacks and code objects.
_FORBIDDEN_ATTRIBUTE_PREFIXES = ("gi_", "cr_", "ag_", "f_", "tb_", "co_")

_ALLOWED_NODES: tuple[type[ast.AST], ...] = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign,
    ast.For, ast.While, ast.If, ast.Expr, ast.Pass, ast.Break, ast.Continue, ast.Try, ast.ExceptHandler,
    ast.Raise, ast.Assert, ast.Import, ast.ImportFrom, ast.alias, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare,
    ast.Call, ast.keyword, ast.IfExp, ast.Lambda, ast.NamedExpr, ast.Dict, ast.Set, ast.List, ast.Tuple,
    ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.comprehension, ast.Constant, ast.Name,
    ast.Attribute, ast.Subscript, ast.Slice, ast.Starred, ast.JoinedStr, ast.FormattedValue, ast.expr_context,
    ast.boolop, ast.operator, ast.unaryop, ast.cmpop,
)  # fmt: skip


def check_source(source: str) -> None:
    """Refuse `source` unless it defines `reward(completion, example, execution)` in the allowed subset of Python.

    Raises:
        StaticCheckError: naming the line and what is not allowed there.
    """
    if len(source) > MAX_SOURCE_CHARS:
        raise StaticCheckError(f"the source has {len(source)} characters; at most {MAX_SOURCE_CHARS} are read")
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise StaticCheckError(f"line {error.lineno}: not valid Python: {error.msg}") from None
    for node in ast.walk(tree):
        _check_node(node)
    _check_defines_reward(tree)


def _check_node(node: ast.AST) -> None:
    where = f"line {getattr(node, 'lineno', '?')}"
    if not isinstance(node, _ALLOWED_NODES):
        raise StaticCheckError(f"{where}: {type(node).__name__} is not allowed in reward code")
    if isinstance(node, ast.Import):
        for alias in node.names:
            _check_module(alias.name, where)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            raise StaticCheckError(f"{where}: relative imports are not allowed")
        _check_module(node.module or "", where)
        if any(alias.name == "*" for alias in node.names):
            raise StaticCheckError(f"{where}: 'from {node.module} import *' is not allowed; name what you use")
    elif isinstance(node, ast.Name):
        if node.id in _FORBIDDEN_NAMES:
            raise StaticCheckError(f"{where}: {node.id!r} is not allowed in reward code (no I/O, no introspection)")
        if node.id.startswith("__"):
            raise StaticCheckError(f"{where}: the name {node.id!r} is not allowed (no dunder names)")
    elif isinstance(node, ast.Attribute):
        _check_attribute(node.attr, where)
    elif isinstance(node, ast.alias) and node.name.startswith("_"):
        raise StaticCheckError(f"{where}: importing {node.name!r} is not allowed (names starting with '_')")
    elif isinstance(node, ast.FunctionDef) and node.decorator_list:
        raise StaticCheckError(f"{where}: decorators are not allowed")


def _check_module(name: str, where: str) -> None:
    if name not in ALLOWED_MODULES:
        allowed = ", ".join(sorted(ALLOWED_MODULES))
        raise StaticCheckError(f"{where}: importing {name!r} is not allowed; reward code may import only {allowed}")


def _check_attribute(name: str, where: str) -> None:
    if name.startswith("_"):
        raise StaticCheckError(f"{where}: the attribute {name!r} is not allowed (attributes starting with '_')")
    if name in _FORBIDDEN_ATTRIBUTES or name.startswith(_FORBIDDEN_ATTRIBUTE_PREFIXES):
        raise StaticCheckError(f"{where}: the attribute {name!r} is not allowed (introspection or formatting)")


def _check_defines_reward(tree: ast.Module) -> None:
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == FUNCTION_NAME]
    if not functions:
        raise StaticCheckError(
            f"no top-level 'def {FUNCTION_NAME}(completion, example, execution)': the source must define it"
        )
    arguments = functions[-1].args
    positional = [*arguments.posonlyargs, *arguments.args]
    required = len(positional) - len(arguments.defaults)
    if arguments.vararg or arguments.kwonlyargs or arguments.kwarg or not required <= PARAMETERS <= len(positional):
        raise StaticCheckError(
            f"line {functions[-1].lineno}: {FUNCTION_NAME} must take exactly {PARAMETERS} positional parameters "
            "(completion, example, execution)"
        )
