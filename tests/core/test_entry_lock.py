"""A cache entry's lock: the second process waits, says so once, and gives up with a clear error."""

from __future__ import annotations

import threading

import pytest
from filelock import FileLock

from lab.core import cache
from lab.core.errors import BuildError


def test_a_free_lock_is_taken_without_a_word(tmp_path):
    said = []
    with cache.entry_lock(tmp_path / "k.lock", lambda: said.append("waiting"), BuildError):
        assert FileLock(str(tmp_path / "k.lock")).is_locked is False  # a new handle does not hold it
    assert said == []


def _held_by_another_thread(path, seconds):
    """The lock held from another thread for `seconds` (filelock's locks are per thread)."""
    taken = threading.Event()

    def hold():
        with FileLock(str(path)):
            taken.set()
            threading.Event().wait(seconds)
    t = threading.Thread(target=hold, daemon=True)
    t.start()
    taken.wait(10)
    return t


def test_a_held_lock_is_waited_for_and_taken_once_released(tmp_path):
    holder = _held_by_another_thread(tmp_path / "k.lock", 0.5)
    said = []
    with cache.entry_lock(tmp_path / "k.lock", lambda: said.append("waiting"), BuildError):
        said.append("held")
    holder.join(10)
    assert said == ["waiting", "held"]


def test_a_lock_held_too_long_is_the_callers_error_naming_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "ENTRY_LOCK_WAIT_S", 0.2)
    holder = _held_by_another_thread(tmp_path / "k.lock", 2)
    with pytest.raises(BuildError, match=r"k\.lock is still held after 0\.2 s"), \
            cache.entry_lock(tmp_path / "k.lock", lambda: None, BuildError):
        pass
    holder.join(10)
