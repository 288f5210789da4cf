"""A rank on the other end of a shared-memory link, in another process, killed
part-way through a message: the operation fails at once with PeerLost naming
it (its socket's EOF), whichever way the message went, and no file is left in
/dev/shm."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from netcoll.errors import PeerLost
from netcoll.links import shm
from netcoll.links.cma import enabled as cma_enabled
from netcoll.links.shm import ShmLink
from netcoll.links.shmring import SHM_DIR
from netcoll.mesh.channel import Channel
from netcoll.mesh.tcpmesh import Listener, TcpMesh
from tests.support.env import subprocess_env

pytestmark = [pytest.mark.tcp, pytest.mark.skipif(not shm.possible(), reason="no /dev/shm here")]

LOOPBACK = "127.0.0.1"
TOKEN = "shm-kill-s3cret"
MIB = 1 << 20


def leftovers(pid: int) -> list[str]:
    """Segment files of process ``pid`` still in /dev/shm."""
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(f"netcoll-{pid}-"))


_RANK1 = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np
    from netcoll.links.factory import LinkConfig
    from netcoll.mesh.channel import Channel
    from netcoll.mesh.tcpmesh import Listener, TcpMesh

    async def main() -> None:
        host, port, token, role = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
        listener = Listener(token=token)
        me = await listener.start("127.0.0.1", 0)
        t = TcpMesh(listener, rank=1, size=2, session="kill", peers=[(host, port), me],
                         token=token, links=LinkConfig(window=1 << 20, shm_bytes=64 << 10))
        await t.connect(10.0)
        ch = Channel(t, t.mailbox.open("g", 0, "fp", (0, 1), "test"))
        if role == "sender":
            await ch.send(0, np.ones(256 << 20, np.uint8), step=0)
        elif role == "receiver":
            await ch.recv(0, step=0, out=np.zeros(256 << 20, np.uint8))
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


def _mid_message(link: ShmLink, role: str) -> bool:
    """Whether the transfer is part-way, seen from rank 0 (the other end of ``role``)."""
    if role == "sender":  # rank 0 receives: pieces are arriving
        return link._in is not None and 0 < link._in.got < 256 * MIB
    if role == "reader":  # rank 0 lent its buffer: it waits for the peer to read it
        return link._direct_done is not None and not link._direct_done.done()
    return link._room is not None and not link._room.done()  # rank 0 sends: it waits for ring space


@pytest.mark.parametrize("role", ["sender", "receiver", "reader"])
async def test_a_peer_killed_mid_transfer_fails_the_operation_with_peer_lost(
    role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1, another process, is SIGKILLed part-way through a 256 MiB message
    through the ring (stopped first, so the transfer is certainly part-way): rank 0's
    receive or send fails at once with PeerLost naming rank 1, and no file is left
    behind. The same for a 1 MiB send that lends its buffer (direct DATA), the
    reader stopped before it could read it."""
    cma = "1" if role == "reader" else "0"
    monkeypatch.setenv("NETCOLL_SHM_CMA", cma)
    if role == "reader" and not cma_enabled():
        pytest.skip("no process_vm_readv here")
    listener = Listener(token=TOKEN)
    me = await listener.start(LOOPBACK, 0)
    t = TcpMesh(listener, rank=0, size=2, session="kill", peers=[me, (LOOPBACK, 9)], token=TOKEN)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _RANK1,
        me[0],
        str(me[1]),
        TOKEN,
        role,
        stdout=subprocess.DEVNULL,
        env=subprocess_env(NETCOLL_SHM_CMA=cma),
    )
    try:
        async with asyncio.timeout(30):
            await t.connect(20.0)
            link = t.links[1]
            assert isinstance(link, ShmLink)
            op = t.mailbox.open("g", 0, "fp", (0, 1), "test")
            ch = Channel(t, op)
            if role == "reader":  # stopped once it reads us, before the announcement reaches it
                while not (link.segment.identity and link.segment.identity.peer_reads()):
                    await asyncio.sleep(0.01)
                child.send_signal(signal.SIGSTOP)
            big = np.zeros((1 if role == "reader" else 256) * MIB, np.uint8)  # (1 MiB: eager, direct)
            work = asyncio.ensure_future(ch.recv(1, step=0, out=big) if role == "sender" else ch.send(1, big, step=0))
            while not _mid_message(link, role):
                await asyncio.sleep(0.001)
            child.send_signal(signal.SIGSTOP)
            await asyncio.sleep(0.05)
            assert _mid_message(link, role) and not work.done()
            child.kill()
            start = asyncio.get_running_loop().time()
            with pytest.raises(PeerLost) as info:
                await work
            assert asyncio.get_running_loop().time() - start < 5
        assert info.value.ranks == (1,) and "rank 1" in str(info.value)
        t.mailbox.close(op)
    finally:
        if child.returncode is None:
            child.kill()
        await asyncio.wait_for(child.wait(), 10)
        await t.close()
        await listener.close()
    assert leftovers(child.pid) == [] and leftovers(os.getpid()) == []
