"""The old home of the scenario model, loader and lookup, now three modules: lab.scenario.model
(the pydantic model and its validators), lab.scenario.loader (the YAML-with-lines loader and the
file/line/field errors) and lab.scenario.lookup (finding a scenario by name or path). The lab's own
code imports from those; these names stay only so that branches written against the old module
still merge and run. New code should not import from here."""

from lab.core.arch import Arch
from lab.scenario.loader import MAX_DEPTH, MAX_FILE_BYTES, read_yaml, validate_scenario
from lab.scenario.lookup import SCENARIOS_DIR, default_scenarios_dir, find_by_name, list_scenarios, load_scenario
from lab.scenario.model import (
    CONTROL_CHARS,
    KNOWN_RUNTIME_FAMILIES,
    Ablation,
    Expect,
    Limits,
    Scenario,
    Signature,
    check_version,
    is_debian_package,
    parse_size,
)

__all__ = [
    "CONTROL_CHARS",
    "KNOWN_RUNTIME_FAMILIES",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "SCENARIOS_DIR",
    "Ablation",
    "Arch",
    "Expect",
    "Limits",
    "Scenario",
    "Signature",
    "check_version",
    "default_scenarios_dir",
    "find_by_name",
    "is_debian_package",
    "list_scenarios",
    "load_scenario",
    "parse_size",
    "read_yaml",
    "validate_scenario",
]
