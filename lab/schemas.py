"""The JSON Schemas of what the lab writes (`lab schema`), for people who script against `--json`,
result.json and bundles. They are generated from the models in lab.results and lab.bundle, in
pydantic's serialization mode: every key listed is present in what the lab writes (null when it has
no value), and readers should ignore keys they do not know (see lab.results on schema versions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from lab.agent.models import TOOL_RESULTS
from lab.bundle.manifest import Manifest
from lab.compare.diff import Comparison
from lab.core.errors import ScenarioError
from lab.core.results import (
    RUN_FILE,
    SCHEMA_VERSION,
    AblationResult,
    BisectResult,
    EvidenceRecord,
    LocalizeResult,
    MatrixResult,
)
from lab.issue.triage_batch import BatchSummary

DIALECT = "https://json-schema.org/draft/2020-12/schema"

# name -> (what it describes, the model)
SCHEMAS: dict[str, tuple[str, Any]] = {
    "run": ("result.json and `lab run --json`: a run that reached a verdict, or one that stopped "
            "without one (verdict null, status interrupted or failed)", RUN_FILE),
    "evidence": ("evidence.json: everything the analysis found in a run, and the judge's checks", EvidenceRecord),
    "bisect": ("bisect.json and `lab bisect --json`", BisectResult),
    "matrix": ("`lab run --json` of a matrix (several torch versions or arches)", MatrixResult),
    "ablation": ("ablation.json and `lab run --ablate --json`", AblationResult),
    "compare": ("`lab compare A B --json`: what changed between two runs of one scenario", Comparison),
    "localize": ("localize.json and `lab localize --json`: the layer and subsystem of a compile bug",
                 LocalizeResult),
    "bundle-manifest": ("bundle.json, the first member of a bundle (`lab bundle --inspect --json`); its "
                        "`format_version` is its schema version", Manifest),
    "triage-batch": ("summary.json of `lab triage` over several pages, and its --json; the batch's own "
                     "`schema_version`", BatchSummary),
    **{name: (f"the structured result of {words}", model) for name, (words, model) in TOOL_RESULTS.items()},
}
# documents with the results' SCHEMA_VERSION (the others carry their own version, or none: the MCP tools'
# results are versioned by the server's tool list)
_VERSIONED = ("run", "evidence", "bisect", "matrix", "ablation", "compare", "localize")


def names() -> list[str]:
    return list(SCHEMAS)


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one document."""
    if name not in SCHEMAS:
        raise ScenarioError(f"there is no schema named {name!r}.", field="NAME",
                            hint=f"Choose one of: {', '.join(SCHEMAS)}.")
    description, model = SCHEMAS[name]
    adapter = model if isinstance(model, TypeAdapter) else TypeAdapter(model)
    schema = adapter.json_schema(mode="serialization", by_alias=True)
    return {"$schema": DIALECT, "title": f"torch-repro-lab {name}",
            "description": description + (f" (schema_version {SCHEMA_VERSION})" if name in _VERSIONED else ""),
            **{k: v for k, v in schema.items() if k not in ("title", "description")}}


def render(name: str) -> str:
    return json.dumps(json_schema(name), indent=2) + "\n"


def write_schemas(folder: Path, which: list[str] | None = None) -> list[Path]:
    """Write `<name>.schema.json` into `folder` for each schema (default: all); return the paths."""
    chosen = which or names()
    texts = {name: render(name) for name in chosen}  # every name checked before anything is written
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in texts.items():
        path = folder / f"{name}.schema.json"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
