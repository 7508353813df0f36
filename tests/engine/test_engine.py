"""Unit tests of lab.engine's confinement settings and stream capture (no engine needed; the real
engine is played against in tests/test_attacks_run.py and tests/test_faults.py)."""

from __future__ import annotations

from pathlib import Path

from lab.core.arch import Arch
from lab.core.records import STREAM_TAIL_BYTES, RunLimits
from lab.engine.docker_containers import _Capture, container_options
from lab.image.layout import OUT as OUT_IN_CONTAINER
from lab.image.layout import RUN_UID, RUN_USER
from tests.image.test_render import case, plan


def test_every_container_is_confined():
    options = container_options(Arch.AMD64, {"l": "v"}, RunLimits(memory_bytes=1 << 30, pids=64, cpus=2), True)
    assert options["user"] == RUN_USER and RUN_USER.split(":")[0] != "0"
    assert options["read_only"] is True
    tmp = options["tmpfs"]["/tmp"].split(",")
    assert "exec" in tmp and "noexec" not in tmp and "nosuid" in tmp and f"size={1 << 30}" in tmp
    assert options["network_mode"] == "none" and options["cap_drop"] == ["ALL"]
    assert options["security_opt"] == ["no-new-privileges"]
    assert (options["mem_limit"], options["memswap_limit"], options["pids_limit"]) == (1 << 30, 1 << 30, 64)
    assert options["log_config"]["Config"]["max-size"] and options["log_config"]["Config"]["max-file"]
    assert "volumes" not in options  # no bind mount of any host folder
    (mount,) = options["mounts"]
    assert (mount["Target"], mount["Type"], mount.get("Source")) == (OUT_IN_CONTAINER, "volume", None)


def test_short_commands_get_no_out_volume():
    options = container_options(None, {}, RunLimits(), False)
    assert "mounts" not in options and "platform" not in options
    assert options["read_only"] is True and options["user"] == RUN_USER


def test_the_image_makes_the_run_user_and_its_out_folder():
    dockerfile = plan(case("libgomp-amd64")).dockerfile
    assert f"useradd --uid {RUN_UID} --gid {RUN_UID}" in dockerfile
    assert "install -d -o lab -g lab -m 0755 /out /out/ld /out/diag /out/trace /out/compile_debug" in dockerfile
    # Its own layer, right after the system packages: shared by every torch version.
    assert dockerfile.index("apt-get install") < dockerfile.index("useradd") < dockerfile.index("COPY lab/ca.crt")


def test_a_stream_under_its_cap_is_kept_whole(tmp_path: Path):
    cap = _Capture("stdout", tmp_path / "stdout.txt", 100)
    for piece in (b"hello ", b"world\n"):
        cap.feed(piece)
    result = cap.finish(None)
    assert (tmp_path / "stdout.txt").read_bytes() == b"hello world\n"
    assert (result.total_bytes, result.kept_bytes, result.cut, result.plain_words()) == (12, 12, False, None)


def test_a_flood_keeps_its_start_and_its_last_bytes_with_a_marker(tmp_path: Path):
    cap = _Capture("stderr", tmp_path / "stderr.txt", 1000)
    cap.feed(b"S" * 900)
    for _ in range(3000):
        cap.feed(b"x" * 1000)
    cap.feed(b"Traceback: the end\n")
    result = cap.finish(None)
    data = (tmp_path / "stderr.txt").read_bytes()
    assert data.startswith(b"S" * 900 + b"x" * 100 + b"\n[torch-repro-lab: stderr cut at 1000 B; ")
    assert data.endswith(b"Traceback: the end\n")
    assert result.cut and result.total_bytes == 900 + 3_000_000 + 19
    assert result.kept_bytes == 1000 + STREAM_TAIL_BYTES
    assert len(data) < 1000 + STREAM_TAIL_BYTES + 200
    assert "stderr was cut at 1000 B" in result.plain_words()


class _FakeContainer:
    """Only for the size check's parsing: what `exec_run` answered, and how it was called."""

    def __init__(self, answer) -> None:
        self.answer, self.calls = answer, []

    def exec_run(self, cmd, **kwargs):
        self.calls.append((cmd, kwargs))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_the_out_size_check_reads_du_and_leaves_no_loader_log():
    import docker.errors

    from lab.engine.docker_containers import _du
    fake = _FakeContainer((1, b"2048\t/out\n"))  # exit 1: some folder was unreadable; the total still counts
    assert _du(fake) == 2048 * 1024
    (cmd, kwargs), = fake.calls
    assert cmd == ["du", "-sk", OUT_IN_CONTAINER] and kwargs["user"] == RUN_USER and kwargs["stderr"] is False
    assert kwargs["environment"]["LD_DEBUG"] == "" and kwargs["environment"]["LD_PRELOAD"] == ""
    assert _du(_FakeContainer((126, b""))) is None
    assert _du(_FakeContainer(docker.errors.APIError("pids limit"))) is None


def test_after_ctrl_c_cleanup_no_worker_gets_a_new_container(monkeypatch):
    """A worker that goes on after its run's container was removed (to collect_env, say) must not
    leave a container behind: the cleanup closes the gate, and a create waits on it."""
    import threading

    import pytest

    from lab.core.errors import EngineError
    from lab.engine import docker_containers as de
    from lab.engine.docker_engine import Engine

    monkeypatch.setattr(de, "_STOPPING", threading.Event())
    made: list[str] = []

    class Containers:
        def create(self, image, **kw):
            made.append(image)
            return image

        def list(self, **kw):
            return []

    class Client:
        containers = Containers()

    engine = Engine(Client())
    limits = RunLimits()
    assert engine._create("before", ["true"], {}, None, {}, limits) == "before"
    engine.remove_session_containers()
    with pytest.raises(EngineError, match="stopping"):
        engine._create("after", ["true"], {}, None, {}, limits)
    assert made == ["before"]
