"""What a measurement ran on, for the records of the benchmarks and the evidence runs: the
CPU as /proc/cpuinfo names it and the installed versions of packages."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

CPU_FIELDS = ("model name", "cpu family", "model", "stepping")


def cpu_fields(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's `CPU_FIELDS` (model name, family, model, stepping) from
    /proc/cpuinfo; empty where there is no such file (macOS, Windows)."""
    fields: dict[str, str] = {}
    try:
        with open(path) as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in CPU_FIELDS and key not in fields:
                    fields[key] = value.strip()
                elif not line.strip() and fields:
                    break  # the first processor is enough
    except OSError:
        pass
    return fields


def package_versions(*names: str) -> dict[str, str | None]:
    """The installed version of each distribution in `names` (None where it is not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions
