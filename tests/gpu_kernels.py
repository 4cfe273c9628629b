"""The test kernels of src/kernels/test_kernels.cu, typed for launching."""
from pyar import _kernels

THREADS = 256


class GpuTestKernels:
    """Loaded on the current device.  Each method queues one launch."""

    def __init__(self, device=None):
        module = _kernels.load("test_kernels", device)
        self.module = module
        self._empty = module.get_function("pyar_test_empty")
        self._store_args = module.get_function(
            "pyar_test_store_args", ("ptr", "ptr", "int32", "int64", "uint32", "uint64", "float32"))
        self._axpy = module.get_function("pyar_test_axpy_f32", ("ptr", "ptr", "float32", "uint64"))
        self._fill = module.get_function("pyar_test_fill_u32", ("ptr", "uint32", "uint64"))
        self._spin = module.get_function("pyar_test_spin", ("uint64",))

    def empty(self, stream=None):
        self._empty.launch(1, 1, (), stream=stream)

    def store_args(self, record_ptr, pointer, i32, i64, u32, u64, f32, stream=None):
        """Writes the arguments into a 40-byte record: u64 pointer, i64, u64, i32, u32, f32,
        then the marker 0xfeedbeef."""
        self._store_args.launch(1, 1, (record_ptr, pointer, i32, i64, u32, u64, f32),
                                stream=stream)

    def axpy_f32(self, y, x, a, n, stream=None):
        """y = a * y + x over n float32 elements (device addresses)."""
        blocks = max(1, min(1024, -(-n // THREADS)))
        self._axpy.launch(blocks, THREADS, (y, x, a, n), stream=stream)

    def fill_u32(self, ptr, pattern, nwords, stream=None):
        """Writes a 32-bit pattern over nwords words (0xffffffff: NaN in every float type)."""
        blocks = max(1, min(1024, -(-nwords // THREADS)))
        self._fill.launch(blocks, THREADS, (ptr, pattern, nwords), stream=stream)

    def spin(self, microseconds, stream=None, blocks=1):
        """Occupies ``blocks`` blocks for about that long: delays later work on the stream."""
        self._spin.launch(blocks, 32, (int(microseconds * 1000),), stream=stream)
