"""BuildPlan -> image: ensure the base, then build unless the content-addressed tag exists."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from .base import ensure_base
from .engine import Engine
from .hostpip import HostPip
from .records import BuiltImage, Events, no_events
from .render import IMAGE_REPO, BuildPlan


def image_tag(plan: BuildPlan, base_id: str) -> str:
    """Content-addressed: the context (Dockerfile included) and the exact base image."""
    digest = hashlib.sha256(f"{plan.digest}\n{base_id}".encode()).hexdigest()
    return f"{IMAGE_REPO}:{plan.case.scenario.name}-{digest[:16]}"


def build_image(plan: BuildPlan, engine: Engine, host: HostPip, events: Events = no_events,
                log_path: Path | None = None) -> BuiltImage:
    """Ensure the base, then build the case image unless its content-addressed tag exists."""
    case = plan.case
    base = ensure_base(engine, case.scenario.base, case.arch, events)
    tag = image_tag(plan, base.image_id)
    existing = engine.image_id(tag)
    if existing:
        events("build", f"image {tag} is cached")
        if log_path:
            log_path.write_text(f"cached: {tag} ({existing})\n")
        return BuiltImage(tag, existing, base, cached=True, build_seconds=0.0)
    events("build", f"building {tag} for {case.arch.platform}")
    started = time.monotonic()
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        events("build", line)

    try:
        image_id = engine.build(plan, base.ref, tag, dict(host.proxies), on_line)
    finally:
        if log_path:
            log_path.write_text("\n".join(lines) + "\n")
    return BuiltImage(tag, image_id, base, cached=False, build_seconds=time.monotonic() - started)
