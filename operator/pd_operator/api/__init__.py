"""The PDDeployment API (pd.serving.dev/v1alpha1) as pydantic models: the single source of truth.

The CRD (crd.py), its documentation (docs/crd-reference.md) and the offline validation of
``pdctl render`` are all generated from these classes. Every field carries a description, because it
becomes what ``kubectl explain pdd.spec...`` prints. Cross-field rules live next to the model they
constrain as :class:`~pd_operator.rules.Rule` objects (CEL for the API server, Python for pydantic,
one message); see ``_rules`` on each class.

One module per concern, each standing only on those listed before it: ``shared`` (names, limits, the
ApiModel base), ``engines``, ``placement`` and ``serving`` (the spec's parts, independent of each
other), ``spec`` (PDDeploymentSpec and the rules across its parts), ``status`` (the status and the
PDDeployment object). This package hands on the names the operator uses; import anything else from its
module.
"""

from __future__ import annotations

from pd_operator.api.engines import ColocatedEngineSpec, DisaggregatedRoleSpec, EngineSettings
from pd_operator.api.placement import PROXY_SETTINGS_DIR, PodTemplateSpec
from pd_operator.api.serving import DEFAULT_METRICS_PEER, AutoscalingSpec, EndpointPickerSpec, GoodputProbeSpec
from pd_operator.api.shared import (
    API_VERSION,
    DEFAULT_IMAGE,
    GROUP,
    KIND,
    MAX_ROLE_INSTANCES,
    PLURAL,
    RUN_PROBE_ANNOTATION,
    SHORT_NAME,
    SINGULAR,
    VERSION,
)
from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.api.status import (
    AllocatedDevice,
    AutoscalingStatus,
    AutotuneStatus,
    AutotuneTrial,
    CapacityStatus,
    Condition,
    ConditionStatus,
    DemandStatus,
    EngineTransferStatus,
    GoodputStatus,
    GpuAssignment,
    LatencyStats,
    PDDeployment,
    PDDeploymentStatus,
    Phase,
    ProbeMeasured,
    ProbeSlo,
    ProbeState,
    ReplicaStatus,
    RoleGpus,
    RoleStatus,
    RouterStatus,
    ScaleRecommendation,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_IMAGE",
    "DEFAULT_METRICS_PEER",
    "GROUP",
    "KIND",
    "MAX_ROLE_INSTANCES",
    "PLURAL",
    "PROXY_SETTINGS_DIR",
    "RUN_PROBE_ANNOTATION",
    "SHORT_NAME",
    "SINGULAR",
    "VERSION",
    "AllocatedDevice",
    "AutoscalingSpec",
    "AutoscalingStatus",
    "AutotuneStatus",
    "AutotuneTrial",
    "CapacityStatus",
    "ColocatedEngineSpec",
    "Condition",
    "ConditionStatus",
    "DemandStatus",
    "DisaggregatedRoleSpec",
    "EndpointPickerSpec",
    "EngineSettings",
    "EngineTransferStatus",
    "GoodputProbeSpec",
    "GoodputStatus",
    "GpuAssignment",
    "LatencyStats",
    "PDDeployment",
    "PDDeploymentSpec",
    "PDDeploymentStatus",
    "Phase",
    "PodTemplateSpec",
    "ProbeMeasured",
    "ProbeSlo",
    "ProbeState",
    "ReplicaStatus",
    "RoleGpus",
    "RoleStatus",
    "RouterStatus",
    "ScaleRecommendation",
]
