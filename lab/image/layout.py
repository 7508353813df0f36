"""The layout of every image the lab makes, in one place: the run user, the folders, the venv, the
freeze file, the runner. The Dockerfile templates are rendered with these values (`template_values`),
the engines run and read with them, and the local engine translates them to host folders."""

from __future__ import annotations

RUN_UID = 10001                                   # the script's user and group in every image
RUN_USER_NAME = "lab"
RUN_USER = f"{RUN_UID}:{RUN_UID}"                 # what a container runs as
RUN_HOME = "/tmp"  # the root filesystem is read-only: HOME (and caches under it) live on the tmpfs

OUT = "/out"                                      # what the script leaves: copied into the run folder
OUT_FOLDERS = ("ld", "diag", "trace", "compile_debug")  # made in /out before the run (loader log, diagnose)
LOADER_LOG = f"{OUT}/ld/ld"                      # LD_DEBUG_OUTPUT
DIAG_DIR = f"{OUT}/diag"
TRACE_DIR = f"{OUT}/trace"
COMPILE_DEBUG_DIR = f"{OUT}/compile_debug"

LAB_DIR = "/lab"
REPRO_DIR = f"{LAB_DIR}/repro"                    # the scenario's script and its files; the work folder
TOOLS_DIR = f"{LAB_DIR}/tools"                    # the lab's in-image runner
RUNNER = f"{TOOLS_DIR}/lab_run.py"
FREEZE_FILE = f"{LAB_DIR}/pip-freeze.txt"         # pip freeze of the venv, made at build time
WHEELS_DIR = f"{LAB_DIR}/wheels"                  # the host's local wheels pip in the image may need
ETC_DIR = "/etc/lab"                              # the host's CA bundle and the image's pip.conf
CA_FILE = f"{ETC_DIR}/ca.crt"

VENV = "/opt/venv"                                # the venv the script's `python` is
VENV_PYTHON = f"{VENV}/bin/python"
LOCK_FILE = ".lab-lock.txt"                       # inside a cross-installed tree: /opt/venv/.lab-lock.txt
FREEZE_IN_TREE = ".lab-freeze.txt"                # inside a cross-installed tree: becomes FREEZE_FILE

# Image names (repositories) the lab tags.
IMAGE_REPO = "torch-repro-lab/case"               # one image per case, tag = content hash
SITE_IMAGE_REPO = "torch-repro-lab/site"          # one image per cross-installed tree, FROM scratch
LAYERS_REPO = "torch-repro-lab/layers"            # anchors for shared layers (bisect keeps them)


def site_file(python: str, relpath: str) -> str:
    """The image path of a file of the venv's site-packages (`torch/version.py`)."""
    return f"{VENV}/lib/python{python}/site-packages/{relpath}"


def template_values() -> dict[str, object]:
    """What the Dockerfile templates are rendered with (as `layout`)."""
    return {"uid": RUN_UID, "user": RUN_USER_NAME, "home": RUN_HOME, "out": OUT,
            "out_folders": [f"{OUT}/{f}" for f in OUT_FOLDERS], "venv": VENV, "freeze": FREEZE_FILE,
            "repro": REPRO_DIR, "tools": TOOLS_DIR, "runner": RUNNER, "lock_file": LOCK_FILE,
            "freeze_in_tree": FREEZE_IN_TREE, "wheels": WHEELS_DIR, "etc": ETC_DIR}
