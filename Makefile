# Two commands for a newcomer (see README.md):
#   make lab    - the main job on the embedded lab
#   make test   - every test: yamllint, ansible-lint, ansible-test sanity, unit tests, then Molecule scenarios and
#                 integration tests side by side
# Both set up what they need first (system packages as root, the virtualenv, the base images, the control plane).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt constraints.txt | sha256sum | cut -c1-12)
LABCTL := $(BIN)/python lab/labctl.py
MOLECULE_JOBS ?= 2
SCENARIOS ?= $(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))

export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: lab lab-up lab-down lab-reset lab-status lab-build test test-integration test-integration-lane2 test-integration-lane3 \
	go-builds go-builds-tools test-lint test-unit lint unit molecule integration \
	setup prereqs images \
	mirror containerd2 promtool prometheus cdi-validate device-plugin-config nvml-mig-mocks kueue-validate oracles ee bench bench-stack bench-scale bench-drift bench-noop-nodes bench-driver-upgrade bench-packing bench-dra scan-tools outdated

# The checkout is the collection gpu_ops.cluster (galaxy.yml). Linked into the virtualenv's ansible_collections, it is
# what Ansible finds for every FQCN (roles, modules, filters, playbooks) and what plain Python imports (unit tests).
setup: $(STAMP)
	@site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
		mkdir -p "$$site/ansible_collections/gpu_ops" && ln -sfn "$(CURDIR)" "$$site/ansible_collections/gpu_ops/cluster"

$(STAMP): requirements.txt constraints.txt
	@echo "==> Python virtualenv $(VENV) (pinned requirements.txt; collections from the ansible bundle)"
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(call timed,venv) $(BIN)/pip install --quiet -r requirements.txt -c constraints.txt
	rm -f $(VENV)/.installed-*
	touch $@

prereqs: setup
	$(call timed,prereqs) $(LABCTL) prereqs

images: prereqs
	$(call timed,images) $(LABCTL) images

# Debian's NVIDIA driver packages plus the NVIDIA-style flat repositories (container toolkit, CUDA doubles).
mirror: prereqs
	$(call timed,mirror) $(LABCTL) mirror

# containerd 2.2, 2.3 and 2.4 from source -> $GPU_LAB_CACHE/bin/containerd2, containerd2.3 and containerd2.4 (the toolkit role's config
# version 3 and 4 checks: unit tests and Molecule), built side by side.
containerd2: setup
	$(call timed,containerd2) $(LABCTL) containerd2

# site.yml's output also goes to reports/site.log, and the run_record callback (plugins/callback) keeps
# reports/site-run.json current as it runs: the summary says what a failed run reached. make exits with site.yml's rc.
RUN_ENV := GPU_RUN_RECORD=reports/site-run.json GPU_RUN_LOG=reports/site.log

lab: setup prereqs mirror
	$(LABCTL) up
	mkdir -p reports && rm -f reports/site-run.json
	rc=0; $(RUN_ENV) $(BIN)/ansible-playbook playbooks/site.yml 2>&1 | tee reports/site.log || rc=$$?; \
		$(LABCTL) summary; exit $$rc

lab-up: setup prereqs
	$(LABCTL) up

lab-down: setup
	$(LABCTL) down

lab-reset: setup prereqs
	$(LABCTL) reset

lab-status: setup
	$(LABCTL) status

lab-build: setup prereqs
	$(call timed,lab-build) $(LABCTL) build

lint: setup
	@echo "==> yamllint"
	$(call timed,yamllint) $(LOW) $(BIN)/yamllint --strict .
	@echo "==> ansible-lint (production profile)"
	$(call timed,ansible-lint) $(LOW) $(BIN)/ansible-lint --strict
	@echo "==> ansible-test sanity (the collection's files, in a scratch ansible_collections tree; tests/sanity/run.py)"
	$(call timed,sanity) $(LOW) $(BIN)/python tests/sanity/run.py

promtool: setup
	$(call timed,promtool) $(LABCTL) promtool

prometheus: setup
	$(call timed,prometheus) $(LABCTL) prometheus

# The CDI oracle (tests/unit/test_cdi_oracle.py): the container-device-interface module's spec loader, built once
# from Go source (lab/go/cdi-validate) into the lab cache.
cdi-validate: setup
	$(LABCTL) cdi-validate

# Our program around the device plugin's own config loader (k8s-device-plugin api/config/v1, from its Go module) ->
# $GPU_LAB_CACHE/bin/device-plugin-config-check: the oracle of tests/unit/test_device_plugin_oracle.py.
device-plugin-config: setup
	$(LABCTL) device-plugin-config

# The MIG tables' oracle (go-nvml's mocks as JSON; tests/unit/test_mig_oracle.py), built from Go source and cached.
nvml-mig-mocks: setup
	$(LABCTL) nvml-mig-mocks

# Our program around Kueue's own ClusterQueue webhook validation (sigs.k8s.io/kueue pkg/webhooks, the release the
# gpu_queues role deploys) -> $GPU_LAB_CACHE/bin/kueue-validate: the oracle of tests/unit/test_kueue_oracle.py.
kueue-validate: setup
	$(LABCTL) kueue-validate

# The four oracles above in one labctl command (built side by side, then linked as each target links it): what
# `make unit` runs first.
oracles: setup
	$(call timed,oracles) $(LABCTL) oracles

# The security scanner (checkov) in its own virtualenv: its dependency tree would otherwise move .venv's pins.
SCAN_VENV := .venv-scan
SCAN_STAMP := $(SCAN_VENV)/.installed-$(shell cat requirements-scan.txt constraints-scan.txt | sha256sum | cut -c1-12)

scan-tools: $(SCAN_STAMP)

$(SCAN_STAMP): requirements-scan.txt constraints-scan.txt
	@echo "==> Scanner virtualenv $(SCAN_VENV) (checkov, pinned)"
	python3 -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/pip install --quiet --upgrade pip
	$(call timed,scan-venv) $(LOW) $(SCAN_VENV)/bin/pip install --quiet -r requirements-scan.txt -c constraints-scan.txt
	rm -f $(SCAN_VENV)/.installed-*
	touch $@

unit: setup promtool scan-tools containerd2 oracles
	@echo "==> pytest unit tests"
	$(call timed,unit) $(LOW) $(BIN)/pytest -q tests/unit

MOLECULE_DEPS := setup images mirror containerd2 ee
define run-molecule
	$(LABCTL) cache-dirs
	@echo "==> Molecule scenarios: $(SCENARIOS)"
	$(BIN)/python tests/run_molecule.py --jobs $(MOLECULE_JOBS) $(SCENARIOS)
endef

molecule: $(MOLECULE_DEPS)
	$(run-molecule)

# The execution environment image (execution-environment.yml), cached by content: a retag when nothing changed.
ee: setup images
	$(call timed,ee) $(BIN)/python ee/build.py

# The main job's test (test_main_job.py) runs site.yml on the node containers, from the mirror: images and mirror first;
# test_execution_environment.py runs validation inside the EE image.
INTEGRATION_DEPS := setup prereqs lab-build promtool images mirror ee
define run-integration
	@echo "==> pytest integration tests (the lab's real control plane; the main job on the whole lab)"
	$(BIN)/pytest -q --durations=40 tests/integration
endef

integration: $(INTEGRATION_DEPS)
	$(run-integration)

# --- make test: stages in lanes side by side (docs/testing.md, "Lanes and budget") ---------------------------------------
# `make test` passes CI_TIMES=1: each stage's command then runs through tests/ci_times.py, which records its wall time,
# and the table is printed at the end (reports/ci-times.json for programs). It also passes LOW='nice -n 10' to the
# stages off the critical path (lint, the unit tests, the scanner's virtualenv), and MID='nice -n 5' to the Go builds
# no lane waits for first (the tools: containerd, promtool, the oracles): on two cores the control plane's build and
# the lanes, which the run's wall time waits for, get the CPU first. Lanes 2 and 3 run at SIDE='nice -n 2': in a warm
# run they ended 3 and 5 minutes before lane 1, the long pole, which then ran alone on a half-idle machine; below lane 1
# they still take every cycle it leaves (docs/testing.md, "Lanes and budget").
timed = $(if $(CI_TIMES),python3 tests/ci_times.py run $(1) --)
LOW ?=
MID ?=
SIDE ?=

# Three lanes, each on a lab of its own, from the moment their prerequisites exist (none waits for lint or the unit
# tests: -k lets every stage finish, and any failure fails `make test`). Balanced by measured time (docs/testing.md).
# - lane 1, the default lab: every test that uses the node containers (their names are fixed, so one lane has them)
#   and the main job; every integration file not listed in lanes 2 and 3.
# - lane 2: Molecule (its own containers and apt caches), then INTEGRATION_LANE2 on a second lab.
# - lane 3: INTEGRATION_LANE3 on a third lab, cluster side only.
# The second and third labs have their own GPU_LAB_STATE, ports shifted by GPU_LAB_PORT_OFFSET (bench labs use 1000
# and 2000), a pod network of their own (the offset moves it: Kueue binds its pod IP on loopback) and fact caches.
# Balanced by the files' measured times (docs/testing.md, "Lanes and budget"); listed in the order they run (the
# conftest.py's RUN_LAST still puts test_lifecycle.py last).
INTEGRATION_LANE2 := tests/integration/test_monitoring.py tests/integration/test_dcgm_exporter.py \
	tests/integration/test_monitoring_operator.py tests/integration/test_k8s_access.py \
	tests/integration/test_dra.py
INTEGRATION_LANE3 := tests/integration/test_dra_workloads.py tests/integration/test_gpu_queues.py \
	tests/integration/test_gpu_scheduling.py tests/integration/test_lab_cluster.py tests/integration/test_validation.py \
	tests/integration/test_workloads.py tests/integration/test_faults.py tests/integration/test_device_plugin.py \
	tests/integration/test_drift_schedule.py tests/integration/test_tenancy.py tests/integration/test_gpu_operator.py \
	tests/integration/test_lifecycle.py
LANE2_ENV := GPU_LAB_STATE=/var/lib/gpu-lab-lane2 GPU_LAB_PORT_OFFSET=5000 \
	ANSIBLE_CACHE_PLUGIN_CONNECTION=$(CURDIR)/.cache/facts-lane2
LANE3_ENV := GPU_LAB_STATE=/var/lib/gpu-lab-lane3 GPU_LAB_PORT_OFFSET=6000 \
	ANSIBLE_CACHE_PLUGIN_CONNECTION=$(CURDIR)/.cache/facts-lane3
# Enough slots that nothing waits for one: a stage that waits for a Go build (labctl takes the build's lock) holds
# its slot, and the images, the mirror and the EE must not queue behind it. The CPU is shared by priority (LOW).
TEST_JOBS ?= 10

test:
	@python3 tests/ci_times.py start --accounting
	@trap 'python3 tests/ci_times.py report; exit 130' INT TERM; \
	rc=0; $(MAKE) --no-print-directory -k -j$(TEST_JOBS) CI_TIMES=1 LOW='nice -n 10' MID='nice -n 5' SIDE='nice -n 2' \
		go-builds go-builds-tools \
		test-lint test-unit test-integration test-integration-lane2 test-integration-lane3 || rc=$$?; \
		python3 tests/ci_times.py report; exit $$rc

# First thing, with nothing before them (standard library and Go only): the control plane's build is the long pole of
# a cold run, and every lane waits for it. `labctl build` later finds them done (a second caller waits on the first).
go-builds:
	$(call timed,go-builds) python3 lab/labctl.py build

go-builds-tools:
	$(call timed,go-builds-tools) $(MID) python3 lab/labctl.py build --tools

test-lint: lint

test-unit: unit

# Lane 1 uses no promtool, only Debian's prometheus (tests/unit/test_ci_lanes.py keeps it so): on a cold machine
# promtool's build (about 1000 packages, below the control plane's priority) ends minutes after the control plane's,
# and lane 1 is the long pole.
LANE1_DEPS := $(patsubst promtool,prometheus,$(INTEGRATION_DEPS))

test-integration: $(LANE1_DEPS)
	@echo "==> pytest integration tests, lane 1 (the lab's real control plane, the node containers, the main job)"
	$(call timed,lane1) $(BIN)/pytest -q --durations=0 tests/integration \
		$(addprefix --ignore=,$(INTEGRATION_LANE2) $(INTEGRATION_LANE3))

# Molecule, then lane 2, in one recipe: lane 2 runs even when a scenario failed (a failed prerequisite would stop it, and
# one CI run would then say nothing about lane 2's tests); the recipe fails if either did. Molecule needs no control
# plane, so it starts without waiting for that build; lane 2's lab needs it and promtool: `labctl build` and
# `labctl promtool` find them built (or wait on the build's lock) before lane 2 starts.
test-integration-lane2: $(MOLECULE_DEPS) prereqs
	$(LABCTL) cache-dirs
	@echo "==> Molecule scenarios: $(SCENARIOS)"
	@molecule=0; $(call timed,molecule) $(BIN)/python tests/run_molecule.py --jobs $(MOLECULE_JOBS) $(SCENARIOS) \
		|| molecule=$$?; \
	lane2=0; $(LABCTL) build && $(LABCTL) promtool || lane2=$$?; \
	echo "==> pytest integration tests, lane 2 (a second lab, cluster side): $(notdir $(INTEGRATION_LANE2))"; \
	[ $$lane2 -ne 0 ] || $(LANE2_ENV) $(call timed,lane2) $(SIDE) $(BIN)/pytest -q -p no:cacheprovider --durations=0 \
		$(INTEGRATION_LANE2) || lane2=$$?; \
	if [ $$molecule -ne 0 ]; then echo "==> Molecule failed (exit $$molecule); lane 2 ran all the same"; fi; \
	[ $$molecule -eq 0 ] && [ $$lane2 -eq 0 ]

test-integration-lane3: setup prereqs lab-build
	@echo "==> pytest integration tests, lane 3 (a third lab, cluster side): $(notdir $(INTEGRATION_LANE3))"
	$(LANE3_ENV) $(call timed,lane3) $(SIDE) $(BIN)/pytest -q -p no:cacheprovider --durations=0 $(INTEGRATION_LANE3)

bench: setup images mirror containerd2
	$(LABCTL) cache-dirs
	$(BIN)/python bench/converge_times.py

bench-stack: setup lab-build
	$(BIN)/python bench/cluster_stack.py

bench-scale: setup lab-build
	$(BIN)/python bench/lab_scale.py

# GPU packing, default kube-scheduler against the gpu_scheduling role's bin-packing profile, on a bench lab.
bench-packing: setup lab-build
	$(BIN)/python bench/gpu_packing.py

# Scheduling latency of GPU pods asking through ResourceClaims (DRA) against the nvidia.com/gpu extended resource, on a
# bench lab of 1000 simulated nodes split between the two allocation modes.
bench-dra: setup lab-build
	$(BIN)/python bench/dra_latency.py

# On the running lab (make lab first): a no-op site.yml against a detect-only drift check (--scale-nodes N: bench lab).
bench-drift: setup lab-build
	$(BIN)/python bench/drift_check.py

# On the running lab (make lab first): one GPU node's driver moved by the bare role and by the rolling upgrade.
bench-driver-upgrade: setup
	$(BIN)/python bench/driver_upgrade.py

# On the running lab (make lab first): a no-op nodes.yml on the node containers, in remote round-trip equivalents.
bench-noop-nodes: setup
	$(BIN)/python bench/noop_nodes.py

# What is behind: every pin of versions.yml and the Python requirements against the newest release the Go module proxy
# and PyPI list, with its date and release notes (tests/outdated.py; not a test: the registries' answers change).
outdated: setup
	$(BIN)/python tests/outdated.py
