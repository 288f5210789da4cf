"""Threads that leave signals to the main thread.

netcoll runs event loops in threads of their own (``netcoll.sync``'s loop, the
rendezvous heartbeat). The kernel delivers a signal sent to the process (Ctrl-C's
SIGINT, a launcher's SIGTERM) to any thread that does not block it. Python runs
its handlers only in the main thread, and a main thread blocked in a lock (a
``future.result()``, a ``join()``) wakes for them only if the signal interrupts
*its* wait: delivered to a loop thread, a Ctrl-C stayed pending while the main
thread waited on, here until ``netcoll.sync.connect``'s 30 s close timeout or
for ever. :func:`start` starts a thread with those signals blocked in it, so they
always reach the main thread. (The mask is inherited at creation: blocking it
around ``start()`` in the creating thread leaves no window, and a signal that
arrives meanwhile is delivered once it is unblocked.)
"""

from __future__ import annotations

import signal
import threading

#: signals a Python program handles (asynchronous ones; a fault such as SIGSEGV
#: goes to the thread that caused it whatever the mask)
HANDLED = frozenset(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)


def start(thread: threading.Thread) -> None:
    """``thread.start()``, with :data:`HANDLED` blocked in the new thread (POSIX;
    elsewhere a plain start)."""
    if not hasattr(signal, "pthread_sigmask"):
        thread.start()
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


__all__ = ["HANDLED", "start"]
