"""Everything a communicator holds on the GPU, and its release in the order
the IPC rules require: peer mappings closed before the memory they map is
freed, and nothing freed while a kernel may still use it."""
from pyar import _hip


class PeerMappings:
    """Peer allocations opened in this process, each once.

    Two registered buffers may live in one peer allocation (a caching
    allocator's segment), and a runtime may refuse to open one handle twice,
    so mappings are shared and counted.
    """

    def __init__(self):
        self._open = {}  # handle bytes -> [IpcMapping, users]

    def open(self, handle):
        """The address of ``handle``'s exported pointer as mapped here."""
        entry = self._open.get(handle.handle)
        if entry is None:
            entry = self._open[handle.handle] = [_hip.ipc_open(handle), 0]
        entry[1] += 1
        return entry[0].base + handle.offset

    def close_all(self):
        for mapping, _ in self._open.values():
            mapping.close()
        self._open.clear()


class Resources:
    """A communicator's device memory, pinned error record and peer mappings."""

    def __init__(self, device):
        self.device = device
        self.owned = []  # DeviceMemory / PinnedMemory, freed last
        self.peers = PeerMappings()

    def device_memory(self, size, uncached=False):
        memory = _hip.DeviceMemory(size, uncached=uncached)
        self.owned.append(memory)
        return memory

    def pinned_memory(self, size):
        memory = _hip.PinnedMemory(size)
        self.owned.append(memory)
        return memory

    def close_mappings(self):
        """Wait for this rank's kernels, then unmap every peer allocation."""
        _hip.set_device(self.device)
        _hip.device_synchronize()
        self.peers.close_all()

    def free(self):
        for memory in reversed(self.owned):
            memory.free()
        self.owned.clear()

    def release(self):
        """Non-collective teardown (finalizer, interpreter exit)."""
        try:
            self.close_mappings()
        finally:
            self.free()
