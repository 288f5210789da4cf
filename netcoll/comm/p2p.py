"""Point-to-point messages of the :class:`~netcoll.comm.Communicator`:
``send`` and ``recv`` (their plans: :mod:`netcoll.calls.p2p`).

Each is a function of ``self: Communicator`` that the class binds by name
(``all_reduce = reducing.all_reduce``): a method like any other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..calls import p2p
from ..tensors import inputs

if TYPE_CHECKING:
    from ..operation import Work
    from .communicator import Communicator
    from .types import ArrayIn, TensorLike


def send(
    self: Communicator, x: ArrayIn | TensorLike[Any], dst: int, tag: int = 0, *, timeout: float | None = None
) -> Work[None]:
    """Send ``x`` to rank ``dst``.

    Messages are matched in order per (sender, receiver, ``tag``): the
    n-th ``send`` to ``dst`` with a tag is the n-th ``recv`` from this rank
    with that tag on ``dst``, whatever else runs in between. Only the two
    ranks take part; the other ranks do not call anything.

    Args:
        x: the array (any shape; every numeric dtype, ``bool``,
            ``bfloat16``; a numpy array or anything ``numpy.asarray``
            takes, or a CPU torch tensor). Shape and dtype travel with it.
            Don't modify it until the Work is done.
        dst: the receiving rank, ``0 <= dst < world_size``, not this rank.
        tag: a non-negative int: a sequence of messages of its own.
        timeout: seconds the send may run (default: the communicator's
            :attr:`timeout`), until the receiver has the message.

    Returns:
        A :class:`~netcoll.Work` issued now, whose result is ``None`` once
        the message is delivered.

    Raises:
        TypeError: at the call: an unsupported dtype.
        ValueError: at the call: ``dst`` not another rank, ``tag`` not a
            non-negative int, ``timeout`` not positive, ``x`` over
            ``max_array_bytes``.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work: ``CollectiveTimeout`` (``dst``
            never received it), ``PeerLost``, ``CollectiveCancelled``,
            ``CollectiveClosed``.

    Example::

        if comm.rank == 0:
            await comm.send(activations, dst=1)
        elif comm.rank == 1:
            activations = await comm.recv(src=0)
    """
    x, _, io = inputs(x)
    return self._issue(p2p.send(self._engine, x, dst, tag, io is not None), timeout, io)


def recv(self: Communicator, src: int, tag: int = 0, *, timeout: float | None = None) -> Work[Any]:
    """Receive the next array rank ``src`` sends with ``tag`` (see :meth:`send`).

    Args:
        src: the sending rank, ``0 <= src < world_size``, not this rank.
        tag: a non-negative int, the sender's.
        timeout: seconds to wait for it (default: the communicator's
            :attr:`timeout`).

    Returns:
        A :class:`~netcoll.Work` issued now: the array as it was sent
        (its shape and dtype; a torch tensor when the sender sent one and
        torch is loaded here).

    Raises:
        ValueError: at the call: ``src`` not another rank, ``tag`` not a
            non-negative int, ``timeout`` not positive.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work: ``CollectiveTimeout`` (nothing came
            from ``src``), ``PeerLost``, ``LimitExceeded`` (the sender
            declared more than ``max_array_bytes``), ``CollectiveCancelled``,
            ``CollectiveClosed``.

    Example::

        x = await comm.recv(src=comm.rank - 1, tag=7)
    """
    return self._issue(p2p.recv(self._engine, src, tag), timeout)


__all__ = ["recv", "send"]
