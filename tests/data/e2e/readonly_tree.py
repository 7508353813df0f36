"""Imports torch, says where it came from (the mount it sits on, from /proc/self/mountinfo), then tries
to add a file to torch's folder and to delete one of its files."""

import pathlib

import torch

folder = pathlib.Path(torch.__file__).parent
print("torch", torch.__version__, "from", folder)
for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
    fields = line.split()
    if fields[4] == str(folder):
        print("mount", fields[4], fields[5])
said = []
for what, act in (("write", lambda: (folder / "planted.py").write_text("x = 1\n")),
                  ("delete", lambda: (folder / "version.py").unlink())):
    try:
        act()
        said.append(f"{what} allowed")
    except OSError:
        said.append(f"{what} refused")
print(", ".join(said))
print("sum", torch.ones(3).sum().item())
