"""Headless matplotlib helpers shared by every stage that draws a picture."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402


def new_figure(width: float = 7.0, height: float = 4.5, ncols: int = 1):
    figure, axes = plt.subplots(1, ncols, figsize=(width, height))
    return figure, axes


def save_figure(figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
