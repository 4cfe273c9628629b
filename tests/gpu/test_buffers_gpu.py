"""Registered buffers' lifetime and read-only outputs on a real GPU
(tests/mpi/buffer_lifetime.py), ranks sharing GPU 0 under MPS."""
import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world", [2, 4])
def test_unregister_then_reuse_the_address(world):
    """register -> calls (one replayed) -> 20 calls queued behind random
    per-rank delays -> unregister at once (it waits for them) -> the buffer
    is no longer kept alive -> freed -> a new one of the same size (usually at
    the same address) sums its new random data, staged then registered;
    unregister refused under an open graph that reads the buffer, accepted
    after graph.close().  Every result within the float64 bound."""
    row = rows_of(scenario("buffer_lifetime", world, "unregister", timeout=300),
                  "unregister")[0]
    assert row["wrong"] == 0 and row["failed_checks"] == 0, row
    assert row["calls"] == 2 * (2 + 20 + 2) + 1, row


def test_a_dropped_registered_buffer_stays_alive_until_close():
    row = rows_of(scenario("buffer_lifetime", 2, "keepalive", timeout=240), "keepalive")[0]
    assert row["wrong"] == 0 and row["failed_checks"] == 0, row


def test_read_only_imports_are_refused_as_outputs():
    """Read-only DLPack (versioned, READ_ONLY), array-interface (read-only
    bit) and JAX-like exports: refused as allreduce's out (3) and as
    allreduce_rmsnorm's out and in-place residual (6) on both ranks, never
    written; as inputs they sum exactly."""
    row = rows_of(scenario("buffer_lifetime", 2, "readonly", timeout=240), "readonly")[0]
    assert row["wrong"] == 0 and row["failed_checks"] == 0, row
    assert row["refused"] == 2 * 9, row
