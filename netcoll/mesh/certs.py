"""Mutual TLS for every netcoll connection, from certificate, key and CA files
(the standard :mod:`ssl` module; ``docs/protocol.md`` §5.3).

:class:`TlsConfig` names three PEM files: this process's certificate, its
private key, and the CA that signs every netcoll certificate. Both contexts
are built when the config is made, so a missing, unreadable or mismatched file
is a :class:`TlsConfigError` at startup, never at the first connection.

What is checked: both sides present a certificate, and each side verifies the
other's chain against the CA (``CERT_REQUIRED`` on servers and clients);
TLS 1.2 at least (1.3 is negotiated when both sides have it). Among TLS 1.3's
suites AES-128-GCM is preferred, and OpenSSL reads ahead (:mod:`.tlstuning`:
both cut CPU per byte; neither changes what is checked). Host names and
IP addresses in the certificate are *not* checked by default (ranks dial each
other by the IP address the coordinator saw, which a certificate made before
the pod existed cannot name): the CA is the trust boundary, so give netcoll a
CA of its own. ``check_hostname=True`` (``NETCOLL_TLS_CHECK_HOSTNAME=1``) makes
clients check the server's name or IP against its certificate's SANs too.

Authentication on top stays the token handshake (:mod:`.auth`): TLS proves
"holds a certificate of this CA", the tokens say "member" or "client".

This module is imported by ``netcoll health``: standard library (and
:mod:`netcoll.errors`, :mod:`netcoll.settings`, :mod:`.tlstuning`) only.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .. import settings
from ..errors import ConfigError
from . import tlstuning

CERT_ENV: Final = settings.registry.TLS_CERT.name
KEY_ENV: Final = settings.registry.TLS_KEY.name
CA_ENV: Final = settings.registry.TLS_CA.name
CHECK_HOSTNAME_ENV: Final = settings.registry.TLS_CHECK_HOSTNAME.name
MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2
#: seconds an orderly TLS close waits for the peer's close_notify
SHUTDOWN_TIMEOUT: Final = 5.0


class TlsConfigError(ConfigError):
    """A TLS setting or file is unusable; ``str()`` is one line naming it
    (a :class:`~netcoll.ConfigError`, so also a ``ValueError``)."""


def _no_password() -> str:
    raise TlsConfigError("the private key is encrypted; netcoll needs an unencrypted key file (mode 0600)")


@dataclass(frozen=True)
class TlsConfig:
    """Mutual TLS settings: PEM file paths.

    Args:
        cert: this process's certificate (may include the chain up to the CA).
        key: its private key (unencrypted PEM).
        ca: the CA certificate(s) every peer's certificate must chain to.
        check_hostname: clients also check the server's host name / IP
            against its certificate (default off: see the module docs).

    Raises :class:`TlsConfigError` when a file cannot be read or the key does
    not belong to the certificate.
    """

    cert: str
    key: str
    ca: str
    check_hostname: bool = False
    #: how errors name the three settings (flags or variables)
    names: tuple[str, str, str] = field(default=("cert", "key", "ca"), repr=False, compare=False)
    _contexts: dict[str, ssl.SSLContext] = field(default_factory=dict, init=False, repr=False, compare=False)
    _tuning: dict[bool, tlstuning.Tuning] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
            elif not isinstance(value, str) or not value.strip():
                raise TlsConfigError(f"TLS {name} must be a file path, got {value!r}")
        self._contexts["server"] = self._context(ssl.PROTOCOL_TLS_SERVER)
        self._contexts["client"] = self._context(ssl.PROTOCOL_TLS_CLIENT)

    def _context(self, protocol: ssl._SSLMethod) -> ssl.SSLContext:
        ctx = ssl.SSLContext(protocol)
        ctx.minimum_version = MINIMUM_VERSION
        ctx.check_hostname = protocol == ssl.PROTOCOL_TLS_CLIENT and self.check_hostname
        ctx.verify_mode = ssl.CERT_REQUIRED
        cert, key, ca = (
            f"{name}={path!r}" for name, path in zip(self.names, (self.cert, self.key, self.ca), strict=True)
        )
        for path, what in ((self.cert, f"certificate {cert}"), (self.key, f"key {key}"), (self.ca, f"CA {ca}")):
            if not os.path.isfile(path) or not os.access(path, os.R_OK):
                why = "no such file" if not os.path.exists(path) else "not a readable file"
                raise TlsConfigError(f"TLS {what}: {why}")
        try:
            ctx.load_cert_chain(self.cert, self.key, password=_no_password)
        except ssl.SSLError as exc:
            why = f"{_reason(exc)} (is the key the certificate's, both PEM?)"
            raise TlsConfigError(f"TLS certificate {cert} / key {key}: {why}") from None
        except OSError as exc:
            raise TlsConfigError(f"TLS certificate {cert} / key {key}: {exc.strerror or exc}") from None
        try:
            ctx.load_verify_locations(cafile=self.ca)
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(f"TLS CA {ca}: {_reason(exc)}") from None
        self._tuning[protocol == ssl.PROTOCOL_TLS_SERVER] = tlstuning.tune(ctx)
        return ctx

    def server_context(self) -> ssl.SSLContext:
        """For listeners: presents ``cert``, requires a client certificate of the CA."""
        return self._contexts["server"]

    def client_context(self) -> ssl.SSLContext:
        """For dialers: presents ``cert``, requires a server certificate of the CA."""
        return self._contexts["client"]

    @property
    def tuning(self) -> tlstuning.Tuning:
        """The OpenSSL settings :func:`~.tlstuning.tune` made on both contexts (AES-128-GCM
        first, read-ahead; each False where it could not set it on both)."""
        server, client = self._tuning[True], self._tuning[False]
        return tlstuning.Tuning(
            suites=server.suites and client.suites, read_ahead=server.read_ahead and client.read_ahead
        )

    def server_hostname(self, host: str) -> str | None:
        """What to pass as ``server_hostname`` when dialing ``host``."""
        return host.strip("[]") if self.check_hostname else None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TlsConfig | None:
        """From ``NETCOLL_TLS_CERT`` / ``_KEY`` / ``_CA`` (all three, or none: None)."""
        files = settings.tls_files(environ)
        return cls.from_paths(
            files.cert, files.key, files.ca, check_hostname=files.check_hostname, names=(CERT_ENV, KEY_ENV, CA_ENV)
        )

    @classmethod
    def from_paths(
        cls,
        cert: str | None,
        key: str | None,
        ca: str | None,
        *,
        check_hostname: bool = False,
        names: tuple[str, str, str] = ("--tls-cert", "--tls-key", "--tls-ca"),
    ) -> TlsConfig | None:
        """All three paths, or none of them (None); ``names`` name them in errors."""
        given = {name: (value or "").strip() for name, value in zip(names, (cert, key, ca), strict=True)}
        if not any(given.values()):
            return None
        missing = [name for name, value in given.items() if not value]
        if missing:
            have = ", ".join(name for name, value in given.items() if value)
            raise TlsConfigError(
                f"TLS needs a certificate, its key and the CA: {have} set but not {', '.join(missing)}"
            )
        cert_, key_, ca_ = given.values()
        return cls(cert_, key_, ca_, check_hostname=check_hostname, names=names)


def coerce(value: Any) -> TlsConfig | None:
    """A ``tls=`` argument: a :class:`TlsConfig`, None, or a mapping with
    ``cert``, ``key`` and ``ca`` (and optionally ``check_hostname``)."""
    if value is None or isinstance(value, TlsConfig):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"cert", "key", "ca", "check_hostname"}
        if unknown or not {"cert", "key", "ca"} <= set(value):
            raise TlsConfigError(f"tls= needs the keys cert, key and ca (and optionally check_hostname), got {value!r}")
        return TlsConfig(**value)
    raise TlsConfigError(f"tls= must be a netcoll.TlsConfig, a mapping or None, got {type(value).__name__}")


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason.lower().replace("_", " ")
    return str(getattr(exc, "strerror", None) or exc)


def describe_failure(exc: BaseException) -> str:
    """A failed TLS handshake, in words (``certificate verify failed: unable to get local issuer...``)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return _reason(exc)
    if isinstance(exc, ConnectionError) and not str(exc):
        return "the peer closed the connection during the TLS handshake (does it trust this side's CA?)"
    return str(exc) or type(exc).__name__


__all__ = [
    "CA_ENV",
    "CERT_ENV",
    "CHECK_HOSTNAME_ENV",
    "KEY_ENV",
    "TlsConfig",
    "TlsConfigError",
    "coerce",
    "describe_failure",
]
