"""What an MCP caller may name, and the refusal of everything else.

The caller of `lab mcp` is untrusted (an agent reading strangers' issue pages). It names scenarios
by name only (the configured scenario folders, and those the server wrote from issue pages into its
own workspace), folders by their path under the server's runs folder, engines from the configured
list, and never a Dockerfile, a base image outside the allowed list, a host path, or network for a
script unless the server was started with `--allow-network`."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from lab.core.errors import LabError
from lab.core.resources import shipped_scenarios_dir
from lab.issue.infer import CPU_BASE, GPU_BASE, OLD_BASE
from lab.scenario.lookup import list_scenarios, load_scenario

__all__ = ["AgentInputError", "Policy", "WORKSPACE"]

WORKSPACE = "agent"          # <runs>/agent: the pages and scenarios the server writes for its callers
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class AgentInputError(LabError):
    """What an MCP caller asked for is refused (a path outside the runs folder, an unknown scenario,
    an engine or base image that is not configured)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Policy:
    runs_root: Path
    scenario_dirs: tuple[Path, ...]
    engines: tuple[str, ...] = ()          # the configured `engines` setting; "local" and "default" always
    allow_network: bool = False
    extra_bases: tuple[str, ...] = ()      # `lab mcp --allow-base`
    output_cap: int = 16_000               # characters of any text a tool returns (a report, a comparison)
    _bases: list[str] = field(default_factory=list, compare=False)

    @property
    def workspace(self) -> Path:
        return self.runs_root / WORKSPACE

    @property
    def scenarios_folder(self) -> Path:
        return self.workspace / "scenarios"

    def search_dirs(self) -> list[Path]:
        return [self.scenarios_folder, *self.scenario_dirs]

    # ------------------------------------------------------------------ scenarios and bases

    def scenario_path(self, name: str) -> Path:
        """The YAML file of a scenario NAME (never a path) in the workspace or a configured folder."""
        if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
            raise AgentInputError(f"scenario {name!r}: give a scenario's name (letters, digits, . _ -) as "
                                  "list_scenarios shows it; paths are not accepted.", field="scenario")
        for folder in self.search_dirs():
            for suffix in (".yaml", ".yml"):
                path = folder / f"{name}{suffix}"
                if path.is_file():
                    return path
        raise AgentInputError(f"there is no scenario named {name!r}: list_scenarios shows the names, and "
                              "scenario_from_issue writes new ones.", field="scenario")

    def allowed_bases(self) -> list[str]:
        """The configured list: every base of the shipped scenarios, the ones the issue inference
        chooses, and `lab mcp --allow-base` (a project scenario on another base needs it too)."""
        if not self._bases:
            found = {CPU_BASE, GPU_BASE, OLD_BASE, *self.extra_bases}
            with contextlib.suppress(LabError):
                found |= {s.base for s in list_scenarios(shipped_scenarios_dir()) if not isinstance(s, Exception)}
            self._bases.extend(sorted(found))
        return self._bases

    def check_scenario(self, name: str):
        """The loaded scenario NAME, refused when its base is not in the allowed list or it asks for
        the network that this server does not allow."""
        path = self.scenario_path(name)
        scenario = load_scenario(path)
        if scenario.base not in self.allowed_bases():
            raise AgentInputError(f"scenario {name!r} uses base image {scenario.base!r}, which is not in this "
                                  f"server's list ({', '.join(self.allowed_bases())}); start `lab mcp` with "
                                  "--allow-base to add it.", field="base")
        if scenario.network and not self.allow_network:
            raise AgentInputError(f"scenario {name!r} asks for network access while its script runs; this server "
                                  "runs scripts without network (start `lab mcp --allow-network` to allow it).",
                                  field="network")
        return path, scenario

    # ------------------------------------------------------------------ folders and engines

    def folder(self, given: str, what: str = "folder") -> Path:
        """A folder under the runs folder, given relative to it (or absolute inside it); `..`, links
        out of it and anything elsewhere are refused."""
        if not isinstance(given, str) or not given.strip() or "\x00" in given:
            raise AgentInputError(f"{what}: give a run or bisect folder relative to the runs folder.", field=what)
        root = self.runs_root.resolve()
        raw = Path(given)
        candidate = raw if raw.is_absolute() else root / raw
        if ".." in raw.parts:
            raise AgentInputError(f"{what} {given!r}: '..' is not accepted; give the folder relative to the "
                                  "runs folder, as the tools return it.", field=what)
        try:
            real = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            raise AgentInputError(f"{what} {given!r}: there is no such folder under the runs folder.",
                                  field=what) from None
        if real == root or not real.is_relative_to(root) or not real.is_dir():
            raise AgentInputError(f"{what} {given!r} is outside the runs folder (or not a folder); this server "
                                  "reads only what is under its runs folder.", field=what)
        return real

    def relative(self, path: str | Path | None) -> str | None:
        """A path under the runs folder as the tools give it: relative to the runs folder."""
        if path is None:
            return None
        p = Path(path).resolve()
        root = self.runs_root.resolve()
        return str(p.relative_to(root)) if p.is_relative_to(root) else p.name

    def engine_args(self, engine: str | None) -> list[str]:
        if engine is None or engine == "default":
            return []
        allowed = {"local", *self.engines}
        if engine not in allowed:
            raise AgentInputError(f"engine {engine!r} is not configured; choose one of: default, "
                                  f"{', '.join(sorted(allowed))}.", field="engine")
        return ["--engine", engine]

    def cap(self, text: str | None) -> str | None:
        if text is None or len(text) <= self.output_cap:
            return text
        return text[: self.output_cap] + f"\n… (cut at {self.output_cap} characters; the full text is in the folder)"
