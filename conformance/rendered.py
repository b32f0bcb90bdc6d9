"""Every engine command line we render, as the kubelet would start it: the cases the tier judges.

Three sources: the examples through the real ``pdctl render`` CLI, the seed appendix's golden command
lines (tests/operator/golden/seed_appendix.sh), and generated variants through the render API (both
transfer modes, colocated, TP/DP shapes, the xgmi backend, custom ports).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pd_operator import layout, render
from pd_operator.validation import SpecError, validate_spec
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# What the kubelet puts into $(POD_IP) / $(VLLM_HOST_IP) (downward API): loopback, so the same
# rendered config can also drive engines on this machine.
POD_IP = "127.0.0.1"
OWNER = layout.Owner(name="conformance", namespace="conformance")
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class EngineCase:
    """One engine container: the argv after ``vllm serve`` (variables expanded) and its literal env."""

    name: str
    serve_args: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


def expand(word: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a command word: defined variables only, ``$$`` escapes."""
    out = _VAR_REF.sub(lambda m: env.get(m[1], m[0]), word.replace("$$", "\0"))
    return out.replace("\0", "$")


def _container_env(container: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[entry["name"]] = POD_IP
    return env


def kubelet_command(container: Mapping[str, Any]) -> list[str]:
    """A container's command as the kubelet starts it: $(VAR) expanded from the container's env."""
    env = _container_env(container)
    return [expand(word, env) for word in container.get("command", [])]


def serve_args_of(command: list[str]) -> list[str] | None:
    """The arguments the engine receives: after ``vllm serve`` or ``pdctl sim-engine`` (same argv)."""
    for i, word in enumerate(command[:-1]):
        if (word, command[i + 1]) in (("vllm", "serve"), ("pdctl", "sim-engine")):
            args = command[i + 2 :]
            if command[i] == "pdctl":  # the simulator's own trailing options are not vLLM's
                args = args[: args.index("--profile")]
            return args
    return None


def engine_cases_of(objects: list[dict[str, Any]], prefix: str) -> Iterator[EngineCase]:
    for obj in objects:
        if obj.get("kind") != "Pod":
            continue
        for container in obj["spec"]["containers"]:
            args = serve_args_of(container.get("command", []))
            if args is not None:
                env = _container_env(container)
                yield EngineCase(f"{prefix}/{container['name']}", [expand(a, env) for a in args], env)


def pod_of(spec: Any) -> dict[str, Any]:
    return render.pod(layout.build(OWNER, spec))


def example_cases() -> list[EngineCase]:
    """Each example through the real CLI, ``pdctl render --policy FILE FILE``: the policy admits the host
    network, the opt-in the RDMA examples document (docs/security.md)."""
    cases: list[EngineCase] = []
    with tempfile.TemporaryDirectory() as scratch:
        opt_in = Path(scratch) / "policy.yaml"
        opt_in.write_text("allowHostNetwork: true\n")
        for path in EXAMPLES:
            out = subprocess.run(
                [sys.executable, "-m", "pd_runtime.cli", "render", "--policy", str(opt_in), str(path)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            objects = [doc for doc in yaml.safe_load_all(out) if doc]
            cases += engine_cases_of(objects, path.stem)
    return cases


def seed_cases() -> list[EngineCase]:
    """The seed appendix's own command lines (the golden file the unit tests compare us with)."""
    from tests.operator.test_render import seed_sections  # one parser of the golden file

    return [EngineCase(f"seed/{name}", args, env) for name, (env, args) in seed_sections().items()]


def installed_release(default: str = PINNED_VLLM_VERSION) -> str:
    """The vLLM release installed here (its local build label, such as +cpu, dropped), else ``default``."""
    try:
        return importlib.metadata.version("vllm").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return default


def example_spec(name: str) -> dict[str, Any]:
    """An example's spec declaring the vLLM release installed here, so the generated variants are rendered
    for the release whose parser and connector judge them (the examples themselves go through the CLI as
    written, for the image's release)."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    spec: dict[str, Any] = doc["spec"]
    spec.setdefault("engineVersion", installed_release())
    return spec


def _gpus(first: int, count: int) -> str:
    return f"{first}-{first + count - 1}" if count > 1 else str(first)


def disaggregated_spec(
    mode: str = "write",
    backend: str = "rdma",
    prefill_shape: tuple[int, int] = (4, 1),
    decode_shape: tuple[int, int] = (4, 1),
    prefill_ports: tuple[int, int, int] | None = None,
    decode_ports: tuple[int, int, int] | None = None,
    registration_port: int | None = None,
) -> dict[str, Any]:
    """The write example's spec changed to one variant (shape = (TP, DP)); ports as (http, handshake, notify)."""
    spec = example_spec("qwen3-235b-write.yaml")
    spec["kvTransfer"]["transferMode"] = mode
    spec["kvTransfer"]["backend"] = backend
    if backend == "xgmi":
        spec["gpuAllocation"] = {"strategy": "hostDevices"}
    first = 0
    for role, (tp, dp), ports in (("prefill", prefill_shape, prefill_ports), ("decode", decode_shape, decode_ports)):
        spec[role].update(tensorParallelSize=tp, dataParallelSize=dp, gpus=_gpus(first, tp * dp))
        first += tp * dp
        if ports is not None:
            spec[role]["ports"] = dict(zip(("http", "handshake", "notify"), ports, strict=True))
    if registration_port is not None:
        spec["proxy"]["registrationPort"] = registration_port
    return spec


SHAPES = [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (1, 4), (1, 8), (2, 2), (4, 2)]


def _variant_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for mode in ("write", "read"):
        for backend in ("rdma", "xgmi"):
            yield f"{mode}-{backend}", disaggregated_spec(mode, backend)
        for tp, dp in SHAPES:
            if tp * dp <= 4:
                yield f"{mode}-tp{tp}dp{dp}", disaggregated_spec(mode, prefill_shape=(tp, dp), decode_shape=(tp, dp))
        yield f"{mode}-p-tp2-d-tp1dp2", disaggregated_spec(mode, prefill_shape=(2, 1), decode_shape=(1, 2))
        yield (
            f"{mode}-custom-ports",
            disaggregated_spec(
                mode, prefill_ports=(31000, 31100, 31200), decode_ports=(32000, 32100, 32200), registration_port=33000
            ),
        )
    colocated = example_spec("qwen3-235b-colocated.yaml")
    yield "colocated", colocated
    one = example_spec("qwen3-235b-colocated.yaml")
    one["colocated"]["engines"] = one["colocated"]["engines"][:1]
    yield "colocated-one-engine", one


@dataclass(frozen=True)
class Refused:
    """A generated variant that admission refuses: it is never rendered, so vLLM never sees it."""

    name: str
    reason: str


def variant_cases() -> tuple[list[EngineCase], list[Refused]]:
    cases: list[EngineCase] = []
    refused: list[Refused] = []
    for name, raw in _variant_specs():
        try:
            spec = validate_spec(raw)
        except SpecError as err:
            refused.append(Refused(name, str(err)))
            continue
        cases += engine_cases_of([pod_of(spec)], f"variant/{name}")
    return cases, refused
