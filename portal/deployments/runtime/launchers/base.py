"""The one interface the rollout controller uses to run instances, whatever runs them.

The controller never keeps state in memory between steps: it asks the launcher what is running
(:meth:`Launcher.observe`), compares that with what the deployment wants, and takes one step
(:meth:`Launcher.start`, :meth:`Launcher.stop`, :meth:`Launcher.set_traffic`). So every
method here must be idempotent and must read its truth from the outside world (processes and
their run directories, or the Kubernetes API), never from the calling worker's memory: a worker
killed between two calls leaves nothing behind that the next worker cannot see.

Instances are grouped by (model, version): a :class:`VersionSet`. A Red-Black rollout has two
sets behind one route; a Versioned deployment has one set behind its own route.
"""

from __future__ import annotations

import abc
import hashlib
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from portal.core.errors import Unavailable
from serving.instance.engines import engine_for_gpus


def dns_label(*parts: str) -> str:
    """A valid DNS label (≤ 63 characters) from ``parts``; too long a name keeps a hash."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-')}-{digest}"


@dataclass(frozen=True)
class Shape:
    """What an instance needs from a machine: an operator-defined ``InstanceType``."""

    name: str
    gpus: int = 0
    cpus: int = 1
    memory_gib: int = 4
    accelerator: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    #: ``tritonserver``, ``cpu``, or ``auto`` (any GPU means tritonserver).
    engine: str = "auto"

    @property
    def serving_engine(self) -> str:
        """The engine an instance of this shape runs (``serving.instance --engine``)."""
        return engine_for_gpus(self.gpus) if self.engine == "auto" else self.engine


@dataclass(frozen=True)
class VersionSet:
    """The instances of one model version for one deployment.

    ``key`` is stable and safe as a DNS label and a directory name (``team-model-v3-d12``), so
    launchers use it to name what they create (a run directory, a Kubernetes Deployment).
    """

    deployment_id: int
    team: str
    model: str
    version: int
    #: The Triton model name the instance serves (``team--model``).
    served_model_name: str
    package_path: Path
    package_digest: str
    #: The version's weights in the model cache, mounted read-only into the instance.
    weights_dir: Path
    shape: Shape
    #: The serving image of the version's platform release (used where instances are containers).
    image: str = ""

    @property
    def key(self) -> str:
        return dns_label(self.team, self.model, f"v{self.version}", f"d{self.deployment_id}")


@dataclass(frozen=True)
class RegionConfig:
    """What a launcher needs to know of the region it launches in (an operator's ``Region``,
    with blanks already filled from the platform's settings)."""

    name: str
    #: Local launcher: where instances' run directories go.
    run_root: Path
    #: The Redis prefix of the routing table this region's gateways follow.
    gateway_prefix: str
    #: Kubernetes launcher: the kubeconfig context ("" for in-cluster or the current one).
    kubernetes_context: str = ""
    kubernetes_namespace: str = ""


class Health(StrEnum):
    """What a launcher can see of one instance."""

    STARTING = "starting"  # launched, not yet answering /v2/health/ready
    READY = "ready"  # /v2/health/ready answers 200
    UNHEALTHY = "unhealthy"  # was ready, now failing its health check but still running
    DRAINING = "draining"  # told to stop, finishing what it has
    EXITED = "exited"  # gone after being told to stop
    CRASHED = "crashed"  # gone without being told to stop, or failed to start


@dataclass(frozen=True)
class ObservedInstance:
    name: str
    health: Health
    #: URLs the gateway and the metrics reader use: ``openai``, ``kserve_http``, ``kserve_grpc``,
    #: ``metrics`` (those the launcher knows).
    endpoints: dict[str, str] = field(default_factory=dict)
    message: str = ""


@dataclass(frozen=True)
class TrafficShare:
    """One version's share of a route: ``weight`` percent over its listed ready instances."""

    version_set: VersionSet
    weight: int
    instances: tuple[ObservedInstance, ...]


@dataclass(frozen=True)
class Route:
    """A stable endpoint: per model for Red-Black, per (model, version) for Versioned.

    ``path`` is the gateway path prefix (``team/model`` or ``team/model/versions/3``); shares'
    weights sum to 100 unless the route has nothing to serve yet (no shares).
    """

    deployment_id: int
    path: str
    shares: tuple[TrafficShare, ...]
    #: The deployment may be scaled to zero: a gateway with no ready instance for the route
    #: holds its requests and wakes the deployment instead of answering 503 at once.
    wake: bool = False


#: The most one :meth:`Launcher.read_log` call returns: a page polling a log never makes the
#: portal hold or send more than this, however large the log has grown.
LOG_CHUNK_BYTES = 256 * 1024
LOG_CHUNK_LINES = 2000
#: How many lines a first read (no cursor) returns: the end of the log, not its beginning.
LOG_DEFAULT_TAIL = 200


class LogCursorError(ValueError):
    """A ``since`` cursor this launcher did not hand out (the API answers 400)."""


class LogUnavailable(Unavailable):
    """The log's source did not answer (the API answers 503): e.g. the cluster's API server."""


@dataclass(frozen=True)
class LogChunk:
    """A bounded piece of an instance's log.

    ``next`` is an opaque cursor: passed back as ``since``, the next read starts right after
    these lines. ``ended`` says the instance is gone and this chunk reaches the end of its log,
    so a reader following it can stop.
    """

    lines: list[str]
    next: str
    ended: bool


class Launcher(abc.ABC):
    """Start, stop (with drain) and observe instances, and point a route's traffic at them."""

    #: The value stored in ``Instance.launcher``.
    kind: str

    @abc.abstractmethod
    def start(self, version_set: VersionSet, count: int) -> list[str]:
        """Start ``count`` more instances of the set; return the names of those it can name now
        (a launcher that learns names later, like Kubernetes, returns an empty list and the
        instances appear in :meth:`observe`)."""

    @abc.abstractmethod
    def stop(self, version_set: VersionSet, names: list[str], drain_seconds: float) -> None:
        """Stop the named instances, letting each finish its in-flight requests for up to
        ``drain_seconds``. Returns without waiting; :meth:`observe` shows them draining, then
        exited. Stopping an instance already gone is not an error."""

    @abc.abstractmethod
    def observe(self, version_set: VersionSet) -> list[ObservedInstance]:
        """Every instance of the set the launcher can see, including exited and crashed ones
        it has not yet forgotten (see :meth:`forget`)."""

    @abc.abstractmethod
    def forget(self, version_set: VersionSet, names: list[str]) -> None:
        """Drop what is left of exited or crashed instances (run directories, pods' records)
        once the controller has recorded their end."""

    @abc.abstractmethod
    def set_traffic(self, routes: list[Route]) -> int:
        """Make ``routes`` the whole truth about traffic: the caller passes the routes of every
        live deployment this launcher serves, and any route not among them is removed. Returns
        a generation number for :meth:`traffic_applied`."""

    @abc.abstractmethod
    def traffic_applied(self, generation: int) -> bool:
        """Whether everything that routes requests has taken up that generation (so an instance
        left out of it receives no new requests and can be stopped)."""

    def last_requests(self) -> dict[str, float] | None:
        """When each route was last called (its path → Unix time), for retiring idle Versioned
        deployments; None when this launcher cannot tell, and then nothing is retired for
        idleness. The local launcher reads what its gateways record."""
        return None

    def gateway_observations(
        self, route: str, since: float, until: float
    ) -> list[dict[str, Any]] | None:
        """The KServe v2 inference requests the platform's gateways observed on ``route``
        (its path) within ``[since, until]``, each with the version that answered, for the
        canary analysis; None when this launcher's traffic does not pass them."""
        return None

    @abc.abstractmethod
    def read_log(
        self,
        version_set: VersionSet,
        name: str,
        *,
        since: str | None = None,
        tail: int = LOG_DEFAULT_TAIL,
    ) -> LogChunk:
        """At most :data:`LOG_CHUNK_LINES` lines (:data:`LOG_CHUNK_BYTES`) of the named
        instance's log: the last ``tail`` lines when ``since`` is None, else the lines after
        that cursor. An instance whose log is gone answers no lines and ``ended``. Raises
        :class:`LogCursorError` for a cursor it cannot read."""
