"""The inter-node data path's choice (pyar.comm.inter_node) and the device
path's pipeline under mpirun without a GPU: tests/test_hierarchical_cpu.py
runs it on 4 and 6 ranks.

pyar.Communicator builds HierarchicalCommunicator on the host stand-ins of
hierarchical_pipeline_cpu.py ("device" memory is host memory).  The MPI
library is the machine's, which is not GPU-aware: the choice is checked
against it as it is, and against its answer replaced per rank
(pyar.diagnostics.mpi_gpu_awareness).  On the device path MPI then
all-gathers host memory standing in for device memory, and the rail kernel
is replaced by its host equivalent (rail.add_in_order over the rows at
rail_kernel.pitch), so what runs for real is the pipeline around them: the
pieces, double buffers, row pitch, byte counts, domains of one rank sending
their own dtype, the bounded all-gather.

Checks:
- the machine's MPI: "auto" takes "host", inter_node="device" and
  PYAR_INTER_NODE=device raise ValueError on every rank naming what the
  library said, a bad PYAR_INTER_NODE raises naming the variable, ranks
  asking for different paths raise on every rank;
- a library GPU-aware on every rank but the last: "auto" takes "host" on
  every rank, "device" raises on every rank naming the last;
- GPU-aware everywhere: "auto" takes "device" (and "host" with
  rail_method="reduce_scatter"); "device" with rail_method="reduce_scatter"
  raises, as does setting it later; for every node shape, fp32/fp16/bf16,
  counts 1, 7, 100, 1001, 2053, out of place and in place, the device path's
  result is bitwise the host path's "allgather" result and the documented
  order's, identical on every rank;
- the last domain skips a call on the device path: every other rank raises
  CollectiveTimeout naming the inter-node step within its wait, and again on
  the next call (hierarchical_pipeline_cpu.check_timeout).

Usage: inter_node_cpu.py
"""
import hashlib
import os

import numpy as np
from mpi4py import MPI

from allreduce_common import bits, run
from hierarchical_pipeline_cpu import (DTYPES, check_timeout, device_array, documented_order,
                                       host_view, inputs, use_stand_ins)

import pyar  # noqa: E402
from pyar import diagnostics  # noqa: E402
from pyar.comm import inter_node, rail, rail_kernel  # noqa: E402

COUNTS = (1, 7, 100, 1001, 2053)
MACHINE_AWARENESS = diagnostics.mpi_gpu_awareness


class HostRailSum:
    """rail_kernel.RailSum's arithmetic on host memory: rail.add_in_order of
    the rows, ``pitch`` apart.  ``made`` holds every one made, in order."""
    made = []

    def __init__(self, module, device):
        assert module == "rail", module
        self.launches = 0
        HostRailSum.made.append(self)

    def launch(self, rows, rows_dtype, n, domains, out, out_dtype, stream):
        rows_dtype, out_dtype = np.dtype(rows_dtype), np.dtype(out_dtype)
        pitch = rail_kernel.pitch(n)
        parts = host_view(rows, domains * pitch, rows_dtype).reshape(domains, pitch)[:, :n]
        rail.add_in_order(parts.astype(np.float32), host_view(out, n, out_dtype),
                          None if out_dtype == np.float32 else np.empty(n, np.float32))
        self.launches += 1


def aware_on(ranks):
    """mpi_gpu_awareness answering True on ``ranks``, the machine's elsewhere."""
    def awareness(platform=None):
        if MPI.COMM_WORLD.Get_rank() in ranks:
            return diagnostics.GpuAwareness(True, "stand-in: GPU-aware")
        return MACHINE_AWARENESS(platform)
    diagnostics.mpi_gpu_awareness = awareness


def build(k, **options):
    return pyar.Communicator(MPI.COMM_WORLD, timeout=30.0, node_size=k, **options)


def check_choice_on_this_mpi(sc, k):
    machine = MACHINE_AWARENESS("cuda")
    sc.check(machine.aware is not True, f"this machine's MPI says it is GPU-aware: {machine}")
    comm = build(k)
    sc.check(comm.inter_node == "host", f"auto took {comm.inter_node!r}")
    comm.close()
    sc.expect_raises(ValueError, lambda: build(k, inter_node="device"),
                     "inter_node='device' on this MPI",
                     contains=("not known to take them", machine.why, "inter_node='host'"))
    os.environ[inter_node.INTER_NODE] = "device"
    sc.expect_raises(ValueError, lambda: build(k), "PYAR_INTER_NODE=device on this MPI",
                     contains=("not known to take them",))
    comm = build(k, inter_node="host")  # the argument wins over the variable
    sc.check(comm.inter_node == "host", f"inter_node='host' took {comm.inter_node!r}")
    comm.close()
    os.environ[inter_node.INTER_NODE] = "gpu"
    sc.expect_raises(ValueError, lambda: build(k), "PYAR_INTER_NODE=gpu",
                     contains=("PYAR_INTER_NODE='gpu'", "'auto', 'host', 'device'"))
    del os.environ[inter_node.INTER_NODE]
    sc.expect_raises(ValueError, lambda: build(k, inter_node="host" if sc.rank else "auto"),
                     "rank 0 asked for 'auto', the others for 'host'",
                     contains=("different inter-node data paths", "rank 0: 'auto'"))


def check_choice_unsure_on_one_rank(sc, k):
    last = sc.world - 1
    aware_on(set(range(last)))
    comm = build(k)
    sc.check(comm.inter_node == "host", f"one rank not GPU-aware: auto took {comm.inter_node!r}")
    comm.close()
    sc.expect_raises(ValueError, lambda: build(k, inter_node="device"),
                     "inter_node='device', the last rank's MPI not GPU-aware",
                     contains=(f"rank {last}:", "not known to take them"))


def check_device_path(sc, k):
    aware_on(set(range(sc.world)))
    shape = f"{sc.world // k}x{k}"
    sc.expect_raises(ValueError, lambda: build(k, inter_node="device",
                                               rail_method="reduce_scatter"),
                     f"{shape}: device with reduce_scatter", contains=("'allgather'",))
    comm = build(k, rail_method="reduce_scatter")
    sc.check(comm.inter_node == "host", f"{shape}: auto with reduce_scatter took "
                                        f"{comm.inter_node!r}")
    comm.close()
    HostRailSum.made.clear()
    device = build(k)
    (rail_sum,) = HostRailSum.made  # the device path's
    host = build(k, inter_node="host", rail_method="allgather")
    sc.check(HostRailSum.made == [rail_sum], f"{shape}: the host path made a rail sum")
    sc.check(device.inter_node == "device" and device.rail_method == "allgather",
             f"{shape}: auto took {device.inter_node!r}, {device.rail_method!r}")

    def set_reduce_scatter():
        device.rail_method = "reduce_scatter"

    sc.expect_raises(ValueError, set_reduce_scatter, f"{shape}: rail_method set later",
                     contains=("'allgather'",))
    calls = 0
    for dtype in DTYPES:
        for n in COUNTS:
            key = n * 31 + k
            data = inputs(dtype, n, sc.rank, key)
            y_device = device.allreduce(device_array(data.copy()))
            y_host = host.allreduce(device_array(data.copy()))
            got, staged = (host_view(y.ptr, n, dtype) for y in (y_device, y_host))
            inplace = device_array(data.copy())
            device.allreduce(inplace, out=inplace)
            what = f"{shape} {dtype} n={n}"
            sc.check(np.array_equal(bits(got), bits(staged)),
                     f"{what}: device path differs from the host path")
            sc.check(np.array_equal(bits(got), bits(documented_order(sc, device, dtype, n, key))),
                     f"{what}: not the documented order's bits")
            sc.check(np.array_equal(bits(host_view(inplace.ptr, n, dtype)), bits(got)),
                     f"{what}: in place differs")
            digest = hashlib.sha256(bits(got).tobytes()).hexdigest()
            sc.check(len(set(sc.mpi.allgather(digest))) == 1, f"{what}: ranks differ")
            calls += 2
    sc.check(rail_sum.launches > 0, f"{shape}: rail kernel launches {rail_sum.launches}")
    device.close()
    host.close()
    return calls


def main(sc):
    use_stand_ins()
    rail_kernel.RailSum = HostRailSum
    os.environ.pop(inter_node.INTER_NODE, None)
    sizes = [k for k in range(1, sc.world) if sc.world % k == 0]
    check_choice_on_this_mpi(sc, sizes[-1])
    check_choice_unsure_on_one_rank(sc, sizes[-1])
    calls = sum(check_device_path(sc, k) for k in sizes)
    aware_on(set(range(sc.world)))
    check_timeout(sc, sizes[-1], inter_node="device")  # last: the failed rail stays behind
    sc.report(test="inter-node", shapes=len(sizes), calls=calls)


if __name__ == "__main__":
    run("inter_node_cpu", main)
