"""Compiler outputs, kept under a hash of everything that decides them, so a
rebuild compiles only what changed.

The hash covers the source and each header it includes, the compiler's
identity and version (a toolkit's path; for NVIDIA's wheels, their names
and versions, not their path, so pip's throw-away build environment and the
installed wheels share entries; the device libraries' contents), the command
line with its flags, arch and defines.  The cache lives in
build/kernel-cache of this source tree, or in $PYAR_KERNEL_CACHE; deleting
it forces a full rebuild.  The log has one line per source, arch and
compiler: compiled (with its time) or cached.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

from .build_log import log

# The source tree (this package's parent folder), whose build/ holds the cache.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cache_folder():
    return os.environ.get("PYAR_KERNEL_CACHE") or os.path.join(ROOT, "build", "kernel-cache")


_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def included_files(source, include_dirs):
    """``source`` and every file it includes (transitively) that is found next
    to the including file or in ``include_dirs``; system headers are covered
    by the compiler's identity."""
    found, pending = [], [os.path.abspath(source)]
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found.append(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name in _INCLUDE.findall(text):
            for folder in (os.path.dirname(path), *include_dirs):
                candidate = os.path.abspath(os.path.join(folder, name))
                if os.path.isfile(candidate):
                    pending.append(candidate)
                    break
    return found


class Job:
    """One compiler run: ``argv(source, output)`` -> a command line;
    ``stable(command)`` -> the command without its build-specific paths."""

    def __init__(self, source, target, compiler, identity, argv, environment=None,
                 stable=lambda command: command):
        self.source, self.target, self.compiler = source, target, compiler
        self.identity, self.argv, self.environment = identity, argv, environment
        self.stable = stable

    def key(self):
        digest = hashlib.sha256()
        digest.update(json.dumps([self.identity,
                                  self.stable(self.argv("SOURCE", "OUTPUT"))]).encode())
        for path in included_files(self.source, [os.path.dirname(self.source)]):
            with open(path, "rb") as f:
                digest.update(os.path.basename(path).encode() + b"\0" + f.read())
        return digest.hexdigest()

    def describe(self):
        return f"{os.path.basename(self.source)} {self.target} {self.compiler}"


def run_cached(job, cache):
    """The cache entry (a folder holding ``output`` and ``log``) of ``job``,
    compiling it unless an entry exists."""
    entry = os.path.join(cache, job.key())
    if os.path.isfile(os.path.join(entry, "output")):
        log(f"{job.describe()}: cached")
        return entry
    os.makedirs(cache, exist_ok=True)
    work = tempfile.mkdtemp(dir=cache, prefix="tmp-")
    try:
        started = time.monotonic()
        result = subprocess.run(job.argv(job.source, os.path.join(work, "output")),
                                capture_output=True, text=True, env=job.environment)
        if result.returncode != 0:
            raise RuntimeError(f"{job.describe()} failed:\n"
                               + " ".join(job.argv(job.source, "OUTPUT")) + "\n"
                               + strip_remarks(result.stdout + result.stderr))
        with open(os.path.join(work, "log"), "w") as f:
            f.write(result.stdout + result.stderr)
        try:
            os.rename(work, entry)
        except OSError:  # another build stored the same entry meanwhile
            if not os.path.isfile(os.path.join(entry, "output")):
                raise
        log(f"{job.describe()}: compiled in {time.monotonic() - started:.0f} s")
        return entry
    finally:
        shutil.rmtree(work, ignore_errors=True)


def strip_remarks(text):
    """A compiler's messages without the resource-usage remarks."""
    return "\n".join(line for line in text.splitlines()
                     if "kernel-resource-usage" not in line and line.strip() != "^"
                     and not re.match(r"\s*\d+ \|", line))
