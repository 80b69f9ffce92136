"""plugins/filter/inputs.py: the boolean check every role's preflight runs first."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import load_filter_plugin

inputs = load_filter_plugin("inputs")
problems = inputs.bool_input_problems


def test_real_booleans_pass():
    assert problems({"a_enabled": True, "a_hold": False}) == []
    assert problems({}) == []


@pytest.mark.parametrize(("value", "expected"), [
    ("false", 'a_flag="false" is not a boolean (str)'),
    ("no", 'a_flag="no" is not a boolean (str)'),
    (0, "a_flag=0 is not a boolean (int)"),
    (None, "a_flag=null is not a boolean (null)"),
    ([True], "a_flag=[true] is not a boolean (list)"),
])
def test_anything_else_is_named_with_its_value_and_type(value, expected):
    assert problems({"a_ok": True, "a_flag": value}) == [expected + ": use true or false, unquoted."]


def test_through_ansible_templating():
    """As the roles call it: values from YAML extra vars reach the filter as Ansible's tagged types."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import filter_loader
    from ansible.template import Templar, trust_as_template

    filter_loader.add_directory(str(Path(__file__).resolve().parents[2] / "plugins" / "filter"))
    loader = DataLoader()
    variables = loader.load('{"x_hold": "false", "x_member_exec": true}')
    rendered = Templar(loader=loader, variables=variables).template(trust_as_template(
        "{{ {'x_hold': x_hold, 'x_member_exec': x_member_exec} | bool_input_problems }}"))
    assert rendered == ['x_hold="false" is not a boolean (str): use true or false, unquoted.']
