"""The shape of the package, checked (tier a):

* imports point one way: every module of pyar imports only modules of its
  own layer or of the layers below it (pyar._hip < pyar.array < pyar.comm <
  pyar.bench and the tools), and the modules of one layer import each other
  without a circle; every module imports alone, in a fresh interpreter;
* nothing outside pyar/comm touches a private attribute of a communicator:
  tests, benchmarks and pyar.bench go through the public API, the planner
  and ``NodeCommunicator.assemble``;
* the kernel build (kernel_build/) is apart: pyar never imports it, and its
  modules import each other without a circle;
* files stay small enough to read whole;
* both communicators offer the documented interface (pyar.comm.protocol)
  with the same signatures.

Each check has a positive control that feeds it a known offender.
"""
import ast
import inspect
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ["pyar._hip", "pyar._kernels", "pyar.array", "pyar.quant", "pyar.diagnostics",
          "pyar.comm", "pyar.bench", "pyar.__main__"]
# A module may import the modules of its own layer and of the layers listed before it.
# pyar/__init__.py re-exports the runtime and array layers and reaches pyar.comm lazily.
MAX_LINES = {"pyar/comm/communicator.py": 450}
PACKAGE_MAX_LINES = 500
TEST_MAX_LINES = 600


def _modules():
    """{dotted name: path} of every Python and Cython module of pyar."""
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "pyar")):
        for name in files:
            if name.endswith((".py", ".pyx")):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-len(name.split(".")[-1]) - 1]
                dotted = dotted.replace(os.sep, ".")
                found[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return found


def _imports(path, package, modules):
    """The pyar modules ``path`` imports at module level (not inside
    functions): ``from a import b`` imports module a.b when there is one,
    else module a."""
    with open(path) as f:
        tree = ast.parse(f.read() if path.endswith(".py") else _cython_imports(f.read()))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else _resolve(package, node)
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {n for n in names if n == "pyar" or n.startswith("pyar.")}


def _resolve(package, node):
    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _cython_imports(text):
    """The Python import statements of a Cython module (cimports are C-level)."""
    statements, statement = [], ""
    for line in text.splitlines():
        starts = re.match(r"(from \S+ import|import )", line) and "cimport" not in line
        if statement or starts:
            statement += " " + line.strip()
            if statement.count("(") == statement.count(")"):
                statements.append(statement.strip())
                statement = ""
    return "\n".join(statements)


def _layer(module):
    for index in range(len(LAYERS) - 1, -1, -1):
        if module == LAYERS[index] or module.startswith(LAYERS[index] + "."):
            return index
    return None


def _graph():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        graph[name] = {m for m in _imports(path, package, modules)
                       if m in modules and m != name}
    return graph


def layer_violations(graph):
    """(importer, imported) pairs where a lower layer imports a higher one."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if a != "pyar" and _layer(a) is not None and _layer(b) is not None
                  and _layer(b) > _layer(a))


def cycles(graph):
    """Some circle of imports, as a list of modules, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if nxt == "pyar" or nxt not in graph:
                continue
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_lower_layers_never_import_higher_ones():
    assert layer_violations(_graph()) == []


def test_layer_check_sees_an_upward_import():
    assert layer_violations({"pyar.array.x": {"pyar.comm.plan"}}) == [
        ("pyar.array.x", "pyar.comm.plan")]


def test_no_module_imports_itself_in_a_circle():
    assert cycles(_graph()) is None


def test_circle_check_sees_a_circle():
    assert cycles({"pyar.comm.a": {"pyar.comm.b"}, "pyar.comm.b": {"pyar.comm.a"}})


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m.startswith("pyar.comm")
                                          and not m.endswith("_eager")))
def test_every_communicator_module_imports_alone(module):
    pytest.importorskip("mpi4py")
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# --- the kernel build, apart from the package ---------------------------------------

def kernel_build_imports(text, inside=False):
    """The kernel_build modules ``text`` imports, anywhere in it (a function's
    import counts: pyar must not run the compilers' code at all); ``inside``:
    text of a kernel_build module, whose relative imports name its siblings."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.level == 0 or inside and node.level == 1):
            module = node.module if node.level == 0 else ".".join(
                ["kernel_build"] + ([node.module] if node.module else []))
            names.update([module] + [f"{module}.{a.name}" for a in node.names])
    return {n for n in names if n == "kernel_build" or n.startswith("kernel_build.")}


def test_pyar_never_imports_the_kernel_build():
    found = {}
    for name, path in _modules().items():
        if path.endswith(".py"):
            with open(path) as f:
                found[name] = kernel_build_imports(f.read())
    assert {n: i for n, i in found.items() if i} == {}


def test_kernel_build_check_sees_an_import():
    text = "import os\ndef f():\n    from kernel_build import cuda_compiler\n"
    assert kernel_build_imports(text) == {"kernel_build", "kernel_build.cuda_compiler"}
    sibling = "from .gpu_targets import KERNEL_FLAGS\nfrom . import build_log\n"
    assert kernel_build_imports(sibling) == set()
    assert kernel_build_imports(sibling, inside=True) == {
        "kernel_build", "kernel_build.gpu_targets", "kernel_build.gpu_targets.KERNEL_FLAGS",
        "kernel_build.build_log"}
    assert cycles({"kernel_build.a": {"kernel_build.b"}, "kernel_build.b": {"kernel_build.a"}})


def test_kernel_build_modules_import_without_a_circle():
    folder = os.path.join(ROOT, "kernel_build")
    graph = {}
    for name in os.listdir(folder):
        if name.endswith(".py") and name != "__init__.py":
            with open(os.path.join(folder, name)) as f:
                graph[f"kernel_build.{name[:-3]}"] = kernel_build_imports(f.read(), inside=True)
    assert sum(len(targets) for targets in graph.values()) > 5  # the check reads the imports
    assert cycles(graph) is None


# --- nothing outside pyar/comm reaches into a communicator -------------------------

def communicator_private_names():
    """Every private name a communicator object has: methods and properties
    of the classes, attributes their methods assign, and the per-call
    state of _eager.PlanCache."""
    names = set()
    for path in ("pyar/comm/communicator.py", "pyar/comm/hierarchical.py"):
        with open(os.path.join(ROOT, path)) as f:
            tree = ast.parse(f.read())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)
                    and n.name in ("NodeCommunicator", "HierarchicalCommunicator")):
            for node in ast.walk(cls):
                if isinstance(node, ast.FunctionDef):
                    names.add(node.name)
                elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id == "self" and isinstance(node.ctx, ast.Store)):
                    names.add(node.attr)
    with open(os.path.join(ROOT, "pyar/comm/_eager.pyx")) as f:
        text = f.read()
    names.update(re.findall(r"^    cdef (?:public |readonly )?[\w ]+?(\b_\w+)", text, re.M))
    names.update(re.findall(r"^    (?:def|cdef \w+) (_\w+)\(", text, re.M))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(text, names, receivers=("comm", "communicator", "local", "c", "node_comm")):
    """(line, expression) of each ``<receiver>._name`` in ``text`` with
    ``_name`` a communicator's private name; receivers are the names tests
    and benchmarks give communicators (also as ``self.comm``)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Attribute) and node.attr in names):
            continue
        base = node.value
        if isinstance(base, ast.Attribute):
            base_name = base.attr
        elif isinstance(base, ast.Name):
            base_name = base.id
        else:
            continue
        if base_name in receivers:
            found.append((node.lineno, f"{base_name}.{node.attr}"))
    return sorted(found)


def _outside_files():
    for top in ("tests", "benchmarks", os.path.join("pyar", "bench"), "examples", "scripts"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(folder, name)


def test_tests_and_benchmarks_never_touch_a_communicators_private_state():
    names = communicator_private_names()
    assert {"_call", "_registry", "_calls", "_plans", "_node"} <= names
    offenders = []
    for path in _outside_files():
        with open(path) as f:
            uses = private_uses(f.read(), names)
        offenders += [(os.path.relpath(path, ROOT), *use) for use in uses]
    assert offenders == []


def test_private_use_check_sees_a_private_access():
    names = communicator_private_names()
    assert private_uses("comm._registry.lookup(1, 2)\nself.comm._calls += 1\n", names) == [
        (1, "comm._registry"), (2, "comm._calls")]


# --- files small enough to read whole -------------------------------------------------

def _line_counts(top, suffixes):
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
        for name in files:
            if name.endswith(suffixes):
                path = os.path.join(folder, name)
                with open(path) as f:
                    yield os.path.relpath(path, ROOT), sum(1 for _ in f)


def test_package_files_are_small():
    sizes = dict(_line_counts("pyar", (".py", ".pyx", ".pxi", ".pxd", ".pyi")))
    sizes.update(_line_counts("kernel_build", (".py",)))
    too_long = {p: n for p, n in sizes.items()
                if n > MAX_LINES.get(p, PACKAGE_MAX_LINES)}
    assert too_long == {}


def test_test_files_are_small():
    too_long = {p: n for p, n in _line_counts("tests", (".py",)) if n > TEST_MAX_LINES}
    assert too_long == {}


# --- one interface, two communicators --------------------------------------------------

def test_both_communicators_offer_the_protocol_with_its_signatures():
    pytest.importorskip("mpi4py")
    from pyar.comm import protocol
    from pyar.comm.communicator import NodeCommunicator
    from pyar.comm.hierarchical import HierarchicalCommunicator
    for cls, proto in ((NodeCommunicator, protocol.NodeCommunicatorProtocol),
                       (HierarchicalCommunicator, protocol.CommunicatorProtocol)):
        for name, member in vars(proto).items():
            if name.startswith("_") and name not in ("__enter__", "__exit__"):
                continue
            if not callable(member) and not isinstance(member, property):
                continue
            assert hasattr(cls, name), (cls.__name__, name)
            if callable(member):
                want = [(p.name, p.default) for p in inspect.signature(member).parameters.values()]
                got = [(p.name, p.default)
                       for p in inspect.signature(getattr(cls, name)).parameters.values()]
                assert got == want, (cls.__name__, name)
        inherited = [n for n in vars(protocol.CommunicatorProtocol)
                     if not n.startswith("_") and callable(vars(protocol.CommunicatorProtocol)[n])]
        assert {"allreduce", "allreduce_rmsnorm", "close", "abort"} <= set(inherited)
