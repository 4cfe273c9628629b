"""Kernel compilation for both platforms (tier a).

Every src/kernels/*.cu, compiled by the package build (kernel_build, through
its kernel cache: after an install nothing is compiled again): nvcc to a
fatbin with machine code for sm_80 and sm_90 plus PTX, and an AMD code-object
bundle for every arch an AMD compiler here can build (clang-19: gfx90a and
gfx942; Debian's hipcc: gfx90a).  The outputs are opened (fatbin container,
clang offload bundle) and every ``extern "C" __global__`` entry point that the
preprocessed source defines must be a symbol of every architecture's code.
Also: the cache (what it reuses and what makes it compile again), the bundle
writer, the register reports, the target parsing of PYAR_GPU_ARCHS and the
probe that drops targets a compiler cannot build.
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from kernel_build import (build_kernels, compile_cache, cuda_compiler, gpu_targets,  # noqa: E402
                          hip_clang_compiler, hipcc_compiler, kernel_resources,
                          offload_bundle)
from tests import kernel_builds  # noqa: E402

KERNELS = os.path.join(ROOT, "src", "kernels")
SOURCES = sorted(f for f in os.listdir(KERNELS) if f.endswith(".cu")) if os.path.isdir(
    KERNELS) else []
CUDA_ARCHS = ("sm_80", "sm_90")
HIP_ARCH = "gfx90a"

NVCC = cuda_compiler.find_nvcc()
HIPCC = hipcc_compiler.find_hipcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH, CUDA_HOME, "
                                "/usr/local/cuda): CUDA kernels cannot be compiled here")
needs_hipcc = pytest.mark.skipif(HIPCC is None, reason="hipcc not found (PATH, ROCM_PATH): "
                                 "AMD kernels cannot be compiled here (CI installs hipcc)")


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, " ".join(command) + "\n" + result.stdout + result.stderr
    return result


# ---------------------------------------------------------------------------
# Entry points of a source, from its preprocessed text


def _strip_attributes(text):
    """``__attribute__((global))`` -> ``__global__``; every other
    ``__attribute__((...))`` removed (balanced parentheses)."""
    out, i = [], 0
    pattern = re.compile(r"__attribute__\s*\(")
    while True:
        match = pattern.search(text, i)
        if not match:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:match.start()])
        depth, j = 1, match.end()
        while depth and j < len(text):
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        inner = re.sub(r"\s", "", text[match.end():j - 1])
        out.append(" __global__ " if inner == "(global)" else " ")
        i = j


_TOKEN = re.compile(r'extern\s*"C"|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|\w+|[{}();]|[^\s\w]')


def entry_points(preprocessed, source):
    """Names of the ``extern "C"`` kernels defined in ``source`` itself (not in
    headers), from a preprocessor's output with its line markers."""
    own, keep = [], True
    for line in preprocessed.splitlines():
        marker = re.match(r'#\s*(?:line\s+)?\d+\s+"([^"]*)"', line)
        if marker:
            keep = os.path.abspath(marker.group(1)) == os.path.abspath(source)
        elif keep and not line.startswith("#"):
            own.append(line)
    tokens = _TOKEN.findall(_strip_attributes("\n".join(own)))

    names = set()
    blocks = []              # one flag per open brace: inside an extern "C" { } block
    declaration = None       # depth at which a single `extern "C" <declaration>` began
    for i, token in enumerate(tokens):
        if token.startswith("extern") and token.endswith('"C"'):
            if i + 1 < len(tokens) and tokens[i + 1] == "{":
                blocks.append("extern")
                continue
            declaration = len(blocks)
        elif token == "{":
            if i and tokens[i - 1].startswith("extern") and tokens[i - 1].endswith('"C"'):
                continue  # already pushed
            blocks.append("other")
        elif token == "}":
            if blocks:
                blocks.pop()
            if declaration is not None and len(blocks) == declaration:
                declaration = None  # end of the extern "C" function body
        elif token == ";" and declaration == len(blocks):
            declaration = None
        elif token == "__global__" and ("extern" in blocks or declaration is not None):
            j = i + 1
            while j < len(tokens) and tokens[j] != "(":
                j += 1
            if j < len(tokens) and re.fullmatch(r"[A-Za-z_]\w*", tokens[j - 1]):
                names.add(tokens[j - 1])
    return names


def preprocess_cuda(source):
    return run([NVCC, "-E", "-x", "cu", *gpu_targets.KERNEL_FLAGS, "-I",
                os.path.dirname(source), source]).stdout


def preprocess_hip(source):
    return run([HIPCC, "-E", "-x", "hip", f"--offload-arch={HIP_ARCH}",
                *gpu_targets.KERNEL_FLAGS, "-I", os.path.dirname(source), source],
               env=hipcc_compiler.hip_environment()).stdout


# ---------------------------------------------------------------------------
# Reading the compilers' outputs


def zstd_decompress(data):
    """The decompressed bytes, or None without a zstd tool (CI installs zstd)."""
    zstd = shutil.which("zstd")
    if zstd is None:
        warnings.warn("zstd not found: the compressed PTX of the fatbin is not inspected")
        return None
    return subprocess.run([zstd, "-d", "-c", "-q"], input=data, capture_output=True,
                          check=True).stdout


def fatbin_entries(data):
    """[(kind, sm_arch, payload)] of every entry of every container in a fatbin;
    kind is "elf" or "ptx"; payloads are decompressed (None if they cannot be)."""
    entries, offset = [], 0
    while offset + 16 <= len(data):
        magic, version, header_size, size = struct.unpack_from("<IHHQ", data, offset)
        assert magic == 0xBA55ED50, f"not a fatbin container at {offset}: {magic:#x}"
        assert version == 1 and header_size == 16
        position, end = offset + header_size, offset + header_size + size
        assert end <= len(data), "truncated fatbin"
        while position < end:
            kind, _, entry_header, payload_size = struct.unpack_from("<HHIQ", data, position)
            compressed_size, = struct.unpack_from("<I", data, position + 16)
            arch, = struct.unpack_from("<I", data, position + 28)
            flags, = struct.unpack_from("<Q", data, position + 40)
            payload = data[position + entry_header:position + entry_header + payload_size]
            if flags & 0x8000:  # zstd-compressed (CUDA 13 compresses the PTX)
                payload = zstd_decompress(payload[:compressed_size])
            entries.append(({1: "ptx", 2: "elf"}.get(kind, kind), arch, payload))
            position += entry_header + payload_size
        offset = end
    return entries


def elf_symbols(elf):
    """Names in the symbol tables of a 64-bit little-endian ELF."""
    assert elf[:4] == b"\x7fELF" and elf[4] == 2 and elf[5] == 1, "not a 64-bit LE ELF"
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind not in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
            continue
        strtab_offset = sections[link][4]
        for k in range(size // entsize):
            name_offset, = struct.unpack_from("<I", elf, offset + k * entsize)
            start = strtab_offset + name_offset
            names.add(elf[start:elf.index(b"\0", start)].decode())
    return names


def missing_cuda_entry_points(fatbin, names, archs):
    """What the fatbin lacks: per arch's ELF and the newest arch's PTX."""
    entries = fatbin_entries(fatbin)
    problems = []
    for arch in archs:
        number = int(arch[3:])
        elves = [payload for kind, sm, payload in entries if kind == "elf" and sm == number]
        if not elves:
            problems.append(f"no {arch} machine code")
            continue
        if None in elves:
            problems.append(f"{arch}: compressed machine code and no zstd to read it")
            continue
        symbols = set().union(*(elf_symbols(elf) for elf in elves))
        problems += [f"{arch}: {name}" for name in sorted(names - symbols)]
    newest = max(int(a[3:]) for a in archs)
    ptx = [payload for kind, sm, payload in entries if kind == "ptx" and sm == newest]
    if not ptx:
        problems.append(f"no compute_{newest} PTX")
    else:
        text = b"".join(p for p in ptx if p is not None).decode(errors="replace")
        if not text and None in ptx:
            return problems  # compressed and no zstd here: presence checked, names not
        problems += [f"compute_{newest} PTX: {name}" for name in sorted(names)
                     if not re.search(rf"\.entry\s+{re.escape(name)}\s*\(", text)]
    return problems


def missing_hip_entry_points(bundle, names, archs):
    entries = offload_bundle.read_bundle(bundle)
    problems = []
    for arch in archs:
        code = [payload for triple, payload in entries.items()
                if triple.startswith(("hip-amdgcn-amd-amdhsa", "hipv4-amdgcn-amd-amdhsa"))
                and triple.split("--", 1)[-1].split(":")[0] == arch]
        if not code:
            problems.append(f"no {arch} code object in {sorted(entries)}")
            continue
        symbols = set().union(*(elf_symbols(elf) for elf in code))
        # an AMD kernel is its function symbol plus its kernel descriptor NAME.kd
        problems += [f"{arch}: {name}" for name in sorted(names)
                     if name not in symbols or f"{name}.kd" not in symbols]
    return problems


# ---------------------------------------------------------------------------
# The sources


def test_kernel_sources_exist():
    assert SOURCES, f"no .cu files in {KERNELS}: nothing would be compiled"


TINY = r'''
#include "pyar_device.h"
#define ENTRY(name) extern "C" __global__ void pyar_tiny_##name(float *x) { x[0] = 1; }
ENTRY(a)
ENTRY(b)
extern "C" {
__global__ void __launch_bounds__(64) pyar_tiny_block(int *x, int n) { if (n) x[0] = n; }
__device__ int pyar_tiny_helper(int v) { return v + 1; }
}
extern "C" __device__ const unsigned pyar_tiny_table[2] = {1, 2};
__global__ void pyar_tiny_cxx_linkage(int *x) { x[0] = 3; }
namespace inner { __global__ void pyar_tiny_namespaced(int *x) { x[0] = 4; } }
template <int N> __global__ void pyar_tiny_template(int *x) { x[0] = N; }
template __global__ void pyar_tiny_template<1>(int *);
'''
TINY_ENTRY_POINTS = {"pyar_tiny_a", "pyar_tiny_b", "pyar_tiny_block"}


@pytest.fixture
def tiny_source(tmp_path):
    source = tmp_path / "tiny.cu"
    source.write_text(TINY)
    shutil.copy(os.path.join(KERNELS, "pyar_device.h"), tmp_path / "pyar_device.h")
    return str(source)


def test_entry_point_parser_on_marked_text():
    text = '\n'.join([
        '# 1 "k.cu"', 'extern "C" __attribute__((global)) void',
        '__attribute__((launch_bounds(512))) a_w2(int *x) { if (x) { x[0] = 1; } }',
        '# 1 "header.h" 1', 'extern "C" __attribute__((global)) void from_header(int *x) {}',
        '# 3 "k.cu" 2', 'extern "C" { __attribute__((global)) void b(void) {}',
        'static __attribute__((device)) int helper(int v) { return v; } }',
        '__attribute__((global)) void cxx(int *x) {}',
        'extern "C" __attribute__((device)) const int table[2] = {1, 2};',
        '__attribute__((global)) void after_table(int *x) {}',
        'extern "C" __global__ void d(const char *s = "extern \\"C\\" {") {}',
        '__global__ void last(int *x) {}',
    ])
    assert entry_points(text, "k.cu") == {"a_w2", "b", "d"}


@needs_nvcc
def test_tiny_kernel_for_cuda(tiny_source, tmp_path):
    names = entry_points(preprocess_cuda(tiny_source), tiny_source)
    assert names == TINY_ENTRY_POINTS
    output = str(tmp_path / "tiny.fatbin")
    run(cuda_compiler.nvcc_command(NVCC, tiny_source, output, CUDA_ARCHS))
    with open(output, "rb") as f:
        fatbin = f.read()
    assert missing_cuda_entry_points(fatbin, names, CUDA_ARCHS) == []
    # The check sees a missing name, a missing arch and a missing PTX.
    assert missing_cuda_entry_points(fatbin, {"pyar_tiny_absent"}, CUDA_ARCHS) == [
        "sm_80: pyar_tiny_absent", "sm_90: pyar_tiny_absent",
        "compute_90 PTX: pyar_tiny_absent"]
    assert missing_cuda_entry_points(fatbin, names, ("sm_80", "sm_100")) == [
        "no sm_100 machine code", "no compute_100 PTX"]
    # C++-linkage kernels are in the binary only under mangled names.
    symbols = set().union(*(elf_symbols(p) for k, _, p in fatbin_entries(fatbin) if k == "elf"))
    assert "pyar_tiny_cxx_linkage" not in symbols
    assert any("pyar_tiny_cxx_linkage" in s for s in symbols)


@needs_hipcc
def test_tiny_kernel_for_amd(tiny_source, tmp_path):
    names = entry_points(preprocess_hip(tiny_source), tiny_source)
    assert names == TINY_ENTRY_POINTS
    output = str(tmp_path / "tiny.hsaco")
    run(hipcc_compiler.hipcc_command(HIPCC, tiny_source, output, [HIP_ARCH]),
        env=hipcc_compiler.hip_environment())
    with open(output, "rb") as f:
        bundle = f.read()
    assert missing_hip_entry_points(bundle, names, [HIP_ARCH]) == []
    assert missing_hip_entry_points(bundle, {"pyar_tiny_absent"}, [HIP_ARCH]) == [
        f"{HIP_ARCH}: pyar_tiny_absent"]
    assert missing_hip_entry_points(bundle, names, ["gfx942"])[0].startswith(
        "no gfx942 code object")


# ---------------------------------------------------------------------------
# Every source of the package, for both platforms


@pytest.fixture(scope="module")
def package_build(tmp_path_factory):
    """The package build's code objects (default targets), from the cache."""
    return kernel_builds.build(tmp_path_factory.mktemp("kernels"),
                               gpu_targets.DEFAULT_CUDA_ARCHS + gpu_targets.DEFAULT_HIP_ARCHS)


@needs_nvcc
@pytest.mark.parametrize("name", SOURCES)
def test_cuda_fatbin_has_every_entry_point(name, package_build):
    source = os.path.join(KERNELS, name)
    names = entry_points(preprocess_cuda(source), source)
    assert names, f"{name} defines no extern \"C\" __global__ entry point"
    with open(package_build[name[:-3] + ".fatbin"], "rb") as f:
        assert missing_cuda_entry_points(f.read(), names, gpu_targets.DEFAULT_CUDA_ARCHS) == []


@needs_hipcc
@pytest.mark.parametrize("name", SOURCES)
def test_amd_code_object_has_every_entry_point(name, package_build):
    source = os.path.join(KERNELS, name)
    names = entry_points(preprocess_hip(source), source)
    assert names, f"{name} defines no extern \"C\" __global__ entry point"
    with open(package_build[name[:-3] + ".hsaco"], "rb") as f:
        bundle = f.read()
    archs = sorted(t.split("--")[-1] for t in offload_bundle.read_bundle(bundle)
                   if t.startswith("hipv4-"))
    assert HIP_ARCH in archs
    assert missing_hip_entry_points(bundle, names, archs) == []


@needs_nvcc
@needs_hipcc
def test_package_build_makes_both_flavours(tiny_source, tmp_path, monkeypatch):
    """build_kernels.build, as the package build runs it, with both toolchains."""
    monkeypatch.setenv("PYAR_GPU_ARCHS", f"sm_90,{HIP_ARCH}")
    output = tmp_path / "out"
    made = build_kernels.build(os.path.dirname(tiny_source), str(output))
    assert sorted(os.path.basename(p) for p in made) == ["tiny.fatbin", "tiny.hsaco"]
    assert missing_cuda_entry_points((output / "tiny.fatbin").read_bytes(), TINY_ENTRY_POINTS,
                                     ("sm_90",)) == []
    assert missing_hip_entry_points((output / "tiny.hsaco").read_bytes(), TINY_ENTRY_POINTS,
                                    [HIP_ARCH]) == []

    report = (output / kernel_resources.REPORT_NAME).read_text()
    assert re.search(rf"^    {HIP_ARCH}: built by \S", report, re.M)  # the build's log
    assert re.search(r"^    tiny.cu sm_90 nvcc [\d.]+: (compiled in \d+ s|cached)$", report, re.M)
    for name in TINY_ENTRY_POINTS:  # a row for sm_90 and one for the AMD arch
        assert len(re.findall(rf"\| tiny \| (sm_90|{HIP_ARCH}) \| [^|]+ \| {name} \|",
                              report)) == 2, report

    monkeypatch.setenv("PYAR_GPU_ARCHS", "sm_90")
    only_cuda = tmp_path / "cuda-only"
    made = build_kernels.build(os.path.dirname(tiny_source), str(only_cuda))
    assert [os.path.basename(p) for p in made] == ["tiny.fatbin"]


def build_log(capfd, tiny_source, output):
    made = build_kernels.build(os.path.dirname(tiny_source), str(output))
    lines = [line for line in capfd.readouterr().err.splitlines() if "tiny.cu" in line]
    return {os.path.basename(p): open(p, "rb").read() for p in made}, lines


@needs_nvcc
def test_cache_reuses_unchanged_builds(tiny_source, tmp_path, monkeypatch, capfd):
    """A second build compiles nothing; a changed header, define or target
    compiles again; one log line per source, target and compiler."""
    monkeypatch.setenv("PYAR_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYAR_GPU_ARCHS", "sm_90")
    first, lines = build_log(capfd, tiny_source, tmp_path / "a")
    assert len(lines) == 1 and re.search(r"tiny.cu sm_90 nvcc [\d.]+: compiled in \d+ s", lines[0])
    again, lines = build_log(capfd, tiny_source, tmp_path / "b")
    assert again == first and len(lines) == 1
    assert "tiny.cu sm_90 nvcc" in lines[0] and lines[0].endswith(": cached")
    header = os.path.join(os.path.dirname(tiny_source), "pyar_device.h")
    with open(header, "a") as f:
        f.write("\n// changed\n")
    _, lines = build_log(capfd, tiny_source, tmp_path / "c")
    assert "compiled" in lines[0]
    monkeypatch.setenv("PYAR_GPU_ARCHS", "sm_80;sm_90")
    _, lines = build_log(capfd, tiny_source, tmp_path / "d")
    assert "tiny.cu sm_80,sm_90" in lines[0] and "compiled" in lines[0]
    made = build_kernels.build(os.path.dirname(tiny_source), str(tmp_path / "e"),
                               defines=("PYAR_TINY",))
    assert "compiled" in [line for line in capfd.readouterr().err.splitlines()
                          if "tiny.cu" in line][0]
    assert len(made) == 1


def test_included_files_follow_the_includes(tmp_path):
    (tmp_path / "a.cu").write_text('#include "b.h"\n#include <stdint.h>\n')
    (tmp_path / "b.h").write_text('  #  include "sub/c.h"\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.h").write_text('#include "../b.h"\n')  # a cycle
    found = compile_cache.included_files(str(tmp_path / "a.cu"), [str(tmp_path)])
    assert [os.path.relpath(p, tmp_path) for p in found] == ["a.cu", "b.h", "sub/c.h"]


BUNDLER = shutil.which("clang-offload-bundler-19") or shutil.which("clang-offload-bundler")


@pytest.mark.skipif(BUNDLER is None, reason="no clang-offload-bundler to read the bundle back")
def test_bundle_reads_back_with_clang_offload_bundler(tmp_path):
    codes = {"gfx942": b"\x7fELF-942" * 1000, "gfx90a": b"\x7fELF-90a" * 3}
    path = str(tmp_path / "k.hsaco")
    offload_bundle.write_bundle(path, codes)
    listed = run([BUNDLER, "--list", "--type=o", f"--input={path}"]).stdout.split()
    assert sorted(listed) == sorted([offload_bundle.HOST_TRIPLE]
                                    + [f"hipv4-amdgcn-amd-amdhsa--{a}" for a in codes])
    for arch, code in codes.items():
        out = tmp_path / arch
        run([BUNDLER, "--unbundle", "--type=o", f"--input={path}", f"--output={out}",
             f"--targets=hipv4-amdgcn-amd-amdhsa--{arch}"])
        assert out.read_bytes() == code
    with open(path, "rb") as f:
        assert {t: len(p) for t, p in offload_bundle.read_bundle(f.read()).items()} == {
            offload_bundle.HOST_TRIPLE: 0, **{f"hipv4-amdgcn-amd-amdhsa--{a}": len(c)
                                             for a, c in codes.items()}}


AMD_REMARKS = """\
k.cu:3:1: remark: Function Name: pyar_a [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     SGPRs: 40 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     VGPRs: 256 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     AGPRs: 0 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     ScratchSize [bytes/lane]: 52 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     Dynamic Stack: False [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     Occupancy [waves/SIMD]: 2 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     SGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     VGPRs Spill: 13 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     LDS Size [bytes/block]: 64 [-Rpass-analysis=kernel-resource-usage]
k.cu:9:1: remark: Function Name: pyar_b [-Rpass-analysis=kernel-resource-usage]
k.cu:9:1: remark:     VGPRs: 8 [-Rpass-analysis=kernel-resource-usage]
"""
PTXAS = """\
ptxas info    : Compiling entry function 'pyar_a' for 'sm_90'
ptxas info    : Function properties for pyar_a
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 400 bytes cmem[0]
ptxas info    : Function properties for _Z6helperi
    24 bytes stack frame, 24 bytes spill stores, 24 bytes spill loads
ptxas info    : Compiling entry function 'pyar_a' for 'sm_80'
ptxas info    : Function properties for pyar_a
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, 380 bytes cmem[0]
"""


def test_resource_reports_are_read():
    amd = kernel_resources.amd_resources(AMD_REMARKS)
    assert amd == [{"kernel": "pyar_a", "sgprs": 40, "vgprs": 256, "agprs": 0, "scratch": 52,
                    "occupancy": 2, "sgpr_spill": 0, "vgpr_spill": 13},
                   {"kernel": "pyar_b", "vgprs": 8}]
    cuda = kernel_resources.cuda_resources(PTXAS)
    assert cuda == [{"kernel": "pyar_a", "arch": "sm_90", "stack": 8, "spill_stores": 4,
                     "spill_loads": 4, "registers": 255},
                    {"kernel": "pyar_a", "arch": "sm_80", "stack": 0, "spill_stores": 0,
                     "spill_loads": 0, "registers": 32}]
    table, summary = kernel_resources.resource_report(
        [("k", "gfx942", "clang", amd), ("k", "sm_90", "nvcc", cuda[:1])])
    assert "| k | gfx942 | clang | pyar_a | 256 | 0/40 | 13 VGPRs, 0 SGPRs | 52 | 2 |" in table
    assert "| k | sm_90 | nvcc | pyar_a | 255 |  | 4 B stores, 4 B loads | 8 |  |" in table
    assert summary == ["k gfx942: 2 kernels, at most 256 registers, 1 spill to memory: pyar_a",
                       "k sm_90: 1 kernels, at most 255 registers, 1 spill to memory: pyar_a"]
    amd[0].update(vgpr_spill=0, scratch=0, sgpr_spill=9)  # SGPRs spill into VGPR lanes
    _, summary = kernel_resources.resource_report([("k", "gfx942", "clang", amd)])
    assert summary == ["k gfx942: 2 kernels, at most 256 registers, no spills to memory"]


def test_isa_version_files():
    assert hip_clang_compiler.isa_version_file("gfx942") == ("oclc_isa_version_942.bc", 9402)
    assert hip_clang_compiler.isa_version_file("gfx90a") == ("oclc_isa_version_90a.bc", 9010)
    assert hip_clang_compiler.isa_version_file("gfx1100") is None
