# Two commands for a newcomer (see README.md):
#   make lab    - the main job on the embedded lab
#   make test   - every test, in order: yamllint, ansible-lint, unit tests, Molecule scenarios
# Both set up what they need first (system packages as root, the virtualenv, the base images).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt constraints.txt | sha256sum | cut -c1-12)
LABCTL := python3 lab/labctl.py
MOLECULE_JOBS ?= 2
SCENARIOS ?= $(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))

export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: lab lab-down test lint unit molecule setup prereqs images mirror bench

setup: $(STAMP)

$(STAMP): requirements.txt constraints.txt
	@echo "==> Python virtualenv $(VENV) (pinned requirements.txt; collections from the ansible bundle)"
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt -c constraints.txt
	rm -f $(VENV)/.installed-*
	touch $@

prereqs:
	$(LABCTL) prereqs

images: prereqs
	$(LABCTL) images

mirror: prereqs
	$(LABCTL) mirror

lab: setup prereqs
	$(LABCTL) up
	$(BIN)/ansible-playbook playbooks/site.yml
	$(LABCTL) summary

lab-down:
	$(LABCTL) down

lint: setup
	@echo "==> yamllint"
	$(BIN)/yamllint --strict .
	@echo "==> ansible-lint (production profile)"
	$(BIN)/ansible-lint --strict

unit: setup
	@echo "==> pytest unit tests"
	$(BIN)/pytest -q tests/unit

molecule: setup images mirror
	$(LABCTL) cache-dirs
	@echo "==> Molecule scenarios: $(SCENARIOS)"
	$(BIN)/python tests/run_molecule.py --jobs $(MOLECULE_JOBS) $(SCENARIOS)

test: lint unit molecule

bench: setup images mirror
	$(BIN)/python bench/converge_times.py
