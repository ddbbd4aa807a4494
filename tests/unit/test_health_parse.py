"""node_health's parsers on what a real H200 node printed, on what other drivers print, and on what no node
should print (pure)."""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from llmgw_pulumi.health import parsers as node_health
from llmgw_pulumi.health.parsers import EccCounts, PcieLink, RemappedRows, parse_ib_ports, parse_smi_xml, parse_xid_events
from tests.unit.health_samples import FIXTURES, IB_ROOT, REAL_XML, UUID0, sysfs_lines

ZEROS = (("sram_correctable", 0), ("sram_uncorrectable_parity", 0), ("sram_uncorrectable_secded", 0),
         ("dram_correctable", 0), ("dram_uncorrectable", 0))


def edited(edits: dict[str, str | None], xml: str = REAL_XML) -> str:
    """The real XML with the text of each element at ``path`` (under <gpu>) set, or the element removed (None)."""
    root = ET.fromstring(xml)
    gpu = root.find("gpu")
    assert gpu is not None
    for path, value in edits.items():
        el = gpu.find(path)
        assert el is not None, path
        if value is None:
            parent_path, _, _ = path.rpartition("/")
            parent = gpu.find(parent_path) if parent_path else gpu
            assert parent is not None
            parent.remove(el)
        else:
            el.text = value
    return ET.tostring(root, encoding="unicode")


def test_the_real_h200_report_is_read_whole() -> None:
    report = parse_smi_xml(REAL_XML)
    assert (report.error, report.driver_version, report.cuda_version) == ("", "580.159.04", "13.0")
    (g,) = report.gpus
    assert (g.index, g.minor_number, g.uuid, g.pci_bus_id, g.product_name, g.memory_total_mib) == (
        0, 0, UUID0, "00000000:00:06.0", "NVIDIA H200", 143771)
    assert (g.driver_version, g.cuda_version) == ("580.159.04", "13.0")
    assert (g.ecc_current, g.ecc_pending) == ("Enabled", "Enabled")
    assert g.ecc_volatile == EccCounts(0, 0, ZEROS) and g.ecc_aggregate == EccCounts(0, 0, ZEROS)
    assert g.remapped_rows == RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False)
    assert (g.channel_repair_pending, g.tpc_repair_pending, g.unrepairable_memory) == (False, False, False)
    assert g.pcie == PcieLink(max_gen=5, current_gen=5, max_width=16, current_width=16)
    assert g.clock_events_active == frozenset() and g.clock_idle is True
    assert (g.persistence_mode, g.gpu_util_percent, g.idle) == ("Enabled", 0, True)


def test_each_counter_and_flag_is_read_from_its_own_element() -> None:
    g = parse_smi_xml(edited({
        "ecc_errors/volatile/dram_uncorrectable": "2", "ecc_errors/volatile/sram_correctable": "7",
        "ecc_errors/aggregate/sram_uncorrectable_parity": "3", "ecc_errors/aggregate/dram_correctable": "11",
        "remapped_rows/remapped_row_corr": "4", "remapped_rows/remapped_row_unc": "1",
        "remapped_rows/remapped_row_pending": "Yes", "remapped_rows/remapped_row_failure": "Yes",
        "ecc_errors/channel_repair_pending": "Yes", "ecc_errors/tpc_repair_pending": "Yes",
        "ecc_errors/unrepairable_memory": "Yes", "pci/pci_gpu_link_info/pcie_gen/max_link_gen": "5",
        "pci/pci_gpu_link_info/pcie_gen/current_link_gen": "3",
        "pci/pci_gpu_link_info/link_widths/current_link_width": "8x", "utilization/gpu_util": "87 %",
        "clocks_event_reasons/clocks_event_reason_gpu_idle": "Not Active",
        "clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown": "Active",
        "clocks_event_reasons/clocks_event_reason_hw_power_brake_slowdown": "Active",
        "persistence_mode": "Disabled", "ecc_mode/pending_ecc": "Disabled", "minor_number": "3",
    })).gpus[0]
    assert (g.ecc_volatile.correctable, g.ecc_volatile.uncorrectable) == (7, 2)
    assert g.ecc_volatile.nonzero_uncorrectable() == (("dram_uncorrectable", 2),)
    assert (g.ecc_aggregate.correctable, g.ecc_aggregate.uncorrectable) == (11, 3)
    assert g.ecc_aggregate.nonzero_uncorrectable() == (("sram_uncorrectable_parity", 3),)
    assert g.remapped_rows == RemappedRows(correctable=4, uncorrectable=1, pending=True, failure=True)
    assert (g.channel_repair_pending, g.tpc_repair_pending, g.unrepairable_memory) == (True, True, True)
    assert g.pcie == PcieLink(max_gen=5, current_gen=3, max_width=16, current_width=8)
    assert g.clock_events_active == {"hw_thermal_slowdown", "hw_power_brake_slowdown"}
    assert (g.clock_idle, g.gpu_util_percent, g.idle) == (False, 87, False)
    assert (g.persistence_mode, g.ecc_pending, g.minor_number, g.index) == ("Disabled", "Disabled", 3, 0)


def test_elements_it_does_not_know_are_ignored_and_missing_or_na_ones_are_none() -> None:
    text = REAL_XML.replace("<gpu_recovery_action>", "<a_future_element><deep>1</deep></a_future_element>"
                                                      "<gpu_recovery_action>")
    assert "a_future_element" in text
    assert parse_smi_xml(text).gpus == parse_smi_xml(REAL_XML).gpus
    g = parse_smi_xml(edited({"ecc_mode": None, "remapped_rows": None, "ecc_errors": None, "pci": None,
                              "clocks_event_reasons": None, "utilization": None, "persistence_mode": None,
                              "fb_memory_usage/total": "N/A", "minor_number": "N/A"})).gpus[0]
    assert (g.ecc_current, g.ecc_pending, g.memory_total_mib, g.minor_number, g.persistence_mode) == (None,) * 5
    assert g.ecc_volatile == EccCounts() == g.ecc_aggregate and g.remapped_rows == RemappedRows()
    assert g.pcie == PcieLink() and g.clock_events_active == frozenset() and g.clock_idle is None
    assert (g.channel_repair_pending, g.unrepairable_memory, g.gpu_util_percent, g.idle) == (None, None, None, False)
    assert g.pci_bus_id == "00000000:00:06.0", "without <pci>, the <gpu id=...> attribute names it"


def test_older_drivers_names_for_clock_reasons_and_ecc_counters_are_read() -> None:
    old = (REAL_XML.replace("clocks_event_reason", "clocks_throttle_reason")
           .replace("<clocks_throttle_reason_hw_slowdown>Not Active", "<clocks_throttle_reason_hw_slowdown>Active"))
    old = re.sub(r"<volatile>.*?</volatile>", "<volatile><single_bit><device_memory>5</device_memory>"
                 "<register_file>1</register_file><total>6</total></single_bit><double_bit><device_memory>2"
                 "</device_memory><total>2</total></double_bit></volatile>", old, count=1, flags=re.S)
    g = parse_smi_xml(old).gpus[0]
    assert g.clock_events_active == {"hw_slowdown"} and g.clock_idle is True
    assert g.ecc_volatile == EccCounts(6, 2, (("single_bit_total", 6), ("double_bit_total", 2)))


@pytest.mark.parametrize(("text", "says"), [
    ("", "nothing"),
    ("No devices were found\n", "not XML"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", "not XML"),
    (REAL_XML[: len(REAL_XML) // 2], "not XML"),
    ("<nvidia_smi_log><driver_version>580</driver_version><attached_gpus>0</attached_gpus></nvidia_smi_log>",
     "lists no GPU"),
    ("<html><body>hello</body></html>", "not nvidia-smi's"),
    ("<nvidia_smi_log>&undefined;</nvidia_smi_log>", "not XML"),
])
def test_what_is_not_a_report_with_gpus_is_an_error_never_an_exception(text: str, says: str) -> None:
    report = parse_smi_xml(text)
    assert report.gpus == () and says in report.error, report.error


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
 <!ENTITY a "aaaaaaaaaa">
 <!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
 <!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">
]>
<nvidia_smi_log><gpu><product_name>&c;</product_name></gpu></nvidia_smi_log>"""
EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<nvidia_smi_log><gpu><product_name>&secret;</product_name></gpu></nvidia_smi_log>"""


@pytest.mark.parametrize("text", [
    BILLION_LAUGHS,
    EXTERNAL_ENTITY,
    REAL_XML.replace('SYSTEM "nvsmi_device_v13.dtd">', '[<!ENTITY x "y">]>'),
    REAL_XML.replace("<nvidia_smi_log>", '<!ENTITY x "y"><nvidia_smi_log>', 1),
    REAL_XML.replace("<nvidia_smi_log>", "<!DOCTYPE again><nvidia_smi_log>", 1),
    REAL_XML.replace("<!DOCTYPE nvidia_smi_log", "<!doctype nvidia_smi_log [<!entity x 'y'>]", 1),
    REAL_XML.replace("<!DOCTYPE", "<!DOCTYPE nvidia_smi_log [<!ELEMENT x ANY>]><!-- -->\n<!DOCTYPE", 1),
])
def test_declarations_are_refused_before_the_parser_sees_them(text: str) -> None:
    report = parse_smi_xml(text)
    assert report.gpus == () and "refused" in report.error, report.error


def test_nvidia_smis_own_doctype_line_is_accepted_and_the_dtd_never_read() -> None:
    assert REAL_XML.splitlines()[1] == '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">'
    assert len(parse_smi_xml(REAL_XML).gpus) == 1
    public = REAL_XML.replace('SYSTEM "nvsmi_device_v13.dtd"', 'PUBLIC "-//x//y" "file:///nonexistent.dtd"')
    assert len(parse_smi_xml(public).gpus) == 1


def test_an_oversized_report_is_refused_unparsed() -> None:
    report = parse_smi_xml(REAL_XML + " " * node_health.MAX_SMI_XML_CHARS)
    assert report.gpus == () and "more than" in report.error


def test_text_from_the_node_is_made_printable() -> None:
    # XML cannot hold an escape (\x1b) at all; a bidirectional override and a line separator it can.
    g = parse_smi_xml(edited({"product_name": "NVIDIA H200\u202e\u2028fix: rm"})).gpus[0]
    assert g.product_name == "NVIDIA H200\\u202e fix: rm", "the override escaped, the separator a space as all"
    bad = parse_smi_xml("\x1b[31mnot xml\x1b[0m")
    assert bad.error.isprintable() and "\\x1b" in bad.error


# --------------------------------------------------------------------------- Xid


def test_xid_lines_of_a_kernel_log_are_parsed_and_other_lines_ignored() -> None:
    events = parse_xid_events((FIXTURES / "xid" / "dmesg-T.txt").read_text())
    assert [(e.code, e.pci_bus_id) for e in events] == [
        (13, "0000:00:06"), (13, "0000:00:06"), (63, "0000:00:06"), (94, "0000:00:06"), (79, "0000:00:07"),
        (154, "0000:00:06"), (69, "0000:00:06")]
    assert events[4].message == "GPU has fallen off the bus."
    assert events[2].message.startswith("Row Remapper: New row (0x000000000027d3e0) marked for remapping")
    assert events[5].message == "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"


@pytest.mark.parametrize(("line", "code", "bus", "message"), [
    ("Nov 29 23:08:30 gpu-01 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1101234, name=nvc:[driver], "
     "GPU has fallen off the bus.", 79, "0000:18:00", "GPU has fallen off the bus."),
    ("[  123.456789] NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "0000:03:00", "Channel 00000001"),
    ("NVRM: Xid (PCI:0000:b3:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
     48, "0000:b3:00", "An uncorrectable double bit error"),
    ("NVRM: Xid (PCI:0001:0a:00): 119", 119, "0001:0a:00", ""),
])
def test_xid_line_formats(line: str, code: int, bus: str, message: str) -> None:
    (e,) = parse_xid_events(f"noise\n{line}\nmore noise\n")
    assert (e.code, e.pci_bus_id, e.message) == (code, bus, message)


def test_xid_text_is_made_printable_and_a_forged_line_stays_one_event() -> None:
    (e,) = parse_xid_events("NVRM: Xid (PCI:0000:18:00): 79, GPU gone\x1b[2J\u2028  fix: rm -rf /\n")
    assert e.message.isprintable() and "\\x1b" in e.message and "\\u2028" in e.message


def test_pci_addresses_of_nvidia_smi_and_of_the_driver_compare_equal() -> None:
    assert node_health.pci_address("00000000:18:00.0") == node_health.pci_address("0000:18:00") == (0, 0x18, 0)
    assert node_health.pci_address("00000000:B3:00.0") == node_health.pci_address("0000:b3:00") == (0, 0xB3, 0)
    assert node_health.pci_address("00000001:18:00.0") != node_health.pci_address("0000:18:00")
    assert node_health.pci_address("GPU-65decab1") is None


# --------------------------------------------------------------------------- InfiniBand


def test_ib_ports_from_sysfs() -> None:
    ports = parse_ib_ports(sysfs_lines(IB_ROOT))
    assert [(p.hca, p.port, p.state, p.phys_state, p.rate_gbps, p.rate_text) for p in ports] == [
        ("mlx5_0", "1", "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)"),
        ("mlx5_1", "1", "DOWN", "Disabled", 10.0, "10 Gb/sec (4X SDR)"),
        ("mlx5_2", "1", "ACTIVE", "LinkUp", 200.0, "200 Gb/sec (4X HDR)"),
        ("mlx5_3", "1", "INIT", "LinkUp", 400.0, "400 Gb/sec (4X NDR)"),
    ]


@pytest.mark.parametrize(("value", "name"), [("4: ACTIVE", "ACTIVE"), ("5: LinkUp", "LinkUp"), ("1: DOWN", "DOWN"),
                                            ("2: Polling\n", "Polling"), ("ACTIVE", None), ("", None), ("4:", None)])
def test_sysfs_enum(value: str, name: str | None) -> None:
    assert node_health.sysfs_enum(value) == name


@pytest.mark.parametrize(("value", "gbps"), [("400 Gb/sec (4X NDR)", 400.0), ("2.5 Gb/sec (1X SDR)", 2.5),
                                            ("100 Gb/sec (2X HDR)", 100.0), ("", None), ("fast", None)])
def test_sysfs_rate(value: str, gbps: float | None) -> None:
    assert node_health.sysfs_rate_gbps(value) == gbps


def test_ib_lines_that_are_not_six_fields_or_unreadable_are_kept_as_unknown() -> None:
    ports = parse_ib_ports("ib-port\tmlx5_0\t1\t\t\t\nib-port\tmlx5_0\t2\nhca\tmlx5_0\n")
    assert [(p.hca, p.port, p.state, p.phys_state, p.rate_gbps) for p in ports] == [("mlx5_0", "1", None, None, None)]


# --------------------------------------------------------------------------- purity


@pytest.mark.parametrize("module", ["parsers", "readiness"])
def test_the_health_modules_import_only_the_standard_library_and_pure_siblings(module: str) -> None:
    tree = ast.parse((Path(node_health.__file__).parent / f"{module}.py").read_text())
    imported = {n.module if isinstance(n, ast.ImportFrom) and not n.level else f".{n.module}"
                for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported, "no import found: the check reads nothing"
    siblings = {m for m in imported if m.startswith(".")}
    assert siblings <= {".text", ".parsers"}, siblings  # (``..text`` reads as ``.text`` here)
    outside = {m.split(".")[0] for m in imported - siblings} - {"__future__"}
    assert outside <= {"re", "shlex", "xml", "dataclasses", "collections", "typing"}, outside
