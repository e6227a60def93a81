"""Change notices on a store backend: posted by name, taken once per reader, removed by owned delete after a grace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_speculative.store import changes
from airflow_provider_speculative.store.backend import PosixBackend, StoreNotOwnedError
from airflow_provider_speculative.store.layout import StageLayout
from tests.factories import Clock
from tests.unit.store.memory import MemoryBackend

STAGE = "d/r/scan"


def _owned_memory() -> MemoryBackend:
    store = MemoryBackend()
    store.claim("d/r")
    return store


def test_a_notice_is_an_empty_object_named_after_its_attempt() -> None:
    store = _owned_memory()
    changes.post(store, STAGE, 3, 1)
    changes.post(store, STAGE, 3, 1)  # a second change of the same attempt: a second notice
    found = changes.listed(store, STAGE)
    assert sorted(found.values()) == [(3, 1), (3, 1)]
    for name in found:
        assert name.startswith("d/r/scan/changes/3.1.") and store.read(name) == b""
    # Anything else under the prefix is not a notice.
    store.replace("d/r/scan/changes/notes.txt", b"x")
    store.replace("d/r/scan/changes/1.2.x/inner", b"x")
    assert len(changes.listed(store, STAGE)) == 2


def test_each_reader_takes_a_notice_once_and_only_its_own_grace_removes_it() -> None:
    store = _owned_memory()
    clock = Clock()
    first = changes.NoticeReader(store, STAGE, clock, grace=30.0)
    second = changes.NoticeReader(store, STAGE, clock, grace=30.0)
    changes.post(store, STAGE, 0, 0)
    assert first.changed() and first.take() == {(0, 0)}
    assert first.acknowledge() == 0  # read now, but too young: the other reader may not have listed it yet
    assert not first.changed() and first.take() == set()  # read once
    clock.now += 5.0
    assert second.changed() and second.take() == {(0, 0)}  # the hand-over's other controller still sees it
    second.acknowledge()
    clock.now += 25.0
    assert first.acknowledge() == 1 and changes.listed(store, STAGE) == {}
    assert second.take() == set() and second.acknowledge() == 0  # forgotten: it is gone
    assert not second._read


def test_a_take_not_acknowledged_is_taken_again() -> None:
    store = _owned_memory()
    reader = changes.NoticeReader(store, STAGE, Clock(), grace=0.0)
    changes.post(store, STAGE, 4, 2)
    assert reader.take() == {(4, 2)}  # the step failed before its polls were done
    assert reader.changed() and reader.take() == {(4, 2)}
    assert reader.acknowledge() == 1 and not reader.changed() and changes.listed(store, STAGE) == {}


def test_a_notice_posted_after_a_take_is_new_to_every_reader() -> None:
    store = _owned_memory()
    clock = Clock()
    reader = changes.NoticeReader(store, STAGE, clock, grace=1.0)
    changes.post(store, STAGE, 0, 0)
    reader.take()
    reader.acknowledge()
    changes.post(store, STAGE, 0, 0)
    assert reader.changed() and reader.take() == {(0, 0)}


def test_a_run_without_this_stores_marker_keeps_its_notices_and_nothing_raises() -> None:
    store = MemoryBackend()  # no marker on d/r
    clock = Clock()
    reader = changes.NoticeReader(store, STAGE, clock, grace=10.0)
    changes.post(store, STAGE, 1, 0)
    assert reader.take() == {(1, 0)}
    reader.acknowledge()
    clock.now += 10.0
    assert reader.acknowledge() == 0 and len(changes.listed(store, STAGE)) == 1
    asked = store.marker_reads
    clock.now += 1.0
    assert reader.acknowledge() == 0 and store.marker_reads == asked  # not asked again on every step...
    clock.now += 9.0
    assert reader.acknowledge() == 0 and store.marker_reads > asked  # ... but a grace period later
    assert not reader.changed()  # still taken: never polled twice for one notice
    store.claim("d/r")  # planning or a rerun claimed the run since
    clock.now += 10.0
    assert reader.acknowledge() == 1 and changes.listed(store, STAGE) == {}


def test_delete_many_checks_every_parent_before_deleting_anything() -> None:
    store = _owned_memory()
    store.replace("d/r/scan/changes/0.0.a", b"")
    store.replace("d/other/scan/changes/0.0.b", b"")  # run d/other has no marker
    with pytest.raises(StoreNotOwnedError):
        store.delete_many(["d/r/scan/changes/0.0.a", "d/other/scan/changes/0.0.b"])
    assert store.exists("d/r/scan/changes/0.0.a") and store.exists("d/other/scan/changes/0.0.b")
    store.delete_many(["d/r/scan/changes/0.0.a", "d/r/scan/changes/0.0.missing"])
    assert not store.exists("d/r/scan/changes/0.0.a")


# -- the path functions the supervisors and the runtime call ---------------------------------------------


def test_the_path_functions_write_list_and_remove_the_same_notices(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path / "store", "d", "r", "scan")
    layout.claim_run()
    assert changes.pending(layout.dir) == (set(), []) and not changes.any_pending(layout.dir)
    changes.notify(layout.dir, 2, 0)
    changes.notify(str(layout.dir), 2, 1)
    keys, paths = changes.pending(layout.dir)
    assert keys == {(2, 0), (2, 1)} and changes.any_pending(layout.dir)
    for path in map(Path, paths):
        # Created in place with O_EXCL, as before the backend: empty, one link, no temporary file left.
        assert path.parent == layout.dir / "changes" and path.stat().st_size == 0 and path.stat().st_nlink == 1
    assert sorted(p.name for p in (layout.dir / "changes").iterdir()) == sorted(Path(p).name for p in paths)
    # The backend reads the same notices by name.
    assert set(changes.listed(layout.store, layout.name(layout.dir)).values()) == keys
    changes.acknowledge(paths)
    assert changes.pending(layout.dir) == (set(), [])


def test_acknowledge_by_path_leaves_the_notices_of_a_run_without_a_marker(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path / "store", "d", "r", "scan")
    changes.notify(layout.dir, 0, 0)
    _, paths = changes.pending(layout.dir)
    changes.acknowledge(paths)  # refused: left, and nothing raised
    assert changes.pending(layout.dir)[0] == {(0, 0)}


def test_a_notices_directory_linked_elsewhere_is_never_deleted_through(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path / "store", "d", "r", "scan")
    layout.claim_run()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "1.2.keep").write_text("not the store's")
    layout.dir.mkdir(parents=True)
    (layout.dir / "changes").symlink_to(elsewhere, target_is_directory=True)
    clock = Clock()
    reader = changes.NoticeReader(layout.store, layout.name(layout.dir), clock, grace=0.0)
    assert reader.take() == {(1, 2)}
    assert reader.acknowledge() == 0  # refused (a link on the way), not raised into the controller
    assert (elsewhere / "1.2.keep").read_text() == "not the store's"


def test_an_empty_exclusive_create_is_one_o_excl_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PosixBackend(tmp_path)
    linked: list[str] = []
    real_link = os.link
    monkeypatch.setattr(os, "link", lambda *a, **k: linked.append(str(a[0])) or real_link(*a, **k))
    assert store.create_exclusive("a/b/notice", b"") and not store.create_exclusive("a/b/notice", b"")
    assert linked == [] and sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["notice"]
    assert store.create_exclusive("a/b/claim", b"{}") and linked  # content still goes through a link
