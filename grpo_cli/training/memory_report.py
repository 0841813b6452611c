"""The memory plan as a user reads it: its parts, the verdict against the free memory, the one-line
summary and warning, and the table of `grpo train plan=true` (training.memory_plan computes it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.table import Table

GIB, MIB = 2**30, 2**20
KNOBS_SHOWN = 4


@dataclass
class Part:
    """One line of the plan: a size, and when it is held (resident, a phase, or the allocator's)."""

    name: str
    bytes: int
    when: str  # resident | generation | no-grad passes | update | allocator
    how: str = ""


@dataclass
class MemoryPlan:
    """The parts, each phase's total, the expected peak, and the memory free where it runs."""

    parts: list[Part]
    phases: dict[str, int]
    peak: int
    device: str
    free: int | None  # None: unknown on this platform
    sharing: int = 1  # processes that share this free memory (data parallelism on one CPU)
    knobs: list[tuple[str, int]] = field(default_factory=list)  # (override, peak with it) when it does not fit

    @property
    def fits(self) -> bool:
        return self.free is None or self.peak * self.sharing <= self.free

    @property
    def largest_phase(self) -> str:
        return max(self.phases, key=lambda name: self.phases[name])

    @property
    def biggest(self) -> Part:
        """The biggest part that counts towards the peak: a resident one or one of the largest phase's."""
        return max((p for p in self.parts if p.when in ("resident", self.largest_phase)), key=lambda p: p.bytes)

    def summary(self) -> str:
        return (
            f"memory plan: expected peak {size(self.peak)} per process on {self.device} ({self._free()}); "
            f"biggest part: {self.biggest.name} {size(self.biggest.bytes)}; grpo train ... plan=true shows every part"
        )

    def warning(self) -> str | None:
        """When it does not fit: the biggest part and the single overrides that would bring it down."""
        if self.fits:
            return None
        knobs = ", ".join(f"{override} (peak {size(peak)})" for override, peak in self.knobs[:KNOBS_SHOWN])
        return (
            f"memory plan: the expected peak {size(self.peak)}{self._times()} does not fit the {size(self.free)} "
            f"available on {self.device}; the biggest part is {self.biggest.name} ({size(self.biggest.bytes)}). "
            + (f"Overrides that lower it: {knobs}" if knobs else "No single override lowers it much.")
        )

    def caption(self) -> str:
        phases = ", ".join(f"{name} {size(total)}" for name, total in self.phases.items())
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"expected peak {size(self.peak)}{self._times()} = resident parts + the largest phase ({phases})"
            + (" + the CPU allocator's" if any(p.when == "allocator" for p in self.parts) else "")
            + f"; {self._free()}: {verdict}"
        )

    def _free(self) -> str:
        return f"{size(self.free)} available" if self.free is not None else "free memory unknown"

    def _times(self) -> str:
        return f" x {self.sharing} processes" if self.sharing > 1 else ""


def size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / MIB:.1f} MiB"


def plan_table(plan: MemoryPlan) -> Table:
    """The plan as a rich table: each part, when it is held, and the peak against the free memory."""
    table = Table(title=f"grpo train: memory plan (per process, {plan.device})", header_style="bold")
    for column, justify in (("part", "left"), ("size", "right"), ("when", "left"), ("how", "left")):
        table.add_column(column, justify=justify)
    for part in plan.parts:
        table.add_row(part.name, size(part.bytes) if part.bytes else "-", part.when, part.how)
    table.caption = plan.caption()
    return table


def plan_lines(plan: MemoryPlan) -> list[str]:
    """The plan as plain lines (CI logs, files): what the table says."""
    lines = [f"grpo train: memory plan (per process, {plan.device})"]
    for part in plan.parts:
        lines.append(f"  {part.name:<24} {size(part.bytes) if part.bytes else '-':>10}  {part.when:<15} {part.how}")
    return [*lines, plan.caption()]
