"""One configuration model per ``netcoll`` command (coordinator, rank, status, submit,
up), each a :class:`~netcoll.config.base.Settings`. See :mod:`netcoll.config`."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from .base import (
    COORDINATOR_HTTP_PORT,
    COORDINATOR_PORT,
    DEFAULT_COORDINATOR,
    UNEXPANDED,
    LogLevel,
    Settings,
    http_port_after,
)

log = logging.getLogger("netcoll.config")


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
            if UNEXPANDED.match(text):  # k8s leaves $(VAR) as is when VAR is not defined
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
        from ..sizes import parse_size

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
        from ..sizes import parse_size

        return parse_size(v)

    @property
    def coordinator_http_port(self) -> int | None:
        if "http_port" in self.model_fields_set:
            return self.http_port
        return int(http_port_after(self.port))


__all__ = ["ClientConfig", "CoordinatorConfig", "RankConfig", "StatusConfig", "SubmitConfig", "UpConfig"]
