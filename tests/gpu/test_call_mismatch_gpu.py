"""Ranks that call different collectives without PYAR_DEBUG (docs/design.md, Call
signatures and MismatchError): the kernels' start barrier compares the call
signatures, every rank raises MismatchError naming every rank's call, nobody reads a
peer's data or hangs. One mpirun launch per world runs every case of
tests/mpi/call_mismatch.py; its positive control runs against kernels built with the
comparison compiled out."""
import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu

CASES = {"elements", "elements-far", "chunks", "dtype", "algorithm", "ll-elements",
         "ll-algorithm", "ll_twoshot-elements", "ll_twoshot-algorithm", "registered",
         "quantization", "split-rows", "operation"}


@pytest.mark.parametrize("world", [2, 4, 8])
def test_mismatched_calls_raise_on_every_rank(world):
    """The last rank passes 4097 instead of 4096 elements, 2**20 + 3, float16
    instead of float32, one-shot instead of two-shot, LL 4097 instead of 4096
    elements, LL instead of two-shot, LL two-shot 4097 instead of 4096
    elements, LL two-shot instead of LL, a staged instead of a registered
    input, FP8 quantization in a fused call, reduce_scatter instead
    of allreduce: every rank raises MismatchError before the 5 s timeout
    naming every rank's call, every output keeps its NaN sentinel and every
    input its contents, close() returns, and a new communicator sums exactly."""
    rows = scenario("call_mismatch", world, "main", timeout=240)
    cases = rows_of(rows, "call-mismatch")
    assert {r["case"] for r in cases} == CASES
    for row in cases:
        assert row["raised"] == world, row
        assert row["outputs_written"] == 0 and row["inputs_changed"] == 0, row
        assert row["elapsed"] < row["timeout"], row
        assert row["close_seconds"] < 2 * row["timeout"] + 10, row
    assert rows_of(rows, "call-mismatch-after")[0]["wrong"] == 0


def test_positive_control_sees_the_mismatch_without_the_check(kernels_ignoring_signatures):
    """Against kernels that skip the comparison, the same disagreeing calls
    (elements, dtype) go ahead: no MismatchError, and the ranks write outputs
    from data their peers never meant to send -- what the check prevents.
    (kernels_ignoring_signatures: tests/gpu/conftest.py, PYAR_TEST_IGNORE_SIGNATURE=1.)"""
    rows = rows_of(scenario("call_mismatch", 2, "control", kernels_ignoring_signatures,
                            timeout=240), "call-mismatch-control")
    assert {r["case"] for r in rows} == {"elements", "dtype"}
    for row in rows:
        assert row["raised"] == 0 and row["outputs_written"] > 0, row
