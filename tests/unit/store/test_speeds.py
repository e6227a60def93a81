"""Target speed history in the store: kept per target, ignored when old or damaged."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_speculative.store.speeds import MAX_AGE, read_history, record_speeds, speed_path


def test_recorded_slowness_is_read_back_until_it_is_too_old(tmp_path: Path) -> None:
    record_speeds(tmp_path, {"fast": 1.0, "slow": 3.98765}, now=1000.0, where="d/r/scan")
    assert read_history(tmp_path, ["fast", "slow", "other"], now=1000.0 + MAX_AGE) == (
        {"fast": 1.0, "slow": 3.988}, frozenset())
    assert read_history(tmp_path, ["fast", "slow"], now=1001.0 + MAX_AGE) == ({}, frozenset())


def test_records_of_this_dag_run_are_told_apart(tmp_path: Path) -> None:
    record_speeds(tmp_path, {"fast": 1.0, "slow": 4.0}, now=10.0, where="d/r/scan")
    record_speeds(tmp_path, {"other": 2.0, "fast": 1.0}, now=10.0, where="d/r2/scan")
    assert read_history(tmp_path, ["fast", "slow", "other"], now=11.0, run="d/r")[1] == {"slow"}
    assert read_history(tmp_path, ["fast", "slow", "other"], now=11.0, run="d/r2")[1] == {"fast", "other"}


def test_a_damaged_or_foreign_record_is_no_history(tmp_path: Path) -> None:
    record_speeds(tmp_path, {"a": 2.0, "b": 2.0, "c": 2.0}, now=10.0, where="x")
    speed_path(tmp_path, "a").write_text("{not json")
    speed_path(tmp_path, "b").write_text('{"slowness": "fast", "at": 10}')
    speed_path(tmp_path, "c").write_text('{"slowness": -1, "at": 10}')
    assert read_history(tmp_path, ["a", "b", "c"], now=11.0) == ({}, frozenset())


def test_a_target_name_cannot_leave_the_targets_directory(tmp_path: Path) -> None:
    assert speed_path(tmp_path, "../../etc").parent.parent == tmp_path / "_targets"


def test_one_probe_per_dag_run_and_old_claims_are_pruned(tmp_path: Path) -> None:
    import os

    from airflow_provider_speculative.store.speeds import claim_probe

    assert claim_probe(tmp_path, "slow", "d/r1", now=100.0)
    assert not claim_probe(tmp_path, "slow", "d/r1", now=101.0)  # a concurrent stage of the same run
    assert claim_probe(tmp_path, "slow", "d/r2", now=102.0) and claim_probe(tmp_path, "other", "d/r1", now=103.0)
    probes = tmp_path / "_targets" / "slow" / "probes"
    (probes / "notes.txt").write_text("not a claim")  # anything else in there is not ours to delete
    for entry in probes.iterdir():
        os.utime(entry, (0.0, 0.0))
    assert claim_probe(tmp_path, "slow", "d/r3", now=MAX_AGE + 10.0)
    # r1's and r2's claims were older than MAX_AGE; the foreign file stays, however old.
    assert sorted(p.suffix for p in probes.iterdir()) == [".json", ".txt"]


def test_a_record_says_when_and_by_what_it_was_written(tmp_path: Path) -> None:
    from airflow_provider_speculative.store.speeds import read_records

    record_speeds(tmp_path, {"a": 1.0, "b": 5.0}, now=100.0, where="d/r/speed-check")
    record_speeds(tmp_path, {"c": 1.0}, now=40.0, where="d/r/scan")
    records = read_records(tmp_path, ["a", "b", "c", "none"], now=130.0)
    assert sorted(records) == ["a", "b", "c"] and records["b"].slowness == 5.0 and records["c"].at == 40.0
    assert [t for t, r in sorted(records.items()) if r.checked_in("d/r")] == ["a", "b"]
    assert all(r.of_run("d/r") for r in records.values())
    assert not any(r.of_run("d/r2") or r.checked_in("d/r2") for r in records.values())


def test_one_speed_check_per_dag_run_and_target_set(tmp_path: Path) -> None:
    from airflow_provider_speculative.store.speeds import claim_speed_check

    assert claim_speed_check(tmp_path, ["b", "a"], "d/r", now=1.0)
    assert not claim_speed_check(tmp_path, ["a", "b"], "d/r", now=2.0)  # a concurrent stage of the run
    assert claim_speed_check(tmp_path, ["a", "b"], "d/r2", now=3.0)
    assert not claim_speed_check(tmp_path, [], "d/r3", now=4.0)


def test_old_probe_claims_are_pruned_by_owned_deletes_under_the_targets_marker(tmp_path: Path) -> None:
    import json
    import os

    from airflow_provider_speculative.store.backend import PosixBackend
    from airflow_provider_speculative.store.speeds import claim_probe

    assert claim_probe(tmp_path, "slow", "d/r1", now=100.0)
    target = tmp_path / "_targets" / "slow"
    assert not (target / "_owner.json").exists()  # nothing to prune yet: no marker written
    for entry in (target / "probes").iterdir():
        os.utime(entry, (0.0, 0.0))
    assert claim_probe(tmp_path, "slow", "d/r2", now=MAX_AGE + 10.0)
    # The target's prefix is claimed for the delete; the marker sits outside probes/, which holds claims only.
    assert json.loads((target / "_owner.json").read_text())["prefix"] == "_targets/slow"
    assert len(list((target / "probes").iterdir())) == 1

    # A target prefix another store claimed (the same directory named by another path) is left unpruned.
    other = tmp_path / "other"
    PosixBackend(other, owner="another store").claim("_targets/slow")
    assert claim_probe(other, "slow", "d/r1", now=100.0)
    for entry in (other / "_targets" / "slow" / "probes").iterdir():
        os.utime(entry, (0.0, 0.0))
    assert claim_probe(other, "slow", "d/r2", now=MAX_AGE + 10.0)
    assert len(list((other / "_targets" / "slow" / "probes").iterdir())) == 2


def test_probe_claims_are_pruned_by_their_modification_time_on_any_backend(tmp_path: Path) -> None:
    from airflow_provider_speculative.store.backend import ObjectInfo
    from airflow_provider_speculative.store.speeds import claim_probe
    from tests.unit.store.memory import MemoryBackend

    class Timed(MemoryBackend):
        """A store without paths whose objects carry the time they were written (S3's LastModified)."""

        def __init__(self) -> None:
            super().__init__()
            self.now, self.mtimes = 0.0, {}

        def _create_exclusive(self, name: str, data: bytes) -> bool:
            created = super()._create_exclusive(name, data)
            if created:
                self.mtimes[name] = self.now
            return created

        def _stat(self, name: str) -> ObjectInfo | None:
            data = self.objects.get(name)
            return None if data is None else ObjectInfo(name, len(data), self.mtimes[name])

    store = Timed()
    assert claim_probe(tmp_path, "slow", "d/r1", now=0.0, store=store)
    store.now = MAX_AGE / 2
    assert claim_probe(tmp_path, "slow", "d/r2", now=store.now, store=store)
    store.objects["_targets/slow/probes/notes.txt"] = b"not a claim"
    store.now = MAX_AGE + 1.0
    assert claim_probe(tmp_path, "slow", "d/r3", now=store.now, store=store)
    probes = sorted(n.rsplit("/", 1)[-1] for n in store.objects if "/probes/" in n)
    assert len(probes) == 3 and "notes.txt" in probes  # r1's claim went, r2's is younger than MAX_AGE
    assert "_targets/slow/_owner.json" in store.objects and not list(tmp_path.iterdir())  # nothing on disk
