"""One operation's life, and every way it can end (no I/O here).

An *operation* is one collective (or one point-to-point message) of one
group, numbered ``seq`` when it is issued. Its states::

    ISSUED ──start()──▶ RUNNING ──succeed()──▶ SUCCEEDED
       │                   │
       └──────fail()───────┴──────────────────▶ FAILED

and it fails for exactly one :class:`Reason`, the first one that happens
(later failures are ignored). :class:`Failure` is that reason with its
message and the ranks it names; :meth:`Failure.error` is the typed exception
users see (its ``.reason`` is the same value). The rules that decide *what* a
frame or an event means for an operation are the methods of
:class:`Operation` — a frame with another call's fingerprint is a mismatch,
an ABORT is the sender's failure, a lost peer is ``PEER_LOST`` unless it
left in order after finishing its part — so the mailbox only routes frames
to operations and the engine only drives them.

:class:`Work` is the public handle of an issued operation (``netcoll.Work``):
an awaitable future with ``done/result/exception/add_done_callback/cancel``
and a thread-safe blocking :meth:`Work.wait`.
"""

from __future__ import annotations

from .reasons import ERROR_CLASSES, Failure, Reason, State, detail, reason_of
from .state import Operation, SlotKey
from .work import Work

__all__ = ["ERROR_CLASSES", "Failure", "Operation", "Reason", "SlotKey", "State", "Work", "detail", "reason_of"]
