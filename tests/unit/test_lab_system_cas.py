"""Lab.system_cas: a host's /etc/ca-certificates.conf keeps its comments and its first system CAs only."""

from __future__ import annotations

from lab.host import SYSTEM_CAS_NOTE, trust_first_system_cas


def write_conf(root, text: str):
    conf = root / "etc" / "ca-certificates.conf"
    conf.parent.mkdir()
    conf.write_text(text)
    return conf


def test_only_the_first_system_cas_stay_listed(tmp_path):
    conf = write_conf(tmp_path, "# header\n!mozilla/Old.crt\n" + "".join(f"mozilla/CA{i}.crt\n" for i in range(140)))
    trust_first_system_cas(tmp_path, keep=3)
    lines = conf.read_text().splitlines()
    assert [line for line in lines if not line.startswith("#")] == ["mozilla/CA0.crt", "mozilla/CA1.crt", "mozilla/CA2.crt"]
    assert lines[0] == "# header" and SYSTEM_CAS_NOTE in lines
    assert conf.stat().st_mode & 0o777 == 0o644


def test_applying_it_again_at_the_next_boot_changes_nothing(tmp_path):
    conf = write_conf(tmp_path, "# header\n" + "".join(f"mozilla/CA{i}.crt\n" for i in range(10)))
    trust_first_system_cas(tmp_path, keep=3)
    once = conf.read_text()
    trust_first_system_cas(tmp_path, keep=3)
    assert conf.read_text() == once and once.count(SYSTEM_CAS_NOTE) == 1
