# Prepared launch sequences: copies and kernel launches whose arguments are
# packed once and replayed with a few values patched per call, so that a
# repeated call does no argument parsing.
from libc.stdlib cimport realloc, free as c_free

cdef enum StepKind:
    STEP_COPY, STEP_KERNEL

cdef struct Step:
    StepKind kind
    hipFunction_t function
    unsigned int grid[3]
    unsigned int block[3]
    unsigned int shared
    int nargs
    uint64_t slots[MAX_KERNEL_ARGS]
    int call_slot      # the argument that takes the call's number, or -1
    int out_slot       # the argument that takes out + out_offset, or -1
    uint64_t out_offset
    uintptr_t dst      # copies: destination (out + out_offset when out_slot is 0)
    uintptr_t src
    size_t nbytes


cdef class LaunchSequence:
    """Copies and kernel launches queued together by ``run``.

    ``add_kernel`` packs a Function's arguments like ``Function.launch``;
    one of them may be the call number (``call_arg``: its index, set per
    step from ``run``'s ``first_call`` counting up) and any pointer argument
    may be relative to ``run``'s ``out`` address (``out_args``: {index:
    offset}).  The sequence holds the Functions, and their modules must stay
    loaded while it is used."""
    cdef Step* _steps
    cdef int _count
    cdef readonly int calls
    cdef list _functions

    def __cinit__(self):
        self._functions = []

    def __dealloc__(self):
        c_free(self._steps)

    def __len__(self):
        return self._count

    cdef Step* _append(self) except NULL:
        cdef Step* grown = <Step*>realloc(self._steps, (self._count + 1) * sizeof(Step))
        if grown == NULL:
            raise MemoryError("cannot grow a LaunchSequence")
        self._steps = grown
        c_memset(&grown[self._count], 0, sizeof(Step))
        self._count += 1
        return &grown[self._count - 1]

    def add_copy(self, dst, src, size, out_offset=None):
        """A device-to-device copy of ``size`` bytes; ``out_offset`` given:
        the destination is run's ``out`` plus it, not ``dst``."""
        cdef uintptr_t dst_ptr = 0 if out_offset is not None else as_pointer(dst)
        cdef uintptr_t src_ptr = as_pointer(src)
        cdef size_t nbytes = checked_size(size, "size")
        cdef Step* step = self._append()
        step.kind = STEP_COPY
        step.dst = dst_ptr
        step.src = src_ptr
        step.nbytes = nbytes
        step.call_slot = -1
        step.out_slot = -1 if out_offset is None else 0
        step.out_offset = 0 if out_offset is None else checked_size(out_offset, "out_offset")

    def add_kernel(self, Function function not None, grid, block, args=(), shared_mem=0, *,
                   call_arg=None, out_args=None):
        """A launch of ``function``, its arguments packed now."""
        cdef Step* step
        cdef unsigned int g[3]
        cdef unsigned int b[3]
        cdef uint64_t slots[MAX_KERNEL_ARGS]
        cdef size_t shared_bytes = checked_size(shared_mem, "shared_mem")
        dims(grid, g, "grid")
        dims(block, b, "block")
        if function.module is None:
            raise ValueError(f"{function.name} is not bound to a module; use Module.get_function")
        function.module.checked_handle()
        function.pack(args, slots)
        out_args = dict(out_args or {})
        if len(out_args) > 1:
            raise ValueError("at most one argument may be relative to out")
        for index in ([] if call_arg is None else [call_arg]) + list(out_args):
            if not 0 <= index < function._nargs:
                raise ValueError(f"{function.name} has no argument {index}")
        step = self._append()
        step.kind = STEP_KERNEL
        step.function = function._handle
        memcpy(step.grid, g, sizeof(g))
        memcpy(step.block, b, sizeof(b))
        step.shared = shared_bytes
        step.nargs = function._nargs
        memcpy(step.slots, slots, sizeof(slots))
        step.call_slot = -1 if call_arg is None else call_arg
        step.out_slot = -1
        for index, offset in out_args.items():
            step.out_slot = index
            step.out_offset = checked_size(offset, "out offset")
        if call_arg is not None:
            self.calls += 1
        self._functions.append(function)

    def run(self, uintptr_t stream, uint32_t first_call=0, uintptr_t out=0):
        """Queue every step on the stream with handle ``stream``: step k that
        takes a call number gets ``first_call + k`` (counting only those)."""
        cdef int i, j
        cdef Step* step
        cdef void* params[MAX_KERNEL_ARGS]
        cdef uint32_t call = first_call
        cdef hipError_t status
        cdef hipStream_t handle = <hipStream_t>stream
        ensure_loaded()
        for i in range(self._count):
            step = &self._steps[i]
            if step.kind == STEP_COPY:
                status = pyar_rt.hipMemcpyAsync(
                    <void*>(out + step.out_offset if step.out_slot == 0 else step.dst),
                    <const void*>step.src, step.nbytes, PYAR_hipMemcpyDeviceToDevice, handle)
                if status != PYAR_hipSuccess:
                    raise_error(status, "hipMemcpyAsync")
                continue
            if step.call_slot >= 0:
                memcpy(&step.slots[step.call_slot], &call, 4)
                call += 1
            if step.out_slot >= 0:
                step.slots[step.out_slot] = out + step.out_offset
            for j in range(step.nargs):
                params[j] = &step.slots[j]
            status = pyar_rt.hipModuleLaunchKernel(
                step.function, step.grid[0], step.grid[1], step.grid[2], step.block[0],
                step.block[1], step.block[2], step.shared, handle, params, NULL)
            if status != PYAR_hipSuccess:
                raise_error(status, "hipModuleLaunchKernel")

    def __repr__(self):
        return f"<pyar.LaunchSequence of {self._count} steps>"
