"""Rule 6 of docs/design.md, in the machine code of every shipped kernel (tier a).

The package build of src/kernels (through the kernel cache: the same bytes
the install shipped) is disassembled for every arch, kernel by kernel, and
every barrier's system-scope release and acquire is checked (the rules are in
tests/machine_code.py).  The check is shown to fail on code that lacks the
release wait: the same sources built with PYAR_TEST_NO_RELEASE_WAIT (the
release store as it was before the explicit wait; clang-19 drops the wait
there), and on the shipped code with the waits or invalidates taken out.
Run with -s to see the tables; `python3 tests/machine_code.py pyar/_kernels`
prints them for the installed code objects.  The rows of a code object are
kept in the kernel cache under the hash of its bytes, the checker and the
disassembler (reading the fused kernels' SASS takes most of a minute).
"""
import pytest

from kernel_build import cuda_compiler, gpu_targets, hip_clang_compiler, hipcc_compiler
from tests import kernel_builds
from tests import machine_code as mc
from tests import machine_code_speed as speed

OBJDUMP = mc.find_llvm_objdump()
CUOBJDUMP = mc.find_cuobjdump()
needs_objdump = pytest.mark.skipif(OBJDUMP is None, reason="no llvm-objdump of LLVM >= 19 "
                                   "(apt-get install llvm-19): AMD machine code not read here")
needs_cuobjdump = pytest.mark.skipif(CUOBJDUMP is None, reason="no cuobjdump with nvdisasm (pip "
                                     "install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm): SASS "
                                     "not read here")
# Every collective kernel opens with a start barrier and closes with an exit barrier
# (or releases and acquires flags around its data, FLAG_AROUND_DATA); the signal
# floor's flag exchange (pyar.bench --latency --signal-floor) releases and acquires as
# they do.
COLLECTIVES = ("pyar_allreduce_one_shot", "pyar_allreduce_two_shot", "pyar_allreduce_rmsnorm",
               "pyar_reduce_scatter", "pyar_all_gather", mc.LL_KERNELS,
               "pyar_test_flag_exchange")
HIP_ARCHS = ("gfx90a", "gfx942")  # what CI's clang-19 builds
# Kernels that release their start flag before their data moves and acquire
# the peers' flags once it has come (pyar_lamport.h, pyar_ll.h): loads between
# the two are their point, not a slow barrier.
FLAG_AROUND_DATA = ("pyar_allreduce_rmsnorm_lamport", mc.LL_KERNELS)


def is_collective(kernel):
    return kernel.startswith(COLLECTIVES)


def print_table(title, rows):
    print(f"\n{title}\n{mc.table(rows)}")


def sole_compiler_is_clang19():
    clang = hip_clang_compiler.find_hip_clang()
    return (hipcc_compiler.find_rocm_hipcc() is None and clang is not None
            and clang.endswith("clang++-19")
            and hip_clang_compiler.find_device_libs() is not None)


def shipped(tmp_path_factory, archs, suffix, missing):
    """{name: path} of the package build's code objects ending in ``suffix``."""
    made = kernel_builds.build(tmp_path_factory.mktemp(suffix), archs)
    found = {name: path for name, path in made.items() if name.endswith("." + suffix)}
    if not found:
        pytest.skip(missing)
    return found


def failures(rows_by_name):
    """Every problem found, and every collective kernel in which the check
    found no release or no acquire (it would be looking in the wrong place);
    every kind of collective must be among the kernels read."""
    found, kinds = [], set()
    for name, rows in rows_by_name.items():
        print_table(f"## {name}", rows)
        for arch, kernel, releases, acquires, problems in rows:
            if problems:
                found.append(f"{name} {arch} {kernel}: {problems[0]}")
            if is_collective(kernel):
                kinds.add(next(c for c in COLLECTIVES if kernel.startswith(c)))
                if not (releases and acquires):
                    found.append(f"{name} {arch} {kernel}: {releases} releases, {acquires} "
                                 "acquires: the barriers are not where the check looks")
    assert kinds == set(COLLECTIVES)
    return found


@pytest.fixture(scope="module")
def amd_bundles(tmp_path_factory):
    return shipped(tmp_path_factory, gpu_targets.DEFAULT_HIP_ARCHS, "hsaco",
                   "no AMD compiler here: no code objects to read")


@pytest.fixture(scope="module")
def amd_rows(amd_bundles):
    return {name: mc.check_hsaco(path, OBJDUMP) for name, path in sorted(amd_bundles.items())}


@needs_objdump
def test_ci_ships_gfx90a_and_gfx942(amd_rows):
    if not sole_compiler_is_clang19() and hipcc_compiler.find_rocm_hipcc() is None:
        pytest.skip("neither ROCm nor clang++-19 with rocm-device-libs: gfx942 not buildable")
    for name, rows in amd_rows.items():
        assert {arch for arch, *_ in rows} >= set(HIP_ARCHS), name


@needs_objdump
def test_every_amd_barrier_waits_and_invalidates(amd_rows):
    assert failures(amd_rows) == []


@pytest.fixture(scope="module")
def amd_without_release_wait(tmp_path_factory):
    made = kernel_builds.build(tmp_path_factory.mktemp("no-release-wait"), HIP_ARCHS,
                               defines=("PYAR_TEST_NO_RELEASE_WAIT",), names=["allreduce.cu"])
    if "allreduce.hsaco" not in made:
        pytest.skip("no AMD compiler here: no negative fixture")
    return mc.check_hsaco(made["allreduce.hsaco"], OBJDUMP)


@needs_objdump
def test_check_catches_the_dropped_release_wait(amd_without_release_wait):
    rows = amd_without_release_wait
    print_table("## allreduce.hsaco built with PYAR_TEST_NO_RELEASE_WAIT", rows)
    caught = [(arch, kernel) for arch, kernel, _, _, problems in rows
              if any("without s_waitcnt vmcnt(0)" in p for p in problems)]
    if not caught and not sole_compiler_is_clang19():
        pytest.skip("this compiler keeps the wait even without the workaround: the negative "
                    "fixture has nothing to show (the mutation tests still do)")
    # clang-19 drops the wait after a system-scope release when its own model of the
    # thread's memory accesses has none in flight: every two-shot kernel's `mid` barrier,
    # on every arch.  (Where the compiler still counts an access in flight -- the
    # staging copy's stores before both kernels' start flags, the output's stores before
    # the exit flags: pyar's wait in sync_block_before_release is inline assembly it does
    # not model -- it keeps a wait of its own; so one-shot, whose start barrier dropped
    # it before the kernels staged their input, shows nothing now.)  Every LL kernel's
    # start flag (announce: before the block's first access to memory) loses it too.
    for arch, kernel, releases, _, problems in rows:
        assert releases > 0 and all("without s_waitcnt vmcnt(0)" in p for p in problems)
    assert {arch for arch, _ in caught} == set(HIP_ARCHS)
    assert {kernel for _, kernel in caught} == {
        kernel for _, kernel, *_ in rows
        if kernel.startswith(("pyar_allreduce_two_shot", mc.LL_KERNELS))}


@needs_objdump
@pytest.mark.parametrize("arch", HIP_ARCHS)
def test_check_catches_mutated_machine_code(amd_bundles, arch):
    """The shipped code of a two-shot kernel (three barriers) passes; without
    the waits after its write-backs, or without its invalidates, it fails at
    every site; without the waves' own waits before its block barriers, the
    staging copy's stores reach the start barrier's."""
    code_objects = mc.code_objects(amd_bundles["allreduce.hsaco"])
    if arch not in code_objects:
        pytest.skip(f"no compiler here builds {arch}")
    code = mc.disassemble_amd(OBJDUMP, code_objects[arch], arch)["pyar_allreduce_two_shot_f32_w4"]
    releases, acquires, problems = mc.check_amd_kernel(code, arch)
    # per barrier: one release; the first flag load, the spinning one, and the give-up
    # check's two (the rank's failure latch and the error word); the start barrier's
    # wait for a peer's signature (on a disagreement only); and the rank's failure
    # latch, which other blocks store, read at the block's start
    assert (releases, acquires, problems) == (3, 14, [])

    # pyar's wait and the compiler's (when it emits one) both go
    no_wait, waiting = [], False
    for instruction in code:
        if instruction.mnemonic == "buffer_wbl2":
            waiting = True
        elif mc.is_vector_memory(instruction):
            waiting = False
        if not (waiting and instruction.mnemonic == "s_waitcnt"):
            no_wait.append(instruction)
    _, _, problems = mc.check_amd_kernel(no_wait, arch)
    assert len(problems) == releases and all("without s_waitcnt" in p for p in problems)

    # the waves' own waits before the block barrier go: the last vmcnt(0) wait before
    # each s_barrier with no vector memory access or block end between them.  The
    # staged input's copy stores precede the start barrier; the waves whose lanes all
    # skip the barrier's address loads (only lanes < W make them: s_cbranch_execz)
    # meet no other wait on their way to it, and the rule follows that path.
    block_waits = set()
    for j, instruction in enumerate(code):
        if instruction.mnemonic != "s_barrier":
            continue
        for i in range(j - 1, -1, -1):
            if mc.is_vector_memory(code[i]) or mc.ends_block(code[i]):
                break
            if code[i].mnemonic == "s_waitcnt" and "vmcnt(0)" in code[i].operands:
                block_waits.add(i)
                break
    no_block_wait = [ins for i, ins in enumerate(code) if i not in block_waits]
    _, _, problems = mc.check_amd_kernel(no_block_wait, arch)
    assert problems and all("reaches it without s_waitcnt vmcnt(0)" in p for p in problems)
    start_release = next(ins for ins in code if ins.mnemonic == "buffer_wbl2")
    assert any(f"before {start_release!r}: " in p and "_store" in p for p in problems), problems

    invalidate = "buffer_inv" if arch == "gfx942" else "buffer_wbinvl1_vol"
    no_invalidate = [ins for ins in code if ins.mnemonic != invalidate]
    _, _, problems = mc.check_amd_kernel(no_invalidate, arch)
    assert len(problems) == acquires and all("without the invalidate" in p for p in problems)


AMD_SNIPPET = [
    "0000000000001000 <k>:",
    "\tglobal_store_dword v1, v2, s[4:5]       // 000000000FF0: DC708000 00000201",
    "\ts_waitcnt vmcnt(0)                      // 000000000FF8: BF8C0F70",
    "\ts_barrier                               // 000000000FFC: BF8A0000",
    "\tbuffer_wbl2 sc0 sc1                     // 000000001000: E0A0C000 00000000",
    "\ts_waitcnt vmcnt(0) lgkmcnt(0)           // 000000001008: BF8C0070",
    "\tglobal_store_dword v1, v2, s[0:1] sc0 sc1 // 00000000100C: DC718000 00000201",
    "\tglobal_load_dword v3, v1, s[0:1] sc0 sc1  // 000000001014: DC518000 037F0001",
    "\ts_waitcnt vmcnt(0)                      // 00000000101C: BF8C0F70",
    "\tbuffer_inv sc0 sc1                      // 000000001020: E0A4C000 00000000",
    "\tglobal_load_dwordx4 v[4:7], v1, s[2:3] nt // 000000001028: DC5C8000 047F0001",
    "\ts_endpgm                                // 000000001030: BF810000",
]


@pytest.mark.parametrize("removed, found", [
    (None, None),
    (2, "0xffc: s_barrier before 0x1000: buffer_wbl2 sc0 sc1: 0xff0: global_store_dword v1, v2, "
        "s[4:5] reaches it without s_waitcnt vmcnt(0)"),
    (5, "0x1000: buffer_wbl2 sc0 sc1 reaches 0x100c: global_store_dword v1, v2, s[0:1] sc0 sc1 "
        "without s_waitcnt vmcnt(0)"),
    (8, "0x1014: global_load_dword v3, v1, s[0:1] sc0 sc1 reaches 0x1028: global_load_dwordx4 "
        "v[4:7], v1, s[2:3] nt without the s_waitcnt vmcnt(0)"),
    (9, "0x1014: global_load_dword v3, v1, s[0:1] sc0 sc1 reaches 0x1028: global_load_dwordx4 "
        "v[4:7], v1, s[2:3] nt without the invalidate"),
])
def test_amd_rules_on_a_snippet(removed, found):
    code = mc.parse_amd("\n".join(line for i, line in enumerate(AMD_SNIPPET) if i != removed))
    releases, acquires, problems = mc.check_amd_kernel(code["k"], "gfx942")
    assert (releases, acquires) == (1, 1)
    assert problems == ([] if found is None else [found])


# A wave whose lanes all skip the block that waits (s_cbranch_execz 1 jumps over the
# wait, straight to the barrier) reaches the barrier with its store in flight; a branch
# that lands on the wait (offset 0) does not.
BRANCH_SNIPPET = [
    "0000000000003000 <k>:",
    "\tglobal_store_dwordx4 v1, v[4:7], s[4:5]  // 000000003000: DC7C8000 00000401",
    "\ts_cbranch_execz {offset}                  // 000000003008: BF880001",
    "\ts_waitcnt vmcnt(0)                      // 00000000300C: BF8C0F70",
    "\ts_barrier                               // 000000003010: BF8A0000",
    "\tbuffer_wbl2 sc0 sc1                     // 000000003014: E0A0C000 00000000",
    "\ts_waitcnt vmcnt(0) lgkmcnt(0)           // 00000000301C: BF8C0070",
    "\tglobal_store_dword v1, v2, s[0:1] sc0 sc1 // 000000003020: DC718000 00000201",
    "\ts_endpgm                                // 000000003028: BF810000",
]


@pytest.mark.parametrize("offset, found", [
    (0, None),
    (1, "0x3010: s_barrier before 0x3014: buffer_wbl2 sc0 sc1: 0x3000: global_store_dwordx4 "
        "v1, v[4:7], s[4:5] reaches it without s_waitcnt vmcnt(0)"),
])
def test_a_wait_some_path_skips_does_not_count(offset, found):
    code = mc.parse_amd("\n".join(BRANCH_SNIPPET).format(offset=offset))
    releases, _, problems = mc.check_amd_kernel(code["k"], "gfx942")
    assert releases == 1
    assert problems == ([] if found is None else [found])


FENCE_SNIPPET = [
    "0000000000002000 <k>:",
    "\tglobal_store_dwordx4 v1, v[4:7], s[4:5]  // 000000002000: DC7C8000 00000401",
    "\tbuffer_wbl2 sc0 sc1                     // 000000002008: E0A0C000 00000000",
    "\ts_waitcnt vmcnt(0)                      // 000000002010: BF8C0F70",
    "\ts_barrier                               // 000000002014: BF8A0000",
    "\ts_endpgm                                // 000000002018: BF810000",
]


@pytest.mark.parametrize("removed, found", [
    (None, None),
    (3, "0x2008: buffer_wbl2 sc0 sc1 reaches 0x2018: s_endpgm without s_waitcnt vmcnt(0)"),
])
def test_a_thread_fence_before_a_barrier_needs_only_its_wait(removed, found):
    """A thread's __threadfence_system over its pushes into peers' memory: no
    block barrier before it (the barrier's own release comes after), but its
    write-back is waited for like any release's."""
    code = mc.parse_amd("\n".join(line for i, line in enumerate(FENCE_SNIPPET) if i != removed))
    releases, _, problems = mc.check_amd_kernel(code["k"], "gfx942")
    assert releases == 1
    assert problems == ([] if found is None else [found])


# ---------------------------------------------------------------------------
# NVIDIA


@pytest.fixture(scope="module")
def cuda_fatbins(tmp_path_factory):
    return shipped(tmp_path_factory, gpu_targets.DEFAULT_CUDA_ARCHS, "fatbin",
                   "nvcc not found: no fatbins to read")


@needs_cuobjdump
def test_every_cuda_barrier_fences_and_invalidates(cuda_fatbins):
    rows = {name: mc.check_fatbin(path, CUOBJDUMP) for name, path in sorted(cuda_fatbins.items())}
    for name, checked in rows.items():
        assert {arch for arch, *_ in checked} == set(gpu_targets.DEFAULT_CUDA_ARCHS), name
    assert failures(rows) == []


@needs_cuobjdump
def test_cuda_check_catches_mutated_sass(cuda_fatbins):
    code = mc.disassemble_cuda(CUOBJDUMP, cuda_fatbins["allreduce.fatbin"],
                               "sm_90")["pyar_allreduce_two_shot_f32_w4"]
    releases, acquires, problems = mc.check_cuda_kernel(code)
    assert releases == 3 and acquires >= 6 and problems == []  # flag loads: before, in the spin
    _, _, problems = mc.check_cuda_kernel([i for i in code if not i.mnemonic.startswith("MEMBAR")])
    assert len(problems) == releases and all("no MEMBAR.SYS" in p for p in problems)
    _, _, problems = mc.check_cuda_kernel([i for i in code if i.mnemonic != "CCTL.IVALL"])
    assert len(problems) == acquires and all("without CCTL.IVALL" in p for p in problems)


@needs_cuobjdump
def test_no_cuda_barrier_loads_between_its_release_and_acquire(cuda_fatbins):
    """Speed, not ordering: no collective kernel loads anything (the state, above all)
    between a flag's release and its acquire, lamport's aside (FLAG_AROUND_DATA,
    whose loads there are the rows it pushes); and the check sees such a load (the
    c766338 kernels reloaded the rank there, twice a start barrier)."""
    late, around = [], set()
    for name, path in sorted(cuda_fatbins.items()):
        for arch, kernel, found in speed.fatbin_loads_before_acquire(path, CUOBJDUMP):
            if kernel.startswith(FLAG_AROUND_DATA):
                around.add(kernel)
            elif is_collective(kernel) and found:
                late.append(f"{name} {arch} {kernel}: {found[0]}")
    assert late == []
    # the lamport kernels and the LL one-shot and two-shot only
    assert len(around) == 63 + 2 * 21, sorted(around)
    code = mc.disassemble_cuda(CUOBJDUMP, cuda_fatbins["allreduce.fatbin"],
                               "sm_90")["pyar_allreduce_one_shot_f32_w2"]
    release = next(i for i, instruction in enumerate(code) if mc._global_sys(instruction, "ST"))
    reload = mc.Instruction(code[release].address, "LDG.E", "R7, desc[UR6][R12.64+0x88]")
    assert len(speed.loads_before_acquire(code[:release + 1] + [reload] + code[release + 1:])) == 1


@needs_cuobjdump
def test_one_shot_peer_loads_go_out_in_one_wave(cuda_fatbins):
    """Speed, not ordering: every one-shot kernel on sm_90 issues the W peer loads
    of a pack before it waits for any (allreduce.cu, PYAR_ALLREDUCE_BOUNDS: the
    schedule nvcc 13's ptxas chose under the one-argument bound took up to five
    round trips at 8 ranks); and the count sees a round trip more when an
    instruction uses a load's register before the next load."""
    code = mc.disassemble_cuda(CUOBJDUMP, cuda_fatbins["allreduce.fatbin"], "sm_90")
    waves = {kernel: speed.peer_load_waves(sass) for kernel, sass in code.items()
             if kernel.startswith("pyar_allreduce_one_shot")}
    assert len(waves) == 21
    assert all(found == (1, int(kernel.rsplit("_w", 1)[1])) for kernel, found in waves.items()), \
        waves
    sass = code["pyar_allreduce_one_shot_f32_w8"]
    first = next(i for i, instruction in enumerate(sass) if speed.is_peer_load(instruction))
    loaded = sass[first].operands.split(",")[0]
    use = mc.Instruction(sass[first].address, "FADD", f"R0, {loaded}, RZ")
    assert speed.peer_load_waves(sass[:first + 1] + [use] + sass[first + 1:]) == (2, 8)


@needs_cuobjdump
def test_fused_one_stage_first_row_waits_for_memory_at_most_twice(cuda_fatbins):
    """Speed, not ordering: every one-stage fused kernel of one pack a thread on
    sm_90 has issued its first row's W peer loads after at most two round trips
    (pyar_rows.h, norm_rows: the kernels of 5-8 ranks summed that row a
    second time on a block's last row and took up to 9); and the count grows
    when each load's register is used before the next load goes out."""
    code = mc.disassemble_cuda(CUOBJDUMP, cuda_fatbins["allreduce_rmsnorm.fatbin"], "sm_90")
    waves = {kernel: speed.peer_load_waves(sass) for kernel, sass in code.items()
             if kernel.startswith("pyar_allreduce_rmsnorm_one_stage") and "_p1_" in kernel}
    assert len(waves) == 63
    slow = {kernel: found for kernel, found in waves.items()
            if found[0] > 2 or found[1] < int(kernel.rsplit("_w", 1)[1])}
    assert slow == {}
    sass = code["pyar_allreduce_rmsnorm_one_stage_bf16_plain_p1_w8"]
    serialized = []
    for instruction in sass:
        serialized.append(instruction)
        if speed.is_peer_load(instruction):
            loaded = instruction.operands.split(",")[0]
            serialized.append(mc.Instruction(instruction.address, "FADD", f"R0, {loaded}, RZ"))
    assert speed.peer_load_waves(serialized)[0] >= 8


@needs_cuobjdump
def test_barrier_free_kernels_load_the_flags_beside_their_polls(cuda_fatbins):
    """Speed, not ordering: every LL and lamport kernel on sm_90 loads the peers'
    start flags while polls of its data are in flight (pyar_lamport.h, FlagGlance:
    confirm then judges a flag already loaded; f6670fc's kernels had none in
    flight at any acquire); and the count sees none once each poll's register is
    read right after it."""
    code = {}
    for name in ("allreduce.fatbin", "allreduce_rmsnorm.fatbin"):
        code.update(mc.disassemble_cuda(CUOBJDUMP, cuda_fatbins[name], "sm_90"))
    found = {kernel: speed.polls_in_flight_at_an_acquire(sass) for kernel, sass in code.items()
             if kernel.startswith(FLAG_AROUND_DATA)}
    assert len(found) == 63 + 2 * 21
    assert {kernel: n for kernel, n in found.items() if n < 2} == {}
    waited = []
    for i, instruction in enumerate(code["pyar_allreduce_rmsnorm_lamport_bf16_plain_p1_w4"]):
        waited.append(instruction)
        if speed.is_peer_load(instruction):
            loaded = instruction.operands.split(",")[0]
            waited.append(mc.Instruction(instruction.address, "FADD", f"R0, {loaded}, RZ"))
    assert speed.polls_in_flight_at_an_acquire(waited) == 0


@needs_cuobjdump
def test_signature_cost_builds_leave_out_their_piece(tmp_path_factory):
    """benchmarks/signature_cost.py prices the start barrier's pieces by builds of this
    tree without one each: every such build differs from the shipped kernel, and the one
    without the signature computes no digest (fmix32's first multiplier, 0x85ebca6b),
    in the barrier one-shot and in the LL kernels (its ``--algo ll`` rows)."""
    from benchmarks import signature_cost

    if cuda_compiler.find_nvcc() is None:
        pytest.skip("nvcc not found: the benchmark's kernels cannot be built")
    entries = ("pyar_allreduce_one_shot_f32_w8", "pyar_allreduce_ll_f32_w2",
               "pyar_allreduce_ll_two_shot_bf16_w8")
    sass = {}
    for name, (commit, defines) in signature_cost.KERNELS.items():
        if commit is None:  # the rows of older commits need git history (CI may lack it)
            made = kernel_builds.build(tmp_path_factory.mktemp("signature-cost"), ("sm_90",),
                                       defines, ["allreduce.cu"])
            code = mc.disassemble_cuda(CUOBJDUMP, made["allreduce.fatbin"], "sm_90")
            sass[name] = {entry: [(i.mnemonic, i.operands) for i in code[entry]]
                          for entry in entries}
    shipped_code = sass.pop(signature_cost.SHIPPED)
    assert sass and all(code[entries[0]] != shipped_code[entries[0]] for code in sass.values())

    def digests(code):
        return any("-0x7a143595" in operands for _, operands in code)

    for entry in entries:
        assert digests(shipped_code[entry]), entry
        assert not digests(sass["no-signature"][entry]), entry


# --- LL packets (pyar_ll.h) ----------------------------------------------------------

def _replaced(code, chosen, *instead):
    """``code`` with every instruction ``chosen(instruction)`` selects replaced by
    the (mnemonic, operands) of ``instead(instruction)``."""
    out = []
    for instruction in code:
        if not chosen(instruction):
            out.append(instruction)
            continue
        out += [mc.Instruction(instruction.address, m, o) for m, o in instead[0](instruction)]
    return out


@needs_cuobjdump
def test_cuda_ll_packets_are_single_64_bit_system_accesses(cuda_fatbins):
    """sm_90 pyar_allreduce_ll_f32_w4: its packet stores and polls pass; split into
    32-bit halves, or the polls cached (a weak, non-coherent load), the check fails."""
    code = mc.disassemble_cuda(CUOBJDUMP, cuda_fatbins["allreduce.fatbin"],
                               "sm_90")["pyar_allreduce_ll_f32_w4"]
    kernel = "pyar_allreduce_ll_f32_w4"
    releases, acquires, problems = mc.check_cuda_kernel(code, "sm_90", kernel)
    assert releases >= 1 and acquires >= 1 and problems == []
    store = lambda i: i.mnemonic == "STG.E.64.STRONG.SYS"  # noqa: E731
    split = _replaced(code, store, lambda i: [("STG.E", i.operands),
                                              ("STG.E.STRONG.SYS", i.operands)])
    _, _, problems = mc.check_cuda_kernel(split, "sm_90", kernel)
    assert any("no packet pushed to all 4 ranks" in p for p in problems), problems
    assert any("no MEMBAR.SYS" in p for p in problems)  # the 32-bit halves are no packet
    polls = {code[i].address for i in range(len(code)) if code[i].mnemonic ==
             "LDG.E.64.STRONG.SYS" and mc._cuda_acquire_problem(code, i)}
    assert len(polls) >= 4
    poll = lambda i: i.address in polls  # noqa: E731
    for instead, found in (("LDG.E.64.CONSTANT", "packet polls"),
                           ("LDG.E.64", "packet polls"),
                           ("LDG.E.STRONG.SYS", "without CCTL.IVALL")):
        mutated = _replaced(code, poll, lambda i: [(instead, i.operands)])
        _, _, problems = mc.check_cuda_kernel(mutated, "sm_90", kernel)
        assert any(found in p for p in problems), (instead, problems)


@needs_objdump
@pytest.mark.parametrize("arch", HIP_ARCHS)
def test_amd_ll_packets_are_single_64_bit_system_accesses(amd_bundles, arch):
    """pyar_allreduce_ll_f32_w4: its packet stores (one dwordx2 with the system scope's
    bits) and polls (one system-coherent dwordx2) pass; a store split into dwords, a poll
    without the system-coherent bits (cached), or split into dwords, fails."""
    code_objects = mc.code_objects(amd_bundles["allreduce.hsaco"])
    if arch not in code_objects:
        pytest.skip(f"no compiler here builds {arch}")
    kernel = "pyar_allreduce_ll_f32_w4"
    code = mc.disassemble_amd(OBJDUMP, code_objects[arch], arch)[kernel]
    releases, acquires, problems = mc.check_amd_kernel(code, arch, kernel)
    assert releases >= 1 and acquires >= 1 and problems == []
    bits = ("sc0", "sc1") if arch == "gfx942" else ("glc",)
    store = lambda i: i.mnemonic.endswith("store_dwordx2")  # noqa: E731
    split = _replaced(code, store, lambda i: [(i.mnemonic[:-1], i.operands)] * 2)
    _, _, problems = mc.check_amd_kernel(split, arch, kernel)
    assert any("no packet pushed to all 4 ranks" in p for p in problems), problems
    polls = {code[i].address for i in mc.amd_ll_polls(code, arch)}
    assert len(polls) >= 4
    poll = lambda i: i.address in polls  # noqa: E731
    cached = _replaced(code, poll, lambda i: [(i.mnemonic, " ".join(
        t for t in i.operands.split(" ") if t not in bits))])
    _, _, problems = mc.check_amd_kernel(cached, arch, kernel)
    assert any("packet polls" in p for p in problems), problems
    halves = _replaced(code, poll, lambda i: [(i.mnemonic[:-1], i.operands)] * 2)
    _, _, problems = mc.check_amd_kernel(halves, arch, kernel)
    assert any("without the" in p for p in problems), problems
