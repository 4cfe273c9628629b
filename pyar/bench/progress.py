"""A progress bar for long sweeps, drawn only where someone watches: on a
terminal.  Piped or redirected output (a log, CI, mpirun's forwarding) gets
no carriage-return clutter; there the rows, printed as they are measured,
say how far a sweep got."""
import sys


class Progress:
    """``total`` steps, drawn on ``stream`` (stderr) when it is a terminal.

    ``step()`` after each step; ``print(line)`` prints a result line to
    stdout without it landing inside the bar; ``close()`` at the end."""

    WIDTH = 30

    def __init__(self, total, stream=None, enabled=True):
        self.total = max(1, total)
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(enabled and isatty is not None and isatty())

    def step(self, count=1):
        self.done = min(self.total, self.done + count)
        self._draw()

    def print(self, line, file=None):
        self._erase()
        print(line, file=sys.stdout if file is None else file, flush=True)
        self._draw()

    def close(self):
        self._erase()

    def _erase(self):
        if self.enabled:
            self.stream.write("\r" + " " * (self.WIDTH + 24) + "\r")
            self.stream.flush()

    def _draw(self):
        if self.enabled:
            bar = "#" * (self.WIDTH * self.done // self.total)
            self.stream.write(f"\r[{bar:<{self.WIDTH}}] {self.done}/{self.total}")
            self.stream.flush()
