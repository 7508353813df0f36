"""Case -> BuildPlan: the Dockerfile rendered from dockerfiles/ and a byte-stable build context.

The Dockerfile depends only on the case, never on the host, so `lab render` prints
the same bytes everywhere. Host specifics (CA bundle, pip settings, local wheels, and the
venv tree cross-installed on the host, `site/`) are covered by the plan's digest, so a change
rebuilds. The site tree can be gigabytes: its digest is computed once, when its cache entry is
made (lab.crossinstall), and only mixed in here. It does not travel in the case's context. The
Dockerfile copies it from an image (`COPY --from=site`); the lab itself builds that Dockerfile in
two parts around that line (`render_parts`), with the tree stacked on the first part's image
as one layer (`write_site_tar` under the venv, `Engine.stack_layer`), so that it is written once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import jinja2

from lab import __version__
from lab.core import config
from lab.core.errors import ScenarioError
from lab.core.hashing import HashingWriter
from lab.core.records import Events, no_events
from lab.core.resources import RUNNER_NAME, runner_source, template_loader
from lab.core.tarwrite import add_bytes, add_dir, add_file, stream_tar
from lab.image import layout, wheelsonly
from lab.image.crossinstall import (
    FREEZE_FILE,
    Installer,
    Site,
    install_with_uv,
    no_site,
    prepare_site,
    write_tree_tar,
)
from lab.image.hostpip import HostPip, local_wheels
from lab.image.resolve import Case
from lab.image.wheelsonly import direct_references
from lab.scenario.model import CONTROL_CHARS, is_debian_package

BASE_PACKAGES = ("ca-certificates", "python3", "python3-venv")
CA_IN_IMAGE = layout.CA_FILE
WHEELS_IN_IMAGE = layout.WHEELS_DIR
IMAGE_REPO = layout.IMAGE_REPO
SITE_IMAGE_REPO = layout.SITE_IMAGE_REPO
RUNNER_IN_IMAGE = layout.RUNNER
WHEELS_README = b"Wheels from the host's local pip sources (find-links, file:// indexes).\n"
SITE_DIR = "site"
STACK_ARG = "LAB_STACKED"  # the suffix Dockerfile's base: the prefix's image plus the site layer
CONTEXT_FORMAT = 3  # part of the plan digest: bump when the context's layout changes


@dataclass(frozen=True, slots=True)
class ContextFile:
    """One file of the build context: its path inside the context and its bytes or host source."""

    arcname: str
    data: bytes | None = None
    source: Path | None = None

    def size(self) -> int:
        return len(self.data) if self.data is not None else self.source.stat().st_size  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class ContextTree:
    """A folder of the build context whose digest is already known (the cross-installed venv).

    The tar still gets every entry, sorted, with normalised metadata; only the hashing is
    skipped. `root` None is an empty folder."""

    arcname: str
    root: Path | None
    digest: str
    total_size: int = 0

    def size(self) -> int:
        return self.total_size


ContextEntry = ContextFile | ContextTree


@dataclass(frozen=True, slots=True)
class Sealed:
    """How a build of a stranger's bundle (`lab replay`) is confined: it never gets the host's index
    credentials, and its steps get no network (`network_mode="none"`) except where named here.

    `rendered`: the Dockerfile is this lab's re-render, so its steps before the venv (the system
    packages, from the base's own Debian sources) are the lab's: they get the engine's default
    network, and the host's proxies without credentials, when the base lacks the packages
    (lab.image.builder). A bundle's own Dockerfile (`--bundled-dockerfile`) gets no network at all.
    `source_builds` (`--allow-source-builds`): pip in the image may install what the host did not
    resolve to wheels; that step then gets the engine's default network (never the host's), and
    still no credentials."""

    rendered: bool = True
    source_builds: bool = False
    scenario_file: str | None = None  # how errors name the bundled scenario


@dataclass(frozen=True)
class BuildPlan:
    case: Case
    dockerfile: str
    files: tuple[ContextEntry, ...]
    digest: str  # sha256 over every context file's content and the site tree's digest
    site: Site | None = None  # what was cross-installed on the host into site/
    host_wheels: tuple[Path, ...] = ()  # local wheels pip in the image needs when site/ is empty
    sealed: Sealed | None = None  # a replay's build (see Sealed); None: the user's own, as `lab run`

    @property
    def notes(self) -> tuple[str, ...]:
        """What the user should know about this build (requirements left to pip in the image)."""
        return self.site.notes if self.site else ()

    @property
    def platform(self) -> str:
        return self.case.arch.platform

    @property
    def pip_in_image(self) -> tuple[str, ...]:
        """What pip inside the image still has to install (nothing when the host's tree is complete)."""
        site = self.site or no_site(self.case, "cross-install not requested")
        return site.in_image(self.case.requirements)

    @property
    def tag(self) -> str:
        return f"{IMAGE_REPO}:{self.case.scenario.name}-{self.digest[:16]}"

    @property
    def site_image(self) -> str | None:
        """The image that holds the cross-installed tree (build arg SITE), or None: nothing was."""
        if self.site is None or self.site.root is None:
            return None
        return f"{SITE_IMAGE_REPO}:{self.site.digest[:24]}-{self.case.arch.value}"

    def context_size(self) -> int:
        return sum(f.size() for f in self.files)


# --- the Dockerfile: no input reaches it raw ---------------------------------------------------
# Each value is checked here (no line break or control character anywhere; Debian package names
# only), then quoted by the template for where it lands: `shquote` for shell words, `label` for
# LABEL values, `word` for ARG values, `json` for CMD's array. A `finalize` hook refuses a line
# break in whatever an expression gives, so a template field added later cannot add an
# instruction either. Honest values come out unchanged by every quoting filter.

# Where each template field comes from, for error messages.
FIELD_SOURCES = {
    "case_name": "case", "scenario_file": "file name", "scenario_name": "name",
    "platform": "arch", "base": "base", "torch": "torch", "arch": "arch",
    "system_packages": "system_packages", "requirements": "pip", "script": "script",
    "venv_pip": "pip",
}
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_.:/@+=,-]+")


def dockerfile_quote(value: object) -> str:
    """A double-quoted Dockerfile word (LABEL and ARG values): `\\`, `"` and `$` escaped, so
    the engine reads back exactly `value` and substitutes no variable."""
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def dockerfile_word(value: object) -> str:
    """`value` as one Dockerfile word: as it is when it is plain (an image reference), quoted otherwise."""
    text = str(value)
    return text if _PLAIN_WORD.fullmatch(text) else dockerfile_quote(text)


def _refuse_line_breaks(value: object) -> object:
    """Jinja's `finalize`: the last check on every `{{ ... }}` before it is written."""
    if value is not None and CONTROL_CHARS.search(str(value)):
        raise ScenarioError(f"a value for the Dockerfile holds a line break or another control character "
                            f"({_short(value)}); the lab refuses to render it.")
    return value


def _short(value: object, limit: int = 80) -> str:
    text = repr(str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


@functools.lru_cache(maxsize=1)
def template_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=template_loader(config.current().templates_dir),  # package data, or templates_dir
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_refuse_line_breaks,
    )
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    env.filters["json"] = json.dumps
    env.filters["label"] = dockerfile_quote
    env.filters["word"] = dockerfile_word
    # every template is rendered with the image layout (lab.image.layout), and as a whole
    # Dockerfile unless a `part` is asked for (render_parts)
    env.globals.update(layout=layout.template_values(), stack_arg=STACK_ARG, part="whole")
    return env


def template_for(case: Case) -> str:
    return "cuda.Dockerfile.j2" if case.scenario.gpu else "debian.Dockerfile.j2"


def system_packages(case: Case) -> tuple[str, ...]:
    """The Debian packages the image gets: the lab's own and the scenario's, sorted."""
    return tuple(sorted(set(BASE_PACKAGES) | set(case.scenario.system_packages)))


def dockerfile_fields(case: Case) -> dict[str, object]:
    """What the template is filled with, taken from the case."""
    scenario = case.scenario
    return dict(
        case_name=case.name,
        lab_version=__version__,
        scenario_file=scenario.source.name if scenario.source else "(no file)",
        scenario_name=scenario.name,
        platform=case.arch.platform,
        base=scenario.base,
        torch=case.torch,
        arch=case.arch.value,
        system_packages=list(system_packages(case)),
        requirements=case.requirements,
        script=scenario.script.name,
    )


def check_fields(fields: dict[str, object], file: str | None = None) -> None:
    """Refuse a field that no quoting makes safe: a line break or control character in any text,
    or a system package that is not a Debian package name. The error names the field."""
    for name, value in fields.items():
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            text = str(item)
            if CONTROL_CHARS.search(text) and name == "scenario_file":  # then `file` holds it too
                raise ScenarioError(
                    f"the scenario file's name {_short(text)} holds a line break or another control "
                    "character, which would change the Dockerfile's instructions.", hint="Rename the file.")
            if CONTROL_CHARS.search(text):
                raise ScenarioError(
                    f"{_short(text)} holds a line break or another control character, which would "
                    "change the Dockerfile's instructions.", file=file, field=FIELD_SOURCES.get(name, name),
                    hint="Rename the file." if name == "script" else "Remove it.")
            if name == "system_packages" and not is_debian_package(text):
                raise ScenarioError(f"{_short(text)} is not a Debian package name.", file=file,
                                    field="system_packages")


def render_template(template: str, fields: dict[str, object], file: str | None = None, part: str = "whole") -> str:
    """Check the fields, then render `template` with them and the image layout (lab.image.layout).
    `part`: the whole Dockerfile, or one of the two parts it is built in when the cross-installed
    tree is stacked as a layer (`render_parts`)."""
    check_fields(fields, file)
    return template_environment().get_template(template).render(**{"venv_pip": (), **fields}, part=part)


def render_dockerfile(case: Case) -> str:
    """The Dockerfile for `case`: deterministic, the same bytes for the same case."""
    source = str(case.scenario.source) if case.scenario.source else None
    return render_template(template_for(case), dockerfile_fields(case), source)


# The first comment of every Dockerfile the lab renders; a replay's re-render carries the bundle's
# own line (the scenario file the original run used) in place of this host's (lab.bundle.replay).
PROVENANCE = re.compile(r"# Rendered by torch-repro-lab [0-9A-Za-z.+-]{1,40} from [A-Za-z0-9_.+-]{1,200}\.",
                        re.ASCII)


def builds_as_rendered(dockerfile: str, case: Case) -> bool:
    """Whether `dockerfile` builds what this lab renders for `case`: the same text, but for the
    provenance comment (a replay's re-render names the original run's scenario file there)."""
    def steps(text: str) -> list[str]:
        return [line for line in text.split("\n") if not PROVENANCE.fullmatch(line)]
    return steps(dockerfile) == steps(render_dockerfile(case))


def render_parts(case: Case) -> tuple[str, str, str]:
    """The lab's Dockerfile for `case` in the two parts it is built in around the copy of the site
    image into the venv (`COPY --from=site`): the steps before it (base, system packages, user, CA,
    the venv), and the steps after it, as a Dockerfile of its own `FROM` an image that is the first
    part's plus the site layer stacked on it (`Engine.stack_layer`), so the tree is not written a
    second time by `COPY`. The third part is the folder the tree goes into (the venv)."""
    source = str(case.scenario.source) if case.scenario.source else None
    fields = dockerfile_fields(case)
    return (render_template(template_for(case), fields, source, part="prefix"),
            render_template(template_for(case), fields, source, part="suffix"), layout.VENV)


def render_mounted(case: Case, venv_pip: tuple[str, ...] = ()) -> tuple[str, str]:
    """The lab's Dockerfile for `case` when each run gets the cross-installed tree as read-only
    mounts (lab.image.sitemount): the same first part as `render_parts`, and a second part `FROM`
    the first part's image that copies only the tree's pip freeze (no site layer), and where
    `venv_pip` names them, upgrades the venv's own pip or setuptools (no other pip step)."""
    source = str(case.scenario.source) if case.scenario.source else None
    fields = dockerfile_fields(case)
    return (render_template(template_for(case), {**fields, "venv_pip": ()}, source, part="prefix"),
            render_template(template_for(case), {**fields, "venv_pip": venv_pip}, source, part="mounted"))


def image_pip_conf(host: HostPip, *, credentials: bool = False) -> str:
    """The pip.conf of the image (/etc/lab/pip.conf) and the run folder: the CA, the wheels folder
    and only the index URLs that are not secrets (HostPip.pip_conf). With `credentials`, the full
    one a build fetches and deletes in its pip step (lab.buildsecret); it never goes into a
    context, an image or a file."""
    ca = host.ca_bundle is not None and host.ca_bundle.stat().st_size > 0
    return host.pip_conf(CA_IN_IMAGE if ca else None, WHEELS_IN_IMAGE, credentials=credentials)


def context_files(case: Case, dockerfile: str, host: HostPip, site: Site | None = None) -> tuple[ContextEntry, ...]:
    """The build context. Local wheels travel only for what pip in the image must install."""
    site = site or no_site(case, "cross-install not requested")
    ca = host.ca_bundle.read_bytes() if host.ca_bundle else b""
    files: list[ContextEntry] = [
        ContextFile("Dockerfile", dockerfile.encode()),
        ContextFile("lab/ca.crt", ca),
        ContextFile("lab/pip.conf", image_pip_conf(host).encode()),
        ContextFile("repro/" + case.scenario.script.name, source=case.scenario.script),
        ContextFile("tools/" + RUNNER_NAME, runner_source()),  # lab/probe/lab_run.py, package data
        ContextFile("wheels/README", WHEELS_README),
        ContextTree(SITE_DIR, site.root, site.digest, site.size),
    ]
    files += [ContextFile("wheels/" + w.name, source=w)
              for w in local_wheels(host, site.in_image(case.requirements), case.wheel_tags)]
    return tuple(sorted(files, key=lambda f: f.arcname))


def context_digest(files: tuple[ContextEntry, ...]) -> str:
    """The plan's identity: each file's path and content, each tree's path and stored digest."""
    sha = hashlib.sha256(f"torch-repro-lab context v{CONTEXT_FORMAT}\n".encode())
    for f in sorted(files, key=lambda f: f.arcname):
        if isinstance(f, ContextTree):
            sha.update(f"tree\0{f.arcname}\0{f.digest}\n".encode())
        else:
            sha.update(f"file\0{f.arcname}\0{f.size()}\0{_content_sha256(f)}\n".encode())
    return sha.hexdigest()


def _content_sha256(f: ContextFile) -> str:
    if f.data is not None:
        return hashlib.sha256(f.data).hexdigest()
    sha = hashlib.sha256()
    with f.source.open("rb") as fh:  # type: ignore[union-attr]
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def write_context(files: tuple[ContextEntry, ...], out: BinaryIO) -> str:
    """Write the context as a tar with sorted entries and normalised metadata (owner root,
    mtime 0, mode 0644 or 0755); return the tar's sha256."""
    hasher = HashingWriter(out)
    with stream_tar(hasher) as tar:
        for f in files:
            if isinstance(f, ContextTree):
                _add_tree(tar, f)
            elif f.data is not None:
                add_bytes(tar, f.arcname, f.data)
            else:
                add_file(tar, f.arcname, f.source, f.size())  # type: ignore[arg-type]
    return hasher.hexdigest()


def write_site_tar(tree: ContextTree, out: BinaryIO, under: str = "") -> str:
    """The site layer, streamed file by file: the tree at the root, as `COPY --from` copies it into
    the venv, or `under` a folder (`opt/venv`: the layer stacked on the image's own venv, which
    `COPY --from` would have written). Returns the tar's SHA-256."""
    hasher = HashingWriter(out)
    write_tree_tar(tree.root, hasher, under)
    return hasher.hexdigest()


def _add_tree(tar: tarfile.TarFile, tree: ContextTree) -> None:
    """The tree's folder only: an old Dockerfile's `COPY site/` then finds it empty. Its content
    goes into the site image (`write_site_tar`)."""
    add_dir(tar, tree.arcname)


def plan_build(case: Case, host: HostPip, events: Events = no_events,
               installer: Installer | None = install_with_uv, sealed: Sealed | None = None) -> BuildPlan:
    """The Dockerfile and the context, with the requirements cross-installed on the host into
    site/ (from the lab's cache when there). `installer=None` leaves all of it to pip in the image.

    `sealed` (a replay): wheels only, resolved on the host. A requirement the host did not resolve
    to a wheel is refused (lab.image.wheelsonly.SourceBuildError) before anything is built, unless
    `sealed.source_builds`; otherwise the image's pip.conf names no index, only /lab/wheels, which
    holds the host's wheels of what the venv seeds itself (pip, setuptools) and a requirement needs.
    When the host's tree holds everything (no pip runs in the build), the context is the same as
    `lab run`'s, so a replay reuses the user's own image of the same case."""
    dockerfile = render_dockerfile(case)
    if sealed is not None and sealed.source_builds and _direct_references(case):
        site = no_site(case, "the bundle names a direct URL, VCS or path reference, which this host does not fetch; "
                             "with --allow-source-builds")
        for note in site.notes:
            events("site", note)
    else:
        site = (no_site(case, "cross-install not requested") if installer is None else
                prepare_site(case, host, events, installer))
    files = context_files(case, dockerfile, host, site)
    if sealed is not None:
        files = _sealed_files(case, host, site, files, sealed)
    return BuildPlan(case=case, dockerfile=dockerfile, files=files, digest=context_digest(files), site=site,
                     host_wheels=tuple(local_wheels(host, case.requirements, case.wheel_tags)), sealed=sealed)


def _direct_references(case: Case) -> bool:
    return bool(direct_references(case.scenario.pip))


def _sealed_files(case: Case, host: HostPip, site: Site, files: tuple[ContextEntry, ...],
                  sealed: Sealed) -> tuple[ContextEntry, ...]:
    missing = wheelsonly.unresolved(site, case.requirements)
    if missing and sealed.source_builds:
        return files  # pip in the image installs them, from the indexes without credentials
    wheelsonly.refuse_unresolved(missing, file=sealed.scenario_file)
    if site.root is not None and (site.root / FREEZE_FILE).is_file():
        return files  # the tree holds everything: no pip runs in the build, the context is `lab run`'s
    wheels = wheelsonly.seeded_wheels(site, case.requirements, host, site.target, case.wheel_tags) \
        if site.target is not None else ()
    ca = host.ca_bundle is not None and host.ca_bundle.stat().st_size > 0
    kept = [f for f in files if f.arcname != "lab/pip.conf" and not
            (f.arcname.startswith("wheels/") and f.arcname.endswith(".whl"))]
    kept.append(ContextFile("lab/pip.conf", wheelsonly.sealed_pip_conf(CA_IN_IMAGE if ca else None,
                                                                       WHEELS_IN_IMAGE).encode()))
    kept += [ContextFile("wheels/" + w.name, source=w) for w in dict.fromkeys(wheels)]
    return tuple(sorted(kept, key=lambda f: f.arcname))


# What a run folder must not send to `docker build .`: the run's own records.
_RUN_DOCKERIGNORE = "out\ndiagnose\n*.txt\n*.json\n*.md\n*.log\nscenario.yaml\n"


def write_context_folder(folder: Path, plan: BuildPlan) -> None:
    """The plan's build context as files, so that `docker build .` works in a run folder. Large
    local wheels are listed, not copied; site/ (the venv tree the lab cross-installed on the host,
    up to gigabytes) stays empty but for a README, so `docker build .` there installs the
    requirements with pip inside the image. No secret of the host is written: lab/pip.conf is
    the image's, without the secret URLs, and the README's notes are redacted."""
    for f in plan.files:
        if isinstance(f, ContextTree) or f.arcname.startswith(SITE_DIR + "/"):
            continue
        target = folder / f.arcname
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.data is not None:
            target.write_bytes(f.data)
        elif not f.arcname.startswith("wheels/"):
            target.write_bytes(f.source.read_bytes())  # type: ignore[union-attr]
    (folder / SITE_DIR).mkdir(exist_ok=True)  # its README.md: lab.report.run_folder.write_site_readme
    if plan.host_wheels:
        (folder / "wheels" / "FROM-HOST.txt").write_text(
            "Copy these host wheels here before `docker build .`:\n" + "".join(f"{w}\n" for w in plan.host_wheels))
    (folder / ".dockerignore").write_text(_RUN_DOCKERIGNORE + f"{SITE_DIR}/README.md\n")
