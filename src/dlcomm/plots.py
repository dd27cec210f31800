"""The one plot setup of dlcomm: matplotlib without a screen, PNGs written atomically.

Every report module draws through :func:`pyplot` (the Agg backend, chosen before pyplot is
first imported, so plots work on machines without a display) and writes through
:func:`save_figure`, so that a failed run never leaves half a PNG behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlcomm.results import write_atomic

__all__ = ["pyplot", "save_figure"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (imported lazily: it costs ~0.3 s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write a matplotlib figure as PNG, atomically, and close it."""
    plt = pyplot()
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    finally:
        plt.close(fig)
