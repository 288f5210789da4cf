"""The rank service: rank daemons, the coordinator's job service, and the Client.

- :class:`~netcoll.service.daemon.RankDaemon` — ``netcoll rank``
- :class:`~netcoll.service.scheduler.JobService` — added to a Coordinator by ``netcoll coordinator``
- :class:`~netcoll.service.client.Client` — submit jobs from Python (``netcoll submit`` uses it)
"""

from __future__ import annotations

from .client import Client
from .daemon import RankDaemon
from .jobs import JobSpec, JobState, parse_size
from .scheduler import JobService

__all__ = ["Client", "RankDaemon", "JobService", "JobSpec", "JobState", "parse_size"]
