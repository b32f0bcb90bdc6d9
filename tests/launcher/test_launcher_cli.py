"""`pdctl engine` as the kubelet runs it: a real process that execs its command or fails with 78."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pd_runtime import hostfacts
from pd_runtime.launcher import parse

PDCTL = [sys.executable, "-m", "pd_runtime.cli", "engine"]


def run_engine(args: list[str], termination_log: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PD_TERMINATION_LOG": str(termination_log)}
    return subprocess.run([*PDCTL, *args], capture_output=True, text=True, env=env, timeout=30, check=False)


def test_simulated_engine_execs_its_command_with_arguments_intact(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    command = [sys.executable, "-c", "import sys; print(sys.argv[1:]); sys.exit(3)", "--port", "x y"]
    result = run_engine(["--role", "decode", "--gpus", "0", "--backend", "none", "--", *command], log)
    assert result.returncode == 3, result.stderr
    assert result.stdout.strip() == "['--port', 'x y']"
    assert not log.exists()


def test_exec_replaces_the_launcher_process() -> None:
    process = subprocess.Popen(
        [*PDCTL, "--role", "engine", "--gpus", "0", "--", sys.executable, "-c", "import os; print(os.getpid())"],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = process.communicate(timeout=30)
    assert int(out.strip()) == process.pid


def test_failed_preflight_writes_the_termination_message_and_exits_78(tmp_path: Path) -> None:
    if Path("/dev/kfd").exists():
        pytest.skip("this machine has an AMD GPU")
    log = tmp_path / "termination-log"
    result = run_engine(["--role", "prefill", "--gpus", "4", "--backend", "rdma", "--", "true"], log)
    assert result.returncode == 78
    message = log.read_text()
    assert message.startswith("pdctl engine: preflight failed for the prefill engine:")
    assert "/dev/kfd is missing" in message and "RDMA" in message
    assert message in result.stderr


def test_a_busy_port_fails_the_preflight(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        port = listener.getsockname()[1]
        log = tmp_path / "termination-log"
        result = run_engine(["--role", "decode", "--gpus", "0", "--ports", f"{port}", "--", "true"], log)
    assert result.returncode == 78
    assert f"port {port} is already in use" in log.read_text()


def test_missing_executable_is_reported(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    result = run_engine(["--role", "decode", "--gpus", "0", "--", "no-such-engine-binary"], log)
    assert result.returncode == 127
    assert "cannot exec 'no-such-engine-binary'" in log.read_text()


def test_check_only_prints_facts_and_problems_as_json(tmp_path: Path) -> None:
    result = run_engine(["--role", "decode", "--gpus", "0", "--check-only"], tmp_path / "log")
    assert result.returncode == 0
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["problems"] == []
    assert report["needs"]["role"] == "decode"
    assert "shm_bytes" in report["facts"]


def test_parse_keeps_everything_after_the_separator() -> None:
    argv = "--role prefill --gpus 4 --backend rdma --ports 20005,6301,6105 -- vllm serve m --role x -- y"
    needs, command, check_only = parse(argv.split())
    assert command == ["vllm", "serve", "m", "--role", "x", "--", "y"]
    assert needs.ports == (20005, 6301, 6105) and needs.min_shm_mib == 1024 and not check_only


@pytest.mark.parametrize(
    "args",
    [
        ["--role", "other", "--gpus", "0", "--", "true"],
        ["--role", "prefill", "--gpus", "-1", "--", "true"],
        ["--role", "prefill", "--gpus", "1", "--ports", "70000", "--", "true"],
        ["--role", "prefill", "--gpus", "1", "--ports", "a,b", "--", "true"],
        ["--role", "prefill", "--gpus", "1"],
    ],
)
def test_bad_flags_exit_2(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(args)
    assert exit_info.value.code == 2


def test_a_simulated_engine_of_another_release_is_refused_before_it_starts(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    sim = ["pdctl", "sim-engine", "m", "--port", "1", "--vllm-version", "0.32.0"]
    result = run_engine(["--role", "decode", "--gpus", "0", "--vllm-version", "0.33.0", "--", *sim], log)
    assert result.returncode == 78, result.stderr
    assert "declares vLLM 0.33.0" in log.read_text() and "runs vLLM 0.32.0" in log.read_text()


def test_the_vllm_release_is_read_from_the_python_that_runs_the_executable(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm-0.34.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.34.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f"#!{sys.executable}\n")
    (bin_dir / "vllm").chmod(0o755)
    env = {"PATH": str(bin_dir), "PYTHONPATH": str(site)}
    assert hostfacts.engine_version(["vllm", "serve", "m"], env) == (
        "0.34.0",
        f"the 'vllm' distribution's metadata in {sys.executable}",
    )
    assert hostfacts.engine_version(["vllm", "serve", "m"], {"PATH": str(bin_dir)})[0] is None
