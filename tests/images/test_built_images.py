"""The images `make images` builds (images/build.sh, docs/images.md), run for real with podman on the
build's private storage: the operator image as its non-root user on a read-only root, the runtime
image's commands and a simulated engine serving a completion, Dockerfile.rocm on its stand-in base and its
refusal of a base without vLLM, and the docker-archives a node's containerd imports."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pd_operator.api import DEFAULT_IMAGE
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from tests.ports import TEST_PORTS

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pd-operator"
OPERATOR_UID = "65532"

# A cold build (Debian rootfs, pip installs) takes minutes; a warm one seconds (docs/images.md).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@dataclass(frozen=True)
class Built:
    """build.sh's manifest: image name -> docker-archive, role -> image name, the storage's variables."""

    images: dict[str, Path]
    roles: dict[str, str]
    base: str
    env: dict[str, str]

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args], env=os.environ | self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def run(self, role: str, *args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
        """A throwaway container of the role's image: read-only root, host network."""
        options = ["--rm", "--read-only", "--network=host"] + ([f"--entrypoint={entrypoint}"] if entrypoint else [])
        return self.podman("run", *options, self.roles[role], *args)


def read_manifest(path: Path) -> Built:
    manifest = json.loads(path.read_text())
    images = {name: Path(archive) for name, archive in manifest["images"].items()}
    return Built(images, manifest["roles"], manifest["base"], manifest["env"])


def archive_tags(archive: Path) -> list[str]:
    """The names a docker-archive gives its image (what `ctr images import` tags it as)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        return [tag for entry in json.load(member) for tag in entry["RepoTags"]]


@pytest.fixture(scope="module")
def built() -> Built:
    """The images, built or (warm) found by build.sh, which prints its manifest's path last."""
    result = subprocess.run(
        ["bash", str(REPO / "images" / "build.sh")], capture_output=True, text=True, timeout=1700, check=False
    )
    assert result.returncode == 0, result.stderr[-6000:]
    return read_manifest(Path(result.stdout.splitlines()[-1]))


def test_the_images_carry_the_names_the_chart_and_the_examples_use(built: Built) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert built.roles["operator"] == f"{values['image']['repository']}:{chart['appVersion']}"
    assert built.roles["runtime"] == DEFAULT_IMAGE
    assert set(built.images) == set(built.roles.values())


def test_each_archive_names_its_image(built: Built) -> None:
    for name, archive in built.images.items():
        assert archive_tags(archive) == [name]


def test_operator_image_runs_pdctl_as_its_non_root_user_on_a_read_only_root(built: Built) -> None:
    helped = built.run("operator", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "operator" in helped.stdout
    who = built.run("operator", "-u", entrypoint="id")
    assert who.stdout.strip() == OPERATOR_UID
    wrote = built.run("operator", "/opt/pd/written", entrypoint="touch")
    assert wrote.returncode != 0, "the root filesystem was writable"


@pytest.mark.parametrize("command", ["engine", "proxy", "sim-engine", "bench"])
def test_runtime_image_commands_start(built: Built, command: str) -> None:
    helped = built.run("runtime", "pdctl", command, "--help")
    assert helped.returncode == 0, helped.stderr


def test_runtime_image_launcher_execs_its_engine(built: Built) -> None:
    launched = built.run("runtime", "pdctl", "engine", "--role", "decode", "--gpus", "0", "--", "true")
    assert launched.returncode == 0, launched.stderr
    assert built.run("runtime", "id", "-u").stdout.strip() == OPERATOR_UID


@pytest.fixture
def container_name(built: Built) -> Iterator[str]:
    name = f"pd-images-test-{uuid.uuid4().hex[:8]}"
    yield name
    built.podman("rm", "--force", "--time", "0", name)


@pytest.mark.parametrize(
    ("role", "serve"),
    [("runtime", ("pdctl", "sim-engine")), ("runtime-rocm-standin", ("vllm", "serve"))],
    ids=["runtime", "rocm-on-stand-in"],
)
def test_simulated_engine_in_the_image_serves_a_completion(
    built: Built, container_name: str, role: str, serve: tuple[str, ...]
) -> None:
    """On the runtime image, and through the stand-in's `vllm serve` on the image Dockerfile.rocm made."""
    port = TEST_PORTS.port()
    command = ["podman", "run", "--rm", "--read-only", "--network=host", "--name", container_name]
    command += [built.roles[role], *serve, "m", "--host", "127.0.0.1", "--port", str(port)]
    with subprocess.Popen(command, env=os.environ | built.env, stderr=subprocess.PIPE, text=True) as engine:
        assert engine.stderr is not None
        seen = []
        for line in engine.stderr:  # the engine logs "serving on" once it listens
            seen.append(line)
            if "serving on" in line:
                break
        assert "serving on" in seen[-1], "".join(seen)
        body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 2}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        assert answer["usage"]["completion_tokens"] == 2
        built.podman("stop", "--time", "5", container_name)
        assert engine.wait(timeout=30) == 0


def test_rocm_image_labels_the_pinned_vllm(built: Built) -> None:
    label = '{{index .Labels "dev.serving.pd.vllm.version"}}'
    inspected = built.podman("image", "inspect", "--format", label, built.roles["runtime-rocm-standin"])
    assert inspected.stdout.strip() == PINNED_VLLM_VERSION


def test_rocm_dockerfile_refuses_a_base_without_vllm(built: Built) -> None:
    """Dockerfile.rocm unchanged on the plain Debian base: its presence check fails the build."""
    digest = built.podman("image", "inspect", "--format", "{{.Digest}}", built.base).stdout.strip()
    refused = "localhost/pd-operator/rocm-refused:test"
    build = [
        *("bash", str(REPO / "images" / "bud.sh"), "-f", str(REPO / "Dockerfile.rocm"), "-t", refused),
        *("--build-arg", f"BASE_NAME={built.base.rsplit(':', 1)[0]}", "--build-arg", f"BASE_DIGEST={digest}"),
        str(REPO),
    ]
    result = subprocess.run(build, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode != 0
    assert "command -v vllm" in result.stdout + result.stderr, result.stderr[-4000:]
    assert built.podman("image", "exists", refused).returncode != 0


def test_vllm_cpu_image_runs_vllm_beside_pdctl(built: Built) -> None:
    """Only once built (make images VLLM_CPU=1, or make e2e at the live tier's release; docs/images.md):
    vLLM's CLI finds its CPU build at the release the image's label names, and its Python the host-memory
    mori.io and the CPU plugin's entry point."""
    if "runtime-vllm-cpu" not in built.roles:
        pytest.skip("the vllm-cpu runtime image is opt-in: make images VLLM_CPU=1")
    label = '{{index .Labels "dev.serving.pd.vllm.version"}}'
    release = built.podman("image", "inspect", "--format", label, built.roles["runtime-vllm-cpu"]).stdout.strip()
    assert built.roles["runtime-vllm-cpu"].endswith(f"-vllm-cpu-{release}")
    version = built.run("runtime-vllm-cpu", "vllm", "--version")
    assert version.returncode == 0, version.stderr[-4000:]
    assert version.stdout.strip().splitlines()[-1] == f"{release}+cpu"
    assert built.run("runtime-vllm-cpu", "pdctl", "engine", "--help").returncode == 0
    plugins = "from importlib.metadata import entry_points; print(entry_points(group='vllm.general_plugins').names)"
    found = built.run("runtime-vllm-cpu", "/opt/vllm/bin/python", "-c", f"import mori.io; {plugins}")
    assert found.returncode == 0 and "pd_live_cpu" in found.stdout, found.stderr[-4000:]
