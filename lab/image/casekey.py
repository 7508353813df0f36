"""Case -> ContentKey: what a run of the case depends on, hashed, so that a bisection probe, a matrix
cell or a triage step is reused only when it was made from the same thing.

The key is a SHA-256 over named parts, each the hash of a canonical JSON value (sorted keys, one
spelling per value), so that a YAML comment, the order of keys or `8g` against `8GiB` change
nothing, while every value that changes what is built, what runs or how it is judged does:

- `case`: the torch version, the arch, the backend and the mode;
- `scenario`: what the run is given besides those: env, args, timeout, gpu, network, limits (in
  bytes), the ablation settings and the script's file name (it is in the command);
- `script`: the script's bytes (the only file a scenario ships into its image or sandbox);
- `expect`: the judging conditions;
- `vars`: the scenario's vars after `--set`;
- `base`: the base image the scenario asks for;
- `deps`: pip requirements, system packages, how they are installed (the cross_install setting),
  the dependency era (`deps`: latest, era or a date, lab.image.era) and the pins the lab chose
  itself (a blame probe's); an era's resolved pins follow from the setting and are not a part;
  the versions a replay constrains to (its original run's freeze) are one when there are any;
- `lab`: RULES_VERSION, the Dockerfile template(s) the case renders with (the shipped ones or
  `templates_dir`'s) and the in-image runner (lab_run.py).

The lab's own version is not a part: a release that changes neither templates, runner nor rules
keeps every finished probe; one whose judging or building changes meaning bumps RULES_VERSION.
Left out on purpose: the scenario's name, title, upstream, description and cpu_variant (the run
does not see them), and the file's path (a copied scenario is the same scenario). The engine a
probe ran on is not a part either: an emulated and a native run of one case are the same case.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from lab.core.config import current
from lab.core.resources import runner_source
from lab.image.render import template_environment, template_for
from lab.image.resolve import Case

# Bump when the templates' or the judging rules' meaning changes without a file change.
# 2: a failure of the script's own code (NameError, ImportError...) is not reproduced by an exit code alone.
RULES_VERSION = 2
KEY_FORMAT = 1

PARTS = ("case", "scenario", "script", "expect", "vars", "base", "deps", "lab")
# How each part is named when it differs from a recorded one (the progress line says these).
PART_WORDS = {"case": "torch, arch, backend or mode", "scenario": "env, args, timeout, limits, gpu, network "
              "or ablation", "script": "the script", "expect": "expect", "vars": "vars (with --set)",
              "base": "base", "deps": "pip, system_packages, "
              "cross_install or the dependencies' era (deps)", "lab": "the lab's templates, "
              "runner or judging rules"}


@dataclass(frozen=True)
class ContentKey:
    digest: str                                  # sha256 hex over every part
    parts: Mapping[str, str] = field(default_factory=dict)  # part -> its own sha256 (16 hex digits)

    @property
    def scenario_part(self) -> str:
        """A hash of every part but `case` (torch, arch, backend, mode): what the probes of one
        bisection share."""
        return hashlib.sha256("".join(f"{n}\0{self.parts.get(n, '')}\n" for n in PARTS if n != "case")
                              .encode()).hexdigest()[:32]

    def differs(self, digest: str | None, parts: Mapping[str, str] | None) -> str | None:
        """None when a recorded key (`digest`, `parts`) is this one; else why not, in words."""
        if digest == self.digest:
            return None
        if not digest:
            return "it has no content key (made by an older lab), so what it ran is unknown"
        changed = [PART_WORDS[name] for name in PARTS if parts and parts.get(name) != self.parts.get(name)]
        if not changed:
            return "its content key differs"
        return "the scenario changed since (" + "; ".join(changed) + ")"


def content_key(case: Case) -> ContentKey:
    """The content key of `case` (reads the script and the templates: cheap, no engine, no network)."""
    values = _values(case)
    parts = {name: _sha(values[name])[:16] for name in PARTS}
    sha = hashlib.sha256(f"torch-repro-lab content key v{KEY_FORMAT}\n".encode())
    for name in PARTS:
        sha.update(f"{name}\0{parts[name]}\n".encode())
    return ContentKey(sha.hexdigest(), parts)


def _values(case: Case) -> dict[str, object]:
    s = case.scenario
    limits = s.limits
    expect = s.expect.model_dump(mode="json", exclude_none=True)
    if "exit_code" in expect:  # `exit_code: 1` and `[1]` are one condition
        expect["exit_code"] = sorted(s.expect.exit_codes)
    return {
        "case": {"torch": case.torch, "arch": case.arch.value, "backend": case.backend, "mode": case.mode},
        "scenario": {"env": dict(s.env), "args": list(s.args), "timeout": s.timeout, "gpu": s.gpu,
                     "network": s.network, "ablation": s.ablation.model_dump(mode="json"),
                     "script_name": s.script.name,
                     "limits": {"memory": limits.memory_bytes, "pids": limits.pids, "cpus": limits.cpus,
                                "output": limits.output_bytes, "logs": limits.logs_bytes}},
        "script": hashlib.sha256(s.script.read_bytes()).hexdigest(),
        "expect": expect,
        "vars": dict(case.vars),
        "base": s.base,
        "deps": {"pip": list(s.pip), "system_packages": sorted(s.system_packages),
                 "cross_install": _cross_install(),
                 **({"era": case.deps} if case.deps != "latest" else {}),
                 **({"pins": sorted(case.pins)} if case.pins else {}),
                 **({"constraints": sorted(case.constraints)} if case.constraints else {})},
        "lab": {"rules": RULES_VERSION, "templates": _templates(case), "runner": _runner()},
    }


def _sha(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _cross_install() -> bool:
    return bool(current().cross_install)


def _templates(case: Case) -> dict[str, str]:
    """The sha256 of each Dockerfile template the case renders with (cuda's extends debian's)."""
    env = template_environment()
    found: dict[str, str] = {}
    for name in sorted({template_for(case), "debian.Dockerfile.j2"}):
        try:
            source = env.loader.get_source(env, name)[0] if env.loader is not None else ""
        except Exception:  # noqa: BLE001 - a missing template is rendered (and refused) elsewhere
            source = ""
        found[name] = hashlib.sha256(source.encode()).hexdigest()
    return found


def _runner() -> str:
    return hashlib.sha256(runner_source()).hexdigest()
