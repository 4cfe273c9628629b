"""Markdown tables, the one format every pyar benchmark and summary prints.

``Table`` prints a header, then one line per row as soon as the row is
measured (a long sweep shows its results as it goes); ``markdown`` formats
rows known in advance, each column as wide as its widest cell."""


class Table:
    """Columns named ``head``; ``widths`` pads cells (right-aligned) so that
    rows printed one at a time line up.  A wider cell widens its line only."""

    def __init__(self, head, widths=None):
        self.head = [str(name) for name in head]
        widths = widths or [0] * len(self.head)
        if len(widths) != len(self.head):
            raise ValueError(f"{len(self.head)} columns but {len(widths)} widths")
        self.widths = [max(w, len(name)) for w, name in zip(widths, self.head)]

    def header(self):
        names = "| " + " | ".join(n.rjust(w) for n, w in zip(self.head, self.widths)) + " |"
        rule = "|" + "|".join("-" * (w + 1) + ":" for w in self.widths) + "|"
        return names + "\n" + rule

    def row(self, cells):
        cells = ["-" if c is None else str(c) for c in cells]
        if len(cells) != len(self.head):
            raise ValueError(f"{len(self.head)} columns but a row of {len(cells)} cells")
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, self.widths)) + " |"


def markdown(head, rows, title=None):
    """The whole table of ``rows`` (sequences of cells in ``head``'s order),
    under a ``## title`` heading when one is given."""
    rows = [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max([len(str(name))] + [len(row[i]) for row in rows])
              for i, name in enumerate(head)]
    table = Table(head, widths)
    lines = ([f"## {title}", ""] if title else []) + [table.header()]
    return "\n".join(lines + [table.row(row) for row in rows])
