"""The build's messages: on stderr as they come, and kept for the top of
kernel_resources.md, since pip hides the build's output unless run with -v."""
import sys
from typing import List

_logged: List[str] = []


def start_log():
    """Forgets the messages of an earlier build in this process."""
    del _logged[:]


def logged_lines():
    """The messages since start_log, oldest first."""
    return list(_logged)


def log(message):
    _logged.append(message)
    sys.stderr.write(f"pyar kernels: {message}\n")  # one write: the threads' lines stay whole
    sys.stderr.flush()
