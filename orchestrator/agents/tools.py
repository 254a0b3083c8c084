"""The tools an LLM agent works with, confined to the run's worktree.

Paths are relative to the worktree; absolute paths, `..` and symlinks that lead out of it are
refused. Reads may look at the whole worktree; writes only reach the phase's allowed paths and the
agent's notes file (addressed as `notes.md`, kept in the run folder outside the repository).
`run` executes a shell command in the worktree with the scrubbed environment, in its own process
group, killed as a group at its timeout, its output truncated.

Every tool returns a ToolResult; a refusal or failure is a result with `is_error` set (the model
reads the message and acts on it), never an exception.
"""
from __future__ import annotations

import fnmatch
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from orchestrator.processes import run_group, scrubbed_env
from orchestrator.results import RunFolder
from orchestrator.sandbox import Sandbox, Walls

NOTES_NAME = RunFolder.NOTES
SKIPPED_DIRS = {".git", "__pycache__", ".venv", "node_modules", ".pytest_cache", ".mypy_cache"}
MAX_READ_CHARS = 100_000
MAX_LIST_ENTRIES = 400
MAX_OUTPUT_CHARS = 12_000
DEFAULT_RUN_TIMEOUT_S = 120


@dataclass
class ToolResult:
    content: str
    is_error: bool = False
    submitted: Optional[str] = None   # the description, set only by submit


TOOL_DEFINITIONS: list[dict[str, Any]] = [
    {
        "name": "read_file",
        "description": "Read a text file. `path` is relative to the repository root "
                       "(or `notes.md` for your notes file).",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                         "required": ["path"]},
    },
    {
        "name": "list_files",
        "description": "List the files under a directory of the repository, recursively "
                       "(`.` for the root), with their sizes in bytes.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                         "required": ["path"]},
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a file with `content`. Only the paths allowed in this "
                       "phase and `notes.md` may be written.",
        "input_schema": {"type": "object",
                         "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                         "required": ["path", "content"]},
    },
    {
        "name": "edit_file",
        "description": "Replace the one occurrence of `old` in a file by `new`. `old` must occur "
                       "exactly once: include enough surrounding lines to make it unique.",
        "input_schema": {"type": "object",
                         "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                        "new": {"type": "string"}},
                         "required": ["path", "old", "new"]},
    },
    {
        "name": "run",
        "description": "Run a shell command in the repository root and return its exit code and "
                       "output (truncated). No secrets are in its environment. Use it for quick "
                       "checks (a syntax check, a few seconds of training); the daemon does the "
                       "real training and scoring after you submit.",
        "input_schema": {"type": "object",
                         "properties": {"command": {"type": "string"},
                                        "timeout_s": {"type": "integer", "minimum": 1}},
                         "required": ["command"]},
    },
    {
        "name": "submit",
        "description": "Finish this experiment: the daemon commits your edits, trains and scores "
                       "them. `description` is one line saying what you changed and why.",
        "input_schema": {"type": "object", "properties": {"description": {"type": "string"}},
                         "required": ["description"]},
    },
]


class Toolbox:
    def __init__(self, worktree: Path, allowed_paths: list[str], notes_path: Optional[Path] = None,
                 scratch_dir: Optional[Path] = None, max_run_timeout_s: float = 600,
                 extra_env: Optional[dict] = None, sandbox: str = "auto", hidden: tuple = ()):
        self.worktree = Path(worktree).resolve()
        self.allowed_paths = list(allowed_paths)
        self.notes_path = Path(notes_path) if notes_path is not None else None
        self.scratch_dir = Path(scratch_dir) if scratch_dir is not None else None
        self.max_run_timeout_s = max_run_timeout_s
        self.extra_env = dict(extra_env or {})
        self.sandbox = Sandbox(sandbox)
        self.hidden = [Path(p) for p in hidden]

    # -- dispatch -------------------------------------------------------------------------------

    def call(self, name: str, arguments: Any) -> ToolResult:
        handler = getattr(self, f"tool_{name}", None)
        if handler is None:
            return ToolResult(f"unknown tool {name!r}; the tools are: "
                              + ", ".join(tool["name"] for tool in TOOL_DEFINITIONS), is_error=True)
        if not isinstance(arguments, dict):
            return ToolResult(f"{name}: arguments must be an object", is_error=True)
        try:
            return handler(**arguments)
        except TypeError as err:
            return ToolResult(f"{name}: bad arguments ({err}); see the tool's input schema",
                              is_error=True)
        except OSError as err:
            return ToolResult(f"{name}: {err}", is_error=True)

    # -- tools ----------------------------------------------------------------------------------

    def tool_read_file(self, path: str) -> ToolResult:
        target = self._notes_or_resolve(path)
        if isinstance(target, ToolResult):
            return target
        if target == self.notes_path and not target.exists():
            return ToolResult("(notes.md is empty)")
        if not target.is_file():
            return ToolResult(f"{path}: no such file", is_error=True)
        try:
            text = target.read_text()
        except UnicodeDecodeError:
            return ToolResult(f"{path}: not a text file", is_error=True)
        if len(text) > MAX_READ_CHARS:
            text = text[:MAX_READ_CHARS] + f"\n[... truncated: the file has {len(text)} characters]"
        return ToolResult(text)

    def tool_list_files(self, path: str = ".") -> ToolResult:
        target = self._resolve(path)
        if isinstance(target, ToolResult):
            return target
        if not target.is_dir():
            return ToolResult(f"{path}: not a directory", is_error=True)
        lines = []
        for root, dirs, files in os.walk(target):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            for name in sorted(files):
                file = Path(root) / name
                lines.append(f"{file.relative_to(self.worktree).as_posix()}  {file.lstat().st_size}")
                if len(lines) >= MAX_LIST_ENTRIES:
                    lines.append(f"[... stopped at {MAX_LIST_ENTRIES} entries; list a subdirectory]")
                    return ToolResult("\n".join(lines))
        return ToolResult("\n".join(lines) if lines else "(no files)")

    def tool_write_file(self, path: str, content: str) -> ToolResult:
        target = self._writable(path)
        if isinstance(target, ToolResult):
            return target
        if not isinstance(content, str):
            return ToolResult("write_file: content must be a string", is_error=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return ToolResult(f"wrote {path} ({len(content)} characters)")

    def tool_edit_file(self, path: str, old: str, new: str) -> ToolResult:
        target = self._writable(path)
        if isinstance(target, ToolResult):
            return target
        if not target.is_file():
            return ToolResult(f"{path}: no such file (use write_file to create it)", is_error=True)
        text = target.read_text()
        count = text.count(old) if old else 0
        if count != 1:
            reason = ("`old` is empty" if not old else
                      "`old` was not found (it must match the file exactly, whitespace included; "
                      "read_file the file again)" if count == 0 else
                      f"`old` occurs {count} times; include more surrounding lines to make it unique")
            return ToolResult(f"edit_file {path}: {reason}; nothing changed", is_error=True)
        target.write_text(text.replace(old, new, 1))
        return ToolResult(f"edited {path}")

    def tool_run(self, command: str, timeout_s: float = DEFAULT_RUN_TIMEOUT_S) -> ToolResult:
        if not isinstance(command, str) or not command.strip():
            return ToolResult("run: command must be a non-empty string", is_error=True)
        try:
            timeout = min(max(float(timeout_s), 1.0), self.max_run_timeout_s)
        except (TypeError, ValueError):
            return ToolResult("run: timeout_s must be a number of seconds", is_error=True)
        env = scrubbed_env({"PYTHONDONTWRITEBYTECODE": "1", **self.extra_env})
        # `python` is the daemon's interpreter (inside the sandbox a pyenv shim under $HOME is not).
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
        if self.scratch_dir is not None:
            # Training output goes outside the repository so it never shows up in the diff.
            self.scratch_dir.mkdir(parents=True, exist_ok=True)
            env.setdefault("AUTORL_OUTPUT_DIR", str(self.scratch_dir))
        # A file, not a pipe: a grandchild that escapes the group cannot keep us waiting for EOF.
        # A stop signal raised mid-command still kills the group (run_group's finally).
        with tempfile.TemporaryDirectory() as scratch:
            output = Path(scratch) / "run.log"
            # Walled where bubblewrap works: no network, only the worktree and the scratch dir writable.
            writable = [self.worktree] + ([self.scratch_dir] if self.scratch_dir is not None else [])
            walls = Walls(cwd=self.worktree, writable=writable, hidden=self.hidden)
            result = run_group(["bash", "-c", command], self.worktree, env, output, timeout,
                               should_stop=lambda: False, walls=walls, sandbox=self.sandbox)
            text = output.read_text(errors="replace")
        text = truncate_middle(text, MAX_OUTPUT_CHARS)
        if result.timed_out:
            return ToolResult(f"timed out after {timeout:.0f} s (process group killed)\n{text}",
                              is_error=True)
        status = f"exit code {result.returncode} after {result.wall_s:.1f} s"
        return ToolResult(f"{status}\n{text}", is_error=result.returncode != 0)

    def tool_submit(self, description: str = "") -> ToolResult:
        return ToolResult("submitted; the daemon will now train and score your change.",
                          submitted=str(description))

    # -- paths ----------------------------------------------------------------------------------

    def _notes_or_resolve(self, path: str) -> Path | ToolResult:
        if self.notes_path is not None and _normalise(path) == NOTES_NAME:
            return self.notes_path
        return self._resolve(path)

    def _resolve(self, path: str) -> Path | ToolResult:
        """The absolute path inside the worktree that `path` names, or a refusal."""
        if not isinstance(path, str) or not path.strip():
            return ToolResult("path must be a non-empty string relative to the repository root",
                              is_error=True)
        if os.path.isabs(path) or path.startswith("~"):
            return ToolResult(f"{path}: absolute paths are refused; use a path relative to the "
                              f"repository root", is_error=True)
        if ".." in PurePosixPath(path).parts:
            return ToolResult(f"{path}: '..' is refused; paths must stay inside the repository",
                              is_error=True)
        target = (self.worktree / path).resolve()
        if target != self.worktree and self.worktree not in target.parents:
            return ToolResult(f"{path}: refused, it leads outside the repository (symlink)",
                              is_error=True)
        return target

    def _writable(self, path: str) -> Path | ToolResult:
        target = self._notes_or_resolve(path)
        if isinstance(target, ToolResult) or target == self.notes_path:
            return target
        relative = target.relative_to(self.worktree).as_posix()
        if relative != _normalise(path):
            return ToolResult(f"{path}: refused, it is a symlink to {relative}", is_error=True)
        if not self.is_allowed(relative):
            allowed = ", ".join(self.allowed_paths) or "(none)"
            notes = f" and {NOTES_NAME}" if self.notes_path is not None else ""
            return ToolResult(f"{path}: writing is not allowed in this phase; "
                              f"the writable paths are: {allowed}{notes}", is_error=True)
        return target

    def is_allowed(self, relative: str) -> bool:
        for allowed in self.allowed_paths:
            if allowed.endswith("/") and relative.startswith(allowed):
                return True
            if relative == allowed.rstrip("/") or fnmatch.fnmatchcase(relative, allowed):
                return True
        return False


def _normalise(path: str) -> str:
    return PurePosixPath(os.path.normpath(path)).as_posix()


def truncate_middle(text: str, limit: int) -> str:
    """Keep the head and the (more useful) tail of a long output."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"
