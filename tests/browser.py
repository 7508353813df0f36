"""A real headless browser for the report tests: Debian's `chromium`, driven through the DevTools
protocol over a pipe (`--remote-debugging-pipe`: JSON messages separated by NUL bytes on fds 3 and 4),
so no WebSocket library and no Playwright download is needed.

`open_page(url)` loads a page and returns what a test asserts on: console messages and errors,
every request the page made, the geometry of chosen elements, and a full-page PNG screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
          "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
          "--remote-debugging-pipe", "--window-size=1280,1000")


def find_chromium() -> str | None:
    env = os.environ.get("LAB_CHROMIUM")
    if env:
        return env
    return next((p for n in CHROMIUM_NAMES if (p := shutil.which(n))), None)


@dataclass
class PageReport:
    url: str
    console: list[tuple[str, str]] = field(default_factory=list)      # (type, text)
    errors: list[str] = field(default_factory=list)                   # exceptions, console errors, log errors
    requests: list[str] = field(default_factory=list)                 # every URL the page asked for
    boxes: dict[str, dict] = field(default_factory=dict)              # selector -> geometry and visibility
    screenshot: bytes = b""


def _onto_3_and_4(read_fd: int, write_fd: int) -> None:
    """In the child: the command pipe on fd 3, the answer pipe on fd 4 (moved up first, so that
    neither clobbers the other when one of them already is 3 or 4)."""
    import fcntl
    high_r, high_w = fcntl.fcntl(read_fd, fcntl.F_DUPFD, 10), fcntl.fcntl(write_fd, fcntl.F_DUPFD, 10)
    os.dup2(high_r, 3)
    os.dup2(high_w, 4)


class _Pipe:
    def __init__(self, exe: str, profile: str) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # chromium reads commands on fd 3 and writes answers on fd 4
        self.proc = subprocess.Popen(
            [exe, *_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=lambda: _onto_3_and_4(to_chrome_r, from_chrome_w))
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            for m in self._read(deadline):
                if m.get("id") == self._next_id:
                    if "error" in m:
                        raise RuntimeError(f"{method}: {m['error']}")
                    return m.get("result", {})
                self.events.append(m)

    def wait_for(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, m in enumerate(self.events):
                if m.get("method") == method:
                    return self.events[i]
            self.events += self._read(deadline)

    def _read(self, deadline: float) -> list[dict]:
        import select
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium exited (code {self.proc.poll()})")
                self._buf += chunk
        *whole, self._buf = self._buf.split(b"\0")
        return [json.loads(w) for w in whole if w]

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            with contextlib.suppress(OSError):
                os.close(fd)


_BOX = """(() => { const out = {};
  for (const sel of %s) { const el = document.querySelector(sel);
    if (!el) { out[sel] = null; continue; }
    const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    out[sel] = {width: r.width, height: r.height, display: s.display, visibility: s.visibility,
                text: (el.innerText || el.textContent || '').slice(0, 50000)}; }
  return JSON.stringify(out); })()"""


def open_page(url: str, selectors: tuple[str, ...] = (), exe: str | None = None) -> PageReport:
    """Load `url` in headless chromium; report console errors, requests, element boxes and a screenshot."""
    exe = exe or find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium: run bin/setup-host (Debian: apt-get install chromium)")
    report = PageReport(url)
    with tempfile.TemporaryDirectory(prefix="lab-chromium-") as profile:
        pipe = _Pipe(exe, profile)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.events.clear()
            pipe.send("Page.navigate", {"url": url}, session=session)
            pipe.wait_for("Page.loadEventFired")
            result = pipe.send("Runtime.evaluate", {"expression": _BOX % json.dumps(list(selectors)),
                                                    "returnByValue": True}, session=session)
            report.boxes = json.loads(result["result"]["value"])
            shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                             session=session)
            report.screenshot = base64.b64decode(shot["data"])
        finally:
            pipe.close()
    for m in pipe.events:
        method, p = m.get("method"), m.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            report.console.append((p.get("type", ""), text))
            if p.get("type") in ("error", "assert"):
                report.errors.append(f"console.{p['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            report.errors.append(f"exception: {p.get('exceptionDetails', {}).get('text', '')}")
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            report.errors.append(f"log: {p['entry'].get('text', '')} ({p['entry'].get('url', '')})")
        elif method == "Network.requestWillBeSent":
            report.requests.append(p.get("request", {}).get("url", ""))
    return report


def save_screenshot(report: PageReport, folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(report.screenshot)
    return path
