"""BuildPlan -> image: ensure the base, then build unless the content-addressed tag exists.

Before anything is built, `check_release` refuses a torch version that the host's package
sources do not have for the case. During a build, the host's pip credentials reach the pip step
through a one-shot server (lab.buildsecret), never through the context, and the build log that
goes into the run folder has every credential and secret value taken out (lab.scrub).

A replay's build (`plan.sealed`, a stranger's bundle) never gets those credentials, nor the proxies'
passwords, and runs with no network (`network_mode="none"`) except where a step genuinely needs it
(`_sealed_networks`): then it gets the engine's default network, never the host's.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

from filelock import FileLock
from packaging.version import Version

from lab.core.cache import cache_dir
from lab.core.errors import BuildError
from lab.core.records import BuiltImage, Events, MountedImage, no_events
from lab.core.scrub import redact_secrets, redact_url, strip_url_credentials
from lab.image import releases, wheelsonly
from lab.image.base import bootstrap_tag, debian_suite, ensure_base
from lab.image.buildsecret import serve_once
from lab.image.crossinstall import FREEZE_FILE
from lab.image.hostpip import HostPip
from lab.image.imagestore import ImageStore
from lab.image.layout import LAYERS_REPO
from lab.image.render import (
    IMAGE_REPO,
    SITE_DIR,
    STACK_ARG,
    BuildPlan,
    ContextFile,
    ContextTree,
    builds_as_rendered,
    image_pip_conf,
    render_dockerfile,
    render_mounted,
    render_parts,
    system_packages,
    write_context,
    write_site_tar,
)
from lab.image.resolve import Case
from lab.image.sitemount import MountDecision, freeze_of, mount_decision
from lab.scenario.bases import BASES, KnownBase

PIP_CONF_URL_ARG = "LAB_PIP_CONF_URL"  # the template's ARG for the one-shot pip.conf
MOUNTED_KEY = "\nsite mounted"  # in the tag of an image whose runs get the tree mounted


def image_tag(plan: BuildPlan, base_id: str, mounted: bool = False) -> str:
    """Content-addressed: the context (Dockerfile included), the exact base image, and whether the
    venv's packages are in it or mounted into each run (lab.image.sitemount)."""
    digest = hashlib.sha256(f"{plan.digest}\n{base_id}{MOUNTED_KEY if mounted else ''}".encode()).hexdigest()
    return f"{IMAGE_REPO}:{plan.case.scenario.name}-{digest[:16]}"


def check_release(case: Case, host: HostPip, events: Events = no_events) -> None:
    """Refuse, before anything is built, a torch version that no source of the host's pip has a
    wheel of for the case's arch and Python (the release lists lab.releases reads and caches for a
    day; a miss reads them again). `torch==2.13.0` is there when only `2.13.0+cpu` is, as pip
    matches it. When the base's Python is unknown, or an index cannot be read, the check is
    skipped and the build decides."""
    python = case.python
    if python is None:
        events("build", f"not checking that torch {case.torch} exists: the lab does not know the Python "
                        f"of {case.scenario.base}")
        return
    try:
        found = _releases(case, host, python, refresh=False)
        if not _published(found, case.torch):
            found = _releases(case, host, python, refresh=True)
    except releases.IndexUnreachableError as exc:
        events("build", f"could not check that torch {case.torch} exists ({exc.message}); building anyway")
        return
    if _published(found, case.torch):
        return
    target = Version(case.torch)
    nearest = [v for v in found if Version(v) < target][-1:] + [v for v in found if Version(v) > target][:1]
    where = ", ".join(redact_url(url) for _, url in releases.sources(host))
    others = _bases_with_release(case, host, python)
    raise releases.ReleaseError(
        f"torch {case.torch} has no {releases.describe(python, case.arch)} on the host's package sources "
        f"({where}), so there is nothing to build for {case.name}"
        + (f"; the nearest {'releases are' if len(nearest) > 1 else 'release is'} {' and '.join(nearest)}"
           if nearest else "; they have no torch wheel for it at all")
        + (f"; it has wheels for the Python of {' and '.join(f'{b.name} ({b.python})' for b in others)}."
           if others else "."),
        hint=(f"Set `base: {others[0].name}` in the scenario to run this release there, choose"
              if others else "Choose")
             + " a release that exists (`lab bisect --from/--to` lists the candidates), or add the index "
               "or find-links folder that has this build to the host's pip settings.")


def _bases_with_release(case: Case, host: HostPip, python: str) -> list[KnownBase]:
    """The bases the lab can make without a registry whose python3 has a wheel of the case's release
    (from the file lists the check read: no more requests), in the table's order."""
    found = []
    for base in BASES:
        if not base.bootstrappable or base.python == python:
            continue
        with contextlib.suppress(releases.IndexUnreachableError):
            if _published(_releases(case, host, base.python, refresh=False), case.torch):
                found.append(base)
    return found


def _releases(case: Case, host: HostPip, python: str, refresh: bool) -> list[str]:
    return releases.candidates("torch", host=host, python=python, arch=case.arch, include_pre=True,
                               refresh=refresh)


def _published(found: list[str], wanted: str) -> bool:
    """Whether pip's `torch==wanted` finds one of `found` (a public version matches its local builds)."""
    target = Version(wanted)
    return any(Version(v) == target or (not target.local and Version(v).public == target.public)
               for v in found)


def build_image(plan: BuildPlan, engine: ImageStore, host: HostPip, events: Events = no_events,
                log_path: Path | None = None, *, for_runs: bool = True) -> BuiltImage:
    """Ensure the base, then build the case image unless its content-addressed tag exists.
    `for_runs`: the image serves the lab's own runs, which on a Docker engine on this host get the
    cross-installed tree mounted (lab.image.sitemount); False (`lab build`, an image to use on its
    own): the tree is always a layer of it."""
    case = plan.case
    base_started = time.monotonic()
    base = ensure_base(engine, case.scenario.base, case.arch, events, system_packages(case))
    decision = mount_decision(plan, engine.on_this_host, builds_as_rendered(plan.dockerfile, case),
                              lambda folder: engine.sees_host_folder(folder, base.ref)) if for_runs else \
        MountDecision(False, "an image to use on its own: the tree is a layer of it")
    if plan.site is not None and plan.site.root is not None:
        events("build", decision.why)
    mounted = decision.mount
    tag = image_tag(plan, base.image_id, mounted)
    # no two builds of one image on one engine at once (parallel cells and probes, two processes):
    # the second waits, then finds it cached
    key = hashlib.sha256(f"{engine.engine_id}\0{tag}".encode()).hexdigest()[:32]
    with FileLock(str(cache_dir("locks") / f"build-{key}.lock")):
        image = _build_locked(plan, engine, host, events, log_path, base, base_started, tag, decision)
    if not mounted:
        return image
    site = plan.site
    assert site is not None and site.root is not None and site.target is not None
    return replace(image, mounted=MountedImage(image.tag, site.root, site.target.python))


def _build_locked(plan: BuildPlan, engine: ImageStore, host: HostPip, events: Events, log_path: Path | None,
                  base, base_started: float, tag: str, decision: MountDecision | None = None) -> BuiltImage:
    case = plan.case
    existing = engine.image_id(tag)
    if existing:
        events("build", f"image {tag} is cached")
        if log_path:
            log_path.write_text(f"cached: {tag} ({existing})\n")
        return BuiltImage(tag, existing, base, cached=True, build_seconds=0.0,
                          base_seconds=time.monotonic() - base_started)
    events("build", f"building {tag} for {case.arch.platform}")
    started = time.monotonic()
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        events("build", line)

    try:
        if decision is not None and decision.mount:  # the first part, then the script's part FROM it
            image_id = _build_mounted(plan, engine, host, base.ref, tag, on_line, events, decision.venv_pip)
            return BuiltImage(tag, image_id, base, cached=False, build_seconds=time.monotonic() - started,
                              base_seconds=started - base_started)
        # the lab's own Dockerfile is built in two parts, rendered apart; another (a bundle's) whole
        parts = render_parts(case) if plan.site_image and plan.dockerfile == render_dockerfile(case) else None
        nets = _sealed_networks(plan, base, parts is not None, events) if plan.sealed is not None else None
        if parts is None:
            site_args, files = _ensure_site_image(plan, engine, events), plan.files
        else:
            prefix, suffix, venv = parts
            site_args = {STACK_ARG: _stacked_site(plan, engine, host, base.ref, prefix, venv, on_line, events,
                                                  None if nets is None else nets[0])}
            files = _with_dockerfile(plan.files, suffix)
        if nets is not None:  # a replay: no credentials ever, no network unless named
            image_id = engine.build(partial(write_context, files), case.arch, base.ref, tag,
                                    {**_proxies(host, nets[1]), **site_args}, on_line, network_mode=nets[1])
        else:
            with _pip_credentials(plan, engine, host, events) as (extra_args, network_mode):
                image_id = engine.build(partial(write_context, files), case.arch, base.ref, tag,
                                        {**dict(host.proxies), **site_args, **extra_args}, on_line,
                                        network_mode=network_mode)
    except BuildError as exc:
        redact = partial(redact_secrets, urls=host.remote_urls)  # pip names the indexes, whose URLs are secrets
        raise BuildError(redact(exc.message), log=redact(exc.log),
                         hint=redact(exc.hint) if exc.hint else None) from None
    finally:
        if log_path:
            log_path.write_text(redact_secrets("\n".join(lines) + "\n", urls=host.remote_urls))
    return BuiltImage(tag, image_id, base, cached=False, build_seconds=time.monotonic() - started,
                      base_seconds=started - base_started)


def _ensure_site_image(plan: BuildPlan, engine: ImageStore, events: Events) -> dict[str, str]:
    """The build arg SITE: the image of the cross-installed tree, built once per tree (its tag
    is the tree's digest), so the case's own context stays small. {} when nothing was."""
    ref = plan.site_image
    if ref is None:
        return {}
    # the tag names the arch; an imported image carries the engine's own arch, so it is not checked
    if engine.image_id(ref) is None:
        tree = next(f for f in plan.files if isinstance(f, ContextTree) and f.arcname == SITE_DIR)
        events("build", f"making {ref}: the venv's packages from the host ({tree.size() / 1e6:.0f} MB), "
                        "imported once for every image that uses them")
        engine.import_layer(partial(write_site_tar, tree), ref)
    return {"SITE": ref}


def _stacked_site(plan: BuildPlan, engine: ImageStore, host: HostPip, base_ref: str, prefix: str, venv: str,
                  on_line, events: Events, sealed_network: str | None = None) -> str:
    """The image the case is built `FROM`: the Dockerfile's steps up to the venv (the engine's build
    cache keeps them, and a layer anchor tag keeps that image), plus the cross-installed tree stacked
    on it as one layer (`Engine.stack_layer`), made once per tree and prefix. The tree crosses into
    the engine once, and no `COPY` writes it again."""
    case = plan.case
    key = hashlib.sha256(f"{prefix}\n{base_ref}".encode()).hexdigest()[:16]
    if plan.sealed is None:
        args, network = dict(host.proxies), None
    else:
        args, network = _proxies(host, sealed_network), sealed_network
    prefix_id = engine.build(partial(write_context, _with_dockerfile(plan.files, prefix)), case.arch, base_ref,
                             f"{LAYERS_REPO}:venv-{key}", args, on_line, network_mode=network)
    ref = f"{plan.site_image}-{prefix_id.removeprefix('sha256:')[:12]}"
    if engine.image_id(ref) is None:
        tree = next(f for f in plan.files if isinstance(f, ContextTree) and f.arcname == SITE_DIR)
        events("build", f"making {ref}: the venv's packages from the host ({tree.size() / 1e6:.0f} MB), "
                        f"one layer on the image's own venv, loaded once for every image that uses them")
        layer = plan.site.layer if plan.site is not None else None
        known = (layer.sha256, layer.size) if layer is not None and layer.under == venv.strip("/") else None
        engine.stack_layer(prefix_id, partial(write_site_tar, tree, under=venv), ref, case.arch,
                           f"torch-repro-lab: the venv's packages from the host, into {venv}", known=known)
    return ref


def _build_mounted(plan: BuildPlan, engine: ImageStore, host: HostPip, base_ref: str, tag: str, on_line,
                   events: Events, venv_pip: tuple[str, ...]) -> str:
    """The case image when each run gets the tree mounted (lab.image.sitemount): the Dockerfile's
    steps up to the venv (the same image `_stacked_site` builds on, shared by every release), then
    the tree's pip freeze, the lab's tools and the script, and pip only where `venv_pip` names the
    venv's own pip or setuptools. The tree itself never enters the engine."""
    case, site = plan.case, plan.site
    assert site is not None and site.root is not None
    prefix, suffix = render_mounted(case, venv_pip)
    key = hashlib.sha256(f"{prefix}\n{base_ref}".encode()).hexdigest()[:16]
    args = dict(host.proxies)
    prefix_id = engine.build(partial(write_context, _with_dockerfile(plan.files, prefix)), case.arch, base_ref,
                             f"{LAYERS_REPO}:venv-{key}", args, on_line)
    freeze = ContextFile(f"{SITE_DIR}/{FREEZE_FILE}", freeze_of(site.root))
    files = tuple(sorted((*_with_dockerfile(plan.files, suffix), freeze), key=lambda f: f.arcname))
    if not venv_pip:
        return engine.build(partial(write_context, files), case.arch, base_ref, tag,
                            {**args, STACK_ARG: prefix_id}, on_line)
    with _pip_credentials(plan, engine, host, events) as (extra_args, network_mode):
        return engine.build(partial(write_context, files), case.arch, base_ref, tag,
                            {**args, STACK_ARG: prefix_id, **extra_args}, on_line, network_mode=network_mode)


def _with_dockerfile(files, text: str) -> tuple:
    return tuple(ContextFile("Dockerfile", text.encode()) if f.arcname == "Dockerfile" else f for f in files)


@contextlib.contextmanager
def _pip_credentials(plan: BuildPlan, engine: ImageStore, host: HostPip,
                     events: Events) -> Iterator[tuple[dict[str, str], str | None]]:
    """(extra build args, network mode) for this build: the one-shot pip.conf URL and the host's
    network when the host's indexes need credentials, else nothing. Credentials go only to a
    Dockerfile this lab rendered for the case (never to a bundle's own), and only to a local engine
    (a remote one cannot reach the host's loopback)."""
    if not host.has_credentials:
        yield {}, None
        return
    if plan.dockerfile != render_dockerfile(plan.case):
        events("build", "the host's index credentials are not passed to a Dockerfile the lab did not "
                        "render; pip in this build sees the indexes without them")
        yield {}, None
        return
    if not engine.on_this_host:
        events("build", "the engine is remote, so it cannot fetch the host's index credentials; pip in "
                        "this build sees the indexes without them")
        yield {}, None
        return
    with serve_once(image_pip_conf(host, credentials=True).encode()) as shot:
        events("build", "the host's index credentials reach the pip step through a one-shot URL on "
                        "127.0.0.1 (the build uses the host's network); no layer keeps them")
        yield {PIP_CONF_URL_ARG: shot.url}, "host"


OFFLINE = "none"


def _sealed_networks(plan: BuildPlan, base, stacked: bool, events: Events) -> tuple[str | None, str | None]:
    """(network of the steps up to the venv, network of the rest) for a replay's build: "none"
    (no network at all), or None (the engine's default network: the internet the engine reaches,
    never the host's own network or loopback) where a step genuinely needs it:
    - this lab's system-packages step, when the base lacks the packages (a base the lab bootstrapped
      with them has them: then apt does not run);
    - pip in the image with --allow-source-builds, when the host left requirements to it.
    A bundle's own Dockerfile gets no network at all. No step gets the host's index credentials."""
    sealed = plan.sealed
    assert sealed is not None
    case = plan.case
    apt = sealed.rendered and not _has_packages(base, case)
    pip = sealed.rendered and sealed.source_builds and plan.site is not None and \
        bool(wheelsonly.unresolved(plan.site, case.requirements))
    if not stacked:
        apt = pip = apt or pip
    first, rest = (None if apt else OFFLINE), (None if pip else OFFLINE)
    said = {OFFLINE: "no network", None: "the engine's default network, with no credentials"}
    if first == rest:
        events("build", f"a replay's build: {said[first]}; the host's index credentials are never passed")
    else:
        events("build", f"a replay's build: the system packages step ({', '.join(system_packages(case))}) with "
                        f"{said[first]}, the rest with {said[rest]}; the host's index credentials are never passed")
    return first, rest


def _has_packages(base, case) -> bool:
    """Whether the base is one the lab bootstrapped with the case's system packages included."""
    suite = debian_suite(case.scenario.base)
    return base.origin == "bootstrapped" and suite is not None and \
        base.ref == bootstrap_tag(suite, case.arch, system_packages(case))


def _proxies(host: HostPip, network: str | None) -> dict[str, str]:
    """The host's proxy variables for a replay's step: none when it has no network, else without
    their `user:password@`."""
    if network == OFFLINE:
        return {}
    return {k: strip_url_credentials(v) for k, v in host.proxies}
