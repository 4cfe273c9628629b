"""Checks of the kernels' speed read from their sm_90 machine code (SASS): not
rules of the ordering (machine_code.py holds those), but schedules that a
change of the sources or of ptxas can lose without any output changing --
loads between a barrier's release and its acquire, peer loads that go out
in several round trips instead of one, start flags loaded only after the
data came.  Each counts in code order, not along the paths the branches
take, and misses the waits the hardware's scoreboards add: a lower bound.
"""
import re

from tests import machine_code as mc


def loads_before_acquire(code):
    """Every load between a flag's release store and the next acquire load
    in code order (the barrier's first look at its own slot), as
    "release ... load": none is needed there, every address is ready
    before the release (pyar_protocol.h, BlockState), and each load of the
    state there held the acquire back by a round trip.  Not a rule of the
    ordering, a check of the barriers' speed."""
    found, released = [], None
    for instruction in code:
        if mc._global_sys(instruction, "ST"):
            released = instruction
        elif mc._global_sys(instruction, "LD"):
            released = None
        elif released is not None and instruction.mnemonic.startswith(("LDG", "LD.")):
            found.append(f"{released!r} ... {instruction!r}")
    return found


_REGISTER = re.compile(r"(?<![A-Z])R(\d+)(\.64)?")


def _registers(operand, width=1):
    return [r for match in _REGISTER.finditer(operand)
            for r in range(int(match[1]), int(match[1]) + (2 if match[2] else width))]


def _destination_width(mnemonic):
    if ".128" in mnemonic:
        return 4
    if ".64" in mnemonic or ".WIDE" in mnemonic or mnemonic.startswith("CS2R"):
        return 2
    return 1


def _written_and_touched(instruction):
    """(registers the instruction writes, registers it reads or writes)."""
    operands = instruction.operands.split(",")
    written = operands[0] if "[" not in operands[0] else ""
    filled = _registers(written, _destination_width(instruction.mnemonic))
    return filled, filled + [r for operand in operands[1 if written else 0:]
                             for r in _registers(operand)]


def is_peer_load(instruction):
    """A 128-bit load of a peer's data (``ld.global.cg``: ``.STRONG.GPU``)."""
    return instruction.mnemonic.startswith("LDG.E.128.STRONG.GPU")


def peer_load_waves(code):
    """(round trips, loads): how many round trips to memory, one after
    another, the peer loads of the kernel's first data loop take, and how
    many peer loads that loop issues before its first 128-bit store (a
    branch, barrier or exit ends it sooner).  SASS issues in order: an
    instruction that reads or overwrites a register a load has not filled
    yet waits for that load, and a load issued after the wait starts a later
    round trip.  Waits forced by the hardware's scoreboards are not in
    cuobjdump's listing, so the count is a lower bound.  Not a rule of the
    ordering, a check of the kernels' speed (allreduce.cu,
    PYAR_ALLREDUCE_BOUNDS)."""
    start = next(i for i, instruction in enumerate(code) if is_peer_load(instruction))
    filled, wave, loads = {}, 0, 0
    for instruction in code[start:]:
        if instruction.mnemonic.startswith(("BRA", "BAR", "EXIT")):
            break
        written, touched = _written_and_touched(instruction)
        wave = max([wave] + [filled.get(r, 0) for r in touched])
        if is_peer_load(instruction):
            loads += 1
            filled.update((r, wave + 1) for r in written)
        if instruction.mnemonic.startswith(("STG.E.128", "ST.E.128")):
            break
    return max(filled.values()), loads


def _is_acquire(code, i):
    return mc._global_sys(code[i], "LD") and mc._cuda_acquire_problem(code, i) is None


def _is_poll(code, i):
    """A load of pushed data: lamport's 128-bit pack (``.STRONG.GPU``) or an
    LL packet (64-bit, strong at system scope, no CCTL.IVALL after it)."""
    instruction = code[i]
    return is_peer_load(instruction) or (instruction.mnemonic == "LDG.E.64.STRONG.SYS"
                                         and not _is_acquire(code, i))


def polls_in_flight_at_an_acquire(code):
    """The most data polls still in flight (their registers not yet read or
    overwritten, in code order from the kernel's first poll) when an
    acquire goes out: the LL and lamport kernels load the peers' start
    flags beside their polls (pyar_lamport.h, FlagGlance), so that confirm
    judges a flag already loaded instead of loading it once the data came;
    0 means every flag load waits for the data first.  Not a rule of the
    ordering, a check of the kernels' speed; code order, not the paths the
    branches take, as peer_load_waves."""
    start = next(i for i in range(len(code)) if _is_poll(code, i))
    in_flight, most = set(), 0
    for i in range(start, len(code)):
        instruction = code[i]
        if _is_acquire(code, i):
            most = max(most, len(in_flight))
        written, touched = _written_and_touched(instruction)
        in_flight = {poll for poll in in_flight if not set(poll) & set(touched)}
        if _is_poll(code, i):
            in_flight.add(tuple(written))
    return most


@mc.remembered
def fatbin_loads_before_acquire(path, cuobjdump):
    """[(arch, kernel, loads_before_acquire)] of a fatbin."""
    return [(arch, kernel, loads_before_acquire(code))
            for arch in mc.fatbin_sass_archs(cuobjdump, path)
            for kernel, code in sorted(mc.disassemble_cuda(cuobjdump, path, arch).items())]
