"""tests/mpi_launch.py's result rows: what a scenario reports reaches the test through a
file of its own, whole lines in the order written, besides the printed line."""
import json
import os
import subprocess
import sys

from tests import mpi_launch


def test_report_prints_and_appends_whole_lines(tmp_path, monkeypatch, capsys):
    path = tmp_path / "results.jsonl"
    monkeypatch.setenv(mpi_launch.RESULT_FILE, str(path))
    mpi_launch.report(test="first", world=2, value=1.5)
    mpi_launch.report(test="second", world=2, names=["a", "b"])
    printed = capsys.readouterr().out.splitlines()
    assert printed == [mpi_launch.RESULT_PREFIX + json.dumps({"test": "first", "world": 2,
                                                              "value": 1.5}),
                       mpi_launch.RESULT_PREFIX + json.dumps({"test": "second", "world": 2,
                                                              "names": ["a", "b"]})]
    assert mpi_launch.read_results(str(path)) == [
        {"test": "first", "world": 2, "value": 1.5},
        {"test": "second", "world": 2, "names": ["a", "b"]}]


def test_reports_of_processes_at_once_stay_whole_lines(tmp_path):
    """Eight processes append 200 rows each at once: every row reads back whole."""
    path = tmp_path / "results.jsonl"
    code = ("import sys; from tests import mpi_launch\n"
            "for i in range(200): mpi_launch.report(rank=int(sys.argv[1]), i=i, pad='x' * 300)\n")
    env = dict(os.environ, PYTHONPATH=mpi_launch.ROOT, **{mpi_launch.RESULT_FILE: str(path)})
    writers = [subprocess.Popen([sys.executable, "-c", code, str(rank)], env=env,
                                stdout=subprocess.DEVNULL) for rank in range(8)]
    assert all(w.wait(timeout=120) == 0 for w in writers)
    rows = mpi_launch.read_results(str(path))
    assert sorted((r["rank"], r["i"]) for r in rows) == [(q, i) for q in range(8)
                                                         for i in range(200)]
    for rank in range(8):
        assert [r["i"] for r in rows if r["rank"] == rank] == list(range(200))


def test_no_file_means_no_rows(tmp_path):
    assert mpi_launch.read_results(str(tmp_path / "absent.jsonl")) == []
