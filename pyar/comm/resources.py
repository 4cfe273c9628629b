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

    def release(self, handle):
        """One user of ``handle``'s mapping is done; the last one unmaps it
        (after the caller made sure no queued kernel still reads it)."""
        entry = self._open[handle.handle]
        entry[1] -= 1
        if entry[1] == 0:
            del self._open[handle.handle]
            entry[0].close()

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

    def synchronize(self):
        """Wait for everything this process queued on the device: afterwards no
        kernel of this rank reads a peer mapping any more.  Bounded: the
        collective kernels give up on peers after the timeout."""
        _hip.set_device(self.device)
        _hip.device_synchronize()

    def close_mappings(self):
        """Wait for this rank's kernels, then unmap every peer allocation."""
        self.synchronize()
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
