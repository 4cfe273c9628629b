"""src/kernels/allreduce_rmsnorm.cu, after the row code it includes
(pyar_rows.h), as the CPU tests read it: macro continuation lines joined,
then the entry names and parameter lists its macros define, ``struct
RowArgs`` (pyar_rows.h), the instantiations and the ``QuantKind`` codes,
parsed with regular expressions (no compiler needed).

Parameters come back as [(C type, name)]; ``kind`` turns a C type into the
pyar._hip argument kind the host passes it as (pyar.comm.kernels' *_ARGS).
"""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "src", "kernels")

# The fields of struct RowArgs, in the order the kernels declare them.
ROW_FIELDS = ("residual", "weight", "residual_out", "y", "q", "scales", "hidden", "eps",
              "quant", "group")

_BOUNDS = r"void __launch_bounds__\(pyar::kMaxRowThreads\) "


def read(name):
    with open(os.path.join(KERNELS, name)) as f:
        return f.read()


def joined():
    """pyar_rows.h then allreduce_rmsnorm.cu, macro continuation lines joined."""
    return re.sub(r"\\\n", " ", read("pyar_rows.h") + read("allreduce_rmsnorm.cu"))


@pytest.fixture(scope="module")
def source():
    return joined()


def macro(source, name):
    """(parameter names, body) of ``#define name(...) body``."""
    m = re.search(r"^#define %s\(([^)]*)\)(.*)$" % name, source, re.M)
    assert m, f"macro {name} not found in allreduce_rmsnorm.cu"
    return [p.strip() for p in m.group(1).split(",")], " ".join(m.group(2).split())


def macro_body(source, name):
    m = re.search(r"^#define %s[ \t](.*)$" % name, source, re.M)
    assert m, f"macro {name} not found in allreduce_rmsnorm.cu"
    return " ".join(m.group(1).split())


def paste(template, **values):
    """``a##b##c`` with the macro parameters among the pieces substituted."""
    return "".join(values.get(piece.strip(), piece.strip()) for piece in template.split("##"))


def kind(ctype):
    """The pyar._hip argument kind a C parameter type is passed as."""
    if ctype.endswith("*"):
        return "ptr"
    return {"uint64_t": "uint64", "uint32_t": "uint32", "float": "float32"}[ctype]


def kinds_of(params):
    return tuple(kind(ctype) for ctype, _ in params)


def names_of(params):
    return [name for _, name in params]


def parameters(text):
    """[(C type, name)] of a parameter list such as ``const T *a, uint32_t n``."""
    params = []
    for p in text.split(","):
        m = re.fullmatch(r"(.*?)\s*(\w+)", " ".join(p.split()))
        assert m, f"cannot parse parameter {p!r}"
        ctype = re.sub(r"\s*\*", " *", m.group(1)).strip()
        params.append((ctype, m.group(2)))
    return params


def row_params(source):
    return parameters(macro_body(source, "PYAR_ROW_PARAMS"))


def _with_row_params(source, text):
    return text.replace("PYAR_ROW_PARAMS", macro_body(source, "PYAR_ROW_PARAMS"))


def instantiations(source):
    """The top-level ``PYAR_ROW_KINDS(name, T, P)`` lines: [(name, T, P)]."""
    found = [(n, t, int(p)) for n, t, p in
             re.findall(r"^PYAR_ROW_KINDS\((\w+), ([\w:]+), (\d+)\)", source, re.M)]
    assert found, "no PYAR_ROW_KINDS instantiation found"
    return found


def dtype_names(source):
    """{dtype name: C type} of the instantiations."""
    return {name: t for name, t, _ in instantiations(source)}


def quant_kinds(source):
    """{quant kind name: QuantKind enumerator} that PYAR_ROW_KINDS instantiates."""
    args, body = macro(source, "PYAR_ROW_KINDS")
    assert args == ["name", "T", "P"], args
    return dict(re.findall(r"PYAR_ROW_KERNELS\(name, T, (\w+), pyar::(\w+), P\)", body))


def _worlds(source):
    args, body = macro(source, "PYAR_EACH_WORLD")
    assert args == ["M", "..."], args
    return re.findall(r"M\(__VA_ARGS__, (\d+)\)", body)


def fused_entries(source):
    """(every one-stage/two-stage entry name the macros define, its [(C type, name)])."""
    args, body = macro(source, "PYAR_FUSED_ENTRY")
    assert args == ["algo", "name", "T", "kind", "Q", "P", "W"], args
    m = re.search(_BOUNDS + r"([\w#]+)\((.*?)\) \{", body)
    assert m, body
    template, params = m.group(1), parameters(_with_row_params(source, m.group(2)))
    _, worlds_body = macro(source, "PYAR_FUSED_WORLDS")
    worlds = re.findall(r"PYAR_FUSED_ENTRY\(algo, name, T, kind, Q, P, (\d+)\)", worlds_body)
    _, kernels_body = macro(source, "PYAR_ROW_KERNELS")
    algos = re.findall(r"PYAR_FUSED_WORLDS\((\w+), name, T, kind, Q, P\)", kernels_body)
    names = {paste(template, algo=a, name=t, kind=k, P=str(p), W=w)
             for a in algos for t, _, p in instantiations(source) for k in quant_kinds(source)
             for w in worlds}
    return names, params


def split_entries(source):
    """(every split first-kernel name the macros define, its [(C type, name)])."""
    args, body = macro(source, "PYAR_SPLIT_ENTRY")
    assert args == ["name", "T", "P", "W"], args
    m = re.search(r"void PYAR_SPLIT_BOUNDS ([\w#]+)\((.*?)\) \{", body)
    assert m, body
    template, params = m.group(1), parameters(m.group(2))
    _, kinds_body = macro(source, "PYAR_ROW_KINDS")
    # once per (dtype, P)
    assert "PYAR_EACH_WORLD(PYAR_SPLIT_ENTRY, name, T, P)" in kinds_body
    names = {paste(template, name=t, P=str(p), W=w)
             for t, _, p in instantiations(source) for w in _worlds(source)}
    return names, params


def lamport_entries(source):
    """(every lamport entry name the macros define, its [(C type, name)]):
    one pack per thread only (PYAR_LAMPORT_P1), every world."""
    args, body = macro(source, "PYAR_LAMPORT_ENTRY")
    assert args == ["name", "T", "kind", "Q", "W"], args
    m = re.search(_BOUNDS + r"([\w#]+)\((.*?)\) \{", body)
    assert m, body
    template, params = m.group(1), parameters(_with_row_params(source, m.group(2)))
    assert macro(source, "PYAR_LAMPORT_P1")[1] == (
        "PYAR_EACH_WORLD(PYAR_LAMPORT_ENTRY, name, T, kind, Q)")
    assert macro(source, "PYAR_LAMPORT_P2")[1] == macro(source, "PYAR_LAMPORT_P4")[1] == ""
    assert "PYAR_LAMPORT_P##P(name, T, kind, Q)" in macro(source, "PYAR_ROW_KERNELS")[1]
    names = {paste(template, name=t, kind=k, W=w)
             for t, _, p in instantiations(source) if p == 1 for k in quant_kinds(source)
             for w in _worlds(source)}
    return names, params


def local_entries(source):
    """{kernel name: [(C type, name)]} of the single-GPU kernels."""
    entries = {}
    for name, kinds in (("PYAR_LOCAL_ENTRIES", quant_kinds(source)),
                        ("PYAR_QUANTIZE_ENTRY", ("fp8", "mxfp4"))):
        args, body = macro(source, name)
        assert args == ["name", "T", "kind", "Q", "P"], args
        (template, params), = re.findall(_BOUNDS + r"([\w#]+)\((.*?)\) \{", body)
        for t, _, p in instantiations(source):
            for k in kinds:
                entries[paste(template, name=t, kind=k, P=str(p))] = parameters(
                    _with_row_params(source, params))
    _, kinds_body = macro(source, "PYAR_ROW_KINDS")
    assert re.findall(r"PYAR_QUANTIZE_ENTRY\(name, T, (\w+), pyar::\w+, P\)", kinds_body) == [
        "fp8", "mxfp4"]
    return entries


def struct_fields(source, name):
    body = re.search(r"struct %s \{(.*?)\n\};" % name, source, re.S)
    assert body, f"struct {name} not found"
    fields = []
    for line in body.group(1).splitlines():
        code = line.split("//")[0].strip()
        if code:
            fields.extend(parameters(code.rstrip(";")))
    return fields


def constants(text):
    return {name: int(value, 0)
            for name, value in re.findall(r"constexpr \w+ (k\w+) = (0x[0-9a-fA-F]+|\d+);", text)}


def device_function(source, name):
    """The body of ``PYAR_DEVICE void name(...)`` up to its closing brace."""
    return re.search(r"PYAR_DEVICE void %s\(.*?\n\}\n" % name, source, re.S).group(0)
