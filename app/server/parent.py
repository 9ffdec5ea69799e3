"""The engine ends with the window that started it: PR_SET_PDEATHSIG on Linux, and a watch of the parent
on every OS, which also closes the race of a window that died before the engine could ask for the signal.

A window passes its pid (`serve --parent-pid N`). When that process goes, the engine stops as on SIGTERM
(listeners closed, the model freed); one that has not ended EXIT_GRACE_S later (a model load cannot be
interrupted) leaves at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("foresight.parent")

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_S = 0.5
EXIT_GRACE_S = 20.0
ORPHANED_EXIT_CODE = 3


def watch(parent_pid: int) -> threading.Thread:
    """Ask the kernel for SIGTERM when the parent dies (Linux), check that it has not died already, and
    start the thread that watches it; returns that thread."""
    kernel_signals = sys.platform.startswith("linux") and _ask_death_signal()
    if sys.platform != "win32" and os.getppid() != parent_pid:
        # the window died between starting this process and the prctl: the signal will never come
        _orphaned(parent_pid, signal_self=True)
        kernel_signals = False
    if sys.platform == "win32":
        target, args = _wait_windows, (parent_pid,)
    else:  # where the kernel sends SIGTERM itself, a second one could land after the loop's handler is gone
        target, args = _poll_posix, (parent_pid, not kernel_signals)
    thread = threading.Thread(target=target, args=args, name="parent-watch", daemon=True)
    thread.start()
    return thread


def _ask_death_signal() -> bool:
    """SIGTERM from the kernel when the parent dies; False where it could not be asked."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


def _poll_posix(parent_pid: int, signal_self: bool) -> None:
    # a process whose parent died is adopted by init (or a subreaper): its parent pid changes
    while os.getppid() == parent_pid:
        time.sleep(POLL_S)
    _orphaned(parent_pid, signal_self)


def _wait_windows(parent_pid: int) -> None:
    synchronize, infinite = 0x00100000, 0xFFFFFFFF
    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    # the handle holds the process object: a pid reused meanwhile cannot fool the wait
    handle = kernel32.OpenProcess(synchronize, False, parent_pid)
    if handle:
        kernel32.WaitForSingleObject(handle, infinite)
        kernel32.CloseHandle(handle)
    _orphaned(parent_pid, signal_self=True)


_told = threading.Event()  # the stop was asked for once: a second SIGTERM must not cut the clean end short


def _orphaned(parent_pid: int, signal_self: bool) -> None:
    """Stop as on SIGTERM (sent here unless the kernel sent it), and leave outright if that takes long."""
    if _told.is_set():
        return
    _told.set()
    log.warning("the window that started this engine (pid %d) is gone: stopping", parent_pid)
    threading.Thread(target=_exit_later, name="parent-gone", daemon=True).start()
    if not signal_self:
        return
    if sys.platform == "win32":
        signal.raise_signal(signal.SIGTERM)
    else:
        os.kill(os.getpid(), signal.SIGTERM)


def _exit_later() -> None:
    time.sleep(EXIT_GRACE_S)
    log.warning("still running %.0f s after the window went: leaving now", EXIT_GRACE_S)
    logging.shutdown()
    os._exit(ORPHANED_EXIT_CODE)
