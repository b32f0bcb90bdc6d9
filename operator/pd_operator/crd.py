"""Generate the PDDeployment CRD from the pydantic models.

Pydantic's JSON schema is close to, but not, a Kubernetes structural schema. This module turns one into
the other: ``$ref`` inlined, ``title`` dropped, optional fields (``anyOf [X, null]``) become plain X
(absent means unset), ``const`` becomes a one-value enum, free-form maps become
``x-kubernetes-preserve-unknown-fields``, defaults of nested objects become ``{}`` so the API server
applies the leaf defaults (and CEL rules can rely on them), and each model's rules become its
``x-kubernetes-validations``. A map's key bounds (``propertyNames``, which apiextensions does not have and
the API server would drop silently) become a CEL rule on the map.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml
from pydantic import BaseModel

from pd_operator import api, conditions, naming

JsonSchema = dict[str, Any]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode", "description": "disaggregated or colocated"},
    {"name": "Transfer", "type": "string", "jsonPath": ".status.transfer", "description": "KV transfer mode"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready", "description": "Ready replicas / replicas"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase"},
    {
        "name": "Containers",
        "type": "string",
        "jsonPath": ".status.containersReady",
        "description": "Ready containers over every replica",
        "priority": 1,
    },
    {
        "name": "Available",
        "type": "integer",
        "jsonPath": ".status.availableReplicas",
        "description": "Replicas Ready with a verified KV transfer",
        "priority": 1,
    },
    {
        "name": "Router",
        "type": "string",
        "jsonPath": ".status.router.ready",
        "description": "Ready router pods / router pods (spec.router)",
        "priority": 1,
    },
    {
        "name": "Prefill GPUs",
        "type": "string",
        "jsonPath": ".status.gpuAssignment.prefill",
        "description": "GPUs of the prefill engine",
    },
    {
        "name": "Decode GPUs",
        "type": "string",
        "jsonPath": ".status.gpuAssignment.decode",
        "description": "GPUs of the decode engine",
    },
    {"name": "Goodput", "type": "string", "jsonPath": ".status.goodput.summary", "description": "Latest probe"},
    {
        "name": "vLLM",
        "type": "string",
        "jsonPath": ".status.engineVersion",
        "description": "vLLM release the engines run",
        "priority": 1,
    },
    {
        "name": "Capacity",
        "type": "string",
        "jsonPath": ".status.capacity.summary",
        "description": "Requests per second one replica holds within the SLO, and where that comes from",
        "priority": 1,
    },
    {
        "name": "Demand",
        "type": "string",
        "jsonPath": ".status.demand.summary",
        "description": "Requests per second the replicas' proxies see",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# `kubectl scale pdd/NAME --replicas N` and HorizontalPodAutoscalers go through this.
SCALE_SUBRESOURCE = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}


def _models_by_name(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from ``root``, keyed by the name pydantic uses in ``$defs``."""
    found: dict[str, type[BaseModel]] = {}
    pending: list[type[BaseModel]] = [root]
    while pending:
        model = pending.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for field in model.model_fields.values():
            pending.extend(_nested_models(field.annotation))
    return found


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _nested_models(arg)]


def _crd_default(model: type[BaseModel], name: str) -> Any:
    """The CRD default of a field: scalars as is, an all-default nested object as ``{}``, lists dumped."""
    field = model.model_fields[name]
    if field.default_factory is None:
        value = field.default
        return value if isinstance(value, str | int | float | bool) else None
    value = field.default_factory()  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        # The whole default object, not {}: the API server checks CEL rules against the default as
        # written, before nested defaults would fill it.
        return value.model_dump(exclude_none=True, by_alias=True)
    if isinstance(value, list) and value:
        return [v.model_dump(exclude_none=True, by_alias=True) if isinstance(v, BaseModel) else v for v in value]
    return None


def _openapi_v3_bounds(node: JsonSchema) -> None:
    """JSON Schema's numeric ``exclusiveMinimum: N`` is OpenAPI v3.0's ``minimum: N, exclusiveMinimum: true``."""
    for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        bound = node.get(exclusive)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            node[inclusive] = bound
            node[exclusive] = True


def _key_length_rule(bounds: JsonSchema) -> JsonSchema:
    """A map's ``propertyNames: {maxLength: N}`` as the CEL rule that enforces it."""
    if set(bounds) != {"maxLength"}:
        raise ValueError(f"unsupported map key schema (only maxLength converts to CEL): {bounds}")
    limit = bounds["maxLength"]
    return {"rule": f"self.all(k, size(k) <= {limit})", "message": f"keys must be at most {limit} characters"}


class _Converter:
    def __init__(self, root: type[BaseModel]) -> None:
        self.full = root.model_json_schema(by_alias=True, mode="validation")
        self.defs: dict[str, JsonSchema] = self.full.get("$defs", {})
        self.models = _models_by_name(root)

    def convert(self) -> JsonSchema:
        root = {k: v for k, v in self.full.items() if k != "$defs"}
        return self._node(root, next(iter(self.models.values())))

    def _node(self, node: JsonSchema, model: type[BaseModel] | None = None) -> JsonSchema:
        node = copy.deepcopy(node)
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            target = self._node(self.defs[name], self.models[name])
            return {**target, **{k: v for k, v in node.items() if k != "default"}}
        if "anyOf" in node:
            return self._optional(node)
        if "const" in node:
            node["enum"] = [node.pop("const")]
        key_bounds = node.pop("propertyNames", None)
        if key_bounds is not None:
            node.setdefault("x-kubernetes-validations", []).append(_key_length_rule(key_bounds))
        extra = node.pop("additionalProperties", None)
        if isinstance(extra, dict):
            node["additionalProperties"] = self._node(extra)
        elif extra is True or ("type" not in node and "enum" not in node):
            node["x-kubernetes-preserve-unknown-fields"] = True
            node.setdefault("type", "object")
        if node.get("default") is None:
            node.pop("default", None)
        node.pop("title", None)
        _openapi_v3_bounds(node)
        if "items" in node:
            node["items"] = self._node(node["items"])
        if "properties" in node:
            node["properties"] = {k: self._node(v) for k, v in node["properties"].items()}
            if model is not None:
                self._model_extras(node, model)
        return node

    def _optional(self, node: JsonSchema) -> JsonSchema:
        variants = [v for v in node.pop("anyOf") if v.get("type") != "null"]
        if len(variants) != 1:
            raise ValueError(f"unsupported union in schema: {variants}")
        merged = {**self._node(variants[0]), **{k: v for k, v in node.items() if k not in ("title", "default")}}
        return merged

    def _model_extras(self, node: JsonSchema, model: type[BaseModel]) -> None:
        rules = getattr(model, "_rules", ())
        if rules:
            node["x-kubernetes-validations"] = [rule.crd_entry() for rule in rules]
        for name, field in model.model_fields.items():
            alias = field.alias or name
            prop = node["properties"].get(alias)
            if prop is None:
                continue
            default = _crd_default(model, name)
            if default is not None:
                prop["default"] = default
            else:
                prop.pop("default", None)


def spec_schema() -> JsonSchema:
    """The OpenAPI v3 schema of a whole PDDeployment object (spec and status)."""
    schema = _Converter(api.PDDeployment).convert()
    props = schema["properties"]
    props["apiVersion"] = {"type": "string", "description": props["apiVersion"]["description"]}
    props["kind"] = {"type": "string", "description": props["kind"]["description"]}
    props["metadata"] = naming.name_schema()
    schema["required"] = ["spec"]
    return schema


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": [api.SHORT_NAME],
                "categories": ["all", "pd-serving"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": SCALE_SUBRESOURCE},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": spec_schema()},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `pdctl crd` from operator/pd_operator/api/. Do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


# ---- docs/crd-reference.md --------------------------------------------------------------------------


def _type_of(node: JsonSchema) -> str:
    kind = str(node.get("type", "object"))
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if kind == "array":
        return f"list of {_type_of(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of {_type_of(node['additionalProperties'])}"
    return kind


def _bounds(node: JsonSchema) -> str:
    parts = []
    lo_open, hi_open = node.get("exclusiveMinimum") is True, node.get("exclusiveMaximum") is True
    if "minimum" in node:
        parts.append(f"{'>' if lo_open else '>='} {node['minimum']}")
    if "maximum" in node:
        parts.append(f"{'<' if hi_open else '<='} {node['maximum']}")
    if "pattern" in node:
        parts.append(f"pattern `{node['pattern']}`")
    if "maxItems" in node:
        parts.append(f"at most {node['maxItems']} items")
    return ", ".join(parts)


def _default_cell(prop: JsonSchema, required: bool) -> str:
    if "default" not in prop:
        return "required" if required else ""
    return "its fields' defaults" if isinstance(prop["default"], dict) else f"`{json.dumps(prop['default'])}`"


def _rows(node: JsonSchema, path: str) -> list[str]:
    rows: list[str] = []
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        here = f"{path}.{name}"
        default = _default_cell(prop, name in required)
        desc = " ".join(str(prop.get("description", "")).split()).replace("|", "\\|")
        bounds = _bounds(prop)
        rows.append(f"| `{here}` | {_type_of(prop)} | {default} | {desc}{' (' + bounds + ')' if bounds else ''} |")
        child = prop.get("items", prop) if prop.get("type") == "array" else prop
        rows += _rows(child, here + ("[]" if prop.get("type") == "array" else ""))
    return rows


def _rules_section(node: JsonSchema, path: str) -> list[str]:
    lines = [f"- `{path}`: {r['message']}" for r in node.get("x-kubernetes-validations", [])]
    for name, prop in node.get("properties", {}).items():
        child = prop.get("items", prop) if prop.get("type") == "array" else prop
        lines += _rules_section(child, f"{path}.{name}" + ("[]" if prop.get("type") == "array" else ""))
    return lines


_PHASES = """## Reading the status

Phases: **Pending** (no pod yet, or not scheduled: the message quotes the scheduler), **Progressing**
(containers starting, or the pod rolling after a spec change), **Ready** (every container of every
replica ready),
**Degraded** (a container crashed or cannot start; the message carries its last termination message,
e.g. a failed launcher preflight; or the pod's node is NotReady or unreachable), **Failed** (invalid
spec, or the pod ended)."""

_STATUS_GUIDE = f"""The grace of `NodeLost` is the operator's `--node-lost-grace-seconds` (default 300, the cluster's
default toleration), shortened by the pod's own `tolerationSeconds` for `node.kubernetes.io/not-ready`/`unreachable`
(set them in `spec.node.tolerations`); a pod that tolerates them forever is never replaced.

Replicas: each replica is one serving pod (`NAME`, `NAME-1`, ...) observed on its own; its phase,
readiness (`ready`, containers) and `available` (Ready and KV transfer verified) are in
`status.replicaStatuses`. With one replica the phase and conditions are that pod's; with several,
`Ready` and each readiness condition are True when True on every replica, and otherwise name the
replicas holding them back. Column `READY` is ready replicas / replicas; `kubectl get pdd -o wide`
adds `CONTAINERS` (ready containers over every replica) and `AVAILABLE`. A spec change rolls at most
`spec.rollout.maxUnavailable` replicas at a time, highest index first, each waiting for its
replacement to be Ready and KVTransferVerified; with one replica the pod is deleted and recreated.
A PodDisruptionBudget (`minAvailable: replicas - maxUnavailable`) guards node drains.

Events: one per phase change (`Pending`, `Progressing`, `Ready`, `Degraded`, `Failed`), `CreatedPod`,
`RollingPod`, `ReplacingPod`, `ScalingDown`, `InvalidSpec` (or the tenancy policy's rule), `KVTransferVerified`,
`KVMismatch` (Warning),
`GoodputProbeStarted`,
`GoodputMeasured`, `GoodputProbeFailed`, `GoodputMet`, `GoodputMissed`, `NodeNotReady`, `NodeLost`.

Goodput probes: with `spec.goodputProbe.enabled`, a Job `<name>-goodput-<time>` runs `pdctl bench` against
the Service once the deployment is Ready, then every `intervalSeconds`, never two at a time and never
while not Ready. Run one now with
`kubectl annotate pdd NAME {api.RUN_PROBE_ANNOTATION}="$(date +%s)" --overwrite` (any new value counts).
The result is `status.goodput` (column Goodput); finished Jobs are deleted.

Deletion: children carry owner references and are garbage-collected with the PDDeployment. kopf's
timer adds its finalizer (`kopf.zalando.org/KopfFinalizerMarker`), which the operator removes on
deletion: delete PDDeployments while the operator runs."""


def _gates_ready(kind: conditions.ConditionKind[Any]) -> str:
    if kind is conditions.READY:
        return "-"
    if not kind.gates_ready:
        return "no"
    return "yes, in pods running this role" if kind.role else "yes"


def _conditions_section() -> list[str]:
    """Every condition the operator writes, from conditions.TABLE."""
    rows = []
    for kind in conditions.TABLE:
        reasons = ", ".join(f"`{r}`" for r in kind.reasons) + (f"; {kind.more_reasons}" if kind.more_reasons else "")
        rows.append(f"| `{kind.type}` | {_gates_ready(kind)} | {kind.set_by} | {reasons} | {kind.meaning} |")
    return [
        "Conditions (from operator/pd_operator/conditions.py), in the order the status lists them:",
        "",
        "| Condition | Gates Ready | Set by | Reasons | Meaning |",
        "|---|---|---|---|---|",
        *rows,
    ]


def reference_markdown() -> str:
    """docs/crd-reference.md: every field with type, default and description, then the admission rules."""
    schema = spec_schema()["properties"]
    out = [
        "# PDDeployment reference (pd.serving.dev/v1alpha1)",
        "",
        "Generated from operator/pd_operator/api/ and conditions.py by `python -m pd_operator.crd --docs`; "
        "do not edit.",
        f"Short name `{api.SHORT_NAME}`; `kubectl explain pdd.spec` prints the same descriptions.",
        f"Annotation `{api.RUN_PROBE_ANNOTATION}`: set or change its value to run a goodput probe now.",
        "",
    ]
    for section in ("spec", "status"):
        out += [f"## {section}", "", "| Field | Type | Default | Description |", "|---|---|---|---|"]
        out += [*_rows(schema[section], section), ""]
    out += ["## Admission rules (CEL, also checked offline by `pdctl render`)", ""]
    out += [*_rules_section(schema["metadata"], "metadata"), *_rules_section(schema["spec"], "spec"), ""]
    out += [*_PHASES.splitlines(), "", *_conditions_section(), "", *_STATUS_GUIDE.splitlines(), ""]
    return "\n".join(out)


def main() -> None:
    """`python -m pd_operator.crd [--docs]`: regenerate crds/pddeployment.yaml or docs/crd-reference.md."""
    import sys

    sys.stdout.write(reference_markdown() if "--docs" in sys.argv[1:] else crd_yaml())


if __name__ == "__main__":
    main()
