"""The byte counts the fused benchmark reports bandwidth against
(pyar.bench.traffic), per allreduce_rmsnorm variant: pure arithmetic on
sizes, no GPU or MPI (tier a)."""
import pytest

pytest.importorskip("mpi4py")  # pyar.comm initializes MPI (a singleton here)

from pyar.bench import traffic  # noqa: E402
from pyar.comm import algorithms  # noqa: E402


@pytest.mark.parametrize("world", [2, 4, 8])
def test_fused_traffic_counts_each_variants_bytes(world):
    n, out = 32 << 20, 32 << 20  # 4096 rows of 4096 bf16 per rank, y as output
    rows = world * (2 * n + out)  # residual read, residual_out and y written
    assert traffic.fused_shared_gpu_bytes("onestage", n, out, world) == world * n + rows
    # Two-stage: every rank's gather buffer receives the whole reduced rows
    # and is read back.
    assert traffic.fused_shared_gpu_bytes("twostage", n, out, world) == 3 * world * n + rows
    # Split moves two-stage's bytes: the sums pushed, then read by the norm kernel.
    assert traffic.fused_shared_gpu_bytes("split", n, out, world) == 3 * world * n + rows
    # Lamport: each rank's input read once and stored into every rank's slot,
    # where it is read back and emptied.
    assert traffic.fused_shared_gpu_bytes("lamport", n, out, world) == \
        world * n + 3 * world * world * n + rows
    # Unfused: the all-reduce's bytes, then the sum read again by add + RMSNorm.
    allreduce = traffic.shared_gpu_bytes(algorithms.choose(n, world), n, world, False)
    assert traffic.fused_shared_gpu_bytes("unfused", n, out, world) == \
        allreduce + world * n + rows
    # ... which is split's plus the two-shot's reduced shards, written and read back.
    assert traffic.fused_shared_gpu_bytes("unfused", n, out, world) == \
        traffic.fused_shared_gpu_bytes("split", n, out, world) + 2 * n


@pytest.mark.parametrize("world", [2, 4, 8])
def test_add_rmsnorm_traffic_reads_sum_and_residual_writes_y_and_residual_out(world):
    n = 8 << 20
    assert traffic.add_rmsnorm_shared_gpu_bytes(n, world) == world * (2 * n + 2 * n)
    # The unfused path's norm moves the same bytes as the fused rows without quantization.
    assert traffic.add_rmsnorm_shared_gpu_bytes(n, world) == \
        traffic.fused_shared_gpu_bytes("unfused", n, n, world) \
        - traffic.shared_gpu_bytes(algorithms.choose(n, world), n, world, False)
