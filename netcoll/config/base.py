"""The base of every command's configuration (:class:`Settings`: defaults, then
``NETCOLL_*`` variables, then flags; credentials and TLS fields; the checks they share)
and the address and port rules. See :mod:`netcoll.config`."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .. import settings
from ..errors import ConfigError
from ..mesh.auth import is_loopback

if TYPE_CHECKING:
    from ..mesh.certs import TlsConfig

DEFAULT_COORDINATOR = "127.0.0.1:29400"
COORDINATOR_PORT = 29400
COORDINATOR_HTTP_PORT = 29401
#: the ports the deploy files pin for rank daemons (`netcoll rank` itself binds any free ports)
RANK_PORT = 29500
RANK_HTTP_PORT = 29501
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

_OFF = ("off", "none", "no", "false", "disabled", "-1")
UNEXPANDED = re.compile(r"^\$\(?\{?[A-Za-z_][A-Za-z0-9_]*\}?\)?$")  # $(VAR) / ${VAR} / $VAR left as is
_SERVICE_LINK = re.compile(r"^(tcp|udp)://", re.IGNORECASE)


#: token field -> the field naming a file to read it from
_TOKEN_FILES = {"token": "token_file", "client_token": "client_token_file"}
#: the TLS fields every command has -> their environment variables
TLS_ENV = {
    "tls_cert": "NETCOLL_TLS_CERT",
    "tls_key": "NETCOLL_TLS_KEY",
    "tls_ca": "NETCOLL_TLS_CA",
    "tls_check_hostname": "NETCOLL_TLS_CHECK_HOSTNAME",
}


def check_address(value: str, default_port: int = COORDINATOR_PORT) -> str:
    """``host:port``, ``[v6]:port`` or a bare ``host`` (default port) -> ``host:port``."""
    text = value.strip()
    if _SERVICE_LINK.match(text):
        raise ValueError(
            "looks like a Kubernetes/Docker service-link variable, not HOST:PORT "
            "(set enableServiceLinks: false, or pass the flag)"
        )
    if not text:
        raise ValueError("address must be HOST:PORT, got an empty string")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"address must be HOST:PORT or [IPv6]:PORT, got {value!r}")
        port_s = rest[1:] if rest else str(default_port)
        host_out = f"[{host}]"
    elif text.count(":") == 1:
        host, _, port_s = text.partition(":")
        host_out = host
    elif ":" not in text:
        host, port_s, host_out = text, str(default_port), text
    else:
        raise ValueError(f"address must be HOST:PORT (write an IPv6 address as [ADDR]:PORT), got {value!r}")
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"address must be HOST:PORT with a host name, got {value!r}")
    if not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise ValueError(f"address must be HOST:PORT with a port in 1..65535, got {value!r}")
    return f"{host_out}:{int(port_s)}"


def http_port_after(port: Any) -> Any:
    """The HTTP port that goes with RPC port ``port`` when none is given: ``port + 1``
    (29400 -> 29401), any free port (0) for ``port`` 0 or 65535; ``port`` itself when it
    is not a number (its own check then says so)."""
    try:
        number = int(str(port).strip())
    except ValueError:
        return port
    return number + 1 if 0 < number < 65535 else 0


def _port(value: Any, *, allow_off: bool) -> Any:
    if isinstance(value, str):
        text = value.strip().lower()
        if _SERVICE_LINK.match(text):
            raise ValueError(
                "looks like a Kubernetes/Docker service-link variable, not a port "
                "(set enableServiceLinks: false, or pass the flag)"
            )
        if allow_off and text in _OFF:
            return None
    if isinstance(value, int) and allow_off and value == -1:
        return None
    return value


class Settings(BaseModel):
    """Base: defaults < ``NETCOLL_*`` environment < flags."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    #: field -> environment variable read for it
    ENV: ClassVar[dict[str, str]] = {}
    #: field -> the flag that sets it (for error messages)
    FLAGS: ClassVar[dict[str, str]] = {}

    #: mutual TLS (every command): certificate, key and CA files, all three or none
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_check_hostname: bool = False

    @classmethod
    def load(cls, flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Any:
        """Merge ``environ`` (only the variables in :attr:`ENV`) and ``flags``
        (``None`` values mean "not given"); validate; raise :class:`ConfigError`."""
        values: dict[str, Any] = {}
        source: dict[str, str] = {}
        for name, var in {**TLS_ENV, **cls.ENV}.items():
            raw = settings.raw(var, environ)
            if raw is not None and raw.strip() != "":
                values[name], source[name] = raw, var
        for name, value in (flags or {}).items():
            if value is not None and name in cls.model_fields:
                values[name], source[name] = value, cls._flag(name)
        cls._read_token_files(values, source)
        try:
            cfg = cls.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(cls._explain(exc, values, source)) from None
        cfg._check_tokens(source)
        cfg._tls(source)  # unreadable or mismatched files: a ConfigError now, not at the first connection
        return cfg

    def tls_config(self) -> TlsConfig | None:
        """The TLS settings as a :class:`~netcoll.TlsConfig` (None without TLS)."""
        return self._tls({})

    def _tls(self, source: Mapping[str, str]) -> TlsConfig | None:
        from ..mesh.certs import TlsConfig, TlsConfigError

        cert, key, ca = (source.get(f) or f"{self._flag(f)} / {TLS_ENV[f]}" for f in ("tls_cert", "tls_key", "tls_ca"))
        try:
            return TlsConfig.from_paths(
                self.tls_cert, self.tls_key, self.tls_ca, check_hostname=self.tls_check_hostname, names=(cert, key, ca)
            )
        except TlsConfigError as exc:
            raise ConfigError(f"invalid configuration: {exc}") from None

    @classmethod
    def _read_token_files(cls, values: dict[str, Any], source: dict[str, str]) -> None:
        """A token not given directly is read from its file (``NETCOLL_TOKEN_FILE``...)."""
        from ..mesh.auth import read_token

        for field, file_field in _TOKEN_FILES.items():
            if field not in cls.model_fields or file_field not in values:
                continue
            path = values[file_field]
            given = values.get(field)
            if isinstance(given, str) and given.strip():
                continue  # the token itself wins over its file
            try:
                token = read_token(None, str(path), "")
            except ValueError as exc:
                where = source.get(file_field) or cls._flag(file_field)
                why = str(exc).split(": ", 1)[-1]
                raise ConfigError(f"invalid configuration: {where}={path!r}: {why}") from None
            if token is not None:
                values[field], source[field] = token, source.get(file_field, cls._flag(file_field))

    def _check_tokens(self, source: Mapping[str, str]) -> None:
        client, member = getattr(self, "client_token", None), getattr(self, "token", None)
        if client is None or "host" not in type(self).model_fields:
            return  # only a server that holds a client token has rules about it
        if member is None:
            raise ConfigError(
                f"invalid configuration: {source.get('client_token', 'NETCOLL_CLIENT_TOKEN')} is set but "
                "NETCOLL_TOKEN is not: set a member token too (rank daemons would be unauthenticated)"
            )
        if client == member:
            raise ConfigError(
                "invalid configuration: NETCOLL_CLIENT_TOKEN must differ from NETCOLL_TOKEN "
                "(a client credential must never be able to join as a member)"
            )

    def require_credentials(self, what: str) -> None:
        """Secure by default: refuse to listen off loopback with no token unless ``insecure``."""
        host = str(getattr(self, "host", "127.0.0.1"))
        if getattr(self, "token", None) or self.tls_cert or getattr(self, "insecure", False) or is_loopback(host):
            return  # mutual TLS counts as credentials; roles (member / client) still need tokens
        clients = "; and NETCOLL_CLIENT_TOKEN for job submitters" if "client_token" in type(self).model_fields else ""
        raise ConfigError(
            f"refusing to start the {what} on {host} without credentials: set NETCOLL_TOKEN "
            f"(or NETCOLL_TOKEN_FILE{clients}) or TLS (--tls-cert/--tls-key/--tls-ca), listen on 127.0.0.1, "
            "or pass --insecure "
            "(NETCOLL_INSECURE=1) to let anyone who can reach it in"
        )

    @classmethod
    def _flag(cls, name: str) -> str:
        return cls.FLAGS.get(name, "--" + name.replace("_", "-"))

    @classmethod
    def _explain(cls, exc: ValidationError, values: Mapping[str, Any], source: Mapping[str, str]) -> str:
        parts = []
        for err in exc.errors(include_url=False):
            field = str(err["loc"][0]) if err.get("loc") else ""
            where = source.get(field) or cls._flag(field)
            if field in values:
                where = f"{where}={values[field]!r}"
            msg = str(err.get("msg", "invalid value"))
            msg = msg.removeprefix("Value error, ")
            parts.append(f"{where}: {msg}")
        return "invalid configuration: " + "; ".join(parts)

    # -- shared validators ---------------------------------------------------------------
    @field_validator("log_level", mode="before", check_fields=False)
    @classmethod
    def _log_level(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip().lower()
            v = {"warn": "warning", "fatal": "critical"}.get(v, v)
            if v not in LOG_LEVELS:
                raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}")
        return v

    @field_validator("coordinator", mode="before", check_fields=False)
    @classmethod
    def _coordinator(cls, v: Any) -> Any:
        return check_address(v) if isinstance(v, str) else v

    @field_validator(
        "token",
        "client_token",
        "token_file",
        "client_token_file",
        "tls_cert",
        "tls_key",
        "tls_ca",
        mode="before",
        check_fields=False,
    )
    @classmethod
    def _token(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip() == "":
            return None
        return v

    @field_validator("port", mode="before", check_fields=False)
    @classmethod
    def _listen_port(cls, v: Any) -> Any:
        return _port(v, allow_off=False)

    @field_validator("http_port", mode="before", check_fields=False)
    @classmethod
    def _http_port(cls, v: Any) -> Any:
        return _port(v, allow_off=True)

    @field_validator("host", "http_host", "advertise_host", mode="before", check_fields=False)
    @classmethod
    def _host(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("[") and v.endswith("]"):
                v = v[1:-1]
            if not v or any(c.isspace() for c in v) or "/" in v:
                raise ValueError("must be a host name or IP address")
        return v

    @property
    def level(self) -> int:
        return int(getattr(logging, str(getattr(self, "log_level", "info")).upper()))

    def redacted(self) -> dict[str, Any]:
        """The settings with the token hidden (for logs)."""
        data = self.model_dump()
        for field in _TOKEN_FILES:
            if data.get(field):
                data[field] = "***"
        return data


LogLevel = Literal["debug", "info", "warning", "error", "critical"]


__all__ = ["DEFAULT_COORDINATOR", "LogLevel", "Settings", "check_address", "http_port_after"]
