"""The typed results of `lab mcp`'s tools (their JSON Schemas: `lab schema mcp-run` and the others).

Every result that ran something carries the verdict, an evidence summary, the folder (relative to the
server's runs folder, as read_report, compare and comment take it back) and the paste-ready comment:
never a bare log. Texts are capped (the report and the logs stay in the folder)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ScenarioInfo(_Model):
    name: str
    title: str | None = None
    torch: list[str] = Field(default_factory=list)
    arch: list[str] = Field(default_factory=list)
    gpu: bool = False
    base: str | None = None
    origin: str = Field(description="project, shipped, or agent (written by scenario_from_issue)")
    error: str | None = Field(None, description="why the file does not load, for a broken scenario")


class ScenarioList(_Model):
    scenarios: list[ScenarioInfo]


class ScenarioDetail(_Model):
    name: str
    yaml: str = Field(description="the scenario as the lab understands it (YAML)")
    script: str | None = Field(None, description="the script it runs (capped)")


class InferredFact(_Model):
    name: str
    value: str
    line: int | None = Field(None, description="the page line it came from (null: a default)")
    how: str
    default: bool = False


class FromIssueResult(_Model):
    scenario: str = Field(description="the name to give run, bisect and show_scenario")
    cpu_variant: str | None = Field(None, description="the CPU variant's name, for a GPU page")
    torch: str
    arch: str
    base: str
    expect: dict
    no_oracle: bool = Field(description="true when the page showed no failure to check, so the expectation "
                                        "is the default (the script exits non-zero)")
    facts: list[InferredFact]
    fixups: list[str]


class Evidence(_Model):
    exception: str | None = Field(None, description="the final exception, `Type: message` (capped)")
    duplicate_runtimes: list[str] = Field(default_factory=list, description="runtime families loaded twice")
    summary: list[str] = Field(default_factory=list, description="the run's findings in plain words")
    output_cut: bool = Field(False, description="true when the script's output passed its cap and was cut")


class RunToolResult(_Model):
    scenario: str
    torch: str
    arch: str
    engine: str | None
    emulated: bool
    verdict: str = Field(description="reproduced | not_reproduced | failed_differently | error | timeout")
    reason: str
    evidence: Evidence
    run_folder: str = Field(description="relative to the server's runs folder")
    network: bool = Field(description="whether the script had network")
    confinement: str | None = Field(None, description="the limits the script ran under")
    comment: str = Field(description="a Markdown comment ready to paste into the issue")


class BisectStepResult(_Model):
    torch: str
    verdict: str


class BisectToolResult(_Model):
    status: str = Field(description="found, or why no boundary was found")
    from_verdict: str | None
    to_verdict: str | None
    last_old: str | None
    first_new: str | None
    steps: list[BisectStepResult]
    summary: str
    blame: list[str] = Field(default_factory=list, description="packages whose change flips the verdict")
    folder: str
    comment: str


class CompareToolResult(_Model):
    a: str
    b: str
    same_verdict: bool | None = None
    summary: list[str]


class CommentResult(_Model):
    folder: str
    comment: str


class TriageToolResult(_Model):
    source: str
    scenario: str | None
    page_verdict: str | None = Field(description="the verdict on the release the page names")
    page_torch: str | None
    newest_verdict: str | None = Field(description="the verdict on the newest release")
    newest_torch: str | None
    boundary: str | None = Field(None, description="`last_old -> first_new` when a bisection found it")
    blame: list[str] = Field(default_factory=list)
    summary: list[str]
    folder: str
    comment: str | None


class ReportResult(_Model):
    folder: str
    kind: str = Field(description="run, bisect, matrix or triage")
    verdict: str | None = None
    summary: list[str] = Field(default_factory=list)
    report: str = Field(description="report.md (or bisect.md, summary.md), capped")


TOOL_RESULTS: dict[str, tuple[str, type[BaseModel]]] = {
    "mcp-list-scenarios": ("`lab mcp` tool list_scenarios", ScenarioList),
    "mcp-show-scenario": ("`lab mcp` tool show_scenario", ScenarioDetail),
    "mcp-scenario-from-issue": ("`lab mcp` tool scenario_from_issue", FromIssueResult),
    "mcp-run": ("`lab mcp` tool run", RunToolResult),
    "mcp-bisect": ("`lab mcp` tool bisect", BisectToolResult),
    "mcp-compare": ("`lab mcp` tool compare", CompareToolResult),
    "mcp-comment": ("`lab mcp` tool comment", CommentResult),
    "mcp-triage": ("`lab mcp` tool triage", TriageToolResult),
    "mcp-read-report": ("`lab mcp` tool read_report", ReportResult),
}
