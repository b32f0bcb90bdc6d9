"""The node agent's pure pod-spec rules, without a cluster."""

from __future__ import annotations

import pytest

from e2e import podspec
from e2e.podspec import ConfigError, Obj, PodAddress, PodFacts

FACTS = PodFacts(pod_ip="10.213.1.2", host_ip="10.213.1.1")


def _pod(containers: list[Obj], volumes: list[Obj] | None = None) -> Obj:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
        "spec": {"nodeName": "mi300x-0", "containers": containers, "volumes": volumes or []},
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-$(B)"),
        ("$$(A)", "$(A)"),
        ("no vars", "no vars"),
        ("$(A)$(A)", "11"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert podspec.expand(text, {"A": "1"}) == expected


def test_env_order_refs_and_field_paths() -> None:
    container: Obj = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "P_"}],
        "env": [
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "URL", "value": "http://$(IP):8000"},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": True}}},
        ],
    }
    refs = {
        ("ConfigMap", "ns", "cm"): {"a": "1"},
        ("Secret", "ns", "s"): {"pw": "x"},
        ("ConfigMap", "ns", "gone"): None,
    }
    env = podspec.resolve_env(_pod([container]), container, refs, FACTS)
    assert env == {"P_a": "1", "IP": "10.213.1.2", "LABEL": "x", "URL": "http://10.213.1.2:8000", "PW": "x"}


def test_missing_required_key_is_a_config_error() -> None:
    container: Obj = {"name": "c", "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]}
    with pytest.raises(ConfigError, match="key 'k' not found"):
        podspec.resolve_env(_pod([container]), container, {("ConfigMap", "ns", "cm"): {}}, FACTS)


def test_argv_needs_a_command() -> None:
    assert podspec.resolve_argv({"name": "c", "command": ["a", "$(X)"], "args": ["b"]}, {"X": "1"}) == ["a", "1", "b"]
    with pytest.raises(ConfigError, match="no command"):
        podspec.resolve_argv({"name": "c"}, {})


def test_volumes_plans_and_unsupported_kinds() -> None:
    volumes: list[Obj] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "cfg", "configMap": {"name": "cm", "items": [{"key": "a", "path": "sub/a.txt"}]}},
    ]
    plans = podspec.plan_volumes(_pod([], volumes), {("ConfigMap", "ns", "cm"): {"a": "A"}}, FACTS)
    assert plans[0].kind == "tmpfs" and plans[0].size_bytes == 64 * 2**20
    assert [(f.path, f.content) for f in plans[1].files] == [("sub/a.txt", "A")]
    with pytest.raises(ConfigError, match="not supported"):
        podspec.plan_volumes(_pod([], [{"name": "pvc", "persistentVolumeClaim": {"claimName": "x"}}]), {}, FACTS)


def test_named_probe_ports_resolve() -> None:
    container = {"name": "c", "ports": [{"name": "http", "containerPort": 8000}]}
    probe = podspec.parse_probe(container, {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5})
    assert probe is not None and probe.port == 8000 and probe.period_s == 5 and probe.failure_threshold == 3


def test_service_names_resolve_to_matching_pods() -> None:
    services: list[Obj] = [
        {"metadata": {"namespace": "ns", "name": "web"}, "spec": {"selector": {"app": "x"}}},
        {"metadata": {"namespace": "other", "name": "web"}, "spec": {"selector": {"app": "x"}}},
        {"metadata": {"namespace": "ns", "name": "headless"}, "spec": {}},
    ]
    me = PodAddress("ns", "client", {}, "10.213.1.3")
    server = PodAddress("ns", "p", {"app": "x"}, "10.213.1.2")
    targets = podspec.service_targets(services, [me, server], [])
    assert targets == {("ns", "web"): "10.213.1.2"}
    hosts = podspec.render_hosts(me, "client", targets)
    assert "10.213.1.2\tweb.ns.svc.cluster.local web.ns.svc web.ns web\n" in hosts


def test_service_names_prefer_ready_endpoints_on_any_node() -> None:
    services: list[Obj] = [{"metadata": {"namespace": "ns", "name": "web"}, "spec": {"selector": {"app": "x"}}}]
    local = PodAddress("ns", "a-local", {"app": "x"}, "10.213.1.2")
    endpoint_slice: Obj = {
        "metadata": {"namespace": "ns", "name": "web-abc", "labels": {"kubernetes.io/service-name": "web"}},
        "endpoints": [
            {"addresses": ["10.213.1.2"], "conditions": {"ready": False}, "targetRef": {"name": "a-local"}},
            {"addresses": ["10.213.2.5"], "conditions": {"ready": True}, "targetRef": {"name": "z-remote"}},
            {"addresses": ["10.213.2.6"], "targetRef": {"name": "y-remote"}},  # no condition: ready
        ],
    }
    endpoints = podspec.slice_endpoints(endpoint_slice)
    assert [e.ready for e in endpoints] == [False, True, True]
    assert podspec.service_targets(services, [local], endpoints) == {("ns", "web"): "10.213.2.6"}
    not_ready = [e for e in endpoints if not e.ready]
    assert podspec.service_targets(services, [local], not_ready) == {("ns", "web"): "10.213.1.2"}


def test_pre_stop_command_is_the_exec_hook_only() -> None:
    hook = {"lifecycle": {"preStop": {"exec": {"command": ["pdctl", "wait-proxy-gone", "--port", "8001"]}}}}
    assert podspec.pre_stop_command({"name": "c", **hook}) == ["pdctl", "wait-proxy-gone", "--port", "8001"]
    assert podspec.pre_stop_command({"name": "c"}) is None
    assert podspec.pre_stop_command({"name": "c", "lifecycle": {"preStop": {"sleep": {"seconds": 5}}}}) is None
    assert podspec.pre_stop_command({"name": "c", "lifecycle": {"postStart": {"exec": {"command": ["x"]}}}}) is None
