"""The documentation's links and citations (tier a, no GPU).

README.md and docs/*.md must point only at things that exist:

- every relative Markdown link ``[text](target)`` names a file or folder of
  the repository, resolved from the linking file's folder; an anchor
  (``#section``) into a Markdown file names one of its headings (GitHub's
  slugs); links with a scheme (``https:``, ``mailto:``) are not checked;
- every repository path written in backticks, or as a word of a fenced code
  block, exists, resolved from the repository root.  A word counts as a
  repository path when it has no whitespace, contains a ``/`` and its first
  component is one of REPOSITORY_FOLDERS (so ``/opt/rocm``, ``bin/nvcc``,
  ``$OUT/summary.md`` or ``hip/hip_runtime.h`` are not); a trailing ``/``
  asks for a folder, a trailing ``:LINE`` is dropped.

Patterns are checked as far as they are concrete:

- a ``*``, ``?`` or ``[..]`` glob must match at least one path;
- a placeholder component (``<name>``, ``{a,b}``, ``...``, ``$VAR``) and
  everything after it is dropped, and the folder before it must exist
  (``benchmarks/<name>.py`` asks for ``benchmarks/``);
- files the package build writes (BUILD_OUTPUTS) need only their folder.

A link to a file under benchmarks/results/ is checked like any other: the
file must exist.

Also: no source or documentation file of the repository cites the design
document except as docs/design.md (the old top-level name is gone) or a
Markdown document by a name that no file of the repository has (WRITTEN_MD:
the ones that runs write), and
README.md stays short and opens with its two commands.  The checker is shown to report what it must
(test_checker_reports_*).
"""
import fnmatch
import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIS_FILE = os.path.relpath(os.path.abspath(__file__), ROOT)
README_MAX_LINES = 220

# A word whose first component is one of these is a repository path.
REPOSITORY_FOLDERS = (".ci", "benchmarks", "docs", "examples", "kernel_build", "pyar", "scripts",
                      "src", "tests")
# Written by `pip install` (pyar/_kernels is tracked, its code objects are not).
BUILD_OUTPUTS = ("pyar/_kernels/*.fatbin", "pyar/_kernels/*.hsaco",
                 "pyar/_kernels/kernel_resources.md")
# Files that may not cite the design document by another name.
CITING_SUFFIXES = (".py", ".pyx", ".pxi", ".pxd", ".h", ".cu", ".cpp", ".c", ".md", ".sh")
# The old name, spelt in two pieces so that this file does not cite it.
OLD_DESIGN_NAME = "DESIGN" + ".md"
# Markdown files that runs write, which sources may name.
WRITTEN_MD = ("summary.md", "steps.md", "kernel_resources.md")
MARKDOWN_NAME = re.compile(r"[A-Za-z0-9_-]+\.md\b")

FIRST_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test,cuda,mpi]' && "
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -n 4 --oversubscribe "
    "python examples/allreduce.py --size 16M --dtype bfloat16")
SECOND_COMMAND = "python3 -m pytest -q tests"

FENCE = re.compile(r"^(```|~~~)")
BACKTICKS = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
PLACEHOLDER = re.compile(r"<[^>]*>|\{[^}]*\}|\.\.\.|\$")
GLOB = re.compile(r"[*?\[]")
LINE_SUFFIX = re.compile(r":\d+(-\d+)?$")


def split_fences(text):
    """(prose lines, code lines) of a Markdown text: fenced blocks apart."""
    prose, code, inside = [], [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        (code if inside else prose).append(line)
    return prose, code


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped
    (hyphens and underscores kept), spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(text):
    """Every heading anchor of a Markdown text (repeated headings get -1, -2, ..)."""
    found, seen = set(), {}
    prose, _ = split_fences(text)
    for line in prose:
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def _exists(relative, root, want_folder=False):
    path = os.path.normpath(os.path.join(root, relative))
    if os.path.relpath(path, root).startswith(".."):
        return False  # outside the repository
    return os.path.isdir(path) if want_folder else os.path.exists(path)


def repository_path_problem(word, root=ROOT):
    """None when ``word`` is not a repository path or names something that
    exists (under the rules of the module's docstring); else the reason."""
    word = word.strip().strip("\"'").lstrip("(").rstrip(".,;:)")
    word = LINE_SUFFIX.sub("", word)
    if not word or re.search(r"\s", word) or "/" not in word or SCHEME.match(word):
        return None
    parts = word.split("/")
    if parts[0] not in REPOSITORY_FOLDERS:
        return None
    want_folder = word.endswith("/")
    for i, part in enumerate(parts):
        if PLACEHOLDER.search(part):
            prefix = "/".join(parts[:i])
            if not _exists(prefix, root, want_folder=True):
                return f"no folder {prefix}/ before the placeholder"
            return None
    concrete = word.rstrip("/")
    if any(fnmatch.fnmatch(concrete, pattern) for pattern in BUILD_OUTPUTS):
        folder = os.path.dirname(concrete)
        return None if _exists(folder, root, want_folder=True) else f"no folder {folder}/"
    if GLOB.search(concrete):
        if glob.glob(os.path.join(root, concrete)):
            return None
        return "the pattern matches nothing"
    if not _exists(concrete, root, want_folder=want_folder):
        return "no such folder" if want_folder else "no such file or folder"
    return None


def link_problem(target, source, root=ROOT):
    """None when the Markdown link ``target`` of the file ``source``
    (relative to ``root``) resolves; else the reason."""
    if SCHEME.match(target):
        return None
    path, _, anchor = target.partition("#")
    folder = os.path.dirname(source)
    resolved = os.path.normpath(os.path.join(folder, path)) if path else source
    if path:
        if not _exists(resolved, root, want_folder=path.endswith("/")):
            return "no such file or folder"
    if anchor and resolved.endswith(".md"):
        full = os.path.join(root, resolved)
        if os.path.isfile(full):
            with open(full, encoding="utf-8") as f:
                if anchor not in anchors(f.read()):
                    return f"no heading #{anchor} in {resolved}"
    return None


def link_problems(text, source, root=ROOT):
    """Every broken link and repository path of one Markdown text, as
    "source: what: why" lines."""
    problems = []
    prose, code = split_fences(text)
    for line in prose:
        for match in BACKTICKS.finditer(line):
            why = repository_path_problem(match.group(2), root)
            if why:
                problems.append(f"{source}: `{match.group(2).strip()}`: {why}")
        for match in LINK.finditer(BACKTICKS.sub("", line)):
            why = link_problem(match.group(1), source, root)
            if why:
                problems.append(f"{source}: link {match.group(1)}: {why}")
    for line in code:
        for word in re.split(r"[\s=]+", line):
            why = repository_path_problem(word, root)
            if why:
                problems.append(f"{source}: code word {word}: {why}")
    return problems


def old_design_citations(text, source):
    """Every mention of the design document other than docs/design.md (a
    Markdown file in docs/ may also say design.md), as "source:line: text"."""
    found = []
    in_docs = os.path.dirname(source) == "docs"
    for number, line in enumerate(text.splitlines(), 1):
        for match in re.finditer(r"design\.md", line, re.IGNORECASE):
            start = match.start()
            if match.group(0) == "design.md" and (line[max(0, start - 5):start] == "docs/"
                                                  or in_docs):
                continue
            found.append(f"{source}:{number}: {line.strip()}")
    return found


def unknown_markdown_citations(text, source, known):
    """Every Markdown document that ``text`` names whose file name is not in
    ``known``, as "source:line: name"."""
    return [f"{source}:{number}: {name}"
            for number, line in enumerate(text.splitlines(), 1)
            for name in MARKDOWN_NAME.findall(line) if name not in known]


def documentation_files():
    return ["README.md"] + sorted(
        os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def repository_files():
    """Tracked and untracked-but-not-ignored files (every file outside the
    ignored build folders when git is not there)."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return [name for name in listed.splitlines() if os.path.isfile(os.path.join(ROOT, name))]
    except (OSError, subprocess.CalledProcessError):
        skipped = {".git", "build", "dist", ".venv", "__pycache__", ".pytest_cache"}
        names = []
        for folder, subfolders, files in os.walk(ROOT):
            subfolders[:] = [d for d in subfolders
                             if d not in skipped and not d.endswith(".egg-info")]
            names += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files]
        return names


def read(relative):
    with open(os.path.join(ROOT, relative), encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------
# The repository's documentation


@pytest.mark.parametrize("source", documentation_files())
def test_every_link_and_path_exists(source):
    assert link_problems(read(source), source) == []


def test_the_docs_folder_is_there():
    names = {os.path.basename(name) for name in documentation_files()}
    assert {"README.md", "design.md", "api.md", "multi-node.md", "settings.md", "testing.md",
            "benchmarks.md"} <= names


def citing_sources(names):
    """(name, text) of every source among ``names`` that may cite documents
    (CITING_SUFFIXES, text), this file aside."""
    for name in names:
        if name.endswith(CITING_SUFFIXES) and name != THIS_FILE:
            try:
                yield name, read(name)
            except UnicodeDecodeError:
                continue


def test_the_design_document_is_cited_as_docs_design_md():
    found = []
    for name, text in citing_sources(repository_files()):
        found += old_design_citations(text, name)
    assert found == []


def test_every_markdown_document_cited_exists():
    """A source may cite a document by its name alone ("see PLAN.md section 2"),
    which the link check does not read: that name must be a file of the repository."""
    names = repository_files()
    known = {os.path.basename(name) for name in names if name.endswith(".md")} | set(WRITTEN_MD)
    found = []
    for name, text in citing_sources(names):
        found += unknown_markdown_citations(text, name, known)
    assert found == []


def fenced_blocks(text):
    """The contents of a Markdown text's fenced code blocks, in order."""
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_readme_opens_with_the_two_commands():
    """The first command installs pyar and runs the example, the second runs
    the tests; the README's first two code blocks hold them, as they are."""
    assert fenced_blocks(read("README.md"))[:2] == [FIRST_COMMAND, SECOND_COMMAND]


def test_readme_is_short():
    lines = read("README.md").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_readme_and_design_state_the_receive_regions_as_the_code_sizes_them():
    """The LL limits of "auto" and the receive regions' bytes at 8 ranks with the
    default max_size, as README.md and docs/design.md state them, are the code's."""
    from pyar.comm import algorithms, fused_plan, layout, plan
    from pyar.comm.communicator import DEFAULT_MAX_SIZE
    readme, design = (" ".join(read(path).split()) for path in ("README.md", "docs/design.md"))
    ll = layout.ll_region_bytes(8, plan.ll_segment(DEFAULT_MAX_SIZE), 0) >> 20
    segment = fused_plan.lamport_segment(DEFAULT_MAX_SIZE)
    lamport = len(layout.lamport_region(8, segment, 0)) >> 20
    limits = {world: kib >> 10 for world, kib in algorithms.LL_AUTO_MAX_BYTES.items()}
    assert (f"up to {limits[2]} KiB at 2 ranks, {limits[3]} KiB at 3 or 4, {limits[5]} KiB "
            f"at 5 to 8") in readme
    assert limits[3] == limits[4] and len({limits[w] for w in range(5, 9)}) == 1
    assert f"`max_size` bytes each ({DEFAULT_MAX_SIZE >> 20} MiB by default)" in readme
    assert f"(2 x ranks x {segment >> 20} MiB: {lamport} MiB at 8 ranks)" in readme
    assert f"x {algorithms.LL_MAX_BYTES >> 10} KiB of data" in readme
    assert f"as {2 * algorithms.LL_MAX_BYTES >> 10} KiB of packets: {ll} MiB at 8 ranks" in readme
    assert f"1 KiB of counters: {ll} MiB at 8 ranks" in design


# ---------------------------------------------------------------------------
# Positive controls: the checkers see what they must


def test_checker_reports_broken_links_and_paths():
    text = "\n".join([
        "Good: [design](docs/design.md), [folder](docs/), `src/kernels/pyar_protocol.h`,",
        "`tests/machine_code.py:2`, [web](https://example.org/x.md), `/opt/rocm/bin`.",
        "Bad: [gone](docs/no_such_page.md) and `src/kernels/no_such_header.h`.",
        "Bad folder: `pyar/comm/no_such_folder/`; escaping: [up](../../etc/passwd).",
        "```",
        "python examples/allreduce.py && python examples/no_such_example.py",
        "```",
    ])
    problems = link_problems(text, "README.md")
    assert problems == [
        "README.md: `src/kernels/no_such_header.h`: no such file or folder",
        "README.md: link docs/no_such_page.md: no such file or folder",
        "README.md: `pyar/comm/no_such_folder/`: no such folder",
        "README.md: link ../../etc/passwd: no such file or folder",
        "README.md: code word examples/no_such_example.py: no such file or folder",
    ], problems


def test_checker_reports_markdown_documents_the_repository_lacks():
    text = "As PLAN.md section 2 says; see README.md and docs/design.md.\nNOTES.md too."
    assert unknown_markdown_citations(text, "tests/x.py", {"README.md", "design.md"}) == [
        "tests/x.py:1: PLAN.md", "tests/x.py:2: NOTES.md"]


def test_checker_resolves_links_from_the_linking_file():
    assert link_problems("[api](api.md) [up](../README.md)", "docs/index.md") == []
    assert link_problems("[api](api.md)", "README.md") == [
        "README.md: link api.md: no such file or folder"]


def test_checker_reports_missing_anchors():
    text = "[ok](docs/design.md#machine-code-rules) [bad](docs/design.md#no-such-section)"
    assert link_problems(text, "README.md") == [
        "README.md: link docs/design.md#no-such-section: no heading #no-such-section in "
        "docs/design.md"]


def test_checker_checks_result_files_by_name():
    text = ("[results](benchmarks/results/) and "
            "[one run](benchmarks/results/no_such_run_on_any_gpu.json)")
    assert link_problems(text, "docs/../README.md") == [
        "docs/../README.md: link benchmarks/results/no_such_run_on_any_gpu.json: "
        "no such file or folder"]


def test_checker_handles_patterns_and_placeholders():
    good = ("`tests/test_*_cpu.py` `benchmarks/<name>.py` `pyar/comm/...py` "
            "`tests/gpu/{conftest,scenarios}.py` `pyar/_kernels/kernel_resources.md`")
    assert link_problems(good, "README.md") == []
    bad = "`tests/test_*_no_such_tier.py` `benchmarks/no_such_folder/<name>.py`"
    assert link_problems(bad, "README.md") == [
        "README.md: `tests/test_*_no_such_tier.py`: the pattern matches nothing",
        "README.md: `benchmarks/no_such_folder/<name>.py`: no folder "
        "benchmarks/no_such_folder/ before the placeholder"]


def test_checker_reports_old_design_citations():
    text = f"see {OLD_DESIGN_NAME}, rule 6\nsee docs/design.md, rule 6\n"
    assert old_design_citations(text, "tests/example.py") == [
        f"tests/example.py:1: see {OLD_DESIGN_NAME}, rule 6"]
    assert old_design_citations("[design](design.md)", "docs/README.md") == []
    assert old_design_citations("[design](design.md)", "README.md") == [
        "README.md:1: [design](design.md)"]


def test_slugs_follow_github():
    assert slug("Call signatures and `MismatchError`") == "call-signatures-and-mismatcherror"
    assert slug('The barrier-free "lamport" variant') == "the-barrier-free-lamport-variant"
    assert slug("Tier (b): the GPU suite") == "tier-b-the-gpu-suite"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
