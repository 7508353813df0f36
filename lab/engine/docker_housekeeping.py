"""A Docker engine's housekeeping: what the lab made there (images with their disk usage,
containers), removed on request, by the cache cap, or after a bisect probe."""

from __future__ import annotations

import contextlib

import docker
import docker.errors
import requests.exceptions

from lab.core.errors import EngineError
from lab.core.records import ImageUsage
from lab.engine.docker_client import LABEL, short
from lab.engine.docker_containers import _remove
from lab.image.layout import LAYERS_REPO


class DockerHousekeeping:
    """The housekeeping half of lab.engine.docker_engine.DockerEngine."""

    client: docker.DockerClient

    def remove_managed(self) -> tuple[int, int]:
        """Remove every container and image the lab labelled. Returns (containers, images)."""
        containers = self.client.containers.list(all=True, filters={"label": f"{LABEL}=true"})
        for c in containers:
            _remove(c)
        images = self.client.images.list(filters={"label": f"{LABEL}=true"})
        images += self.client.images.list(name=LAYERS_REPO)
        removed = 0
        for img in images:
            try:
                self.client.images.remove(img.id, force=True)
                removed += 1
            except docker.errors.APIError:
                pass
        return len(containers), removed

    def anchor_shared_layers(self, ref: str, marker: str = "python3 -m venv") -> str | None:
        """Tag the newest layer of `ref` built by a step containing `marker` (the system packages and
        the venv, shared by every torch version of a scenario), so that removing `ref` keeps it."""
        try:
            history = self.client.api.history(ref)
        except docker.errors.APIError:
            return None
        for entry in history:  # newest first
            layer = entry.get("Id") or ""
            if marker in (entry.get("CreatedBy") or "") and layer.startswith("sha256:"):
                tag = f"{LAYERS_REPO}:{layer.removeprefix('sha256:')[:16]}"
                with contextlib.suppress(docker.errors.APIError):
                    self.client.api.tag(layer, LAYERS_REPO, layer.removeprefix("sha256:")[:16])
                    return tag
        return None

    def remove_image(self, ref: str) -> bool:
        """Untag (and, when nothing else uses it, delete) one image; False when it was not there."""
        try:
            self.client.images.remove(ref, noprune=False)
            return True
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not remove {ref}: {short(exc)}") from None

    def image_tags(self, pattern: str) -> list[str]:
        """The tags of local images whose reference matches `pattern` (the engine's `reference`
        filter: `*` within a name part), sorted."""
        try:
            images = self.client.images.list(filters={"reference": pattern})
        except docker.errors.APIError:
            return []
        return sorted(t for image in images for t in image.tags)

    def managed_images(self) -> list[ImageUsage]:
        """Every image the lab made (its label, or a layer anchor's repository), with its sizes and
        the containers of any origin that use it. Sizes come from the engine's disk usage report:
        `unique` is what removing the image alone would free, `shared` what it shares with others."""
        try:
            report = self.client.api.df()
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise EngineError(f"the engine did not report its disk usage: {short(exc)}") from None
        in_use: dict[str, list[str]] = {}
        for c in report.get("Containers") or []:
            in_use.setdefault(c.get("ImageID") or "", []).append(
                f"{(c.get('Names') or ['?'])[0].lstrip('/')} ({c.get('State') or 'unknown'})")
        found = []
        for img in report.get("Images") or []:
            labels = img.get("Labels") or {}
            tags = tuple(t for t in (img.get("RepoTags") or []) if t != "<none>:<none>")
            anchor = any(t.startswith(LAYERS_REPO + ":") for t in tags)
            if labels.get(LABEL) != "true" and not anchor:
                continue
            size = int(img.get("Size") or 0)
            shared = max(int(img.get("SharedSize") or 0), 0)
            found.append(ImageUsage(
                image_id=img["Id"], tags=tags, size=size, shared=shared, unique=max(size - shared, 0),
                created=float(img.get("Created") or 0), anchor=anchor,
                containers=tuple(in_use.get(img["Id"], ()))))
        return found

    def remove_unused_image(self, image: ImageUsage) -> bool:
        """Remove one image the lab made, tag by tag, never by force: the engine refuses while a
        container uses it. False when the engine refused or it was gone."""
        refs = list(image.tags) or [image.image_id]
        removed = False
        for ref in refs:
            try:
                self.client.images.remove(ref, noprune=False)
                removed = True
            except docker.errors.ImageNotFound:
                continue
            except docker.errors.APIError:
                return False
        return removed

    def managed_containers(self) -> list[str]:
        """The names of every container the lab labelled (of any session)."""
        return [c.name for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}=true"})]
