"""Plots saved as PNG files (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

import pathlib

import numpy as np


def save_learning_curves(
    path, curves, labels, *, title: str, ylabel: str, xlabel: str = "iteration", x=None
) -> pathlib.Path:
    """One line per run (`curves` [S, I]) plus their mean; returns the path written.

    `x` ([S, I] or [I]) places the points (e.g. env steps); the mean is drawn at the mean x.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = np.asarray(curves)
    x = np.broadcast_to(np.arange(curves.shape[1]) if x is None else np.asarray(x), curves.shape)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    many = len(curves) > 10
    for x_run, curve, label in zip(x, curves, labels):
        axes.plot(x_run, curve, lw=0.8, alpha=0.15 if many else 0.7, color="tab:blue" if many else None,
                  label=None if many else label)
    axes.plot(x.mean(axis=0), curves.mean(axis=0), lw=2.0, color="black", label=f"mean of {len(curves)}")
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def save_histogram(path, values, *, title: str, xlabel: str, markers: dict[str, float] | None = None) -> pathlib.Path:
    """A histogram of `values` with labelled vertical lines at `markers`; returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    axes.hist(np.asarray(values), bins=60, color="tab:blue", alpha=0.8)
    for (label, value), color in zip((markers or {}).items(), ("black", "tab:red", "tab:green")):
        axes.axvline(value, color=color, ls="--", lw=1.2, label=f"{label}: {value:.6f}")
    axes.set(title=title, xlabel=xlabel, ylabel="seeds")
    axes.set_yscale("log")
    if markers:
        axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
