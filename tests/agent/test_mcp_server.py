"""`lab mcp` driven by the `mcp` SDK's own client over stdio (mcp.client.stdio), as a hostile caller.

The fast tests start the real server and try paths out of the runs folder (`..`, absolute paths, a
link that leads out), scenario paths instead of names, an engine that is not configured, a base image
outside the list, and network asked for by a scenario. The `local` test runs real scripts on the local
engine (the cheap amd64 CPU torch of tests/cpu_torch.py, bubblewrap): one that tries the network and
then writes 48 MiB, whose result must say the network was refused and stay small, and one that is
cancelled while it runs, whose processes must be gone and whose folder is marked interrupted."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[2]


def _params(tmp_path: Path, *extra: str) -> StdioServerParameters:
    env = {**os.environ, "LAB_SCENARIOS_DIR": str(tmp_path / "scenarios"), "LAB_BWRAP": "bwrap"}
    return StdioServerParameters(command=sys.executable, args=["-m", "lab", "mcp", "--out", str(tmp_path / "runs"),
                                                               *extra], env=env, cwd=str(ROOT))


async def _session(tmp_path: Path, body, *extra: str):
    async with stdio_client(_params(tmp_path, *extra)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await body(session)


def _scenario(tmp_path: Path, name: str, script: str, extra: str = "") -> None:
    folder = tmp_path / "scenarios"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(script)
    (folder / f"{name}.yaml").write_text(f"name: {name}\n{extra}script: {name}.py\nexpect:\n  exit_code: 0\n")


def test_a_hostile_caller_gets_refusals_with_reasons_and_no_file_outside_the_runs_folder(tmp_path):
    header = "torch: '2.5.1'\narch: amd64\n"
    _scenario(tmp_path, "plain", "print('hi')\n", header + "base: debian:bookworm\n")
    _scenario(tmp_path, "foreign-base", "print('hi')\n", header + "base: evil.example/rootkit:latest\n")
    _scenario(tmp_path, "wants-net", "print('hi')\n", header + "base: debian:bookworm\nnetwork: true\n")
    runs = tmp_path / "runs" / "some-run"
    runs.mkdir(parents=True)
    (runs / "report.md").write_text("# a report\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "report.md").write_text("secret of the host\n")
    (tmp_path / "runs" / "escape").symlink_to(outside)
    shutil.copytree(ROOT / "tests" / "data" / "compare" / "bisect-vmap-newapi", tmp_path / "runs" / "bis")

    async def body(s: ClientSession):
        tools = {t.name: t for t in (await s.list_tools()).tools}
        found = {}
        for name, args in [
            ("read_report", {"folder": "../outside"}), ("read_report", {"folder": str(outside)}),
            ("read_report", {"folder": "escape"}), ("read_report", {"folder": "some-run/../../outside"}),
            ("read_report", {"folder": "/etc"}), ("comment", {"folder": "../outside"}),
            ("compare", {"a": "some-run", "b": "/etc"}),
            ("show_scenario", {"scenario": "../scenarios/plain"}), ("show_scenario", {"scenario": "/etc/passwd"}),
            ("run", {"scenario": str(tmp_path / "scenarios" / "plain.yaml")}),
            ("run", {"scenario": "plain", "engine": "ssh://attacker.example"}),
            ("run", {"scenario": "plain", "torch": "2.5.1; rm -rf /"}),
            ("run", {"scenario": "foreign-base"}), ("run", {"scenario": "wants-net"}),
            ("bisect", {"scenario": "wants-net", "from_torch": "2.5.1", "to_torch": "2.6.0"}),
        ]:
            res = await s.call_tool(name, args)
            found[f"{name} {json.dumps(args)}"] = (res.is_error, res.content[0].text if res.content else "")
        good = await s.call_tool("read_report", {"folder": "some-run"})
        listed = await s.call_tool("list_scenarios", {})
        real = {key: await s.call_tool(name, args) for key, name, args in (
            ("compare", "compare", {"a": "bis"}), ("comment", "comment", {"folder": "bis"}),
            ("read_report", "read_report", {"folder": "bis"}),
            ("read_run", "read_report", {"folder": str(tmp_path / "runs" / "bis" / "torch2.4.0")}))}
        return tools, found, good, listed, real

    tools, found, good, listed, real = anyio.run(_session, tmp_path, body)
    # a real bisection's folder (tests/data/compare): compared, commented and read through the tools
    assert not any(r.is_error for r in real.values()), {k: r.content for k, r in real.items()}
    cmp = real["compare"].structured_content
    assert (cmp["a"], cmp["b"]) == ("bis/torch2.3.1", "bis/torch2.4.0") and cmp["same_verdict"] is False
    assert real["comment"].structured_content["comment"].strip() and str(tmp_path) not in \
        real["comment"].structured_content["comment"]
    assert real["read_report"].structured_content["kind"] == "bisect"
    assert real["read_report"].structured_content["report"].startswith("#")
    run = real["read_run"].structured_content
    assert (run["kind"], run["folder"], run["verdict"]) == ("run", "bis/torch2.4.0", "not_reproduced")
    assert set(tools) >= {"list_scenarios", "show_scenario", "scenario_from_issue", "run", "bisect", "compare",
                          "comment", "triage", "read_report"}
    assert all(t.output_schema for t in tools.values())  # structured results, typed
    assert tools["run"].input_schema["properties"].keys() >= {"scenario", "torch", "arch", "engine"}
    from lab.schemas import json_schema  # `lab schema mcp-*` is what the tools declare
    for name in ("run", "bisect", "triage", "read_report"):
        assert tools[name].output_schema["properties"] == json_schema(f"mcp-{name.replace('_', '-')}")["properties"]
    for call, (is_error, text) in found.items():
        assert is_error, call
        assert "secret of the host" not in text and "root:" not in text, call
    texts = " ".join(t for _, t in found.values())
    assert "outside the runs folder" in texts and "'..' is not accepted" in texts
    assert "paths are not accepted" in texts
    assert "'ssh://attacker.example' is not configured" in texts
    assert "evil.example/rootkit:latest" in texts and "not in this server's list" in texts
    assert "lab mcp --allow-network" in texts
    assert not good.is_error and good.structured_content["report"] == "# a report\n"
    names = {x["name"]: x for x in listed.structured_content["scenarios"]}
    assert {"plain", "foreign-base", "wants-net"} <= set(names)
    assert not list((tmp_path / "runs").glob("*/result.json"))  # nothing ran


PAGE = """### 🐛 Describe the bug

torch.compile fails on this:

```python
import torch
print(torch.__version__)
raise RuntimeError("the bug")
```

```
Traceback (most recent call last):
  File "repro.py", line 3, in <module>
RuntimeError: the bug
```

### Versions

PyTorch version: 2.5.1
"""


def test_a_scenario_from_page_text_lands_in_the_servers_workspace_and_is_listed(tmp_path):
    async def body(s: ClientSession):
        made = await s.call_tool("scenario_from_issue", {"page": PAGE})
        listed = await s.call_tool("list_scenarios", {})
        return made, listed

    made, listed = anyio.run(_session, tmp_path, body)
    assert not made.is_error, made.content
    got = made.structured_content
    assert got["torch"] == "2.5.1" and got["expect"] == {"traceback_contains": "RuntimeError: the bug"}
    assert got["no_oracle"] is False
    written = list((tmp_path / "runs" / "agent" / "scenarios").glob("*.yaml"))
    assert [p.stem for p in written] == [got["scenario"]]
    assert got["scenario"] in {x["name"] for x in listed.structured_content["scenarios"]}


NET_AND_FLOOD = """
import socket, sys
try:
    socket.create_connection(("1.1.1.1", 443), timeout=5)
    print("connect: reached the internet")
except OSError as exc:
    print(f"connect: refused {type(exc).__name__}")
line = "x" * 65535 + "\\n"
for _ in range(768):
    sys.stdout.write(line)
print("flood-end")
"""

SLEEPER = """
import sys, time
print("sleeper started", sys.argv[1:], flush=True)
time.sleep(900)
"""


@pytest.mark.local
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("cpu_torch")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the case is an x86_64 wheel")
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap (run bin/setup-host)")
def test_real_runs_keep_the_network_off_cap_the_output_and_stop_when_cancelled(tmp_path, cpu_torch):
    header = f"{cpu_torch.header}base: debian:bookworm\nsystem_packages: [g++, python3-dev]\npip: [numpy]\n"
    _scenario(tmp_path, "mcp-net-flood", NET_AND_FLOOD, header + "limits: {logs: 1m}\n")
    token = uuid.uuid4().hex
    _scenario(tmp_path, "mcp-sleeper", SLEEPER, header + f"args: [{token}]\ntimeout: 1200\n")

    async def body(s: ClientSession):
        progress: list[str] = []

        async def on_progress(done, total, message):
            progress.append(message or "")
        flood = await s.call_tool("run", {"scenario": "mcp-net-flood", "engine": "local"},
                                  progress_callback=on_progress)
        seen: list[str] = []

        async def on_sleeper(done, total, message):
            seen.append(message or "")
        with anyio.move_on_after(900) as scope:
            async with anyio.create_task_group() as tg:
                async def call():
                    await s.call_tool("run", {"scenario": "mcp-sleeper", "engine": "local"},
                                      progress_callback=on_sleeper)
                tg.start_soon(call)
                while not _running(token):  # the script itself runs: now cancel the call
                    await anyio.sleep(0.5)
                tg.cancel_scope.cancel()
        assert not scope.cancelled_caught, "the sleeper never started"
        deadline = time.monotonic() + 120
        while _running(token) and time.monotonic() < deadline:
            await anyio.sleep(1)
        still = _running(token)
        after = await s.call_tool("list_scenarios", {})  # the server still answers
        return flood, progress, still, after

    flood, progress, still, after = anyio.run(_session, tmp_path, body)
    assert not flood.is_error, flood.content
    r = flood.structured_content
    assert r["verdict"] == "reproduced" and r["network"] is False and r["evidence"]["output_cut"] is True
    assert r["engine"] == "local" and r["comment"].strip()
    assert len(json.dumps(r)) < 64_000  # never the bare log
    logs = (tmp_path / "runs" / r["run_folder"] / "stdout.txt").read_text(errors="replace")
    assert "connect: refused" in logs and "reached the internet" not in logs
    assert progress, "no progress notification arrived"
    assert not still, "the cancelled run's script still runs"
    assert not after.is_error
    sleeper_runs = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("result.json")
                    if "mcp-sleeper" in p.read_text()]
    assert [x.get("status") for x in sleeper_runs] == ["interrupted"]


def _running(token: str) -> bool:
    """Whether a process on this host has `token` in its command line (the sleeper's argument)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline and b"pytest" not in cmdline:
            return True
    return False
