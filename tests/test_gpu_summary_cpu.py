"""scripts/gpu_summary.py's merge of the scenarios' result rows, the control
build name that keeps two positive controls of one scenario mode apart, and
the suite summary it writes to tests/gpu/RESULTS.md (--results-md)."""
import importlib.util
import json
import os
import re

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


def _junit(passed, failed, skipped=0, stamp="2026-12-08T10:11:12.345678"):
    cases = ([f'<testcase classname="tests.gpu.test_allreduce_gpu" name="ok{i}"/>'
              for i in range(passed)]
             + [f'<testcase classname="tests.gpu.test_allreduce_gpu" name="bad{i}">'
                '<failure message="wrong sum">x</failure></testcase>' for i in range(failed)]
             + [f'<testcase classname="tests.gpu.test_rmsnorm_gpu" name="skip{i}">'
                '<skipped message="no GPU"/></testcase>' for i in range(skipped)])
    return (f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
            f'timestamp="{stamp}">{"".join(cases)}</testsuite></testsuites>')


def _suite_output(tmp_path, passed=3, failed=1, skipped=1):
    """A suite run's folder as scripts/gpu_suite.sh leaves it, benchmarks included."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "junit.xml").write_text(_junit(passed, failed, skipped))
    (out / "results.jsonl").write_text(json.dumps(
        {"world": 2, "test": "probe", "algo": "oneshot", "calls": 100, "mismatches": 0}) + "\n")
    (out / "examples.tsv").write_text("command\texit\tseconds\npython3 -m pyar\t0\t2\n")
    (out / "fused_w2.json").write_text(json.dumps(
        {"meta": {"world": 2, "device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16",
                  "one_gpu": True}, "rows": [{"tokens": 1, "fused_us": 5.25}]}))
    (out / "launch.json").write_text(json.dumps({"rows": [{"case": "empty", "host_us": 2.5}]}))
    return out


RUN = ["--build-seconds", "93", "--built", "extensions in place, prebuilt kernels"]


def _summary(capsys, out, *extra):
    gpu_summary.main(["--out", str(out), *RUN, *extra])
    return capsys.readouterr().out


def test_results_md_is_the_suite_summary_under_one_line_naming_the_run(tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.delenv("PYAR_RESULTS_MD", raising=False)
    out = _suite_output(tmp_path)
    plain = _summary(capsys, out, "--test-status", "1")
    path = tmp_path / "RESULTS.md"
    with_md = _summary(capsys, out, "--test-status", "1", "--results-md", str(path),
                       "--commit", "abc1234")
    assert with_md == plain  # the printed summary is the same with or without the file
    text = path.read_text()
    lines = text.splitlines()
    assert "scripts/gpu_summary.py" in lines[0] and "--results-md" in lines[0]
    assert lines[2] == "# GPU suite results"
    assert lines[4] == ("device: NVIDIA H100 80GB HBM3, ranks sharing one GPU; date: 2026-12-08; "
                        "commit: abc1234; build (extensions in place, prebuilt kernels): 93 s")
    suite = text[text.index("## Tests"):]
    assert suite in plain  # the suite's tables exactly as the summary prints them
    assert "| test_allreduce_gpu |      3 |      1 |       0 |" in suite
    assert "pytest exit status: 1" in suite
    assert "## Examples" in suite and "### probe" in suite
    assert "Launch overhead" not in text and "pyar.bench" not in text  # benchmarks stay out
    assert text.endswith("|\n")


def _tests_table(text):
    """{test file: (passed, failed, skipped)} from the Tests table of a summary."""
    table = text.split("## Tests")[1].split("pytest exit status")[0]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
             if line.startswith("|") and not line.startswith("|-")]
    return {row[0]: tuple(int(c) for c in row[1:]) for row in cells[1:]}


def test_results_md_is_rewritten_from_each_run(tmp_path, capsys, monkeypatch):
    """Positive control: a later run's file shows that run's counts, not the first's."""
    monkeypatch.delenv("PYAR_RESULTS_MD", raising=False)
    path = tmp_path / "RESULTS.md"
    out = _suite_output(tmp_path, passed=3, failed=1)
    _summary(capsys, out, "--test-status", "1", "--results-md", str(path), "--commit", "a")
    first = path.read_text()
    (out / "junit.xml").write_text(_junit(5, 0, stamp="2026-12-09T01:02:03"))
    _summary(capsys, out, "--test-status", "0", "--results-md", str(path), "--commit", "b")
    second = path.read_text()
    assert _tests_table(first) == {"test_allreduce_gpu": (3, 1, 0),
                                   "test_rmsnorm_gpu": (0, 0, 1), "**total**": (3, 1, 1)}
    assert _tests_table(second) == {"test_allreduce_gpu": (5, 0, 0), "**total**": (5, 0, 0)}
    assert "pytest exit status: 1" in first and "pytest exit status: 0" in second
    assert "date: 2026-12-08; commit: a;" in first
    assert "date: 2026-12-09; commit: b;" in second and second.count("# GPU suite results") == 1


def test_results_md_after_the_run_reads_the_build_and_status_from_summary_md(tmp_path, capsys,
                                                                            monkeypatch):
    """The second way: the finished run's folder, its summary.md as gpu_suite.sh tee'd it."""
    monkeypatch.delenv("PYAR_RESULTS_MD", raising=False)
    out = _suite_output(tmp_path)
    (out / "summary.md").write_text(_summary(capsys, out, "--test-status", "1"))
    path = tmp_path / "RESULTS.md"
    gpu_summary.main(["--out", str(out), "--results-md", str(path), "--commit", "abc1234"])
    capsys.readouterr()
    text = path.read_text()
    assert "build (extensions in place, prebuilt kernels): 93 s" in text.splitlines()[4]
    assert "pytest exit status: 1" in text


def test_results_md_from_the_environment_and_git(tmp_path, capsys, monkeypatch):
    """gpu_suite.sh passes PYAR_RESULTS_MD on; the commit is git's unless given."""
    out = _suite_output(tmp_path)
    path = tmp_path / "RESULTS.md"
    monkeypatch.setenv("PYAR_RESULTS_MD", str(path))
    monkeypatch.setattr(gpu_summary, "git_commit", lambda: "feedbee")
    _summary(capsys, out, "--test-status", "0")
    assert "; commit: feedbee; " in path.read_text()
    monkeypatch.setattr(gpu_summary, "git_commit", lambda: None)
    _summary(capsys, out, "--test-status", "0")
    assert "; commit: not recorded; " in path.read_text()


def test_the_checked_in_results_md_says_how_it_is_made():
    with open(os.path.join(ROOT, "tests", "gpu", "RESULTS.md")) as f:
        lines = f.read().splitlines()
    assert lines[0] == gpu_summary.REGENERATE
    assert "## Tests" in lines
    assert any(re.match(r"\|\s*\*\*total\*\*\s*\|", line) for line in lines)
