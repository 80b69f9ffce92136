# Two commands for a newcomer (see README.md):
#   make lab    - the main job on the embedded lab
#   make test   - every test, in order: yamllint, ansible-lint, unit tests, Molecule scenarios, integration tests
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

.PHONY: lab lab-up lab-down lab-reset lab-status lab-build test lint unit molecule integration setup prereqs images \
	mirror promtool bench bench-stack bench-scale

setup: $(STAMP)

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

mirror: prereqs
	$(LABCTL) mirror

lab: setup prereqs
	$(LABCTL) up
	rc=0; $(BIN)/ansible-playbook playbooks/site.yml || rc=$$?; $(LABCTL) summary; exit $$rc

lab-up: setup prereqs
	$(LABCTL) up

lab-down: setup
	$(LABCTL) down

lab-reset: setup prereqs
	$(LABCTL) reset

lab-status: setup
	$(LABCTL) status

lab-build: setup
	$(LABCTL) build

lint: setup
	@echo "==> yamllint"
	$(BIN)/yamllint --strict .
	@echo "==> ansible-lint (production profile)"
	$(BIN)/ansible-lint --strict

promtool: setup
	$(LABCTL) promtool

unit: setup promtool
	@echo "==> pytest unit tests"
	$(BIN)/pytest -q tests/unit

molecule: setup images mirror
	$(LABCTL) cache-dirs
	@echo "==> Molecule scenarios: $(SCENARIOS)"
	$(BIN)/python tests/run_molecule.py --jobs $(MOLECULE_JOBS) $(SCENARIOS)

integration: setup prereqs lab-build promtool
	@echo "==> pytest integration tests (the lab's real control plane)"
	$(BIN)/pytest -q tests/integration

test: lint unit molecule integration

bench: setup images mirror
	$(BIN)/python bench/converge_times.py

bench-stack: setup lab-build
	$(BIN)/python bench/cluster_stack.py

bench-scale: setup lab-build
	$(BIN)/python bench/lab_scale.py
