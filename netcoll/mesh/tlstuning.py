"""Two OpenSSL settings of a TLS context that Python 3.11's :mod:`ssl` has no call
for, set through ``ctypes`` on the context's ``SSL_CTX`` (measured in
``docs/reliability.md``, "What TLS costs"):

* **TLS 1.3 cipher suites, AES-128-GCM first** (``SSL_CTX_set_ciphersuites``):
  OpenSSL's default order puts AES-256-GCM first, and ``SSLContext.set_ciphers``
  only reaches TLS 1.2. AES-128-GCM costs about 15 % less per byte (``openssl
  speed`` here: 6.9 against 5.9 GB/s per core) and is the suite every TLS 1.3
  implementation must offer. AES-256-GCM and ChaCha20-Poly1305 stay offered
  after it, so a peer with OpenSSL's defaults still connects.
* **read-ahead** (``SSL_CTX_set_read_ahead``): without it OpenSSL reads each
  16 KiB record with two system calls (its 5-byte header, then its body); with
  it, one read fills OpenSSL's record buffer (about one record) with whatever
  the socket holds, so a record costs one read. The buffer keeps its default
  size: a larger one (``SSL_CTX_set_default_read_buffer_len``) measured worse,
  because OpenSSL moves what is left of the buffer to its start before each
  record it reads, which grows with the buffer. Records read ahead are
  invisible to ``SSLSocket.pending()`` and to the socket's readiness, so a
  non-blocking reader must go on reading until OpenSSL wants to read
  (:class:`~netcoll.links.tlstransport.TlsTransport` does; blocking sockets and
  asyncio's TLS layer do anyway).

Neither changes what is checked (certificates, verification, versions). Both
are set only when the ``SSL_CTX`` pointer is found where CPython keeps it (the
first field after the object header of ``_ssl._SSLContext``, in the CPython
versions :data:`LAYOUT_KNOWN`) and proves to be this context's (its options,
read back through OpenSSL, equal ``ctx.options``), with the OpenSSL library
``ssl`` itself runs on (3.0 or later). Otherwise nothing is changed: OpenSSL's
defaults stay, and :func:`tune` returns :data:`NONE`.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import ssl
import sys
from dataclasses import dataclass
from typing import Final

#: TLS 1.3 suites, most preferred first (OpenSSL's three defaults)
SUITES: Final = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#: CPython versions whose ``_ssl._SSLContext`` starts with its ``SSL_CTX *``
LAYOUT_KNOWN: Final = ((3, 10), (3, 11), (3, 12), (3, 13))
_SSL_CTRL_SET_READ_AHEAD: Final = 41  # SSL_CTX_set_read_ahead is a macro over SSL_CTX_ctrl


@dataclass(frozen=True)
class Tuning:
    """What :func:`tune` set on a context."""

    suites: bool  #: AES-128-GCM first among the TLS 1.3 suites (:data:`SUITES`)
    read_ahead: bool  #: OpenSSL reads ahead


NONE: Final = Tuning(suites=False, read_ahead=False)


@functools.cache
def _libssl() -> ctypes.CDLL | None:
    """The libssl ``_ssl`` runs on, its functions declared; None where this
    Python or OpenSSL is not one :func:`tune` knows."""
    if platform.python_implementation() != "CPython" or sys.version_info[:2] not in LAYOUT_KNOWN:
        return None
    if ssl.OPENSSL_VERSION_INFO < (3, 0):
        return None
    try:
        import _ssl

        lib = ctypes.CDLL(_ssl.__file__)  # its symbols, and those of the libssl it links
        lib.OpenSSL_version_num.restype = ctypes.c_ulong
        lib.OpenSSL_version_num.argtypes = []
        if lib.OpenSSL_version_num() != ssl.OPENSSL_VERSION_NUMBER:
            return None
        lib.SSL_CTX_get_options.restype = ctypes.c_uint64
        lib.SSL_CTX_get_options.argtypes = [ctypes.c_void_p]
        lib.SSL_CTX_set_ciphersuites.restype = ctypes.c_int
        lib.SSL_CTX_set_ciphersuites.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.SSL_CTX_ctrl.restype = ctypes.c_long
        lib.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    except (ImportError, OSError, AttributeError):
        return None
    return lib


def _pointer(lib: ctypes.CDLL, ctx: ssl.SSLContext) -> int | None:
    """``ctx``'s ``SSL_CTX *``, when it is where CPython keeps it and is ``ctx``'s."""
    found = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not found or lib.SSL_CTX_get_options(found) != ctx.options:
        return None
    return int(found)


def tune(ctx: ssl.SSLContext) -> Tuning:
    """Prefer AES-128-GCM among the TLS 1.3 suites and read ahead, on ``ctx``
    (before a connection uses it); returns what was set."""
    lib = _libssl()
    found = None if lib is None or not isinstance(ctx, ssl.SSLContext) else _pointer(lib, ctx)
    if lib is None or found is None:
        return NONE
    suites = lib.SSL_CTX_set_ciphersuites(found, SUITES.encode()) == 1
    lib.SSL_CTX_ctrl(found, _SSL_CTRL_SET_READ_AHEAD, 1, None)
    return Tuning(suites=suites and ctx.get_ciphers()[0]["name"] == SUITES.split(":")[0], read_ahead=True)


__all__ = ["LAYOUT_KNOWN", "NONE", "SUITES", "Tuning", "tune"]
