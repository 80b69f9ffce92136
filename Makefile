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

.PHONY: lab lab-up lab-down lab-reset lab-status lab-build test test-integration test-integration-lane2 lint unit molecule integration \
	setup prereqs images \
	mirror containerd2 promtool ee bench bench-stack bench-scale bench-drift bench-noop-nodes bench-driver-upgrade bench-packing bench-dra scan-tools

# The checkout is the collection gpu_ops.cluster (galaxy.yml). Linked into the virtualenv's ansible_collections, it is
# what Ansible finds for every FQCN (roles, modules, filters, playbooks) and what plain Python imports (unit tests).
setup: $(STAMP)
	@site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
		mkdir -p "$$site/ansible_collections/gpu_ops" && ln -sfn "$(CURDIR)" "$$site/ansible_collections/gpu_ops/cluster"

$(STAMP): requirements.txt constraints.txt
	@echo "==> Python virtualenv $(VENV) (pinned requirements.txt; collections from the ansible bundle)"
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt -c constraints.txt
	rm -f $(VENV)/.installed-*
	touch $@

prereqs: setup
	$(LABCTL) prereqs

images: prereqs
	$(LABCTL) images

# Debian's NVIDIA driver packages plus the NVIDIA-style flat repositories (container toolkit, CUDA doubles).
mirror: prereqs
	$(LABCTL) mirror

# containerd 2.2 and 2.4 from source -> $GPU_LAB_CACHE/bin/containerd2 and containerd2.4 (the toolkit role's config
# version 3 and 4 checks: unit tests and Molecule), built side by side.
containerd2: setup
	$(LABCTL) containerd2

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
	$(LABCTL) build

lint: setup
	@echo "==> yamllint"
	$(BIN)/yamllint --strict .
	@echo "==> ansible-lint (production profile)"
	$(BIN)/ansible-lint --strict
	@echo "==> ansible-test sanity (the collection's files, in a scratch ansible_collections tree; tests/sanity/run.py)"
	$(BIN)/python tests/sanity/run.py

promtool: setup
	$(LABCTL) promtool

# The security scanner (checkov) in its own virtualenv: its dependency tree would otherwise move .venv's pins.
SCAN_VENV := .venv-scan
SCAN_STAMP := $(SCAN_VENV)/.installed-$(shell cat requirements-scan.txt constraints-scan.txt | sha256sum | cut -c1-12)

scan-tools: $(SCAN_STAMP)

$(SCAN_STAMP): requirements-scan.txt constraints-scan.txt
	@echo "==> Scanner virtualenv $(SCAN_VENV) (checkov, pinned)"
	python3 -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/pip install --quiet --upgrade pip
	$(SCAN_VENV)/bin/pip install --quiet -r requirements-scan.txt -c constraints-scan.txt
	rm -f $(SCAN_VENV)/.installed-*
	touch $@

unit: setup promtool scan-tools containerd2
	@echo "==> pytest unit tests"
	$(BIN)/pytest -q tests/unit

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
	$(BIN)/python ee/build.py

# The main job's test (test_main_job.py) runs site.yml on the node containers, from the mirror: images and mirror first;
# test_execution_environment.py runs validation inside the EE image.
INTEGRATION_DEPS := setup prereqs lab-build promtool images mirror ee
define run-integration
	@echo "==> pytest integration tests (the lab's real control plane; the main job on the whole lab)"
	$(BIN)/pytest -q --durations=40 tests/integration
endef

integration: $(INTEGRATION_DEPS)
	$(run-integration)

# Molecule and the integration tests share no container, port or apt cache (Molecule's hosts are its own containers,
# the lab's are the control plane and its node containers), so they run side by side. Their output interleaves as it
# comes (make's --output-sync would hold each command's output until it ends: half an hour without progress).
# In two lanes from the start: the lab's build (Kubernetes, etcd and containerd from source: the longest step on a new
# machine) begins beside the lint, while the unit tests, the images, the mirror and the EE follow as lanes free up;
# then Molecule and the integration tests run side by side, each once lint and unit tests have passed. Molecule's lane
# is done long before the integration tests, so once Molecule is done (passed or not) it runs INTEGRATION_LANE2 (cluster-side
# tests only: no node container, no Kueue) against a second lab of its own (GPU_LAB_STATE, every port shifted by
# GPU_LAB_PORT_OFFSET, its own fact cache), which it starts and stops; the first lane runs every other test.
INTEGRATION_LANE2 := tests/integration/test_faults.py tests/integration/test_monitoring.py \
	tests/integration/test_dcgm_exporter.py tests/integration/test_device_plugin.py \
	tests/integration/test_drift_schedule.py tests/integration/test_k8s_access.py tests/integration/test_tenancy.py \
	tests/integration/test_gpu_operator.py \
	tests/integration/test_monitoring_operator.py \
	tests/integration/test_dra.py tests/integration/test_dra_workloads.py
# Port offset 5000: bench/lab_scale.py's bench labs use 1000 by default, so a bench can run beside a test run.
LANE2_ENV := GPU_LAB_STATE=/var/lib/gpu-lab-lane2 GPU_LAB_PORT_OFFSET=5000 \
	ANSIBLE_CACHE_PLUGIN_CONNECTION=$(CURDIR)/.cache/facts-lane2
test:
	$(MAKE) --no-print-directory -k -j2 test-integration test-integration-lane2

test-integration: lab-build lint unit $(INTEGRATION_DEPS)
	@echo "==> pytest integration tests, lane 1 (the lab's real control plane; the main job on the whole lab)"
	$(BIN)/pytest -q --durations=30 tests/integration $(addprefix --ignore=,$(INTEGRATION_LANE2))

# Molecule, then lane 2, in one recipe: lane 2 runs even when a scenario failed (a failed prerequisite would stop it, and
# one CI run would then say nothing about lane 2's tests); the recipe fails if either did.
test-integration-lane2: lint unit $(MOLECULE_DEPS) $(INTEGRATION_DEPS)
	$(LABCTL) cache-dirs
	@echo "==> Molecule scenarios: $(SCENARIOS)"
	@$(BIN)/python tests/run_molecule.py --jobs $(MOLECULE_JOBS) $(SCENARIOS); molecule=$$?; \
	echo "==> pytest integration tests, lane 2 (a second lab, cluster side): $(notdir $(INTEGRATION_LANE2))"; \
	$(LANE2_ENV) $(BIN)/pytest -q -p no:cacheprovider --durations=15 $(INTEGRATION_LANE2); lane2=$$?; \
	if [ $$molecule -ne 0 ]; then echo "==> Molecule failed (exit $$molecule); lane 2 ran all the same"; fi; \
	[ $$molecule -eq 0 ] && [ $$lane2 -eq 0 ]

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
