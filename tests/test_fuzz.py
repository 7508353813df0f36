"""Fuzzing with a fixed seed: whatever a scenario file or a bundle holds, the lab either accepts it
or refuses it with its own one-paragraph error (ScenarioError, BundleError): never another
exception, never a hang.

Scenario loader: 4,000 structured YAML documents (known and unknown keys, wrong-typed values),
3,000 mutations of the shipped scenario files (byte flips, truncations, non-UTF-8 insertions,
YAML fragments) plus fixed huge-value and YAML-bomb variants of each shipped file, and 3,000 raw
text and byte documents. Bundles: 1,000 generated manifests, 600 mutated bundle.json texts and
500 mutated bundle archives. `test_fuzz_counts` (last) checks that these numbers were reached.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.bundle.archive import inspect_bundle, open_bundle
from lab.bundle.manifest import parse_manifest, validate_manifest
from lab.core.errors import ScenarioError
from lab.core.safetar import BundleError
from lab.scenario.lookup import load_scenario
from lab.scenario.model import Scenario

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))
SHIPPED_BYTES = [p.read_bytes() for p in SHIPPED]
COUNTS: Counter[str] = Counter()
TARGETS = {"structured": 4000, "mutation": 3000, "raw": 3000, "huge": 10 * len(SHIPPED),
           "manifest": 1000, "manifest-bytes": 600, "archive": 500}

FIXED = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                        HealthCheck.data_too_large, HealthCheck.large_base_example,
                                        HealthCheck.filter_too_much])


def fixed(kind: str) -> settings:
    """The fixed-seed settings, running TARGETS[kind] examples."""
    return settings(FIXED, max_examples=TARGETS[kind])


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the shipped scripts (`scripts/*.py`) and `repro.py`, so valid files load."""
    folder = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(ROOT / "scenarios" / "scripts", folder / "scripts")
    (folder / "repro.py").write_text("raise SystemExit(1)\n")
    return folder


def load_bytes(folder: Path, data: bytes, kind: str) -> Scenario | ScenarioError:
    """Loading must either succeed or raise a one-paragraph ScenarioError naming the file."""
    COUNTS[kind] += 1
    path = folder / "fuzz.yaml"
    path.write_bytes(data)
    try:
        return load_scenario(path)
    except ScenarioError as err:
        text = str(err)
        assert "\n" not in text and "fuzz.yaml" in text and "Traceback (most recent call last)" not in text, text
        return err


def test_shipped_files_load(fuzz_dir: Path) -> None:
    """The baseline of the mutations: every shipped scenario is valid from the fuzz folder."""
    assert len(SHIPPED) >= 5
    for data in SHIPPED_BYTES:
        assert isinstance(load_bytes(fuzz_dir, data, "baseline"), Scenario)


# --------------------------------------------------------------------------- structured documents

KNOWN_KEYS = ["name", "title", "upstream", "description", "torch", "arch", "base", "gpu", "cpu_variant",
              "system_packages", "pip", "env", "vars", "script", "args", "timeout", "expect", "ablation",
              "network", "limits"]
SUB_KEYS = {"expect": ["duplicate_runtime", "traceback_contains", "stdout_contains", "stderr_contains",
                       "exit_code", "graph_breaks"],
            "ablation": ["via", "max_autotune"], "limits": ["memory", "pids", "cpus"]}
VALID_BASE = {"name": "fuzz", "torch": "2.5.1", "arch": "amd64", "base": "debian:bookworm",
              "script": "repro.py", "expect": {"exit_code": 1}}
WORDS = ["2.5.1", "2.10", "2.13.0+cpu", "amd64", "arm64", "aarch64", "debian:bookworm", "libgomp", "cublasLt",
         "8g", "512m", "8GiB", "1.5g", "env", "hook", "none", "repro.py", "scripts/libgomp_aarch64.py", "numpy",
         "torch", "g++", "true", "~", "", "\x07", "source", "LD_DEBUG", "LAB_X", "OMP_NUM_THREADS", "-e .",
         "https://github.com/pytorch/pytorch/issues/1", "a" * 300]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.integers(-(10**120), 10**120),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30), st.sampled_from(WORDS),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10) | st.sampled_from(WORDS),
                                                                inner, max_size=4),
    max_leaves=10,
)
unknown_keys = st.text(min_size=1, max_size=12) | st.sampled_from(["torhc", "Timeout", "limit", "source", "env "])


def sub_mapping(key: str) -> st.SearchStrategy[dict[Any, Any]]:
    return st.dictionaries(st.sampled_from(SUB_KEYS[key]) | unknown_keys, values, max_size=4)


field_value = st.sampled_from(KNOWN_KEYS).flatmap(
    lambda key: st.tuples(st.just(key), sub_mapping(key) if key in SUB_KEYS else values))


@st.composite
def structured_docs(draw: st.DrawFn) -> bytes:
    doc: dict[Any, Any] = dict(VALID_BASE) if draw(st.booleans()) else {}
    for key in draw(st.lists(st.sampled_from(KNOWN_KEYS), max_size=3)):
        doc.pop(key, None)
    for key, value in draw(st.lists(field_value, max_size=5)):
        doc[key] = value
    doc.update(draw(st.dictionaries(unknown_keys, values, max_size=2)))
    style = draw(st.sampled_from([None, True, False]))
    text = yaml.safe_dump(doc, default_flow_style=style, allow_unicode=draw(st.booleans()), sort_keys=False)
    return text.encode("utf-8")


@pytest.mark.timeout(600)
@fixed("structured")
@given(data=structured_docs())
def test_fuzz_structured_documents(fuzz_dir: Path, data: bytes) -> None:
    load_bytes(fuzz_dir, data, "structured")


# --------------------------------------------------------------------------- mutations of shipped files

FRAGMENTS = [b"&a ", b"*a", b"<<: *a\n", b"!!python/object/apply:os.system [ls]", b"!!binary ", b"? ", b"\t",
             b": ", b"- ", b"[", b"]", b"{", b"}", b"'", b'"', b"#", b"|\n", b">-\n", b"---\n", b"...\n",
             b"%YAML 1.1\n", b"\x00", b"\xef\xbb\xbf", b"\r\n", b"\xc3\x28", b"\xff\xfe", b"\xed\xa0\x80",
             b"10" + b"0" * 100, b"-1", b".nan", b"~", b"null", b"limits: {memory: 1}\n", b"network: 2\n"]
position = st.integers(0, 1 << 16)
mutation = st.one_of(
    st.tuples(st.just("flip"), position, st.integers(0, 255)),
    st.tuples(st.just("insert"), position, st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("high"), position, st.integers(0x80, 0xFF)),
    st.tuples(st.just("fragment"), position, st.sampled_from(FRAGMENTS)),
    st.tuples(st.just("delete"), position, st.integers(1, 40)),
    st.tuples(st.just("truncate"), position, st.just(0)),
    st.tuples(st.just("dup-line"), position, st.just(0)),
)


def mutate(data: bytes, ops: list[tuple[str, int, Any]]) -> bytes:
    buf = bytearray(data)
    for op, pos, arg in ops:
        at = pos % (len(buf) + 1)
        if op == "flip" and buf:
            buf[min(at, len(buf) - 1)] = arg
        elif op == "insert":
            buf[at:at] = arg
        elif op == "high":
            buf[at:at] = bytes([arg])
        elif op == "fragment":
            buf[at:at] = arg
        elif op == "delete":
            del buf[at:at + arg]
        elif op == "truncate":
            del buf[at:]
        elif op == "dup-line":
            start = buf.rfind(b"\n", 0, at) + 1
            end = buf.find(b"\n", at)
            end = len(buf) if end < 0 else end + 1
            buf[end:end] = buf[start:end]
    return bytes(buf)


@pytest.mark.timeout(600)
@fixed("mutation")
@given(index=st.integers(0, len(SHIPPED) - 1), ops=st.lists(mutation, min_size=1, max_size=6))
def test_fuzz_mutated_shipped_files(fuzz_dir: Path, index: int, ops: list[tuple[str, int, Any]]) -> None:
    load_bytes(fuzz_dir, mutate(SHIPPED_BYTES[index], ops), "mutation")


MIB_TEXT = "x" * 1_000_000
BIG_INT = str(10**100)


def billion_laughs(levels: int = 12, width: int = 10) -> str:
    lines = ['lol0: &lol0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


HUGE = {
    "description-1MB": lambda t: t + f"\ndescription_x: {MIB_TEXT}\n",
    "title-1MB": lambda t: "title: '" + MIB_TEXT + "'\n" + t.replace("title:", "old_title:"),
    "env-1MB": lambda t: t + "\nenv_big: {A: " + MIB_TEXT + "}\n",
    "timeout-10**100": lambda t: "\n".join(line for line in t.splitlines() if not line.startswith("timeout:"))
    + f"\ntimeout: {BIG_INT}\n",
    "memory-10**100": lambda t: t + f"\nlimits: {{memory: {BIG_INT}, pids: {BIG_INT}, cpus: 1e400}}\n",
    "torch-long": lambda t: t + "\ntorch_x: [" + ", ".join(['"2.5.1"'] * 20000) + "]\n",
    "billion-laughs": lambda t: billion_laughs() + t,
    "merge-bomb": lambda t: t + "\nbase_map: &m {a: 1}\n" + "".join(f"k{i}: {{<<: [*m, *m]}}\n" for i in range(3000)),
    "deep-flow": lambda t: t + "\nvars: " + "[" * 50_000 + "]" * 50_000 + "\n",
    "many-keys": lambda t: t + "\nvars:\n" + "".join(f"  K{i}: {i}\n" for i in range(20_000)),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(HUGE))
def test_fuzz_huge_values_and_bombs(fuzz_dir: Path, kind: str) -> None:
    """Every shipped file with a huge value or a YAML bomb: refused (or loaded) quickly, no hang."""
    for data in SHIPPED_BYTES:
        text = HUGE[kind](data.decode("utf-8"))
        result = load_bytes(fuzz_dir, text.encode("utf-8"), "huge")
        if kind in ("billion-laughs", "merge-bomb"):
            assert isinstance(result, ScenarioError) and "anchors and aliases" in str(result)


# --------------------------------------------------------------------------- raw documents

yamlish = st.lists(st.sampled_from([f.decode("utf-8", "replace") for f in FRAGMENTS] +
                                   ["name: x\n", "torch: ", "arch: ", "expect:\n  exit_code: ", "\n", "  ",
                                    "script: repro.py\n", "limits:\n  pids: ", "network: "])
                   | st.text(max_size=8), max_size=40).map("".join)


@pytest.mark.timeout(600)
@fixed("raw")
@given(doc=st.one_of(st.text(max_size=300).map(lambda t: t.encode("utf-8")), st.binary(max_size=300),
                     yamlish.map(lambda t: t.encode("utf-8"))))
def test_fuzz_raw_documents(fuzz_dir: Path, doc: bytes) -> None:
    load_bytes(fuzz_dir, doc, "raw")


# --------------------------------------------------------------------------- bundle manifests

FILES = {"result.json": b'{"verdict": "reproduced"}', "report.md": b"# r\n", "out/ld/ld.1": b"ld\n"}


def good_manifest() -> dict[str, Any]:
    return {
        "format": "torch-repro-lab-bundle", "format_version": 1, "created": "2026-11-22T12:30:00+00:00",
        "lab_version": "0.1.0", "scenario": "s", "case": "s[torch=2.5.1,arch=amd64]", "torch": "2.5.1",
        "arch": "amd64", "verdict": "reproduced", "reason": "r", "summary": ["a finding"], "slim": False,
        "files": [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest(),
                   "kind": "data" if p.startswith("out/") else "meta"} for p, d in FILES.items()],
        "left_out": [{"path": "lab/ca.crt", "size": 3, "sha256": "0" * 64, "why": "host CA bundle"}],
    }


GOOD_MANIFEST_BYTES = json.dumps(good_manifest(), indent=2).encode()
MANIFEST_KEYS = list(good_manifest())
ENTRY_KEYS = ["path", "size", "sha256", "kind", "why"]
PATHS = ["result.json", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a\\b", "", "bundle.json", "a\x00b",
         "é/ü", "x" * 2000, "out/", "a\nb"]
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=True),
                         st.text(max_size=20), st.sampled_from(PATHS + ["0" * 64, "f" * 64, "F" * 64, "meta",
                                                                        "data", "torch-repro-lab-bundle"]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=8) | st.sampled_from(ENTRY_KEYS), inner, max_size=4),
                           max_leaves=8)
entry = st.fixed_dictionaries({}, optional={k: json_values for k in ENTRY_KEYS}) | \
    st.builds(lambda p, s, h: {"path": p, "size": s, "sha256": h, "kind": "meta"},
              st.sampled_from(PATHS) | st.text(max_size=10), st.integers(-5, 10**20) | json_scalars,
              st.sampled_from(["0" * 64, "A" * 64, "0" * 63]) | st.text(max_size=64))


@st.composite
def manifests(draw: st.DrawFn) -> Any:
    doc: dict[str, Any] = good_manifest()
    for key in draw(st.lists(st.sampled_from(MANIFEST_KEYS), max_size=2)):
        doc.pop(key, None)
    for key in draw(st.lists(st.sampled_from(MANIFEST_KEYS) | st.text(max_size=8), max_size=3)):
        doc[key] = draw(json_values)
    if draw(st.booleans()):
        doc["files"] = draw(st.lists(entry, max_size=4))
    if draw(st.booleans()):
        doc["left_out"] = draw(st.lists(entry, max_size=3))
    return doc if draw(st.integers(0, 20)) else draw(json_values)


def check_manifest(raw: bytes, kind: str) -> None:
    COUNTS[kind] += 1
    try:
        parse_manifest(raw, "fuzz.tar.gz")
    except BundleError as err:
        text = str(err)
        assert "\n" not in text and "fuzz.tar.gz" in text and "bundle.json" in text, text


@pytest.mark.timeout(300)
@fixed("manifest")
@given(doc=manifests())
def test_fuzz_generated_manifests(doc: Any) -> None:
    check_manifest(json.dumps(doc).encode(), "manifest")
    try:
        validate_manifest(doc, "fuzz.tar.gz")
    except BundleError as err:
        assert "\n" not in str(err)


@pytest.mark.timeout(300)
@fixed("manifest-bytes")
@given(ops=st.lists(mutation, min_size=1, max_size=6))
def test_fuzz_mutated_manifest_bytes(ops: list[tuple[str, int, Any]]) -> None:
    check_manifest(mutate(GOOD_MANIFEST_BYTES, ops), "manifest-bytes")


# --------------------------------------------------------------------------- bundle archives

MEMBER_TYPES = [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE,
                tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.CONTTYPE, b"Z"]
archive_op = st.one_of(
    st.tuples(st.just("rename"), st.integers(0, 5), st.sampled_from(PATHS[:-1] + ["r/../../x", "r/a/../../b"])),
    st.tuples(st.just("type"), st.integers(0, 5), st.sampled_from(MEMBER_TYPES)),
    st.tuples(st.just("data"), st.integers(0, 5), st.binary(max_size=30)),
    st.tuples(st.just("drop"), st.integers(0, 5), st.none()),
    st.tuples(st.just("dup"), st.integers(0, 5), st.none()),
    st.tuples(st.just("swap"), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("manifest"), st.integers(0, 0), st.lists(mutation, min_size=1, max_size=3)),
    st.tuples(st.just("tar-bytes"), st.integers(0, 0), st.lists(mutation, min_size=1, max_size=3)),
    st.tuples(st.just("gz-bytes"), st.integers(0, 0), st.lists(mutation, min_size=1, max_size=3)),
)


def build_archive(ops: list[tuple[str, int, Any]]) -> bytes:
    members: list[list[Any]] = [["r/bundle.json", tarfile.REGTYPE, GOOD_MANIFEST_BYTES]]
    members += [[f"r/{p}", tarfile.REGTYPE, d] for p, d in FILES.items()]
    tar_ops, gz_ops = [], []
    for op, index, arg in ops:
        i = index % len(members) if members else 0
        if op == "rename" and members:
            members[i][0] = arg
        elif op == "type" and members:
            members[i][1] = arg
        elif op == "data" and members:
            members[i][2] = arg
        elif op == "drop" and members:
            del members[i]
        elif op == "dup" and members:
            members.append(list(members[i]))
        elif op == "swap" and members:
            j = arg % len(members)
            members[i], members[j] = members[j], members[i]
        elif op == "manifest" and members:
            members[0][2] = mutate(members[0][2], arg)
        elif op == "tar-bytes":
            tar_ops += arg
        elif op == "gz-bytes":
            gz_ops += arg
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "/etc/passwd"
            regular = kind in (tarfile.REGTYPE, tarfile.CONTTYPE, b"Z")
            info.size = len(data) if regular else 0
            tar.addfile(info, io.BytesIO(data) if regular else None)
    raw = mutate(buffer.getvalue(), tar_ops) if tar_ops else buffer.getvalue()
    packed = gzip.compress(raw, mtime=0)
    return mutate(packed, gz_ops) if gz_ops else packed


@pytest.mark.timeout(300)
@fixed("archive")
@given(ops=st.lists(archive_op, max_size=4))
def test_fuzz_bundle_archives(ops: list[tuple[str, int, Any]]) -> None:
    COUNTS["archive"] += 1
    with tempfile.TemporaryDirectory() as work:
        bundle = Path(work) / "fuzz.tar.gz"
        bundle.write_bytes(build_archive(ops))
        try:
            inspect_bundle(bundle)
        except BundleError as err:
            assert "\n" not in str(err) and "fuzz.tar.gz" in str(err)
        out = Path(work) / "out"
        out.mkdir()
        try:
            folder = open_bundle(bundle, out / "dest")
        except BundleError as err:
            assert "\n" not in str(err) and "fuzz.tar.gz" in str(err)
            assert list(out.iterdir()) == []  # a refused bundle leaves nothing behind
        else:
            assert folder.parent == out / "dest" and (folder / "bundle.json").is_file()
            assert all(p.is_file() or p.is_dir() for p in (out / "dest").rglob("*"))
            assert not any(p.is_symlink() for p in (out / "dest").rglob("*"))


def test_fuzz_counts() -> None:
    """The fuzz tests above (when they ran) went through their full number of documents."""
    print("fuzz documents:", dict(COUNTS))
    ran = {kind: COUNTS[kind] for kind in TARGETS if COUNTS[kind]}
    if not ran:
        pytest.skip("no fuzz test ran in this session")
    short = {kind: (count, TARGETS[kind]) for kind, count in ran.items() if count < TARGETS[kind]}
    assert not short, short
    scenario_docs = sum(COUNTS[k] for k in ("structured", "mutation", "raw", "huge"))
    bundle_docs = sum(COUNTS[k] for k in ("manifest", "manifest-bytes", "archive"))
    if set(ran) >= {"structured", "mutation", "raw", "huge"}:
        assert scenario_docs >= 10_000
    if set(ran) >= {"manifest", "manifest-bytes", "archive"}:
        assert bundle_docs >= 2_000
