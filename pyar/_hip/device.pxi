# Devices: count, selection, identity and peer access.

def get_device_count():
    cdef int count = 0
    ensure_loaded()
    check(pyar_rt.hipGetDeviceCount(&count), "hipGetDeviceCount")
    return count


cdef int checked_ordinal(ordinal) except -1:
    if not isinstance(ordinal, int) or isinstance(ordinal, bool):
        raise TypeError(f"device ordinal must be an int, not {type(ordinal).__name__}")
    if ordinal < 0:
        raise ValueError(f"device ordinal must be >= 0, got {ordinal}")
    count = get_device_count()
    if not 0 <= ordinal < count:
        raise ValueError(f"device ordinal {ordinal} out of range: {count} device(s) visible")
    return ordinal


def set_device(ordinal):
    """Make ``ordinal`` the calling thread's current device."""
    cdef int device = checked_ordinal(ordinal)
    check(pyar_rt.hipSetDevice(device), "hipSetDevice")


def get_device():
    cdef int device = 0
    ensure_loaded()
    check(pyar_rt.hipGetDevice(&device), "hipGetDevice")
    return device


def device_synchronize():
    cdef hipError_t status
    ensure_loaded()
    with nogil:
        status = pyar_rt.hipDeviceSynchronize()
    check(status, "hipDeviceSynchronize")


cdef int device_attribute(int device, int attribute) except? -1:
    cdef int value = 0
    check(pyar_rt.hipDeviceGetAttribute(&value, pyar_rt.device_attribute[attribute], device),
          "hipDeviceGetAttribute")
    return value


class Device:
    """One GPU, by ordinal among the visible ones (the current one by default)."""

    def __init__(self, ordinal=None):
        self.ordinal = get_device() if ordinal is None else checked_ordinal(ordinal)

    def __repr__(self):
        return f"<pyar.Device {self.ordinal}: {self.name} ({self.arch})>"

    def __eq__(self, other):
        return isinstance(other, Device) and other.ordinal == self.ordinal

    def __hash__(self):
        return hash(("pyar.Device", self.ordinal))

    def __index__(self):
        return self.ordinal

    @property
    def name(self):
        cdef char name[256]
        check(pyar_rt.hipDeviceGetName(name, sizeof(name), self.ordinal), "hipDeviceGetName")
        return name.decode(errors="replace")

    @property
    def arch(self):
        """The compilers' name for the chip: ``"gfx942"``, ``"sm_90"``."""
        cdef char arch[256]
        check(pyar_rt.pyarDeviceGetArchName(arch, sizeof(arch), self.ordinal),
              "hipGetDeviceProperties")
        return arch.decode(errors="replace")

    @property
    def compute_capability(self):
        return (device_attribute(self.ordinal, PYAR_ATTR_COMPUTE_CAPABILITY_MAJOR),
                device_attribute(self.ordinal, PYAR_ATTR_COMPUTE_CAPABILITY_MINOR))

    @property
    def multiprocessor_count(self):
        return device_attribute(self.ordinal, PYAR_ATTR_MULTIPROCESSOR_COUNT)

    @property
    def warp_size(self):
        return device_attribute(self.ordinal, PYAR_ATTR_WARP_SIZE)

    @property
    def max_threads_per_block(self):
        return device_attribute(self.ordinal, PYAR_ATTR_MAX_THREADS_PER_BLOCK)

    @property
    def l2_cache_size(self):
        return device_attribute(self.ordinal, PYAR_ATTR_L2_CACHE_SIZE)

    @property
    def max_shared_memory_per_block(self):
        return device_attribute(self.ordinal, PYAR_ATTR_MAX_SHARED_MEMORY_PER_BLOCK)

    @property
    def pci_bus_id(self):
        cdef char bus_id[64]
        check(pyar_rt.hipDeviceGetPCIBusId(bus_id, sizeof(bus_id), self.ordinal),
              "hipDeviceGetPCIBusId")
        return bus_id.decode()

    def memory_info(self):
        """(free, total) bytes of device memory."""
        cdef size_t free_bytes = 0, total = 0
        self.use()
        check(pyar_rt.hipMemGetInfo(&free_bytes, &total), "hipMemGetInfo")
        return free_bytes, total

    def use(self):
        """Make this the calling thread's current device."""
        check(pyar_rt.hipSetDevice(self.ordinal), "hipSetDevice")
        return self

    def synchronize(self):
        self.use()
        device_synchronize()

    def can_access_peer(self, peer):
        cdef int can = 0
        check(pyar_rt.hipDeviceCanAccessPeer(&can, self.ordinal, checked_ordinal(int(peer))),
              "hipDeviceCanAccessPeer")
        return bool(can)

    def enable_peer_access(self, peer):
        """Let this device map ``peer``'s memory; enabling twice is not an error."""
        cdef int peer_ordinal = checked_ordinal(int(peer))
        if peer_ordinal == self.ordinal:
            return
        if not self.can_access_peer(peer_ordinal):
            raise ValueError(f"device {self.ordinal} cannot access device {peer_ordinal} "
                             "(no peer path between them)")
        self.use()
        cdef hipError_t status = pyar_rt.hipDeviceEnablePeerAccess(peer_ordinal, 0)
        if status == PYAR_hipErrorPeerAccessAlreadyEnabled:
            pyar_rt.hipGetLastError()
            return
        check(status, "hipDeviceEnablePeerAccess")
