"""Where the ranks' GPUs are, as seen from this process: which ranks share
this rank's GPU, and whether this GPU reaches the others'.  GPUs are named by
PCI bus id, the one name every process agrees on whatever devices it is shown."""
from pyar import _hip
from pyar.comm.errors import PeerAccessError


def ranks_sharing(bus_ids, rank):
    """How many ranks (this one included) use this rank's GPU."""
    return bus_ids.count(bus_ids[rank])


def enable_peer_access(device, rank, bus_ids):
    """Check, and enable, this GPU's access to every other GPU of the
    communicator that this process is shown.

    A process shown only its own GPU (CUDA_VISIBLE_DEVICES or
    HIP_VISIBLE_DEVICES set per rank) cannot ask; mapping the peers' memory
    then tells, and the communicator turns that failure into the same error.
    """
    mine = bus_ids[rank]
    first_rank_on = {}
    for peer_rank, bus_id in enumerate(bus_ids):
        if bus_id != mine:
            first_rank_on.setdefault(bus_id, peer_rank)
    if not first_rank_on:
        return
    visible = {_hip.Device(d).pci_bus_id: d for d in range(_hip.get_device_count())}
    me = _hip.Device(device)
    for bus_id, peer_rank in first_rank_on.items():
        peer = visible.get(bus_id)
        if peer is None:
            continue
        if not me.can_access_peer(peer):
            raise PeerAccessError(rank, mine, peer_rank, bus_id)
        me.enable_peer_access(peer)
