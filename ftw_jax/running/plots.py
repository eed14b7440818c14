"""Plots saved as PNG files.

Figures are made with `matplotlib.figure.Figure`, not pyplot: no display is needed and the global backend
is left alone (a notebook that calls these keeps showing its own plots inline).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def save_learning_curves(
    path: pathlib.Path,
    curves: ArrayLike,
    labels: Iterable[str],
    *,
    title: str,
    ylabel: str,
    xlabel: str = "iteration",
    x: ArrayLike | None = None,
    show_mean: bool = True,
) -> pathlib.Path:
    """One line per run (`curves` [S, I]) plus their mean (seeds of one setting; `show_mean=False` when the
    lines are different settings); returns the path written.

    `x` ([S, I] or [I]) places the points (e.g. env steps); the mean is drawn at the mean x.
    """
    from matplotlib.figure import Figure

    curves = np.asarray(curves)
    x = np.broadcast_to(np.arange(curves.shape[1]) if x is None else np.asarray(x), curves.shape)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(6.4, 4.0), dpi=120)
    axes = figure.subplots()
    many = len(curves) > 10
    for x_run, curve, label in zip(x, curves, labels):
        axes.plot(
            x_run,
            curve,
            lw=0.8,
            alpha=0.15 if many else 0.7,
            color="tab:blue" if many else None,
            label=None if many else label,
        )
    if show_mean:
        axes.plot(x.mean(axis=0), curves.mean(axis=0), lw=2.0, color="black", label=f"mean of {len(curves)}")
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    return path


def save_histogram(
    path: pathlib.Path, values: ArrayLike, *, title: str, xlabel: str, markers: dict[str, float] | None = None
) -> pathlib.Path:
    """A histogram of `values` with labelled vertical lines at `markers`; returns the path written."""
    from matplotlib.figure import Figure

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(6.4, 4.0), dpi=120)
    axes = figure.subplots()
    axes.hist(np.asarray(values), bins=60, color="tab:blue", alpha=0.8)
    for (label, value), color in zip((markers or {}).items(), ("black", "tab:red", "tab:green")):
        axes.axvline(value, color=color, ls="--", lw=1.2, label=f"{label}: {value:.6f}")
    axes.set(title=title, xlabel=xlabel, ylabel="seeds")
    axes.set_yscale("log")
    if markers:
        axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    return path


def save_heatmap(
    path: pathlib.Path,
    means: ArrayLike,
    spreads: ArrayLike,
    *,
    x_values: Sequence[Any],
    y_values: Sequence[Any],
    x_label: str,
    y_label: str,
    title: str,
) -> pathlib.Path:
    """A heatmap of `means` [Y, X], each cell annotated "mean ± spread"; returns the path written."""
    from matplotlib.figure import Figure

    means, spreads = np.asarray(means, float), np.asarray(spreads, float)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(1.2 * len(x_values) + 2.4, 0.8 * len(y_values) + 1.8), dpi=120)
    axes = figure.subplots()
    image = axes.imshow(means, cmap="viridis", origin="lower", aspect="auto")
    for row in range(means.shape[0]):
        for column in range(means.shape[1]):
            level = (means[row, column] - np.nanmin(means)) / max(np.nanmax(means) - np.nanmin(means), 1e-12)
            axes.text(
                column,
                row,
                f"{means[row, column]:.3g}\n± {spreads[row, column]:.2g}",
                ha="center",
                va="center",
                fontsize=8,
                color="black" if level > 0.5 else "white",
            )
    axes.set_xticks(range(len(x_values)), [str(v) for v in x_values])
    axes.set_yticks(range(len(y_values)), [str(v) for v in y_values])
    axes.set(xlabel=x_label, ylabel=y_label, title=title)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    figure.savefig(path)
    return path


def save_banded_curves(
    path: pathlib.Path,
    x: ArrayLike | dict[str, ArrayLike],
    bands: dict[str, tuple],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
) -> pathlib.Path:
    """One line per label with a shaded band: `bands[label] = (mean, low, high)`, each [I] at `x` [I] (or at
    `x[label]` when each label has its own x, e.g. env steps)."""
    from matplotlib.figure import Figure

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(6.4, 4.0), dpi=120)
    axes = figure.subplots()
    for label, (mean, low, high) in bands.items():
        at = x[label] if isinstance(x, dict) else x
        (line,) = axes.plot(at, mean, lw=1.8, label=label)
        axes.fill_between(at, low, high, color=line.get_color(), alpha=0.2, lw=0)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    return path
