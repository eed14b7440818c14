"""Stop signals: a SIGINT or SIGTERM asks the run in progress to stop at its next checkpointed boundary.

signal.signal(signal.SIGTERM, request_stop)   # the command line installs the handler (a library never does)
raise_if_stopped()                            # between two units of work that are checkpointed
"""

from __future__ import annotations

import types


class Interrupted(Exception):
    """A stop was asked for (SIGINT, SIGTERM): raised between two periods, once the last one is checkpointed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_stop_signal: list[int] = []  # the signal that asked this process to stop, if one did


def request_stop(signum: int, frame: types.FrameType | None = None) -> None:
    """A signal handler: the run stops after the period in progress (asked twice, at once)."""
    if _stop_signal:
        raise KeyboardInterrupt
    _stop_signal.append(signum)


def clear_stop() -> None:
    _stop_signal.clear()


def raise_if_stopped() -> None:
    """Raises `Interrupted` if a stop was asked for: call it between two units of work that are checkpointed."""
    if _stop_signal:
        raise Interrupted(_stop_signal[0])
