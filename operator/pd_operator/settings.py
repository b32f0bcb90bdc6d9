"""The operator's settings, parsed once at startup (from `pdctl operator` flags), never at import."""

from __future__ import annotations

from dataclasses import dataclass

from pd_operator.policy import DEFAULT_POLICY, TenancyPolicy
from pd_operator.render import OPERATOR_NAMESPACE

FIELD_MANAGER = "pd-operator"


@dataclass(frozen=True)
class Settings:
    resync_seconds: float = 5.0  # period of the status timer per PDDeployment
    drift_repair_seconds: float = (
        300.0  # how often the Service/NetworkPolicy are re-applied; spec changes apply at once
    )
    proxy_timeout_seconds: float = 2.0  # GET of the proxy's admin /status
    # how long the serving pod's node may be NotReady or unreachable before the pod is force-deleted and
    # recreated elsewhere: the cluster's default not-ready/unreachable toleration (DefaultTolerationSeconds);
    # a pod's own shorter tolerationSeconds for those taints wins, one that tolerates them forever opts out
    node_lost_grace_seconds: float = 300.0
    field_manager: str = FIELD_MANAGER  # server-side apply owner of the children's fields
    probe_image: str | None = None  # image of the goodput probe Jobs (the operator's); None: the runtime image
    # where the operator runs (--operator-namespace, POD_NAMESPACE): the serving pods admit it from there only
    operator_namespace: str = OPERATOR_NAMESPACE
    policy: TenancyPolicy = DEFAULT_POLICY  # what a PDDeployment may ask for (--policy FILE, the chart's ConfigMap)
