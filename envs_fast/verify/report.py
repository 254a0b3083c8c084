"""The verification report: per level what was checked, tolerances, pass/fail, the largest deviation
and, for a failure, the exact state, action and differing fields (what an agent repairs from)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

LEVEL_TITLES = {1: "L1 properties", 2: "L2 interactions", 3: "L3 rollouts", 4: "L4 transfer"}
PROGRESS_PREFIX = "verify: "   # the CLI's progress lines on stderr, which a log of its run interleaves


def report_lines(log: str) -> list[str]:
    """The non-blank lines of a verifier run's log, its progress lines left out: what the report says."""
    return [line.strip() for line in log.splitlines() if line.strip() and not line.startswith(PROGRESS_PREFIX)]


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class LevelReport:
    level: int
    status: str = "pass"  # "pass", "fail", or "not applicable" (with the reason in `note`)
    checks: list[Check] = field(default_factory=list)
    tolerances: dict[str, str] = field(default_factory=dict)
    largest_deviation: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    note: str = ""

    @property
    def title(self) -> str:
        return LEVEL_TITLES[self.level]

    @property
    def passed(self) -> bool:
        return self.status != "fail"

    def figures(self) -> str:
        """One line of what the level found: its checks, its largest deviation or its first failure."""
        passed = sum(check.passed for check in self.checks)
        line = f"{passed}/{len(self.checks)} checks"
        if self.failure:
            line += f"; first failure: {self.failure.get('check')}"
        elif self.largest_deviation:
            line += f"; largest deviation {_format_mapping(self.largest_deviation)}"
        return line[:300]

    def add(self, name: str, passed: bool, detail: str, failure: dict[str, Any] | None = None) -> bool:
        self.checks.append(Check(name, bool(passed), detail))
        if not passed:
            self.status = "fail"
            if self.failure is None:
                self.failure = {"check": name, **(failure or {"detail": detail})}
        return bool(passed)


@dataclass
class Report:
    env_id: str
    backend: str
    levels: list[LevelReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(level.passed for level in self.levels)

    @property
    def statistical_only(self) -> bool:
        """No level compared synced states: the weaker kind (third-party backends)."""
        return any(level.note.startswith("statistical only") for level in self.levels)

    def verdict_line(self) -> str:
        """The report's first line, and its first failing check where one failed: what a cached
        verdict keeps of why."""
        line = self.to_text().splitlines()[0]
        for level in self.levels:
            failed = next((check for check in level.checks if not check.passed), None)
            if failed:
                return f"{line}; {level.title}: {failed.name}: {failed.detail}"[:400]
        return line

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        data["statistical_only"] = self.statistical_only
        for level_data, level in zip(data["levels"], self.levels):
            level_data["title"] = level.title
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_jsonable)

    def to_text(self) -> str:
        summary = ", ".join(f"L{lv.level} {lv.status}" for lv in self.levels)
        kind = "; statistical only, the weaker kind: state not synced" if self.statistical_only else ""
        lines = [f"verify {self.env_id} with backend {self.backend}: {'PASS' if self.passed else 'FAIL'} "
                 f"({summary}; {self.seconds:.1f}s{kind})"]
        for level in self.levels:
            lines.append("")
            lines.append(f"{level.title}: {level.status.upper()}" + (f" - {level.note}" if level.note else ""))
            for check in level.checks:
                lines.append(f"  [{'pass' if check.passed else 'FAIL'}] {check.name}: {check.detail}")
            for name, rule in level.tolerances.items():
                lines.append(f"  tolerance {name}: {rule}")
            if level.largest_deviation:
                lines.append(f"  largest deviation: {_format_mapping(level.largest_deviation)}")
            if level.failure:
                lines.append(f"  first failure (check '{level.failure.get('check')}'):")
                for key, value in level.failure.items():
                    if key == "check":
                        continue
                    if key == "fields" and isinstance(value, list):
                        lines.append("    differing fields (field: reference -> backend, |diff|, allowed):")
                        for item in value:
                            lines.append(f"      {item['field']}: {item['reference']} -> {item['backend']}"
                                         f", {item.get('diff', '')}, {item.get('allowed', '')}")
                    else:
                        lines.append(f"    {key}: {value}")
        return "\n".join(lines)


def _format_mapping(mapping: dict[str, Any]) -> str:
    return "; ".join(f"{k}={v}" for k, v in mapping.items())


def _jsonable(value):
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
    except ImportError:
        pass
    return str(value)
