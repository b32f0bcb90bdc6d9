"""Pure: what one reconciliation asks the shell to do, in order (:data:`Action`), and the :class:`Decision` that
carries them with the status. Each action has a key ("<verb> <Kind>/<name>") under which a failure comes back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pd_operator.api import PDDeploymentStatus
from pd_operator.observe import Event
from pd_operator.refusals import ApiFailure, Refusal, refusal

Obj = dict[str, Any]


@dataclass(frozen=True)
class _ObjectAction:
    """An action on a whole rendered object; its key names the verb and the object."""

    obj: Obj
    verb: ClassVar[str]

    @property
    def key(self) -> str:
        return f"{self.verb} {self.obj['kind']}/{self.obj['metadata']['name']}"


@dataclass(frozen=True)
class Apply(_ObjectAction):
    """Server-side apply of a child: creates it, repairs drift, or changes nothing."""

    verb = "apply"


@dataclass(frozen=True)
class Create(_ObjectAction):
    verb = "create"


@dataclass(frozen=True)
class CreateSecret(_ObjectAction):
    """Create a Secret unless one of its name exists, each of ``keys`` a random value the shell draws
    then. Never applied: a resync never changes what the running containers hold."""

    keys: tuple[str, ...] = ()
    verb = "create"


@dataclass(frozen=True)
class Delete:
    """Delete an object; with ``uid``, only that object (a precondition: never one that replaced it)."""

    kind: str
    name: str
    grace_seconds: int | None = None  # 0: force, for a pod whose kubelet will never confirm its end
    uid: str | None = None

    @property
    def key(self) -> str:
        return f"delete {self.kind}/{self.name}"


@dataclass(frozen=True)
class Emit:
    event: Event

    @property
    def key(self) -> str:
        return f"emit {self.event.reason}"


@dataclass(frozen=True)
class Scale:
    """spec.replicas through the scale subresource (spec.autoscaling's decision)."""

    name: str
    replicas: int
    kind: ClassVar[str] = "PDDeployment"

    @property
    def key(self) -> str:
        return f"scale {self.kind}/{self.name}"


@dataclass(frozen=True)
class Adopt:
    """Make this PDDeployment an orphan's controller: a strategic merge patch of its owner references that
    names its uid, so an object that replaced it is refused (422 on ``metadata.uid``), as Kubernetes'
    controllers adopt."""

    kind: str
    name: str
    uid: str
    owner: Obj  # the owner reference

    @property
    def key(self) -> str:
        return f"adopt {self.kind}/{self.name}"

    @property
    def patch(self) -> Obj:
        return {"metadata": {"uid": self.uid, "ownerReferences": [self.owner]}}


Action = Adopt | Apply | Create | CreateSecret | Delete | Emit | Scale


@dataclass(frozen=True)
class Decision:
    status: PDDeploymentStatus
    patch: Obj  # JSON merge patch of .status; empty when nothing changed
    actions: tuple[Action, ...]

    @property
    def events(self) -> list[Event]:
        return [a.event for a in self.actions if isinstance(a, Emit)]


def refused(key: str, failure: ApiFailure) -> Refusal:
    """What the API server's failure of the action ``key`` refused."""
    return refusal(key.split(" ", 1)[1], failure)  # key: "<verb> <Kind>/<name>"
