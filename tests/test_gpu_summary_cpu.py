"""scripts/gpu_summary.py's merge of the scenarios' result rows, and the control
build name that keeps two positive controls of one scenario mode apart."""
import importlib.util
import json
import os

from tests.mpi_launch import ROOT, control_build

_spec = importlib.util.spec_from_file_location(
    "gpu_summary", os.path.join(ROOT, "scripts", "gpu_summary.py"))
gpu_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_summary)


def test_control_build_is_the_folder_without_the_pytest_number():
    assert control_build("/tmp/pytest-0/start_control_kernels0") == "start_control_kernels"
    assert control_build("/tmp/pytest-3/stage_control_kernels12/") == "stage_control_kernels"
    assert control_build(".devcarry/ctl/stage_control_kernels") == "stage_control_kernels"


def _rows(tmp_path, rows):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return gpu_summary.results_table(str(path))


def test_the_controls_of_one_mode_stay_apart_by_build(tmp_path):
    """The start-barrier and late-staging controls both run the control-start mode
    (tests/gpu/test_rmsnorm_gpu.py): with their builds named they are two rows, each
    of its own ranks' reports; without, the summary kept one of them."""
    def control(build, rank, mismatches):
        row = {"world": 2, "test": "fused-control-start", "algo": "onestage",
               "dtype": "bfloat16", "variant": "staged", "calls": 50,
               "mismatches": mismatches, "seconds": 0.1 + rank}
        return row if build is None else dict(row, build=build)

    reports = [control(build, rank, mismatches)
               for build, mismatches in (("start_control_kernels", 99),
                                         ("stage_control_kernels", 7))
               for rank in (0, 1)]
    merged = _rows(tmp_path, reports)
    assert [(row["build"], row["mismatches"], row["reports"]) for row in merged] == [
        ("start_control_kernels", 99, 2), ("stage_control_kernels", 7, 2)]

    unnamed = [control(None, rank, m) for m in (99, 7) for rank in (0, 1)]
    assert [(row["mismatches"], row["reports"]) for row in _rows(tmp_path, unnamed)] == [
        (99, 4)]
