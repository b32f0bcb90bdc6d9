"""What every part of the API stands on: its names, limits, scalar types and the ApiModel base.

Every API object is an :class:`ApiModel`: camelCase on the wire, unknown fields refused, and its
cross-field rules (``_rules``, :class:`~pd_operator.rules.Rule`: CEL for the API server, Python for
pydantic, one message) checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from pd_operator.rules import Rule, ValueRule, violations

GROUP = "pd.serving.dev"
VERSION = "v1alpha1"
KIND = "PDDeployment"
PLURAL = "pddeployments"
SINGULAR = "pddeployment"
SHORT_NAME = "pdd"
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_IMAGE = "ghcr.io/pd-serving/pd-runtime:0.1.0"
DEFAULT_PROXY_PORT = 8000
DEFAULT_ADMIN_PORT = 8001


RUN_PROBE_ANNOTATION = f"{GROUP}/run-goodput-probe"
# Engines per role in one pod (xPyD); with one proxy, 8 GPUs and TP >= 1 more never fit a node.
MAX_ROLE_INSTANCES = 8
MAX_REPLICAS = 64


Name = Annotated[str, StringConstraints(min_length=1, max_length=253)]
Text = Annotated[str, StringConstraints(max_length=1024)]
Quantity = Annotated[str, StringConstraints(max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|m)?$")]
Port = Annotated[int, Field(ge=1, le=65535)]
Arg = Annotated[str, StringConstraints(max_length=4096)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")]


class ApiModel(BaseModel):
    """Base of every API object: camelCase on the wire, unknown fields rejected, CEL rules checked."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        use_attribute_docstrings=False,
    )
    _rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> ApiModel:
        failed = violations(type(self)._rules, self)
        if failed:
            raise PydanticCustomError(
                "spec_rule",
                "{summary}",
                {"summary": "; ".join(v.message for v in failed), "violations": failed},
            )
        return self


@dataclass(frozen=True)
class Checked:
    """``Annotated`` metadata: ``rule`` checked by pydantic and placed in the value's CRD schema."""

    rule: ValueRule

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["x-kubernetes-validations"] = [self.rule.crd_entry()]
        return json_schema

    def _check(self, value: Any) -> Any:
        if not self.rule.check(value):
            raise PydanticCustomError("value_rule", "{message}", {"message": self.rule.message_for(value)})
        return value


class EnvVar(ApiModel):
    """An environment variable for an engine container (literal value)."""

    name: EnvName = Field(description="Variable name.")
    value: Text = Field("", description="Literal value.")


class Resources(ApiModel):
    """Compute resources of a container, as in a Pod (GPU and RDMA resources are added by the operator)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description=(
            "Minimum resources, e.g. cpu: 16, memory: 256Gi; each key given replaces the operator's default "
            "(engines: 4 CPUs and 16Gi plus /dev/shm per GPU; proxy: cpu 500m, memory 256Mi)."
        ),
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description=(
            "Maximum resources. Memory-backed /dev/shm counts against the memory limit. The proxy defaults to "
            "cpu 2, memory 1Gi; engines have no CPU or memory limit unless qosClass is Guaranteed."
        ),
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the PDDeployment's namespace."""

    name: Name = Field(description="Secret name.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field("token", description="Key.")
