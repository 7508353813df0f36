"""Tests for lab.safetar: hostile archives are refused whole, with a clear message, leaving nothing."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from lab.core.errors import LabError
from lab.core.safetar import BundleError, safe_extract

LIMITS = {"max_total_bytes": 1 << 20, "max_files": 50}


def reg(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


def folder(name: str) -> tuple[tarfile.TarInfo, bytes | None]:
    return special(name, tarfile.DIRTYPE)


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def write_archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], *, compress: bool = True,
                  trailer: bytes = b"") -> Path:
    raw = tar_bytes(members) + trailer
    path.write_bytes(gzip.compress(raw, compresslevel=1, mtime=0) if compress else raw)
    return path


def manifest(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> dict[str, tuple[int, str]]:
    return {info.name: (len(data), hashlib.sha256(data).hexdigest()) for info, data in members
            if data is not None}


def snapshot(root: Path) -> dict[str, int]:
    """Every path under root (hidden ones too, links not followed), with its size."""
    found = {}
    for folder_path, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder_path) / name
            found[str(path.relative_to(root))] = path.lstat().st_size
    return found


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path


def refused(work: Path, archive: Path, fragment: str, member: str | None = None, **kwargs) -> BundleError:
    """Extraction is refused with a one-paragraph message naming the archive (and the member),
    and nothing at all changes on disk."""
    before = snapshot(work)
    passwd = Path("/etc/passwd").read_bytes() if Path("/etc/passwd").exists() else None
    args = {**LIMITS, **kwargs}
    with pytest.raises(BundleError) as info:
        safe_extract(archive, work / "out" / "dest", **args)
    text = str(info.value)
    assert str(archive) in text and fragment in text, text
    if member is not None:
        assert repr(member) in text, text
    assert "\n" not in text and "Traceback" not in text
    assert snapshot(work) == before
    assert not (work / "out" / "dest").exists()
    if passwd is not None:
        assert Path("/etc/passwd").read_bytes() == passwd
    return info.value


# --------------------------------------------------------------------------- good archives


def test_extracts_a_good_archive(work: Path) -> None:
    members = [reg("run/result.json", b"{}"), reg("run/repro/s.py", b"print(1)\n", 0o755),
               reg("run/out/ld/ld.1", b"l" * 5000), reg("run/empty.txt", b"")]
    archive = write_archive(work / "in" / "a.tar.gz", members)
    dest = safe_extract(archive, work / "out" / "dest", expected=manifest(members), **LIMITS)
    assert dest == work / "out" / "dest"
    assert (dest / "run" / "result.json").read_bytes() == b"{}"
    assert (dest / "run" / "out" / "ld" / "ld.1").stat().st_size == 5000
    assert (dest / "run" / "repro" / "s.py").stat().st_mode & 0o777 == 0o755
    assert (dest / "run" / "result.json").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in (work / "out").iterdir()) == ["dest"]  # no temporary folder left


def test_folder_members_and_an_empty_dest(work: Path) -> None:
    members = [folder("run"), folder("run/repro"), reg("run/repro/s.py")]
    archive = write_archive(work / "in" / "a.tar.gz", members)
    (work / "out" / "dest").mkdir()
    dest = safe_extract(archive, work / "out" / "dest", expected=manifest(members), **LIMITS)
    assert (dest / "run" / "repro" / "s.py").read_bytes() == b"x"


def test_without_manifest(work: Path) -> None:
    archive = write_archive(work / "in" / "a.tar.gz", [reg("a"), reg("b/c", b"yy")])
    dest = safe_extract(archive, work / "out" / "dest", **LIMITS)
    assert (dest / "b" / "c").read_bytes() == b"yy"


def test_bundle_error_is_a_lab_error() -> None:
    assert issubclass(BundleError, LabError)


# --------------------------------------------------------------------------- hostile archives


@pytest.mark.parametrize(("members", "member", "fragment"), [
    ([reg("/tmp/lab-abs-escape")], "/tmp/lab-abs-escape", "its path is absolute"),
    ([reg("ok"), reg("../escape")], "../escape", "'..' component"),
    ([reg("a/../../escape")], "a/../../escape", "'..' component"),
    ([reg("a\\..\\b")], "a\\..\\b", "backslash"),
    ([reg("./a")], "./a", "empty or '.' component"),
    ([reg("a//b")], "a//b", "empty or '.' component"),
    ([special("passwd", tarfile.SYMTYPE, "/etc/passwd")], "passwd", "symbolic link (to '/etc/passwd')"),
    ([special("inside", tarfile.SYMTYPE, "a")], "inside", "links are refused"),
    ([special("link", tarfile.SYMTYPE, "../.."), reg("link/evil")], "link", "symbolic link"),
    ([special("hard", tarfile.LNKTYPE, "/etc/passwd")], "hard", "hard link"),
    ([reg("a"), special("hard", tarfile.LNKTYPE, "a")], "hard", "hard link"),
    ([special("tty", tarfile.CHRTYPE)], "tty", "device file"),
    ([special("sda", tarfile.BLKTYPE)], "sda", "device file"),
    ([special("pipe", tarfile.FIFOTYPE)], "pipe", "fifo"),
    ([reg("a"), reg("b"), reg("a", b"second")], "a", "holds this name twice"),
    ([folder("d"), reg("d")], "d", "holds this name twice"),
    ([reg("a"), reg("a/b")], "a/b", "lies under 'a', which is a file"),
    ([reg("a/b"), reg("a")], "a", "an earlier member uses it as a folder"),
], ids=["absolute", "dotdot", "dotdot-inner", "backslash", "dot", "empty-part", "symlink-passwd",
        "symlink-inside", "symlink-then-write", "hardlink-outside", "hardlink-inside", "chardev", "blockdev",
        "fifo", "duplicate", "dir-then-file", "file-then-child", "child-then-file"])
def test_hostile_members(work: Path, members: list, member: str, fragment: str) -> None:
    archive = write_archive(work / "in" / "a.tar.gz", members)
    refused(work, archive, fragment, member)
    assert not (work / "escape").exists() and not Path("/tmp/lab-abs-escape").exists()


def test_symlink_then_write_through_it_never_writes_outside(work: Path) -> None:
    (work / "victim").mkdir()
    members = [special("link", tarfile.SYMTYPE, str(work / "victim")), reg("link/evil", b"pwned")]
    archive = write_archive(work / "in" / "a.tar.gz", members)
    refused(work, archive, "symbolic link", "link")
    assert list((work / "victim").iterdir()) == []


def test_manifest_checks(work: Path) -> None:
    members = [reg("a", b"hello"), reg("b", b"world")]
    archive = write_archive(work / "in" / "a.tar.gz", members)
    good = manifest(members)
    refused(work, archive, "its size is 5 bytes, but the manifest says 6", "a",
            expected={**good, "a": (6, good["a"][1])})
    refused(work, archive, "its sha256 is " + good["b"][1] + ", but the manifest says " + "0" * 64, "b",
            expected={**good, "b": (5, "0" * 64)})
    refused(work, archive, "the manifest does not list this file", "b", expected={"a": good["a"]})
    refused(work, archive, "the archive lacks it and 1 more", "c",
            expected={**good, "c": (1, "0" * 64), "d": (1, "0" * 64)})


def test_folder_not_in_manifest(work: Path) -> None:
    members = [folder("stray"), reg("a")]
    refused(work, write_archive(work / "in" / "a.tar.gz", members), "holds nothing the manifest lists", "stray",
            expected=manifest(members))


def test_over_total_size(work: Path) -> None:
    members = [reg("a", b"a" * 600_000), reg("b", b"b" * 600_000)]
    refused(work, write_archive(work / "in" / "a.tar.gz", members), "exceed 1048576 bytes in all", "b")


def test_over_file_count(work: Path) -> None:
    members = [reg(f"f{i}") for i in range(51)]
    refused(work, write_archive(work / "in" / "a.tar.gz", members), "more than 50 members", "f50")


def test_gzip_bomb_in_a_pax_header(work: Path) -> None:
    """A pax header is read whole into memory by tarfile: its size is never trusted."""
    body = b"x" * (30 << 20)
    record = b"comment=" + body + b"\n"
    length = len(record) + len(str(len(record) + 8)) + 1
    pax = f"{length} ".encode() + record
    header = tarfile.TarInfo("PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, len(pax)
    raw = header.tobuf(tarfile.USTAR_FORMAT) + pax + b"\0" * (-len(pax) % 512) + tar_bytes([reg("a")])
    archive = work / "in" / "bomb.tar.gz"
    archive.write_bytes(gzip.compress(raw, compresslevel=1))
    assert archive.stat().st_size < 1 << 20
    refused(work, archive, "compression bomb")


def test_gzip_bomb_of_trailing_zeros(work: Path) -> None:
    archive = write_archive(work / "in" / "bomb.tar.gz", [reg("a")], trailer=b"\0" * (40 << 20))
    assert archive.stat().st_size < 1 << 20
    refused(work, archive, "compression bomb")


def test_declared_size_over_the_limit_is_refused_before_reading(work: Path) -> None:
    archive = write_archive(work / "in" / "big.tar.gz", [reg("big", b"\0" * (8 << 20))])
    refused(work, archive, "exceed 1048576 bytes", "big")


def test_data_after_a_damaged_header(work: Path) -> None:
    raw = tar_bytes([reg("a")])[:1024] + b"garbage!" * 64 + tar_bytes([reg("b")])
    archive = work / "in" / "a.tar.gz"
    archive.write_bytes(gzip.compress(raw))
    refused(work, archive, "data after the end of the tar archive")


@pytest.mark.parametrize(("data", "fragment"), [
    (b"this is not an archive at all" * 10, "not a gzip-compressed tar archive"),
    (b"", "not a valid tar archive"),
    (tar_bytes([reg("a")]), "not a gzip-compressed tar archive"),
    (gzip.compress(b""), "not a valid tar archive"),
    (gzip.compress(b"\x01" * 2048), "not a valid tar archive"),
], ids=["garbage", "empty", "uncompressed-tar", "empty-gzip", "gzip-of-garbage"])
def test_not_an_archive(work: Path, data: bytes, fragment: str) -> None:
    archive = work / "in" / "a.tar.gz"
    archive.write_bytes(data)
    refused(work, archive, fragment)


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_truncated_archive(work: Path, keep: float) -> None:
    import random
    data = random.Random(1).randbytes(200_000)
    members = [reg("a", data), reg("b", data[::-1])]
    archive = write_archive(work / "in" / "a.tar.gz", members)
    whole = archive.read_bytes()
    archive.write_bytes(whole[: int(len(whole) * keep)])
    refused(work, archive, "truncated", expected=manifest(members))
    refused(work, archive, "truncated")


def test_gzip_trailer_cut_off(work: Path) -> None:
    archive = write_archive(work / "in" / "a.tar.gz", [reg("a", b"hello")])
    archive.write_bytes(archive.read_bytes()[:-4])
    refused(work, archive, "truncated")


def test_corrupt_compressed_data(work: Path) -> None:
    archive = write_archive(work / "in" / "a.tar.gz", [reg("a", os.urandom(4096))])
    data = bytearray(archive.read_bytes())
    for i in range(40, 80):
        data[i] ^= 0xFF
    archive.write_bytes(bytes(data))
    err = refused(work, archive, "")
    assert any(word in str(err) for word in ("corrupt", "truncated", "CRC", "not a valid tar"))


def test_dest_that_exists_is_left_alone(work: Path) -> None:
    archive = write_archive(work / "in" / "a.tar.gz", [reg("a")])
    dest = work / "out" / "dest"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep me")
    with pytest.raises(BundleError, match="already exists"):
        safe_extract(archive, dest, **LIMITS)
    assert sorted(p.name for p in dest.iterdir()) == ["mine.txt"]
    assert sorted(p.name for p in (work / "out").iterdir()) == ["dest"]


def test_missing_archive(work: Path) -> None:
    with pytest.raises(BundleError, match="cannot read it"):
        safe_extract(work / "in" / "nope.tar.gz", work / "out" / "dest", **LIMITS)
    assert list((work / "out").iterdir()) == []


# --- extract_outputs: a container's /out, copied as evidence -----------------------------------


def docker_style(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """Names as the engine's archive of `/out/.` gives them: `.` first, then `./name`."""
    root = tarfile.TarInfo(".")
    root.type = tarfile.DIRTYPE
    out = [(root, None)]
    for info, data in members:
        info.name = "./" + info.name
        out.append((info, data))
    return out


def chunked(data: bytes, size: int = 777):
    """The archive as the engine streams it: chunks of any size."""
    for i in range(0, len(data), size):
        yield data[i:i + size]


def copy_out(dest: Path, members, **kwargs):
    from lab.core.safetar import extract_outputs
    args = {**LIMITS, **kwargs}
    return extract_outputs(chunked(tar_bytes(docker_style(members))), dest, **args)


def test_outputs_copy_regular_files_and_their_folders(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    result = copy_out(dest, [folder("ld"), reg("ld/ld.12", b"calling init: x\n"), reg("run.sh", b"#!", 0o755),
                             folder("empty")])
    assert (dest / "ld" / "ld.12").read_bytes() == b"calling init: x\n"
    assert os.stat(dest / "run.sh").st_mode & 0o777 == 0o755
    assert not (dest / "empty").exists()  # folders are made only for the files in them
    assert (result.folder, result.files, result.bytes, result.skipped, result.stopped) == ("out", 2, 18, (), None)


@pytest.mark.parametrize(("member", "kind", "detail"), [
    (special("stdout.txt", tarfile.SYMTYPE, "/root/.ssh/authorized_keys"), "symbolic link",
     "to '/root/.ssh/authorized_keys'"),
    (special("ld/ld.1", tarfile.SYMTYPE, "../../../../etc/shadow"), "symbolic link", "to '../../../../etc/shadow'"),
    (special("ld/ld.2", tarfile.LNKTYPE, "./ld/ld.0"), "hard link", "to './ld/ld.0'"),
    (special("pipe", tarfile.FIFOTYPE), "fifo", ""),
    (special("tty", tarfile.CHRTYPE), "device file", ""),
    (special("sda", tarfile.BLKTYPE), "device file", ""),
    (reg("../escape", b"x"), "unsafe name", "its path has a '..' component, which would leave the folder"),
    (reg("a\\b", b"x"), "unsafe name", "its name contains a backslash"),
])
def test_outputs_never_make_links_fifos_devices_or_escapes(tmp_path: Path, member, kind: str, detail: str) -> None:
    dest = tmp_path / "run" / "out"
    canary = tmp_path / "canary"
    canary.write_text("untouched")
    result = copy_out(dest, [folder("ld"), reg("ld/ld.0", b"loader"), member, reg("zz-after", b"still copied")])
    assert [(s.path, s.kind, s.detail) for s in result.skipped] == [(member[0].name.removeprefix("./"), kind, detail)]
    assert result.stopped is None and result.files == 2
    assert (dest / "zz-after").read_bytes() == b"still copied"
    for path in dest.rglob("*"):
        assert path.is_dir() or (path.is_file() and not path.is_symlink()), path
        if path.is_file():
            assert path.stat().st_nlink == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["canary", "run"]
    assert canary.read_text() == "untouched"
    assert " (" + kind in result.plain_words()[0]


def test_outputs_skip_reserved_names_duplicates_and_clashes(tmp_path: Path) -> None:
    dest = tmp_path / "diagnose"
    dest.mkdir()
    (dest / "stdout.txt").write_text("the lab's own capture")
    result = copy_out(dest, [reg("stdout.txt", b"forged"), reg("diagnostics.json", b"{}"), reg("a", b"1"),
                             reg("a", b"2"), reg("a/b", b"3"), reg("d/e", b"4")],
                      reserved={"stdout.txt", "diagnostics.json"})
    assert (dest / "stdout.txt").read_text() == "the lab's own capture"
    assert not (dest / "diagnostics.json").exists()
    assert (dest / "a").read_bytes() == b"1" and (dest / "d" / "e").read_bytes() == b"4"
    assert [(s.path, s.kind) for s in result.skipped] == [
        ("stdout.txt", "reserved name"), ("diagnostics.json", "reserved name"), ("a", "duplicate"),
        ("a/b", "name clash")]


def test_outputs_stop_at_the_size_cap_and_keep_what_came_before(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    result = copy_out(dest, [reg("a", b"x" * 600), reg("b", b"y" * 600), reg("c", b"z")], max_total_bytes=1000)
    assert (dest / "a").read_bytes() == b"x" * 600
    assert not (dest / "b").exists() and not (dest / "c").exists()
    assert result.files == 1 and result.bytes == 600
    assert result.stopped and "'b'" in result.stopped and "cap of 1000 B" in result.stopped
    assert "the copy of /out stopped early" in result.plain_words()[0]


def test_outputs_stop_at_the_file_cap(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    result = copy_out(dest, [reg(f"f{i}", b"x") for i in range(10)], max_files=4)
    assert result.files == 3  # the `.` entry counts too
    assert result.stopped and "more than 4 entries" in result.stopped


def test_outputs_from_a_broken_stream_keep_whole_files_only(tmp_path: Path) -> None:
    from lab.core.safetar import extract_outputs
    data = tar_bytes(docker_style([reg("a", b"x" * 100), reg("b", b"y" * 5000)]))
    inside_b = data.index(b"y" * 5000) + 1000

    def broken():
        yield data[:inside_b]
        raise OSError("the engine's archive stream broke")

    dest = tmp_path / "out"
    result = extract_outputs(broken(), dest, **LIMITS)
    assert (dest / "a").read_bytes() == b"x" * 100
    assert not (dest / "b").exists()
    assert result.files == 1 and result.stopped and "broke" in result.stopped

    truncated = extract_outputs(chunked(data[:inside_b]), tmp_path / "out2", **LIMITS)
    assert not (tmp_path / "out2" / "b").exists() and truncated.stopped


def test_outputs_of_an_empty_or_unreadable_stream(tmp_path: Path) -> None:
    from lab.core.safetar import extract_outputs
    empty = extract_outputs(iter([tar_bytes([])]), tmp_path / "e", **LIMITS)
    assert (empty.files, empty.stopped) == (0, None) and (tmp_path / "e").is_dir()
    garbage = extract_outputs(iter([b"not a tar" * 100]), tmp_path / "g", **LIMITS)
    assert garbage.files == 0 and garbage.stopped and "could not be read" in garbage.stopped
