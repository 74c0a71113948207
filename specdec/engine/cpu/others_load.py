"""How much of the machine other processes took while this one measured: a profile timed beside a compile
job times the job as much as the model."""

from __future__ import annotations

from pathlib import Path

PROC_STAT, SELF_STAT = Path("/proc/stat"), Path("/proc/self/stat")


def _machine_ticks() -> tuple[int, int]:
    """(ticks the machine's CPUs spent working or stolen by the hypervisor, all ticks), over all CPUs."""
    fields = [int(f) for f in PROC_STAT.read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal, sum(fields)


def _own_ticks() -> int:
    """Ticks this process's threads have run (user and system)."""
    after_name = SELF_STAT.read_text().rsplit(")", 1)[1].split()
    return int(after_name[11]) + int(after_name[12])  # utime and stime: fields 14 and 15 of proc(5)


def _sample() -> tuple[int, int, int] | None:
    """(the machine's busy ticks, all its ticks, this process's ticks), or None where /proc cannot tell."""
    try:
        return (*_machine_ticks(), _own_ticks())
    except (OSError, ValueError, IndexError):
        return None


class OthersLoad:
    """`with OthersLoad() as load: ...`; then `load.share`: the share of all the machine's CPU time that other
    processes took (or the hypervisor stole) during the block, 0..1; None where /proc cannot tell (not Linux,
    or a block too short to count a tick)."""

    def __init__(self):
        self.share: float | None = None
        self._start: tuple[int, int, int] | None = None

    def __enter__(self) -> "OthersLoad":
        self._start = _sample()
        return self

    def __exit__(self, *exc) -> None:
        end = _sample()
        if self._start is None or end is None:
            return
        busy, total, own = (after - before for after, before in zip(end, self._start))
        if total > 0:
            self.share = min(max((busy - own) / total, 0.0), 1.0)
