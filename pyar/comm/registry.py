"""Which input buffers peers read in place, and the device tables that say where.

An input table (layout.pack_table) holds every rank's address of one buffer
as mapped in this process.  A buffer gets one when all ranks register it
together (``register``), or when a stream capture records a call on it
(``defer``): the captured kernel then already points at the table, and the
table is filled after the capture, once the ranks have exchanged handles
(``exchange_deferred``).

A registered buffer is kept alive until the communicator closes or
``unregister`` lets go of it: freed and reallocated at the same address while
registered, it would be read through peers' stale mappings of the old one.
``unregister`` waits for this rank's queued kernels (they may read the peers'
buffers), unmaps the peers' buffers, and lets go of this rank's only after
every rank has unmapped it (a barrier): when its owner frees it no process
maps it any more, and with its key and table gone a new buffer at the same
address is staged until it is registered itself.  A table a capture used is
never handed out again: a graph left open would read another buffer's
addresses through it instead of faulting on closed mappings.

Tables come from blocks allocated ahead: allocating device memory is not
allowed while a stream captures in the global mode.  A server that captures
one graph per batch size uses a new table per capture, so the pool is topped
up after every exchange."""
from pyar import _hip
from pyar.comm import exchange, layout

TABLES_PER_BLOCK = 256


class BufferRegistry:
    def __init__(self, node, resources):
        self._node = node
        self._rank = node.Get_rank()
        self._resources = resources
        self._tables = {}    # (address, nbytes) -> table address, filled
        self._deferred = {}  # (address, nbytes) -> table address, not yet filled
        self._arrays = {}    # (address, nbytes) -> the array, kept alive
        self._peer_handles = {}  # (address, nbytes) -> the peers' handles mapped for it
        self._captured = set()   # (address, nbytes) read in place by a capture
        self._free = []
        self._grow()

    def _grow(self):
        block = self._resources.device_memory(TABLES_PER_BLOCK * layout.TABLE_BYTES)
        self._free.extend(block.ptr + i * layout.TABLE_BYTES
                          for i in reversed(range(TABLES_PER_BLOCK)))

    def _new_table(self, capturing):
        if not self._free:
            if capturing:
                raise RuntimeError(
                    f"more than {TABLES_PER_BLOCK} distinct buffers captured without an "
                    "exchange; call register_graph_buffers() between captures")
            self._grow()
        return self._free.pop()

    def lookup(self, address, nbytes):
        """The filled table's device address for a registered buffer, else None."""
        return self._tables.get((address, nbytes))

    def register(self, array):
        """Collective: every rank passes its own buffer of the same size."""
        address, nbytes = array.ptr, array.nbytes
        known = (address, nbytes) in self._tables
        exchange.check_agreement(self._node, "the registered buffer's size in bytes (and "
                                 "whether it was registered before)", (nbytes, known))
        if known:
            return
        self._arrays[(address, nbytes)] = array
        self._exchange([(address, nbytes, self._new_table(capturing=False))])

    def defer(self, array):
        """A table for a buffer a capture reads in place; filled by exchange_deferred."""
        key = (array.ptr, array.nbytes)
        self._captured.add(key)
        if key in self._tables:
            return self._tables[key]
        if key not in self._deferred:
            self._deferred[key] = self._new_table(capturing=True)
            self._arrays[key] = array
        return self._deferred[key]

    def captured(self, array):
        """Whether a capture recorded a call that reads ``array`` in place."""
        return (array.ptr, array.nbytes) in self._captured

    def unregister(self, array):
        """Collective: stop reading ``array`` in place and let go of it (the
        module docstring says in which order).  Every rank passes its own
        registered buffer of the same size."""
        key = (array.ptr, array.nbytes)
        registered = key in self._tables
        exchange.check_agreement(self._node, "the unregistered buffer's size in bytes (and "
                                 "whether it is registered)", (array.nbytes, registered))
        if not registered:
            raise ValueError("the buffer is not registered with this communicator (never "
                             "registered, or unregistered already)")
        table = self._tables.pop(key)
        self._resources.synchronize()
        for handle in self._peer_handles.pop(key):
            self._resources.peers.release(handle)
        # Kept alive if a peer never gets here: it may still map this buffer.
        self._node.Barrier()
        del self._arrays[key]
        if key in self._captured:
            self._captured.discard(key)
        else:
            self._free.append(table)

    @property
    def pending(self):
        return len(self._deferred)

    def discard_deferred(self):
        """Forget the buffers of a capture that failed; their tables are reused."""
        self._free.extend(self._deferred.values())
        for key in self._deferred:
            del self._arrays[key]
        self._deferred = {}

    def exchange_deferred(self):
        """Collective: exchange the handles of every buffer captured since the
        last exchange, in capture order, and fill their tables."""
        entries = [(address, nbytes, table)
                   for (address, nbytes), table in self._deferred.items()]
        try:
            exchange.check_agreement(
                self._node, "the buffers captured since the last exchange (sizes in bytes, in "
                "capture order): ranks must capture the same collectives in the same order",
                [nbytes for _, nbytes, _ in entries])
        except exchange.MismatchError:
            self.discard_deferred()
            raise
        self._deferred = {}
        if entries:
            self._exchange(entries)
        if len(self._free) < TABLES_PER_BLOCK:
            # Topped up here, outside any capture, so that every capture may
            # record TABLES_PER_BLOCK new buffers however many came before.
            self._grow()

    def _exchange(self, entries):
        handles = exchange.run_everywhere(
            self._node, lambda: [_hip.ipc_get_handle(address) for address, _, _ in entries])
        everyone = self._node.allgather(handles)
        exchange.run_everywhere(self._node, self._fill, entries, everyone)
        for address, nbytes, table in entries:
            self._tables[(address, nbytes)] = table

    def _fill(self, entries, everyone):
        for index, (address, nbytes, table) in enumerate(entries):
            peers = {rank: handles[index] for rank, handles in enumerate(everyone)
                     if rank != self._rank}
            pointers = [address if rank == self._rank else self._resources.peers.open(peers[rank])
                        for rank in range(len(everyone))]
            self._peer_handles[(address, nbytes)] = list(peers.values())
            _hip.memcpy_htod(table, layout.pack_table(pointers))
