"""The generated CRD: committed copy current, structural, bounded for CEL cost, documented."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from pd_operator import api, crd
from pd_operator.commands import crd as crd_command

FORBIDDEN = {"$ref", "$defs", "anyOf", "allOf", "oneOf", "title", "const"}
# The fields of apiextensions.k8s.io/v1 JSONSchemaProps: a keyword outside them (JSON Schema's
# propertyNames, say) is dropped by the API server without a word, and the constraint with it.
JSON_SCHEMA_PROPS = {
    "description", "type", "format", "default", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "multipleOf", "enum",
    "maxProperties", "minProperties", "required", "items", "not", "properties", "additionalProperties",
    "patternProperties", "additionalItems", "example", "nullable", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string", "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type", "x-kubernetes-map-type", "x-kubernetes-validations",
}  # fmt: skip


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, prop in node.get("properties", {}).items():
        yield from walk(prop, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_is_current(repo: Path) -> None:
    assert (repo / "crds" / "pddeployment.yaml").read_text() == crd.crd_yaml(), (
        "run: pdctl crd > crds/pddeployment.yaml"
    )


def test_committed_reference_is_current(repo: Path) -> None:
    expected = crd.reference_markdown()
    assert (repo / "docs" / "crd-reference.md").read_text() == expected, (
        "run: python -m pd_operator.crd --docs > docs/crd-reference.md"
    )


def test_pdctl_crd_prints_the_committed_file(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crd_command.main([]) == 0
    assert capsys.readouterr().out == (repo / "crds" / "pddeployment.yaml").read_text()


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    for path, node in walk(schema):
        assert not FORBIDDEN & node.keys(), path
        assert node.keys() <= JSON_SCHEMA_PROPS, (path, node.keys() - JSON_SCHEMA_PROPS)
        assert "type" in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("exclusiveMinimum", True) is True and node.get("exclusiveMaximum", True) is True, path


def test_map_key_bounds_become_a_cel_rule(schema: dict[str, Any]) -> None:
    """The engine container names of a replica's versions keep their 63-character bound on the server."""
    status = schema["properties"]["status"]["properties"]
    versions = status["replicaStatuses"]["items"]["properties"]["engineVersions"]
    assert {"rule": "self.all(k, size(k) <= 63)", "message": "keys must be at most 63 characters"} in versions[
        "x-kubernetes-validations"
    ]


def test_unsupported_map_key_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported map key schema"):
        crd._key_length_rule({"pattern": "^[a-z]+$"})


def test_every_string_list_and_map_is_bounded_for_cel_cost(schema: dict[str, Any]) -> None:
    for path, node in walk(schema["properties"]["spec"], "spec"):
        kind = node["type"]
        if kind == "string":
            assert "maxLength" in node or "enum" in node, path
        elif kind == "array":
            assert "maxItems" in node, path
        elif kind == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_every_field_has_a_description(schema: dict[str, Any]) -> None:
    for path, node in walk(schema):
        if path.count(".") >= 2 and not path.endswith(("[]", "}")):
            assert node.get("description"), path


def _models(root: type[BaseModel]) -> set[type[BaseModel]]:
    return set(crd._models_by_name(root).values())


def test_every_model_field_has_a_description() -> None:
    for model in _models(api.PDDeployment):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


def test_names_subresource_and_printer_columns() -> None:
    spec = crd.crd()["spec"]
    assert spec["group"] == "pd.serving.dev" and spec["names"]["plural"] == "pddeployments"
    assert spec["names"]["shortNames"] == ["pdd"] and spec["names"]["kind"] == "PDDeployment"
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"]["status"] == {}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Mode", "Transfer", "Ready", "Phase", "Prefill GPUs", "Decode GPUs", "Goodput", "Age"]
    wide = [c["jsonPath"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    assert wide == [
        ".status.containersReady",
        ".status.availableReplicas",
        ".status.router.ready",
        ".status.engineVersion",
        ".status.capacity.summary",
        ".status.demand.summary",
    ]


def test_scale_subresource_points_at_fields_of_the_schema(schema: dict[str, Any]) -> None:
    """`kubectl scale` and HPAs read and write these paths; each must be a field the server keeps."""
    scale = crd.crd()["spec"]["versions"][0]["subresources"]["scale"]
    props = schema["properties"]
    assert (
        scale["specReplicasPath"] == ".spec.replicas" and props["spec"]["properties"]["replicas"]["type"] == "integer"
    )
    status = props["status"]["properties"]
    assert status[scale["statusReplicasPath"].split(".")[-1]]["type"] == "integer"
    assert status[scale["labelSelectorPath"].split(".")[-1]]["type"] == "string"


def test_cel_rules_have_messages_and_valid_field_paths(schema: dict[str, Any]) -> None:
    count = 0
    for path, node in walk(schema):
        for rule in node.get("x-kubernetes-validations", []):
            count += 1
            assert rule["message"] and rule["rule"], path
            target = node
            for part in filter(None, rule.get("fieldPath", "").split(".")):
                target = target["properties"][part]
    assert count >= 15


def test_defaults_of_nested_objects_validate() -> None:
    """The API server checks defaults against the rules as written: they must be complete and valid."""
    for path, node in walk(crd.spec_schema()["properties"]["spec"], "spec"):
        default = node.get("default")
        if isinstance(default, dict) and default and path == "spec.prefill":
            assert default["gpus"] == "0-3" and default["ports"]["http"] == 20005


def test_crd_yaml_round_trips() -> None:
    assert yaml.safe_load(crd.crd_yaml()) == crd.crd()
