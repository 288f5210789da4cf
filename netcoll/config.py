"""Configuration of the ``netcoll`` commands: one pydantic model per command.

Each model merges, in increasing priority: its defaults, ``NETCOLL_*``
environment variables, then command-line flags (a flag always wins)::

    cfg = RankConfig.load({"port": "29500"}, os.environ)

The variables (``NETCOLL_COORDINATOR``, ``NETCOLL_TOKEN``, ``NETCOLL_HOST``, ...) are
declared in :mod:`netcoll.settings` (name, default, meaning, which command reads them:
the README's "Settings" table is generated from it) and read through
:func:`netcoll.settings.raw`; each model's :attr:`Settings.ENV` maps its fields to them.
``NETCOLL_TRANSPORT`` and ``NETCOLL_RECV_WINDOW`` are read where links are made
(:class:`netcoll.links.factory.LinkConfig`), so they apply to rank daemons and embedded
ranks alike.

An empty variable counts as unset (compose passes ``NETCOLL_TOKEN:`` through
empty when the caller has none).

Secure by default: a coordinator or rank daemon asked to listen on an address
other than loopback with neither a token nor TLS refuses to start
(:meth:`Settings.require_credentials`, exit 2) unless ``--insecure``. :meth:`Settings.load` raises
:class:`ConfigError` with one line naming the flag or variable at fault.

This module does not import numpy (``netcoll health`` stays cheap).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import settings
from .errors import ConfigError
from .mesh.auth import is_loopback

if TYPE_CHECKING:
    from .mesh.certs import TlsConfig

DEFAULT_COORDINATOR = "127.0.0.1:29400"
COORDINATOR_PORT = 29400
COORDINATOR_HTTP_PORT = 29401
#: the ports the deploy files pin for rank daemons (`netcoll rank` itself binds any free ports)
RANK_PORT = 29500
RANK_HTTP_PORT = 29501
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

_OFF = ("off", "none", "no", "false", "disabled", "-1")
_UNEXPANDED = re.compile(r"^\$\(?\{?[A-Za-z_][A-Za-z0-9_]*\}?\)?$")  # $(VAR) / ${VAR} / $VAR left as is
_SERVICE_LINK = re.compile(r"^(tcp|udp)://", re.IGNORECASE)

log = logging.getLogger("netcoll.config")

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
        from .mesh.certs import TlsConfig, TlsConfigError

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
        from .mesh.auth import read_token

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


class CoordinatorConfig(Settings):
    """``netcoll coordinator``."""

    ENV: ClassVar[dict[str, str]] = {
        "host": "NETCOLL_HOST",
        "port": "NETCOLL_PORT",
        "http_port": "NETCOLL_HTTP_PORT",
        "http_host": "NETCOLL_HTTP_HOST",
        "token": "NETCOLL_TOKEN",
        "client_token": "NETCOLL_CLIENT_TOKEN",
        "token_file": "NETCOLL_TOKEN_FILE",
        "client_token_file": "NETCOLL_CLIENT_TOKEN_FILE",
        "insecure": "NETCOLL_INSECURE",
        "log_level": "NETCOLL_LOG_LEVEL",
        "state_dir": "NETCOLL_STATE_DIR",
        "keep_jobs": "NETCOLL_KEEP_JOBS",
    }

    host: str = "127.0.0.1"
    port: int = Field(default=COORDINATOR_PORT, ge=0, le=65535)
    #: not given: ``port + 1`` (:func:`http_port_after`), as ``netcoll up`` does; None: off
    http_port: int | None = Field(default=COORDINATOR_HTTP_PORT, ge=0, le=65535)
    http_host: str | None = None
    token: str | None = None
    client_token: str | None = None
    token_file: str | None = None
    client_token_file: str | None = None
    insecure: bool = False
    log_level: LogLevel = "info"
    ready_file: str | None = None
    #: the job journal's directory (netcoll.service.journal); None keeps jobs in memory only
    state_dir: str | None = Field(default=None, min_length=1)
    #: finished jobs kept queryable (in memory and in the journal)
    keep_jobs: int = Field(default=1000, ge=0, le=1_000_000)

    @model_validator(mode="before")
    @classmethod
    def _http_port_follows_port(cls, values: Any) -> Any:
        """``--port 29700`` alone serves HTTP on 29701, never on the default 29401."""
        if isinstance(values, dict) and "http_port" not in values and "port" in values:
            return {**values, "http_port": http_port_after(values["port"])}
        return values


class RankConfig(Settings):
    """``netcoll rank``."""

    ENV: ClassVar[dict[str, str]] = {
        "coordinator": "NETCOLL_COORDINATOR",
        "host": "NETCOLL_HOST",
        "port": "NETCOLL_PORT",
        "http_port": "NETCOLL_HTTP_PORT",
        "http_host": "NETCOLL_HTTP_HOST",
        "rank_hint": "NETCOLL_RANK_HINT",
        "advertise_host": "NETCOLL_ADVERTISE_HOST",
        "token": "NETCOLL_TOKEN",
        "token_file": "NETCOLL_TOKEN_FILE",
        "insecure": "NETCOLL_INSECURE",
        "log_level": "NETCOLL_LOG_LEVEL",
    }

    coordinator: str = DEFAULT_COORDINATOR
    host: str = "0.0.0.0"
    #: 0: any free port (several daemons per host); the bound port is advertised
    port: int = Field(default=0, ge=0, le=65535)
    #: 0: any free port; the bound port is logged, in the ready file and in `netcoll status`
    http_port: int | None = Field(default=0, ge=0, le=65535)
    http_host: str | None = None
    rank_hint: int | None = Field(default=None, ge=0, le=1_000_000)
    advertise_host: str | None = None
    member_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:@-]+$")
    heartbeat: float = Field(default=2.0, gt=0, le=60)
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False
    log_level: LogLevel = "info"
    ready_file: str | None = None

    @field_validator("rank_hint", mode="before")
    @classmethod
    def _hint(cls, v: Any) -> Any:
        if isinstance(v, str):
            text = v.strip()
            if text == "" or text.lower() in ("none", "auto"):
                return None
            if _UNEXPANDED.match(text):  # k8s leaves $(VAR) as is when VAR is not defined
                log.warning("rank hint %r was not expanded by the orchestrator; ignoring it", text)
                return None
        return v

    @property
    def local_host(self) -> str | None:
        """Connect to the coordinator from the listening address when it is a specific one."""
        return None if self.host in ("", "0.0.0.0", "::") else self.host


class ClientConfig(Settings):
    """Common to the client commands (``submit``, ``status``)."""

    ENV: ClassVar[dict[str, str]] = {
        "coordinator": "NETCOLL_COORDINATOR",
        "token": "NETCOLL_TOKEN",
        "client_token": "NETCOLL_CLIENT_TOKEN",
        "token_file": "NETCOLL_TOKEN_FILE",
        "client_token_file": "NETCOLL_CLIENT_TOKEN_FILE",
    }

    coordinator: str = DEFAULT_COORDINATOR
    #: the member token (the operator's); used only when no client token is given
    token: str | None = None
    #: the client token: enough to submit, watch, get and cancel jobs and read status
    client_token: str | None = None
    token_file: str | None = None
    client_token_file: str | None = None
    json_output: bool = False
    connect_timeout: float = Field(default=10.0, gt=0, le=3600)

    FLAGS: ClassVar[dict[str, str]] = {"json_output": "--json"}


class StatusConfig(ClientConfig):
    """``netcoll status``."""

    jobs: int = Field(default=10, ge=0, le=1000)


class SubmitConfig(ClientConfig):
    """``netcoll submit``: where to send the job and the job itself (validated
    again, fully, by :class:`netcoll.service.jobs.JobSpec`)."""

    op: str
    size: int = 1 << 20
    dtype: str = "float32"
    reduce_op: str = "sum"
    root: int = Field(default=0, ge=0)
    algorithm: str = "auto"
    #: none, fp16, bf16, int8 (netcoll.compression); None: the rank daemons' NETCOLL_COMPRESSION
    compression: str | None = None
    iters: int = Field(default=1, ge=1, le=100_000)
    warmup: int = Field(default=0, ge=0, le=10_000)
    world_size: int | None = Field(default=None, ge=1)
    deadline: float = Field(default=300.0, gt=0, le=7 * 86400)
    input: str | None = None
    output: str | None = None
    #: progress on stderr; None: when stderr is a terminal
    progress: bool | None = None

    FLAGS: ClassVar[dict[str, str]] = {"json_output": "--json", "reduce_op": "--op", "op": "OP"}

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        from .sizes import parse_size

        return parse_size(v)

    def job_fields(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~netcoll.service.jobs.JobSpec`."""
        fields: dict[str, Any] = {
            "op": self.op,
            "dtype": self.dtype,
            "reduce_op": self.reduce_op,
            "root": self.root,
            "algorithm": self.algorithm,
            "compression": self.compression,
            "iters": self.iters,
            "warmup": self.warmup,
            "world_size": self.world_size,
            "deadline": self.deadline,
            "output": self.output,
        }
        if self.input:
            fields.update(data="buffer", input=self.input)
        elif self.op != "barrier":
            fields["size"] = self.size
        return fields


class UpConfig(Settings):
    """``netcoll up``: a coordinator and ``ranks`` daemons as local processes."""

    ENV: ClassVar[dict[str, str]] = {
        "host": "NETCOLL_HOST",
        "port": "NETCOLL_PORT",
        "token": "NETCOLL_TOKEN",
        "token_file": "NETCOLL_TOKEN_FILE",
        "log_level": "NETCOLL_LOG_LEVEL",
    }

    ranks: int = Field(default=4, ge=1, le=256)
    host: str = "127.0.0.1"
    port: int = Field(default=COORDINATOR_PORT, ge=0, le=65535)
    http_port: int | None = Field(default=None, ge=0, le=65535)
    token: str | None = None
    token_file: str | None = None
    log_level: LogLevel = "warning"
    demo: bool = False
    size: int = 1 << 20
    iters: int = Field(default=3, ge=1, le=100_000)
    ready_timeout: float = Field(default=60.0, gt=0, le=3600)

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        from .sizes import parse_size

        return parse_size(v)

    @property
    def coordinator_http_port(self) -> int | None:
        if "http_port" in self.model_fields_set:
            return self.http_port
        return int(http_port_after(self.port))


__all__ = [
    "DEFAULT_COORDINATOR",
    "is_loopback",
    "ClientConfig",
    "ConfigError",
    "CoordinatorConfig",
    "RankConfig",
    "Settings",
    "StatusConfig",
    "SubmitConfig",
    "UpConfig",
    "check_address",
    "http_port_after",
]
