"""Writes prometheusrule.yaml (the Prometheus Operator's PrometheusRule) from rules.yml.

rules.yml is the one copy of the rules; run this after editing it:
    python k8s/monitoring/prometheusrule.py
tests/deploy/test_monitoring.py fails while the two differ.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yml"
OUTPUT = HERE / "prometheusrule.yaml"
HEADER = "# Generated from rules.yml by prometheusrule.py: edit rules.yml and run it again.\n"


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> Any:
    # Multi-line expressions and descriptions stay readable as block scalars.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(rules_text: str) -> str:
    groups = yaml.safe_load(rules_text)["groups"]
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "dispatcher", "labels": {"app.kubernetes.io/name": "dispatcher"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(resource, Dumper=_Dumper, sort_keys=False, width=4096)


def main() -> int:
    OUTPUT.write_text(render(RULES.read_text()))
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
