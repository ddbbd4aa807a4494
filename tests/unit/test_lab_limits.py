"""The kernel limits a large lab raises: raised to what the lab's size needs, never lowered."""

from __future__ import annotations

from lab import linux


def test_the_neighbour_table_limits_grow_with_the_lab_and_are_never_lowered(tmp_path, monkeypatch):
    for name, value in (("gc_thresh1", 128), ("gc_thresh2", 512), ("gc_thresh3", 100_000)):
        (tmp_path / name).write_text(f"{value}\n")
    monkeypatch.setattr(linux, "NEIGH_SYSCTLS", tmp_path)
    linux.raise_neighbour_limits(1000)
    got = {name: int((tmp_path / name).read_text()) for name in ("gc_thresh1", "gc_thresh2", "gc_thresh3")}
    # 4 entries per host stay below the first threshold (no garbage collection); a higher value stays.
    assert got == {"gc_thresh1": 4000, "gc_thresh2": 8000, "gc_thresh3": 100_000}
    linux.raise_neighbour_limits(10)
    assert int((tmp_path / "gc_thresh1").read_text()) == 4000


def test_the_input_queue_grows_with_the_lab_and_is_never_lowered(tmp_path, monkeypatch):
    sysctl = tmp_path / "netdev_max_backlog"
    sysctl.write_text("1000\n")
    monkeypatch.setattr(linux, "BACKLOG_SYSCTL", sysctl)
    linux.raise_backlog_limit(1010)  # a broadcast's 1,010 copies and then some
    assert int(sysctl.read_text()) == 4040
    linux.raise_backlog_limit(100)
    assert int(sysctl.read_text()) == 4040
