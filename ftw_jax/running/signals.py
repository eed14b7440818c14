"""Stop signals: a SIGINT or SIGTERM asks the run in progress to stop at its next checkpointed boundary, and ends
the process within seconds wherever it is (importing, compiling, running a long period, saving).

    with watching() as watcher:             # the command line takes the signals (a library never does)
        watcher.grace = lambda: 2.0         # how long the run may take to reach a boundary (default 0: none)
        watcher.finish = say_interrupted    # what is done before the process ends without reaching one
        ...
        raise_if_stopped()                  # between two units of work that are checkpointed

Python runs a signal's handler only between two bytecodes of the main thread, which may sit in XLA (compiling,
running a period) for minutes. The C-level handler still writes the signal's number to the wakeup file, and a
watcher thread reading it wakes at once: it gives the main thread `grace` seconds to stop at a boundary (raising
`Interrupted`), then ends the process itself, `finish(signum)` then `os._exit(128 + signum)`, as a kill would but
with the checkpoint in flight written whole. A second signal skips what is left of the grace. Whichever thread
ends the run claims it first (`claim_ending`), so that one line says so.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_SECONDS = 2.0  # for the main thread to reach a boundary: a period's end, a checkpoint's
_CLOSE = b"\0"  # written to the wakeup file by `watching` as it ends: no signal is numbered 0


class Interrupted(Exception):
    """A stop was asked for (SIGINT, SIGTERM): raised between two periods, once the last one is checkpointed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_stop_signal: list[int] = []  # the signal that asked this process to stop, if one did
_ending: list[int] = []  # the thread that ends the run once a stop is asked for, once one claims it
_claim = threading.Lock()


def request_stop(signum: int, frame: types.FrameType | None = None) -> None:
    """A signal handler: the run stops after the period in progress (a second signal is the watcher's to act on;
    raising here, at whatever line the main thread is, would leave Orbax's threads half stopped)."""
    if not _stop_signal:
        _stop_signal.append(signum)


def clear_stop() -> None:
    _stop_signal.clear()
    _ending.clear()


def claim_ending() -> bool:
    """True if the calling thread is the one that ends the run (the first to ask, and it again after)."""
    with _claim:
        if not _ending:
            _ending.append(threading.get_ident())
        return _ending[0] == threading.get_ident()


def end_here() -> None:
    """Claims the end of the run for the calling thread, or, where the watcher has claimed it and is ending the
    process, waits for that (saying nothing, writing nothing more)."""
    if not claim_ending():
        threading.Event().wait()


def raise_if_stopped() -> None:
    """Raises `Interrupted` if a stop was asked for: call it between two units of work that are checkpointed."""
    if _stop_signal:
        end_here()
        raise Interrupted(_stop_signal[0])


def _say_interrupted(signum: int) -> None:
    print("\ninterrupted", file=sys.stderr, flush=True)


class Watcher:
    """The thread that sees a stop signal however busy the main thread is (`watching` starts and ends it)."""

    def __init__(self):
        self.grace: Callable[[], float] = lambda: 0.0  # read when the first signal arrives
        self.finish: Callable[[int], None] = _say_interrupted  # must not raise: the process ends after it anyway
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.write_end, False)  # the C-level handler must never block
        self.thread = threading.Thread(target=self._watch, name="ftw-jax stop signals", daemon=True)

    def _watch(self) -> None:
        signum, deadline = 0, None
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if select.select([self.read_end], [], [], wait)[0]:
                received = os.read(self.read_end, 64)
                if _CLOSE in received:
                    return
                signals = [number for number in received if number in STOP_SIGNALS]
                if not signals:
                    continue
                if deadline is None:
                    signum, deadline = signals[0], time.monotonic() + self.grace()
                    request_stop(signum)  # the main thread's handler will not run until it leaves C++
                    signals = signals[1:]
                if signals:  # asked twice: no more grace
                    deadline = time.monotonic()
            if deadline is not None and time.monotonic() >= deadline:
                self._end(signum)
                return

    def _end(self, signum: int) -> None:
        """Ends the process, unless the main thread is already ending the run (at a boundary, or done)."""
        if not claim_ending():
            return
        try:
            self.finish(signum)
        finally:  # even if `finish` failed: no traceback, the status of the signal
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(128 + signum)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.write_end, _CLOSE)
        self.thread.join()
        os.close(self.read_end)
        os.close(self.write_end)


@contextlib.contextmanager
def watching(*, to_the_end: bool = False) -> Iterator[Watcher | None]:
    """SIGINT and SIGTERM taken by `request_stop` and a `Watcher` while the block runs (None, and nothing taken,
    outside the main thread, where Python allows no handler); the previous handlers afterwards, or, with
    `to_the_end` (the process's own command, ending), none: a signal while Python shuts down (up to a second)
    is ignored, where Python's own handlers, restored as it shuts down, would kill it (status -2, not 130)."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    watcher = Watcher()
    watcher.thread.start()
    previous_wakeup = signal.set_wakeup_fd(watcher.write_end, warn_on_full_buffer=False)  # before the handlers
    previous = {signum: signal.signal(signum, request_stop) for signum in STOP_SIGNALS}
    try:
        yield watcher
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if to_the_end else handler)
        signal.set_wakeup_fd(previous_wakeup)
        watcher.close()
        clear_stop()
