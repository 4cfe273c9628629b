# Code objects and kernel launch.

DEF MAX_KERNEL_ARGS = 32

# Argument kinds a Function can take, by the names users write.
cdef enum ArgKind:
    ARG_POINTER, ARG_INT32, ARG_UINT32, ARG_INT64, ARG_UINT64, ARG_FLOAT32

_ARG_KINDS = {"ptr": ARG_POINTER, "pointer": ARG_POINTER,
              "int32": ARG_INT32, "uint32": ARG_UINT32,
              "int64": ARG_INT64, "uint64": ARG_UINT64, "float32": ARG_FLOAT32}


cdef class Function


cdef class Module:
    """A loaded code object (CUDA fatbin/cubin/PTX, AMD code object or bundle)."""
    cdef hipModule_t _handle
    cdef bint _loaded
    cdef readonly str source

    @staticmethod
    def from_bytes(data, source="<bytes>"):
        cdef Module module = Module.__new__(Module)
        cdef const unsigned char[::1] image
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"code object must be bytes-like, not {type(data).__name__}")
        image = bytes(data)
        if image.shape[0] == 0:
            raise ValueError("code object is empty")
        ensure_loaded()
        check(pyar_rt.hipModuleLoadData(&module._handle, &image[0]), "hipModuleLoadData")
        module._loaded = True
        module.source = source
        return module

    @staticmethod
    def from_file(path):
        cdef Module module = Module.__new__(Module)
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no code object at {path}")
        ensure_loaded()
        check(pyar_rt.hipModuleLoad(&module._handle, os.fsencode(path)), "hipModuleLoad")
        module._loaded = True
        module.source = path
        return module

    cdef inline hipModule_t checked_handle(self) except? NULL:
        if not self._loaded:
            raise ValueError(f"module {self.source} is unloaded")
        return self._handle

    @property
    def closed(self):
        return not self._loaded

    def get_function(self, name, argtypes=()):
        """The kernel ``name``; ``argtypes`` lists its parameters as "ptr",
        "int32", "uint32", "int64", "uint64" or "float32"."""
        return Function(self, name, argtypes)

    def get_global(self, name):
        """(device address, size) of the ``__device__`` variable ``name``."""
        cdef hipDeviceptr_t ptr = NULL
        cdef size_t size = 0
        check(pyar_rt.hipModuleGetGlobal(&ptr, &size, self.checked_handle(), name.encode()),
              "hipModuleGetGlobal")
        return <uintptr_t>ptr, size

    def unload(self):
        if self._loaded:
            self._loaded = False
            check(pyar_rt.hipModuleUnload(self._handle), "hipModuleUnload")

    close = unload

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unload()

    def __dealloc__(self):
        if self._loaded:
            pyar_rt.hipModuleUnload(self._handle)

    def __repr__(self):
        return f"<pyar.Module {self.source}{'' if self._loaded else ' (unloaded)'}>"


cdef int dims(value, unsigned int out[3], str what) except -1:
    values = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(values) <= 3:
        raise ValueError(f"{what} takes 1 to 3 dimensions, got {len(values)}")
    out[0] = out[1] = out[2] = 1
    for i, v in enumerate(values):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1 or v > 0x7fffffff:
            raise ValueError(f"{what} dimensions must be ints in 1..2**31-1, got {value!r}")
        out[i] = v
    return 0


cdef class Function:
    """A kernel of a Module with a declared parameter list."""
    cdef hipFunction_t _handle
    cdef readonly Module module
    cdef readonly str name
    cdef readonly tuple argtypes
    cdef int _nargs
    cdef ArgKind _kinds[MAX_KERNEL_ARGS]

    def __init__(self, Module module not None, name, argtypes=()):
        if not isinstance(name, str):
            raise TypeError(f"kernel name must be a str, not {type(name).__name__}")
        argtypes = tuple(argtypes)
        if len(argtypes) > MAX_KERNEL_ARGS:
            raise ValueError(f"at most {MAX_KERNEL_ARGS} kernel arguments, got {len(argtypes)}")
        for i, kind in enumerate(argtypes):
            if kind not in _ARG_KINDS:
                raise ValueError(f"argument {i} of {name}: unknown type {kind!r}; "
                                 f"expected one of {sorted(_ARG_KINDS)}")
            self._kinds[i] = _ARG_KINDS[kind]
        check(pyar_rt.hipModuleGetFunction(&self._handle, module.checked_handle(), name.encode()),
              "hipModuleGetFunction")
        self.module = module
        self.name = name
        self.argtypes = argtypes
        self._nargs = len(argtypes)

    cdef int pack(self, args, uint64_t* slots) except -1:
        """Each argument in its 8-byte slot, as ``argtypes`` declares it."""
        cdef int32_t i32
        cdef uint32_t u32
        cdef float f32
        cdef int i
        if len(args) != self._nargs:
            raise TypeError(f"{self.name} takes {self._nargs} arguments, got {len(args)}")
        for i in range(self._nargs):
            value = args[i]
            kind = self._kinds[i]
            slots[i] = 0
            try:
                if kind == ARG_POINTER:
                    slots[i] = as_pointer(value)
                elif kind == ARG_INT32:
                    i32 = operator.index(value)  # a float is an error, not a truncation
                    memcpy(&slots[i], &i32, 4)
                elif kind == ARG_UINT32:
                    u32 = operator.index(value)
                    memcpy(&slots[i], &u32, 4)
                elif kind == ARG_INT64:
                    slots[i] = <uint64_t><int64_t>operator.index(value)
                elif kind == ARG_UINT64:
                    slots[i] = <uint64_t>operator.index(value)
                else:
                    f32 = value
                    memcpy(&slots[i], &f32, 4)
            except (TypeError, OverflowError, ValueError) as error:
                raise type(error)(f"argument {i} of {self.name} ({self.argtypes[i]}): {error}") from None
        return 0

    def launch(self, grid, block, args=(), shared_mem=0, stream=None):
        """Queue the kernel on ``stream`` with ``args`` packed per ``argtypes``."""
        cdef unsigned int g[3]
        cdef unsigned int b[3]
        cdef uint64_t slots[MAX_KERNEL_ARGS]
        cdef void* params[MAX_KERNEL_ARGS]
        cdef int i
        cdef size_t shared_bytes
        cdef hipStream_t handle
        dims(grid, g, "grid")
        dims(block, b, "block")
        shared_bytes = checked_size(shared_mem, "shared_mem")
        self.pack(args, slots)
        for i in range(self._nargs):
            params[i] = &slots[i]
        handle = stream_handle(stream)
        if self.module is None:
            raise ValueError(f"{self.name} is not bound to a module; use Module.get_function")
        self.module.checked_handle()
        check(pyar_rt.hipModuleLaunchKernel(self._handle, g[0], g[1], g[2], b[0], b[1], b[2],
                                            shared_bytes, handle, params, NULL),
              "hipModuleLaunchKernel")

    def max_active_blocks_per_multiprocessor(self, block_size, shared_mem=0):
        """How many blocks of ``block_size`` threads fit on one multiprocessor at once."""
        cdef int blocks = 0
        if self.module is None:
            raise ValueError(f"{self.name} is not bound to a module; use Module.get_function")
        self.module.checked_handle()
        check(pyar_rt.hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(
                  &blocks, self._handle, block_size, checked_size(shared_mem, "shared_mem")),
              "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor")
        return blocks

    @property
    def resources(self):
        """{"registers": per thread, "local_bytes": per thread (spills and
        stack)}, as the loaded kernel was compiled."""
        cdef int registers = 0
        cdef int local_bytes = 0
        if self.module is None:
            raise ValueError(f"{self.name} is not bound to a module; use Module.get_function")
        self.module.checked_handle()
        check(pyar_rt.hipFuncGetAttribute(&registers, PYAR_HIP_FUNC_ATTRIBUTE_NUM_REGS,
                                          self._handle), "hipFuncGetAttribute")
        check(pyar_rt.hipFuncGetAttribute(&local_bytes, PYAR_HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                          self._handle), "hipFuncGetAttribute")
        return {"registers": registers, "local_bytes": local_bytes}

    def __repr__(self):
        return f"<pyar.Function {self.name}({', '.join(self.argtypes)})>"
