"""pyar.comm.algorithms: every choice table names the measurement behind it (a
results file kept under benchmarks/results/), its values and the choices
they make stay those written down here, and the results folder says what
each of its files is."""
import glob
import os
import re

import pytest

from pyar.comm import algorithms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")

K, M = 1 << 10, 1 << 20
# Both sides of every bound in the tables.
SIZES = (0, 1, 64 * K, 128 * K, 128 * K + 1, 224 * K, 256 * K, 256 * K + 1, 448 * K,
         512 * K, 512 * K + 1, 896 * K, M, M + 1, 2 * M, 2 * M + 1, 4 * M, 32 * M,
         32 * M + 1, 1 << 30)
LETTER = {"oneshot": "o", "twoshot": "t", "onestage": "o", "twostage": "t",
          "split": "s", "unfused": "u", "lamport": "l"}

# world -> the letter of choose(n, world) for each n of SIZES.
CHOOSE = {2: "ooooooooootttttttttt", 3: "ooooooooootttttttttt",
          4: "ooooooottttttttttttt", 5: "ooooooottttttttttttt",
          6: "ooooooottttttttttttt", 7: "ooootttttttttttttttt",
          8: "ooootttttttttttttttt"}

# (shared_gpu, row_bytes, lamport_fits) -> world -> the letter of
# choose_fused(n, world, shared_gpu, row_bytes, lamport_fits) for each n of SIZES.
_APART = {2: "ooooooooootttsssssss", 3: "ooooooooootttsssssss",
          4: "ooooooottttttsssssss", 5: "ooooooottttttuuuuuuu",
          6: "ooooooottttttuuuuuuu", 7: "ooootttttttttuuuuuuu",
          8: "ooootttttttttuuuuuuu"}
_APART_LAMPORT = {2: "lllllllllltttsssssss", 3: "llllllloootttsssssss",
                  4: "lllllllttttttsssssss", 5: "llllooottttttuuuuuuu",
                  6: "llllooottttttuuuuuuu", 7: "lllltttttttttuuuuuuu",
                  8: "lllltttttttttuuuuuuu"}
_SHARED = {2: "oooooooooooooooooooo", 3: "oooooooooooooooooooo",
           4: "oooooooooooooooooooo", 5: "oooooooooosssssuuuuu",
           6: "oooooooooosssssuuuuu", 7: "oooooooooosssssuuuuu",
           8: "oooooooooosssssuuuuu"}
_SHARED_LAMPORT = {2: "lllllllllloooooooooo", 3: "lllllllooooooooooooo",
                   4: "lllllllooooooooooooo", 5: "lllloooooosssssuuuuu",
                   6: "lllloooooosssssuuuuu", 7: "lllloooooosssssuuuuu",
                   8: "lllloooooosssssuuuuu"}
_SHARED_WIDE = {2: "ooooooooooooosssssss", 3: "ooooooooooooosssssuu",
                4: "ooooooooooooosssssuu", 5: "ooooooossssssssuuuuu",
                6: "ooooooossssssssuuuuu", 7: "ooooooossssssssuuuuu",
                8: "ooooooossssssssuuuuu"}
_SHARED_WIDE_LAMPORT = {2: "llllllllllooosssssss", 3: "llllllloooooosssssuu",
                        4: "llllllloooooosssssuu", 5: "llllooossssssssuuuuu",
                        6: "llllooossssssssuuuuu", 7: "llllooossssssssuuuuu",
                        8: "llllooossssssssuuuuu"}
CHOOSE_FUSED = {}
for _row in (0, 8 * K, 8 * K + 2):  # no rows given, the widest narrow row, a wide one
    _wide = _row > 8 * K
    CHOOSE_FUSED[(False, _row, False)] = _APART
    CHOOSE_FUSED[(False, _row, True)] = _APART_LAMPORT
    CHOOSE_FUSED[(True, _row, False)] = _SHARED_WIDE if _wide else _SHARED
    CHOOSE_FUSED[(True, _row, True)] = _SHARED_WIDE_LAMPORT if _wide else _SHARED_LAMPORT

TABLES = {
    "ONESHOT_MAX_BYTES": {2: 524288, 3: 524288, 4: 262144, 5: 262144, 6: 262144,
                          7: 131072, 8: 131072},
    "FUSED_ONESTAGE_MAX_BYTES": {2: 524288, 3: 524288, 4: 262144, 5: 262144, 6: 262144,
                                 7: 131072, 8: 131072},
    "FUSED_MAX_BYTES": {world: 1048576 for world in range(2, 9)},
    "FUSED_LARGE": {2: "split", 3: "split", 4: "split", 5: "unfused", 6: "unfused",
                    7: "unfused", 8: "unfused"},
    "SHARED_GPU_FUSED": {2: (None, None), 3: (None, 33554432), 4: (None, 33554432),
                         5: (524288, 2097152), 6: (524288, 2097152), 7: (524288, 2097152),
                         8: (524288, 2097152)},
    "SHARED_GPU_WIDE_ONESTAGE_MAX": {2: 1048576, 3: 1048576, 4: 1048576, 5: 262144,
                                     6: 262144, 7: 262144, 8: 262144},
    "LAMPORT_MAX_BYTES": {2: 524288, 3: 262144, 4: 262144, 5: 131072, 6: 131072,
                          7: 131072, 8: 131072},
    "LL_AUTO_MAX_BYTES": {2: 262144, 3: 131072, 4: 131072, 5: 32768, 6: 32768, 7: 32768,
                          8: 32768},
}
CONSTANTS = {"ALGORITHMS": ("oneshot", "twoshot"), "FUSED_VARIANTS": ("onestage", "twostage"),
             "SPLIT": "split", "UNFUSED": "unfused", "LAMPORT": "lamport",
             "WIDE_ROW_BYTES": 8192, "LAMPORT_SEGMENT_BYTES": 1048576, "LL": "ll",
             "LL_TWOSHOT": "ll_twoshot", "LL_ALGORITHMS": ("ll", "ll_twoshot"),
             "LL_MAX_BYTES": 262144}


def _tables():
    return {name for name, value in vars(algorithms).items()
            if name.isupper() and isinstance(value, dict) and name != "PROVENANCE"}


def test_the_tables_and_constants_keep_their_values():
    assert _tables() == set(TABLES)
    for name, expected in {**TABLES, **CONSTANTS}.items():
        assert getattr(algorithms, name) == expected, name


@pytest.mark.parametrize("world", sorted(CHOOSE))
def test_choose_picks_as_before(world):
    assert "".join(LETTER[algorithms.choose(n, world)] for n in SIZES) == CHOOSE[world]


@pytest.mark.parametrize("case", sorted(CHOOSE_FUSED), ids=str)
@pytest.mark.parametrize("world", range(2, 9))
def test_choose_fused_picks_as_before(case, world):
    shared_gpu, row_bytes, lamport_fits = case
    picks = "".join(LETTER[algorithms.choose_fused(n, world, shared_gpu, row_bytes, lamport_fits)]
                    for n in SIZES)
    assert picks == CHOOSE_FUSED[case][world]


@pytest.mark.parametrize("world", [0, 1, 9])
def test_worlds_without_a_table_are_refused(world):
    calls = [lambda: algorithms.choose(4096, world),
             lambda: algorithms.choose_fused(4096, world),
             lambda: algorithms.choose_fused(4096, world, True),
             lambda: algorithms.choose_fused(4096, world, False, 0, True),
             lambda: algorithms.choose_fused(4096, world, True, 16 * K, True)]
    for call in calls:
        with pytest.raises(ValueError, match="no algorithm table for world size"):
            call()


def _provenance_problems(line):
    """What is missing from one provenance line: device, date, an existing results file."""
    problems = []
    if "\n" in line:
        problems.append("more than one line")
    if not re.search(r"\bH[12]00\b", line):
        problems.append("no device")
    if not re.search(r"\b20\d\d-\d\d-\d\d\b", line):
        problems.append("no date")
    paths = re.findall(r"benchmarks/results/[^\s,;]+", line)
    if not paths:
        problems.append("no results file")
    problems += [f"{path} matches no file" for path in paths
                 if not glob.glob(os.path.join(ROOT, path))]
    return problems


def test_every_table_has_one_line_of_provenance_naming_a_kept_results_file():
    assert set(algorithms.PROVENANCE) == _tables()
    for name, line in algorithms.PROVENANCE.items():
        assert _provenance_problems(line) == [], (name, line)


def test_the_provenance_check_rejects_a_gone_file_and_a_missing_date():
    """Positive control: the check above does reject what it is there to catch."""
    assert _provenance_problems(
        "one H200, 2026-12-04, benchmarks/results/h200_one_gpu_fused_w*_session10.json") == [
        "benchmarks/results/h200_one_gpu_fused_w*_session10.json matches no file"]
    assert _provenance_problems("one H100, benchmarks/results/h100_launch.json") == ["no date"]
    assert _provenance_problems("one H100, 2026-12-06") == ["no results file"]


def test_docs_tuning_has_a_section_per_table():
    with open(os.path.join(ROOT, "docs", "tuning.md")) as f:
        headings = [line for line in f if line.startswith("#")]
    for name in algorithms.PROVENANCE:
        assert any(name in heading for heading in headings), name


def _expand(pattern):
    """``a_{x,y}_b`` -> ``a_x_b``, ``a_y_b`` (the brace lists docs/tuning.md names files by)."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [name for part in match.group(1).split(",")
            for name in _expand(pattern[:match.start()] + part + pattern[match.end():])]


def test_docs_tuning_names_only_kept_results_files():
    with open(os.path.join(ROOT, "docs", "tuning.md")) as f:
        named = re.findall(r"`(h[12]00_[^`]+)`", f.read())
    assert named
    for name in (n for pattern in named for n in _expand(pattern)):
        assert os.path.exists(os.path.join(RESULTS, name)), name


def _results_files():
    return sorted(name for name in os.listdir(RESULTS) if name != "README.md")


def test_results_are_named_by_device_and_measurement_without_run_counters():
    for name in _results_files():
        assert re.match(r"h[12]00_[a-z0-9_.\-]+$", name), name
        assert not re.search(r"session|repeat|before|after|_\d+\.", name), name


def test_results_readme_has_a_line_for_every_file_and_no_other():
    with open(os.path.join(RESULTS, "README.md")) as f:
        text = f.read()
    named = set(re.findall(r"`(h[12]00_[^`]+)`", text))
    assert named == set(_results_files())
