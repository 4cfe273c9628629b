"""Reading the machine code of pyar's kernels for the barrier protocol's
ordering (docs/design.md, rule 6).

AMD (gfx9: gfx90a, gfx94x, gfx950), disassembled with llvm-objdump:
  release  every ``buffer_wbl2`` (the L2 write-back of a system-scope
           release) reaches the next global store or atomic only through an
           ``s_waitcnt`` with ``vmcnt(0)``: the write-back has completed before
           the flag store (the wait LLVM before PR 178316 can drop); and on
           every path into the block barrier before it (the nearest
           ``s_barrier``) an ``s_waitcnt vmcnt(0)`` follows the last vector
           memory access: every wave's own accesses are complete before the
           releasing wave writes the L2 back (paths follow the direct
           branches: a wave whose lanes all skip a block that waits, by
           ``s_cbranch_execz``, reaches the barrier without that wait);
  acquire  every system-coherent load (gfx94x: ``sc0 sc1``; gfx90a: ``glc``
           without ``slc``) -- the flag loads of the spin loops and the error
           word, all acquires in pyar_device.h -- is followed by an
           ``s_waitcnt vmcnt(0)`` and then the cache invalidate (gfx94x:
           ``buffer_inv sc0 sc1``; gfx90a: ``buffer_wbinvl1_vol``) before any
           later vector load or branch.
NVIDIA (sm_XX SASS, disassembled with cuobjdump):
  release  every global ``.STRONG.SYS`` store (``st.release.sys.global``) has
           a ``MEMBAR.*.SYS`` before it with no global memory access between;
  acquire  every global ``.STRONG.SYS`` load (``ld.acquire.sys.global``) is
           followed by ``CCTL.IVALL`` before any later load or branch.
LL packets (pyar_ll.h; kernels pyar_allreduce_ll_*, world W from the name):
  store    the packet pushed to every rank is one 64-bit system-scope store
           per rank: W such stores of one data register (AMD: a
           ``*_store_dwordx2``, with ``sc0 sc1`` on gfx94x; NVIDIA:
           ``STG.E.64.STRONG.SYS``); they are exempt from the release rule;
  poll     at least W 64-bit system-coherent loads (AMD: a
           ``*_load_dwordx2`` with the acquire's bits; NVIDIA:
           ``LDG.E.64.STRONG.SYS``) that no invalidate follows: the polls,
           exempt from the acquire rule.  A split packet (32-bit halves) or a
           cached poll leaves fewer than W of either, and a 32-bit strong
           access still meets the release and acquire rules.
(The flags are 64-bit words: ``global_store_dwordx2``/``global_load_dwordx2``
or their ``flat_`` forms on AMD, ``STG.E.64.STRONG.SYS``/``LDG.E.64.STRONG.SYS`` on
NVIDIA; the rules read every width.  The host-visible error words are
generic-address volatile accesses on NVIDIA -- ``ST.E``/``LD.E`` -- and not part
of the NVIDIA check.)

Run as a script on a folder of code objects, it prints the table
arch x kernel x sites x verdict of every .hsaco and .fatbin there.
"""
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernel_build import compile_cache, cuda_compiler, offload_bundle  # noqa: E402


LL_KERNELS = "pyar_allreduce_ll_"  # the LL packet kernels (pyar_ll.h)


class Instruction:
    __slots__ = ("address", "mnemonic", "operands")

    def __init__(self, address, mnemonic, operands):
        self.address, self.mnemonic, self.operands = address, mnemonic, operands

    def __repr__(self):
        return f"{self.address:#x}: {self.mnemonic} {self.operands}".rstrip()


# ---------------------------------------------------------------------------
# Tools


def find_llvm_objdump():
    """llvm-objdump of LLVM 19 or newer (knows gfx942), or None."""
    rocm = os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "llvm", "bin", "llvm-objdump")
    for candidate in (shutil.which("llvm-objdump-19"), shutil.which("llvm-objdump-20"),
                      rocm if os.access(rocm, os.X_OK) else None):
        if candidate:
            return candidate
    return None


def find_cuobjdump():
    """cuobjdump (with nvdisasm beside it): the CUDA toolkit's, or that of
    NVIDIA's PyPI packages nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm."""
    candidates = [shutil.which("cuobjdump"),
                  os.path.join(os.path.dirname(cuda_compiler.find_nvcc() or "/nonexistent"),
                               "cuobjdump")]
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(glob.glob(os.path.join(folder, "*", "bin", "cuobjdump")))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and os.access(
                os.path.join(os.path.dirname(candidate), "nvdisasm"), os.X_OK):
            return candidate
    return None


# ---------------------------------------------------------------------------
# Disassembly


def disassemble_amd(objdump, code_object, arch):
    """{kernel: [Instruction]} of one arch's code object (ELF bytes)."""
    with tempfile.NamedTemporaryFile(suffix=".co") as f:
        f.write(code_object)
        f.flush()
        text = subprocess.run([objdump, "-d", f"--mcpu={arch}", f.name], capture_output=True,
                              text=True, check=True).stdout
    return parse_amd(text)


def parse_listing(text, header, instruction):
    """{function: [Instruction]} of a disassembler's listing: ``header``
    matches a function's first line (group 1: its name), ``instruction`` an
    instruction (named groups address, mnemonic, operands)."""
    kernels, current = {}, None
    for line in text.splitlines():
        found = re.match(header, line)
        if found:
            current = kernels.setdefault(found.group(1), [])
            continue
        found = re.match(instruction, line)
        if found and current is not None:
            current.append(Instruction(int(found.group("address"), 16), found.group("mnemonic"),
                                       found.group("operands").strip()))
    return kernels


def parse_amd(text):
    return parse_listing(text, r"^[0-9a-f]+ <([^>]+)>:$",
                         r"^\s+(?P<mnemonic>[a-z_][a-z0-9_.]*)\s*(?P<operands>.*?)\s*//\s*"
                         r"(?P<address>[0-9A-F]+):")


def disassemble_cuda(cuobjdump, fatbin_path, arch):
    """{kernel: [Instruction]} of one sm_XX's SASS in a fatbin."""
    text = subprocess.run([cuobjdump, "-sass", "-arch", arch, fatbin_path], capture_output=True,
                          text=True, check=True).stdout
    return parse_sass(text)


def parse_sass(text):
    return parse_listing(text, r"^\s+Function : (\S+)",
                         r"^\s+/\*(?P<address>[0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?"
                         r"(?P<mnemonic>[A-Z][A-Z0-9_.]*)\s*(?P<operands>[^;]*);")


# ---------------------------------------------------------------------------
# The AMD checks


def _tokens(instruction):
    return set(re.split(r"[\s,]+", instruction.operands))


def is_vector_memory(instruction):
    return instruction.mnemonic.startswith(("global_", "flat_", "buffer_")) and any(
        kind in instruction.mnemonic for kind in ("_load", "_store", "_atomic"))


def ends_block(instruction):
    return instruction.mnemonic.startswith(("s_branch", "s_cbranch", "s_setpc", "s_swappc",
                                            "s_endpgm"))


def _waits_for_memory(instruction):
    return instruction.mnemonic == "s_waitcnt" and "vmcnt(0)" in instruction.operands


def _system_coherent_load(instruction, arch):
    if not (is_vector_memory(instruction) and "_load" in instruction.mnemonic):
        return False
    bits = _tokens(instruction)
    if arch.startswith("gfx94") or arch.startswith("gfx95"):
        return {"sc0", "sc1"} <= bits
    return "glc" in bits and "slc" not in bits


def _invalidates(instruction, arch):
    if arch.startswith("gfx94") or arch.startswith("gfx95"):
        return instruction.mnemonic == "buffer_inv" and {"sc0", "sc1"} <= _tokens(instruction)
    return instruction.mnemonic == "buffer_wbinvl1_vol"


def _fence_before_barrier(code, i):
    """Whether the buffer_wbl2 at ``i`` is a thread's own system fence
    (__threadfence_system over its stores to peers, before a barrier): it
    reaches a block barrier before any store, and the release after that
    barrier is checked on its own."""
    following = next((later for later in code[i + 1:] if later.mnemonic == "s_barrier"
                      or (is_vector_memory(later) and "_load" not in later.mnemonic)), None)
    return following is not None and following.mnemonic == "s_barrier"


def branch_target(instruction):
    """The address a direct branch (``s_branch``, ``s_cbranch_*``) goes to: the
    next instruction plus four times its signed 16-bit word offset; else None."""
    if not instruction.mnemonic.startswith(("s_branch", "s_cbranch")):
        return None
    offset = int(instruction.operands.split()[0], 0)
    return instruction.address + 4 + 4 * (offset - (1 << 16) if offset >= 1 << 15 else offset)


def predecessors(code):
    """[indices of the instructions that may run just before code[i]] for
    every i: the one before it unless that one never falls through
    (``s_branch``, ``s_endpgm``, ``s_setpc``), and every direct branch to it."""
    index = {instruction.address: i for i, instruction in enumerate(code)}
    before = [[] for _ in code]
    for i, instruction in enumerate(code):
        target = index.get(branch_target(instruction))
        if target is not None:
            before[target].append(i)
        if i + 1 < len(code) and not instruction.mnemonic.startswith(
                ("s_branch", "s_endpgm", "s_setpc")):
            before[i + 1].append(i)
    return before


def _barrier_problems(code, i, before):
    """[why] when on some path into the block barrier before the release at
    ``i`` (the nearest s_barrier) a vector memory access is not followed by
    the wave's own s_waitcnt vmcnt(0); ``before``: predecessors(code)."""
    barrier = next((j for j in range(i - 1, -1, -1) if code[j].mnemonic == "s_barrier"), None)
    if barrier is None:
        return [f"{code[i]!r}: no s_barrier before it"]
    pending, seen = list(before[barrier]), set()
    while pending:
        j = pending.pop()
        if j in seen or _waits_for_memory(code[j]):
            continue
        seen.add(j)
        if is_vector_memory(code[j]):
            return [f"{code[barrier]!r} before {code[i]!r}: {code[j]!r} reaches it without "
                    "s_waitcnt vmcnt(0)"]
        pending.extend(before[j])
    return []


def amd_release_problems(code):
    """(releases, [why]) for every buffer_wbl2 whose write-back is not waited
    for before the next store, atomic or branch, or whose block barrier
    (the s_barrier before it) some path reaches without the waves' own wait."""
    problems, releases = [], 0
    before = None
    for i, instruction in enumerate(code):
        if instruction.mnemonic != "buffer_wbl2":
            continue
        releases += 1
        if not _fence_before_barrier(code, i):
            before = before or predecessors(code)
            problems.extend(_barrier_problems(code, i, before))
        for later in code[i + 1:]:
            if _waits_for_memory(later):
                break
            if (is_vector_memory(later) and "_load" not in later.mnemonic) or ends_block(later):
                problems.append(f"{instruction!r} reaches {later!r} without s_waitcnt vmcnt(0)")
                break
    return releases, problems


def _amd_acquire_problem(code, i, arch):
    """Why the system-coherent load at ``i`` is no acquire (no wait and
    invalidate before the next vector load or branch), or None."""
    instruction, waited = code[i], False
    for later in code[i + 1:]:
        if waited and _invalidates(later, arch):
            return None
        if _waits_for_memory(later):
            waited = True
        elif (is_vector_memory(later) and "_load" in later.mnemonic) or ends_block(later):
            missing = "invalidate" if waited else "s_waitcnt vmcnt(0)"
            return f"{instruction!r} reaches {later!r} without the {missing}"
    return f"{instruction!r}: no acquire sequence before the end"


def amd_acquire_problems(code, arch, polls=()):
    """[why] for every system-coherent load not followed by the wait and the
    invalidate before the next vector load or branch (but the LL ``polls``)."""
    problems, acquires = [], 0
    for i, instruction in enumerate(code):
        if not _system_coherent_load(instruction, arch) or i in polls:
            continue
        acquires += 1
        problem = _amd_acquire_problem(code, i, arch)
        if problem:
            problems.append(problem)
    return acquires, problems


def ll_world(kernel):
    """W of an LL kernel (pyar_allreduce_ll_<dtype>_w<W>), else 0."""
    return int(kernel.rsplit("_w", 1)[1]) if kernel.startswith(LL_KERNELS) else 0


def _packet_problems(world, stores, polls, store_name, poll_name):
    """The LL packet rules over the candidate ``stores`` (their data
    operands) and ``polls``."""
    problems = []
    pushed = max((stores.count(data) for data in set(stores)), default=0)
    if pushed < world:
        problems.append(f"no packet pushed to all {world} ranks as one {store_name} each "
                        f"(at most {pushed} of one data register)")
    if len(polls) < world:
        problems.append(f"{len(polls)} packet polls ({poll_name} without an invalidate), "
                        f"not {world}")
    return problems


def _store_data(instruction):
    return instruction.operands.split(",")[1].split()[0]


def amd_ll_polls(code, arch):
    return {i for i, instruction in enumerate(code)
            if _system_coherent_load(instruction, arch)
            and instruction.mnemonic.endswith("load_dwordx2")
            and _amd_acquire_problem(code, i, arch)}


def amd_ll_problems(code, arch, world, polls):
    system = ({"sc0", "sc1"} if arch.startswith("gfx94") or arch.startswith("gfx95")
              else set())  # gfx90a: a store to the uncached region needs no bits
    stores = [_store_data(instruction) for instruction in code
              if is_vector_memory(instruction) and instruction.mnemonic.endswith("store_dwordx2")
              and system <= _tokens(instruction)]
    return _packet_problems(world, stores, polls, "system-scope *_store_dwordx2",
                            "system-coherent *_load_dwordx2")


def check_amd_kernel(code, arch, kernel=""):
    world = ll_world(kernel)
    polls = amd_ll_polls(code, arch) if world else set()
    releases, release_problems = amd_release_problems(code)
    acquires, acquire_problems = amd_acquire_problems(code, arch, polls)
    ll_problems = amd_ll_problems(code, arch, world, polls) if world else []
    return releases, acquires, release_problems + acquire_problems + ll_problems


# ---------------------------------------------------------------------------
# The NVIDIA checks


def _global_sys(instruction, kind):
    return instruction.mnemonic.startswith(kind + "G.") and ".STRONG.SYS" in instruction.mnemonic


def _cuda_release_problem(code, i):
    instruction = code[i]
    for earlier in reversed(code[:i]):
        if earlier.mnemonic.startswith("MEMBAR") and earlier.mnemonic.endswith(".SYS"):
            return None
        if earlier.mnemonic.startswith(("LDG", "STG", "LD.", "ST.", "ATOM", "RED")) or \
                earlier.mnemonic.startswith(("BRA", "EXIT", "BSYNC", "RET")):
            return f"{instruction!r}: {earlier!r} before it, no MEMBAR.SYS"
    return f"{instruction!r}: no MEMBAR.SYS before it"


def _cuda_acquire_problem(code, i):
    instruction = code[i]
    for later in code[i + 1:]:
        if later.mnemonic == "CCTL.IVALL":
            return None
        if later.mnemonic.startswith(("LDG", "LD.", "ATOM", "BRA", "EXIT", "BSYNC", "RET")):
            return f"{instruction!r} reaches {later!r} without CCTL.IVALL"
    return f"{instruction!r}: no CCTL.IVALL before the end"


def check_cuda_kernel(code, arch=None, kernel=""):
    """(releases, acquires, [why]); an LL kernel's packet stores and polls
    (64-bit, strong at system scope, without the release's MEMBAR or the
    acquire's CCTL) meet the packet rules instead."""
    problems, releases, acquires = [], 0, 0
    world = ll_world(kernel)
    stores, polls = [], []
    for i, instruction in enumerate(code):
        if _global_sys(instruction, "ST"):
            problem = _cuda_release_problem(code, i)
            if world and problem and instruction.mnemonic == "STG.E.64.STRONG.SYS":
                stores.append(instruction.operands.split(",")[-1].strip())
                continue
            releases += 1
            problems += [problem] if problem else []
        elif _global_sys(instruction, "LD"):
            problem = _cuda_acquire_problem(code, i)
            if world and problem and instruction.mnemonic == "LDG.E.64.STRONG.SYS":
                polls.append(i)
                continue
            acquires += 1
            problems += [problem] if problem else []
    if world:
        problems += _packet_problems(world, stores, polls, "STG.E.64.STRONG.SYS",
                                     "LDG.E.64.STRONG.SYS")
    return releases, acquires, problems


# ---------------------------------------------------------------------------
# Whole code objects


def code_objects(path):
    """{arch: ELF bytes} of a .hsaco bundle."""
    with open(path, "rb") as f:
        entries = offload_bundle.read_bundle(f.read())
    return {triple.split("--", 1)[1].split(":")[0]: payload for triple, payload in entries.items()
            if triple.startswith(("hip-amdgcn", "hipv4-amdgcn"))}


def remembered(check):
    """``check(path, tool)``, its rows kept in the kernel cache under the hash
    of the code object, the check's module and the tool: reading the SASS of the fused
    kernels takes cuobjdump most of a minute, and unchanged inputs give the
    same rows."""
    def cached_check(path, tool):
        digest = hashlib.sha256(check.__name__.encode())
        for name in (path, os.path.abspath(sys.modules[check.__module__].__file__)):
            with open(name, "rb") as f:
                digest.update(f.read())
        digest.update(f"{os.path.realpath(tool)} {os.path.getsize(tool)}".encode())
        entry = os.path.join(compile_cache.cache_folder(), "checks", digest.hexdigest() + ".json")
        if os.path.isfile(entry):
            with open(entry) as f:
                return [tuple(row) for row in json.load(f)]
        rows = check(path, tool)
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        with open(entry + ".tmp", "w") as f:
            json.dump(rows, f)
        os.replace(entry + ".tmp", entry)
        return rows
    return cached_check


@remembered
def check_hsaco(path, objdump):
    """[(arch, kernel, releases, acquires, problems)] of a .hsaco."""
    rows = []
    for arch, code_object in sorted(code_objects(path).items()):
        for kernel, code in sorted(disassemble_amd(objdump, code_object, arch).items()):
            rows.append((arch, kernel, *check_amd_kernel(code, arch, kernel)))
    return rows


def fatbin_sass_archs(cuobjdump, path):
    listing = subprocess.run([cuobjdump, "-lelf", path], capture_output=True, text=True,
                             check=True).stdout
    return sorted(set(re.findall(r"\.(sm_\d+)\.cubin", listing)))


@remembered
def check_fatbin(path, cuobjdump):
    rows = []
    for arch in fatbin_sass_archs(cuobjdump, path):
        for kernel, code in sorted(disassemble_cuda(cuobjdump, path, arch).items()):
            rows.append((arch, kernel, *check_cuda_kernel(code, arch, kernel)))
    return rows


def table(rows):
    """The markdown table arch x kernel x release/acquire sites x verdict."""
    lines = ["| arch | kernel | release sites | acquire sites | verdict |",
             "| --- | --- | --- | --- | --- |"]
    for arch, kernel, releases, acquires, problems in rows:
        verdict = "ok" if not problems else f"FAIL ({len(problems)}): {problems[0]}"
        lines.append(f"| {arch} | {kernel} | {releases} | {acquires} | {verdict} |")
    return "\n".join(lines)


def main(folder):
    objdump, cuobjdump = find_llvm_objdump(), find_cuobjdump()
    failed = False
    for path in sorted(glob.glob(os.path.join(folder, "*.hsaco"))
                       + glob.glob(os.path.join(folder, "*.fatbin"))):
        tool = objdump if path.endswith(".hsaco") else cuobjdump
        if tool is None:
            print(f"\n{os.path.basename(path)}: no disassembler (llvm-objdump-19 / cuobjdump)")
            continue
        rows = (check_hsaco if path.endswith(".hsaco") else check_fatbin)(path, tool)
        print(f"\n## {os.path.basename(path)}\n\n{table(rows)}")
        failed |= any(problems for *_, problems in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "pyar/_kernels"))
