"""The figure helpers the tools' plots share (`report`, `sweep_report`, `benchmark`):
matplotlib figures on the Agg canvas, never pyplot (no global state, no display, safe
beside other threads), the run colours, and writing a PNG. matplotlib is imported when a
figure is made, so importing a tool loads none of it."""
from __future__ import annotations

from pathlib import Path

DPI = 100


def figure(ncols: int = 1, nrows: int = 1, width: float = 6.4, height: float = 4.0):
    """`(figure, axes)`: a constrained-layout figure of `nrows x ncols` panels, each
    `width x height` inches; `axes[row, col]` (always 2-D)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def color(index: int):
    """The `index`-th run's colour (tab10, repeating past ten)."""
    from matplotlib import colormaps

    return colormaps["tab10"](index % 10)


def save(fig, path, dpi: int = DPI) -> Path:
    """Write `fig` as a PNG at `path`; returns the path."""
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    return path
