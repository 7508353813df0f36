"""The cap against the real engine, with the cheapest real case (amd64, the CPU torch of
tests/cpu_torch.py, here 2.13.0+cpu, which shares its layers with tests/data/e2e/sleeper.yaml): two
runs make two images, and a prune under a cap of zero removes the older one and keeps the one a run in progress uses.

The engine is shared (other developers' runs use it), so this test looks only at images whose tag
holds its own unique scenario name, and removes nothing else; its cache folder is its own.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from lab.cache_policy import inventory as inv
from lab.engine.docker_engine import Engine
from lab.image.hostpip import discover
from lab.image.resolve import resolve
from lab.pipeline import run_case
from lab.scenario.lookup import load_scenario
from tests.conftest import SCENARIOS
from tests.cpu_torch import TORCH

BODY = """name: {name}
title: cache eviction test
{torch}base: debian:bookworm
system_packages: [g++, python3-dev]
pip: [numpy]
script: s.py
timeout: 120
expect:
  exit_code: 0
"""


@pytest.mark.docker
@pytest.mark.timeout(2400)
@pytest.mark.usefixtures("cpu_torch")
def test_a_small_cap_evicts_the_least_recently_used_image_and_keeps_the_one_in_use(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    uid = f"cachetest-{uuid.uuid4().hex[:10]}"
    ours = lambda image: any(uid in tag for tag in image.tags)  # noqa: E731
    engine, host = Engine.connect(), discover()
    made: list[str] = []
    try:
        for which in ("a", "b"):
            folder = tmp_path / which
            folder.mkdir()
            (folder / "s.py").write_text(f"print({which!r})\n")
            (folder / "tiny.yaml").write_text(BODY.format(name=f"{uid}-{which}", torch=TORCH.header))
            case = resolve(load_scenario(folder / "tiny.yaml", SCENARIOS), torch=None, arch="amd64")
            outcome = run_case(case, engine, host, tmp_path / "runs", diagnose=False, collect_env=False)
            assert outcome.result.verdict == "reproduced", outcome.result.reason
            made.append(outcome.result.image.tag)
        images = {i.tags[0]: i for i in engine.managed_images() if ours(i)}
        assert set(images) == set(made)
        older, newer = made
        # `a` was last used a day ago; `b` is used by a run in progress (a lease, and its stamp now)
        stamp = tmp_path / "cache" / inv.STAMPS / inv._stamp_name(images[older].image_id)
        day_ago = time.time() - 86400
        os.utime(stamp, (day_ago, day_ago))
        monkeypatch.setenv("LAB_CACHE_CAP", "0")
        # The engine dates `a` by its creation too, seconds ago when the second run hits the build
        # cache; a lease counts as in use whatever was used within _SLACK_S of its start, so the
        # run in progress starts after that margin, as a later run would.
        time.sleep(inv._SLACK_S + 1.5)
        with inv.lease():
            inv.note_use(image_ids=(images[newer].image_id,))
            pruned = inv.prune(engine, only=ours)
        removed_images = [e for e in pruned.removed if e.part == "images"]
        assert [e.name for e in removed_images] == [older]
        assert all(uid in e.name for e in pruned.removed if e.part in ("images", "anchors", "base_images"))
        assert engine.image_id(older) is None and engine.image_id(newer) is not None
        kept = next(e for e in pruned.before.entries if e.name == newer)
        assert "in progress" in kept.in_use
        # what was removed from the disk came first by last use, and only from this test's cache folder
        removed_at = [e.last_used for e in pruned.removed]
        assert removed_at == sorted(removed_at)
    finally:
        for tag in made:
            engine.remove_image(tag)
