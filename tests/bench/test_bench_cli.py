"""`pdctl bench` end to end over real HTTP on loopback against the calibration server (time-scaled).

No assertion here depends on how fast the machine is: the SLOs are far above anything the calibration
server takes, so "good" means "no error", and timings are only checked where causality bounds them (the
client cannot see a token before the server wrote it). How closely the client's timings match the
server's is measured by benchmarks/bench_client_accuracy.py; the SLO arithmetic is tested without I/O in
test_bench_slo.py.
"""

from __future__ import annotations

import itertools
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from pd_runtime.bench.calibration_server import Behaviour
from pd_runtime.bench.cli import main
from pd_runtime.cli import main as pdctl
from tests.bench.conftest import ServerThread

StartServer = Callable[[Behaviour], ServerThread]
FAST = Behaviour(ttft_s=0.02, itl_s=0.002)


def bench(url: str, tmp_path: Path, *extra: str, rate: float = 100, requests: int = 20) -> tuple[int, dict[str, Any]]:
    output = tmp_path / "result.json"
    code = main([
        "--url", url, "--model", "test-model", "--rate", str(rate), "--requests", str(requests),
        "--prompt-tokens", "64", "--output-tokens", "10", "--slo-ttft-ms", "600000", "--slo-itl-ms", "600000",
        "--output", str(output), "--quiet", *extra,
    ])  # fmt: skip
    return code, json.loads(output.read_text()) if output.exists() else {}


def test_rate_run_sends_exactly_the_requests_with_exact_lengths(
    calibration_server: StartServer, tmp_path: Path, validators: dict[str, Draft202012Validator]
) -> None:
    server = calibration_server(FAST)
    summary_path = tmp_path / "summary.json"
    code, result = bench(server.url, tmp_path, "--result-file", str(summary_path), "--arrival", "constant")
    assert code == 0
    validators["result"].validate(result)
    summary = json.loads(summary_path.read_text())
    validators["summary"].validate(summary)
    assert len(summary_path.read_bytes()) < 4096
    assert (summary["requests"], summary["good"], summary["errors"], summary["attainment"]) == (20, 20, 0, 1.0)
    seen = server.server.timings.values()
    assert len(seen) == 20
    assert {t.prompt_tokens for t in seen} == {64} and {t.tokens for t in seen} == {10}
    assert all(r["completion_tokens"] == 10 and r["prompt_tokens"] == 64 for r in result["records"])
    # Planned as asked: constant arrivals 10 ms apart. How closely the sends keep to the plan is a
    # measurement (achieved_rate, lag_ms), which a loaded machine changes.
    scheduled = sorted(r["sent_s"] - r["lag_ms"] / 1e3 for r in result["records"])
    assert [b - a for a, b in itertools.pairwise(scheduled)] == pytest.approx([0.01] * 19, abs=1e-4)


def test_warmup_requests_are_sent_but_left_out(calibration_server: StartServer, tmp_path: Path) -> None:
    server = calibration_server(FAST)
    code, result = bench(server.url, tmp_path, "--warmup", "5")
    assert code == 0
    assert len(server.server.timings) == 25
    assert result["requests"] == 20 and len(result["records"]) == 20
    assert sorted(r["index"] for r in result["records"]) == list(range(20))
    measured_ids = {r["id"] for r in result["records"]}
    assert len(set(server.server.timings) - measured_ids) == 5


def test_errors_and_timeouts_count_as_failures(calibration_server: StartServer, tmp_path: Path) -> None:
    server = calibration_server(Behaviour(ttft_s=0.02, itl_s=0.002, fail_every=4, stall_every=5))
    code, result = bench(server.url, tmp_path, "--timeout-s", "5")  # stalls never end; the rest take ms
    assert code == 0  # the run completed; attainment is a finding, not a failure
    # Of requests 1..20 in arrival order: 4, 8, 12, 16, 20 fail with 500; 5, 10, 15 stall.
    stage = result["stages"][0]
    assert stage["error_kinds"] == {"http_500": 5, "timeout": 3}
    assert result["errors"] == 8 and result["good"] == 12
    assert result["attainment"] == pytest.approx(12 / 20)
    assert all(r["ttft_ms"] is None for r in result["records"] if r["error"])


def test_fail_below_target_sets_the_exit_code(calibration_server: StartServer, tmp_path: Path) -> None:
    server = calibration_server(Behaviour(ttft_s=0.02, itl_s=0.002, fail_every=2))
    code, result = bench(server.url, tmp_path, "--fail-below-target")
    assert code == 3 and result["attainment"] == pytest.approx(0.5)


def test_client_never_sees_a_token_before_the_server_wrote_it(calibration_server: StartServer, tmp_path: Path) -> None:
    """The size of the error is a measurement (benchmarks/bench_client_accuracy.py), not a test."""
    server = calibration_server(Behaviour(ttft_s=0.03, itl_s=0.004, tokens_per_chunk=1))
    code, result = bench(server.url, tmp_path, rate=50, requests=30)
    assert code == 0
    for record in result["records"]:
        truth = server.server.timings[record["id"]]
        assert truth.ttft_s is not None and truth.itl_s is not None
        assert record["ttft_ms"] >= truth.ttft_s * 1e3, record
        assert record["itl_ms"] is not None and record["completion_tokens"] == 10, record


def test_multi_token_chunks_do_not_inflate_itl(calibration_server: StartServer, tmp_path: Path) -> None:
    server = calibration_server(Behaviour(ttft_s=0.01, itl_s=0.003, tokens_per_chunk=5))
    code, result = bench(server.url, tmp_path, "--output-tokens", "20", requests=5)
    assert code == 0
    for record in result["records"]:
        # 4 chunks of 5 tokens: the ITL is the first-to-last-token span over 19 gaps, not over 3. The span
        # is at most the time from the first token to the response's end, whatever the machine's load.
        assert record["completion_tokens"] == 20, record
        assert record["itl_ms"] * 19 <= record["e2e_ms"] - record["ttft_ms"] + 0.01, record


def test_chat_endpoint(calibration_server: StartServer, tmp_path: Path) -> None:
    server = calibration_server(FAST)
    code, result = bench(server.url + "/v1", tmp_path, "--endpoint", "chat", requests=5)
    assert code == 0 and result["good"] == 5
    assert result["config"]["url"].endswith("/v1/chat/completions")
    for record in result["records"]:
        truth = server.server.timings[record["id"]]
        assert truth.ttft_s is not None
        assert record["ttft_ms"] >= truth.ttft_s * 1e3  # the role-only chunk is not the first token


def test_one_token_requests(calibration_server: StartServer, tmp_path: Path) -> None:
    server = calibration_server(FAST)
    code, result = bench(server.url, tmp_path, "--output-tokens", "1", requests=5)
    assert code == 0 and result["good"] == 5
    assert all(r["itl_ms"] is None for r in result["records"]) and result["itl_ms"]["p50"] is None


def test_short_replies_fail_only_when_itl_cannot_be_measured(calibration_server: StartServer, tmp_path: Path) -> None:
    server = calibration_server(Behaviour(ttft_s=0.01, itl_s=0.002, max_output_tokens=1))
    code, result = bench(server.url, tmp_path, requests=5)
    assert code == 0 and result["good"] == 0
    assert result["stages"][0]["error_kinds"] == {"short_reply": 5}


def test_sweep_search_and_plot(calibration_server: StartServer, tmp_path: Path) -> None:
    server = calibration_server(FAST)
    sweep_png, search_png = tmp_path / "sweep.png", tmp_path / "both.png"
    code, sweep = bench(server.url, tmp_path, "--sweep", "50:100:50", "--plot", str(sweep_png), "--label", "A",
                        requests=5)  # fmt: skip
    assert code == 0 and [s["rate"] for s in sweep["stages"]] == [50, 100]
    assert sweep["headline_stage"] == 1 and sweep["goodput_rate"] == 100
    sweep_file = tmp_path / "sweep.json"
    sweep_file.write_text(json.dumps(sweep))
    assert sweep_png.read_bytes().startswith(b"\x89PNG")

    summary_path = tmp_path / "search-summary.json"
    code, search = bench(server.url, tmp_path, "--search", "--result-file", str(summary_path), rate=200, requests=5)
    assert code == 0 and search["mode"] == "search"
    # Everything passes: the bracket doubles from 200 to 200 * 64.
    assert [s["rate"] for s in search["stages"]] == [200 * 2**k for k in range(7)]
    assert json.loads(summary_path.read_text())["goodput_rate"] == 12800
    search_file = tmp_path / "search.json"
    search_file.write_text(json.dumps(search))

    assert main(["--plot", str(search_png), str(sweep_file), str(search_file)]) == 0
    assert search_png.read_bytes().startswith(b"\x89PNG")


def test_unreachable_server_is_a_measurement_not_a_crash(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        code, result = bench(f"http://127.0.0.1:{port}", tmp_path, requests=3)
    assert code == 0
    assert result["errors"] == 3 and result["attainment"] == 0
    assert result["stages"][0]["error_kinds"] == {"connection": 3}


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--url", "http://x", "--rate", "1"],
        ["--url", "http://x", "--model", "m", "--rate", "0"],
        ["--url", "http://x", "--model", "m", "--rate", "1", "--target", "90"],
        ["--url", "http://x", "--model", "m", "--rate", "1", "--sweep", "1:2"],
        ["--url", "http://x", "--model", "m", "--rate", "1", "--sweep", "1:2:1", "--search"],
        ["--plot", "only.png"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "pdctl bench" in capsys.readouterr().err


def test_plot_of_a_missing_file_fails_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--plot", str(tmp_path / "x.png"), str(tmp_path / "missing.json")]) == 1
    assert "missing.json" in capsys.readouterr().err


def test_plot_inputs_are_checked_before_the_run(calibration_server: StartServer, tmp_path: Path) -> None:
    server = calibration_server(FAST)
    code, _ = bench(server.url, tmp_path, "--plot", str(tmp_path / "x.png"), str(tmp_path / "missing.json"))
    assert code == 1
    assert server.server.timings == {}  # nothing was sent


def test_dispatcher_reaches_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert pdctl(["bench", "--help"]) == 0
    assert "--slo-ttft-ms" in capsys.readouterr().out
