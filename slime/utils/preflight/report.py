"""The pre-flight's findings: one line each, naming the flag, the file (and line) and a hint.

`Report.missing` applies the dry-run rule: a path that does not exist on this machine is a
warning under `--dry-run` (a GPU recipe is dry-run away from its cluster) and an error before a
real start; a file that exists and is broken is an error in both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    """One problem: `flag` and what is wrong (the file and line inside `message`), and a hint."""

    flag: str
    message: str
    hint: str = ""

    def line(self) -> str:
        return f"{self.flag} {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


@dataclass
class Report:
    """Findings of every check; `errors` stop the start, `warnings` are logged."""

    dry_run: bool = False
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)

    def error(self, flag: str, message: str, hint: str = "") -> None:
        self.errors.append(Finding(flag, message, hint))

    def warn(self, flag: str, message: str, hint: str = "") -> None:
        self.warnings.append(Finding(flag, message, hint))

    def missing(self, flag: str, path: str, hint: str = "") -> bool:
        """True when `path` exists; else False, and an error unless --dry-run (whose argument
        validation warns about a missing path: a recipe is dry-run away from its cluster)."""
        if os.path.exists(path):
            return True
        if not self.dry_run:  # under --dry-run the argument validation has already warned about it
            self.error(flag, f"{path}: no such file or directory", hint)
        return False
