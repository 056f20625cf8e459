"""workflow.machine: the CPU fields and package versions that benchmark and run records hold."""

from importlib.metadata import version

from workflow.machine import cpu_fields, package_versions

TWO_PROCESSORS = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 106
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
stepping\t: 6
flags\t\t: fpu vme avx2

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7R13
stepping\t: 1
"""


def test_cpu_fields_take_the_first_processor_only(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(TWO_PROCESSORS)
    assert cpu_fields(str(path)) == {
        "cpu family": "6",
        "model": "106",
        "model name": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
        "stepping": "6",
    }


def test_cpu_fields_without_cpuinfo_are_empty(tmp_path):
    assert cpu_fields(str(tmp_path / "absent")) == {}


def test_package_versions_name_the_installed_and_none_for_the_absent():
    versions = package_versions("spacy", "no-such-distribution-xyz")
    assert versions == {"spacy": version("spacy"), "no-such-distribution-xyz": None}
