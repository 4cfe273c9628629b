"""Which memory the hierarchical all-reduce hands MPI between the IPC domains.

- "host": pinned host copies of the shards (device-to-host, MPI, host-to-
  device); works with every MPI library.
- "device": the shards' device addresses, straight to MPI; only for an MPI
  library that takes device pointers in this run (an MPI that does not
  segfaults on them: Open MPI 4.1.6 as Ubuntu ships it does).  Its rail sum is
  an all-gather added in domain order on the GPU, so ``rail_method`` is
  "allgather" (pyar.comm.rail; "reduce_scatter" with "device" raises).
- "auto" (the default): "device" when pyar.diagnostics.mpi_gpu_awareness says
  the library is GPU-aware on every rank, else "host": when unsure, stage.
  Also "host" when ``rail_method`` is "reduce_scatter", a host-only method.

``inter_node=`` of pyar.Communicator, else $PYAR_INTER_NODE, else "auto".
Collective: every rank resolves the same path, or every rank raises the same
ValueError.
"""
import os

from pyar import diagnostics
from pyar.comm import rail

INTER_NODE = "PYAR_INTER_NODE"
PATHS = ("auto", "host", "device")


def requested(inter_node=None):
    """``inter_node``, else $PYAR_INTER_NODE, else "auto"; checked."""
    source = "inter_node"
    if inter_node is None:
        inter_node = os.environ.get(INTER_NODE, "").strip() or "auto"
        source = f"{INTER_NODE}={inter_node!r}"
    if inter_node not in PATHS:
        raise ValueError(f"{source}: the inter-node data path must be one of {PATHS}, "
                         f"got {inter_node!r}")
    return inter_node


def resolve(asked, awareness, rail_method="auto"):
    """"host" or "device" for a rank that asked for ``asked`` (a PATH) and
    whose MPI library answered ``awareness`` (diagnostics.GpuAwareness); the
    ValueError for "device" on a library not known to be GPU-aware, or with
    ``rail_method`` "reduce_scatter"."""
    if asked == "host" or (asked == "auto" and (awareness.aware is not True
                                                or rail_method == "reduce_scatter")):
        return "host"
    if awareness.aware is not True:
        raise ValueError(
            "inter_node='device' hands device pointers to MPI, but the MPI library is not "
            f"known to take them ({awareness.why}); an MPI that does not would crash. Use "
            "inter_node='host' (or 'auto'), or run with a GPU-aware MPI (Open MPI built "
            "--with-cuda, run with --mca opal_cuda_support 1)")
    rail.choose(rail_method, 2, on_device=True)
    return "device"


def agree(comm, inter_node=None, platform=None, rail_method="auto"):
    """``(path, awareness)``: the path every rank of ``comm`` takes, and what
    this rank's MPI library answered (diagnostics.GpuAwareness).  Collective
    over ``comm`` (any mpi4py intra-communicator or pyar BoundedComm): each
    rank's request and its library's answer are gathered, so that no rank
    goes on alone; ranks that asked for different paths, or "device" where
    any rank's library is not known GPU-aware, raise ValueError on every
    rank, naming them."""
    try:
        awareness = diagnostics.mpi_gpu_awareness(platform)
    except Exception as exc:  # noqa: BLE001 - unsure, and the other ranks must not wait
        awareness = diagnostics.GpuAwareness(None, f"asking the MPI library failed "
                                                   f"({type(exc).__name__}: {exc})")
    try:
        mine, problem = (requested(inter_node), awareness), None
    except ValueError as exc:
        mine, problem = None, str(exc)
    everyone = comm.allgather((problem, mine))
    problems = [f"rank {r}: {p}" for r, (p, _) in enumerate(everyone) if p is not None]
    if problems:
        raise ValueError("; ".join(problems))
    asked = {a for _, (a, _) in everyone}
    if len(asked) > 1:
        detail = "; ".join(f"rank {r}: {a!r}" for r, (_, (a, _)) in enumerate(everyone))
        raise ValueError(f"ranks asked for different inter-node data paths ({detail}); pass "
                         f"the same inter_node / {INTER_NODE} on every rank")
    # The path follows the least aware rank: the first that is not known
    # GPU-aware, named when others are.
    unaware = [(r, w) for r, (_, (_, w)) in enumerate(everyone) if w.aware is not True]
    deciding = unaware[0][1] if unaware else mine[1]
    if unaware and len(unaware) < len(everyone):
        deciding = diagnostics.GpuAwareness(deciding.aware,
                                            f"rank {unaware[0][0]}: {deciding.why}")
    return resolve(asked.pop(), deciding, rail_method), mine[1]
