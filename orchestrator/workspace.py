"""The run's git worktree: branch, commit, keep/revert, refs of discarded experiments, path checks.

A run `<tag>` works in `runs/<tag>/` on branch `autorl/<tag>`; the user's checkout is never
touched. The branch tip is always the best experiment; a discarded commit stays reachable as
`refs/autorl/<tag>/exp-NNNN`.
"""
from __future__ import annotations

import fnmatch
import io
import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable, Optional

import git

AUTHOR_ENV = {
    "GIT_AUTHOR_NAME": "autorl", "GIT_AUTHOR_EMAIL": "autorl@localhost",
    "GIT_COMMITTER_NAME": "autorl", "GIT_COMMITTER_EMAIL": "autorl@localhost",
}


class WorkspaceError(Exception):
    pass


def repo_root(start: Path) -> Path:
    try:
        repo = git.Repo(start, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise WorkspaceError(f"{start} is not inside a git repository; run autorl from its checkout") from None
    if repo.bare:
        raise WorkspaceError(f"{start} is a bare repository")
    return Path(repo.working_tree_dir)


def branch_name(tag: str) -> str:
    return f"autorl/{tag}"


def discard_ref(tag: str, exp: int) -> str:
    return f"refs/autorl/{tag}/exp-{exp:04d}"


class Workspace:
    def __init__(self, main_root: Path, tag: str):
        self.main_root = Path(main_root)
        self.tag = tag
        self.path = self.main_root / "runs" / tag
        self.branch = branch_name(tag)
        self.main = git.Repo(self.main_root)

    # ------------------------------------------------------------ setup
    def exists(self) -> bool:
        return self.path.exists() or self.branch in [h.name for h in self.main.heads]

    def start_commit(self, ref: Optional[str] = None) -> str:
        """The commit a new run starts from: `ref` (a branch such as autorl/<tag>, a tag, a sha),
        else the main checkout's HEAD."""
        if ref is None:
            if self.main.head.is_valid() is False:
                raise WorkspaceError(f"{self.main_root} has no commit yet; commit your files first")
            return self.main.head.commit.hexsha
        try:
            return self.main.commit(ref).hexsha
        except (git.BadName, ValueError, git.GitCommandError):
            raise WorkspaceError(f"--from {ref}: no such commit, branch or tag in {self.main_root}") from None

    def create(self, ref: Optional[str] = None) -> str:
        """New worktree on a new branch from `ref` (default: the main checkout's HEAD); returns that commit."""
        base = self.start_commit(ref)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.main.git.worktree("add", "-b", self.branch, str(self.path), base)
        self._exclude_run_folders()
        return base

    def _exclude_run_folders(self) -> None:
        """Keep runs/ and results/ out of the user's `git status` even without a .gitignore entry."""
        exclude = Path(self.main.git_dir) / "info" / "exclude"
        for folder in ("runs", "results"):
            try:
                self.main.git.check_ignore("-q", f"{folder}/{self.tag}")
                continue  # already ignored
            except git.GitCommandError:
                pass
            exclude.parent.mkdir(parents=True, exist_ok=True)
            with open(exclude, "a") as handle:
                handle.write(f"/{folder}/\n")

    def ensure(self) -> None:
        """On resume: recreate the worktree for the existing branch if its folder was removed."""
        self.main.git.worktree("prune")
        if not (self.path / ".git").exists():
            self.main.git.worktree("add", str(self.path), self.branch)

    @property
    def repo(self) -> git.Repo:
        return git.Repo(self.path)

    def head(self) -> str:
        return self.repo.head.commit.hexsha

    def resolve(self, rev: str) -> str:
        return self.repo.commit(rev).hexsha

    def short(self, sha: str) -> str:
        return self.repo.git.rev_parse("--short=7", sha)

    def main_is_dirty(self) -> bool:
        return self.main.is_dirty(untracked_files=False)

    # ------------------------------------------------------------ one experiment
    def changed_paths(self, best: str) -> list[str]:
        """Every path that differs from `best`: edits, new files, deletions, and commits made by
        the agent itself (they are folded into the experiment's one commit)."""
        repo = self.repo
        self._back_on_branch(best)
        repo.git.add("-A")
        names = repo.git.diff("--cached", "--name-only", "--no-renames", "-z", best)
        return sorted(n for n in names.split("\0") if n)

    def _back_on_branch(self, best: str) -> None:
        repo = self.repo
        if repo.head.is_detached or repo.active_branch.name != self.branch:
            repo.git.symbolic_ref("HEAD", f"refs/heads/{self.branch}")
        if repo.head.commit.hexsha != best:
            repo.git.reset("--soft", best)  # the agent committed; keep its changes, not its commits

    def commit(self, message: str) -> str:
        repo = self.repo
        repo.git.add("-A")
        with repo.git.custom_environment(**AUTHOR_ENV):
            repo.git.commit("--no-verify", "--allow-empty", "-q", "-m", message or "(no description)")
        return repo.head.commit.hexsha

    def diff(self, base: str, commit: str) -> str:
        return self.repo.git.diff(base, commit)

    def archive(self, commit: str) -> bytes:
        """The commit's files as `git archive --format=tar.gz` bytes (what a Modal container gets)."""
        buffer = io.BytesIO()
        self.main.archive(buffer, commit, format="tar.gz")
        return buffer.getvalue()

    def extract(self, commit: str, dest: Path, paths: Optional[list[str]] = None, read_only: bool = False) -> Path:
        """A snapshot of the commit's files (only those under `paths`, when given) in `dest` (which must
        not exist yet). Paths the commit lacks extract nothing. `read_only`: every file and folder of it
        without write permission (remove it with `remove_snapshot`)."""
        buffer = io.BytesIO()
        present = [p for p in paths or [] if self.has_path(commit, p)]
        if paths is not None and not present:
            Path(dest).mkdir(parents=True)
            return Path(dest)
        self.main.archive(buffer, commit, format="tar", **({"path": present} if present else {}))
        buffer.seek(0)
        dest = Path(dest)
        dest.mkdir(parents=True)
        with tarfile.open(fileobj=buffer) as tar:
            tar.extractall(dest, filter="data")
        if read_only:
            _set_writable(dest, False)
        return dest

    def commit_beside(self, commit: str, other: str, paths: list[str], folder: str) -> str:
        """A commit on no branch: `commit`'s files and, under `folder`/, `other`'s copies of `paths`
        (those it has), e.g. the incumbent translation beside the candidate's for one benchmark.
        No ref points to it; git's garbage collection drops it after its grace period."""
        repo = self.main
        with tempfile.TemporaryDirectory(prefix="autorl-index-") as scratch:
            with repo.git.custom_environment(GIT_INDEX_FILE=str(Path(scratch) / "index"), **AUTHOR_ENV):
                repo.git.read_tree(commit)
                for path in paths:
                    entry = repo.git.ls_tree(other, "--", path)  # "<mode> blob <sha>\t<path>"
                    if entry:
                        mode, _, sha = entry.split("\t", 1)[0].split()
                        repo.git.update_index("--add", "--cacheinfo", f"{mode},{sha},{folder}/{path}")
                tree = repo.git.write_tree()
                return repo.git.commit_tree(tree, "-p", commit, "-m", f"{commit[:12]} with {other[:12]}'s "
                                                                        f"{', '.join(paths)} under {folder}/")

    def has_path(self, commit: str, path: str) -> bool:
        try:
            self.main.commit(commit).tree / path
            return True
        except KeyError:
            return False

    def keep_ref(self, exp: int, commit: str) -> None:
        self.repo.git.update_ref(discard_ref(self.tag, exp), commit)

    def drop_ref(self, exp: int) -> None:
        """Remove an experiment's ref (a kept experiment is on the branch instead)."""
        try:
            self.repo.git.update_ref("-d", discard_ref(self.tag, exp))
        except git.GitCommandError:
            pass  # it had none

    def reset_to(self, commit: str) -> None:
        """Branch and worktree back to `commit`; untracked leftovers removed (ignored files stay)."""
        repo = self.repo
        self._back_on_branch_hard()
        repo.git.reset("--hard", "-q", commit)
        repo.git.clean("-fdq")

    def _back_on_branch_hard(self) -> None:
        repo = self.repo
        if repo.head.is_detached or repo.active_branch.name != self.branch:
            repo.git.checkout("-f", "-q", self.branch)

    def changed_between(self, base: str, commit: str) -> list[str]:
        """Every path `commit` changes relative to `base` (added, modified, deleted)."""
        names = self.repo.git.diff("--name-only", "--no-renames", "-z", base, commit)
        return sorted(n for n in names.split("\0") if n)

    def remove(self) -> None:
        """The worktree and its branch, gone (the commits stay reachable only through other refs)."""
        if self.path.exists():
            self.main.git.worktree("remove", "--force", str(self.path))
        self.main.git.worktree("prune")
        if self.branch in [h.name for h in self.main.heads]:
            self.main.git.branch("-D", self.branch)

    # ------------------------------------------------------------ the user's checkout
    def dirty_paths(self) -> list[str]:
        """Tracked files of the checkout with uncommitted (staged or unstaged) changes."""
        status = self.main.git.status("--porcelain", "--untracked-files=no")
        return [line[3:] for line in status.splitlines() if line.strip()]

    def land(self, base: str, commit: str, message: str, fallback_ref: str) -> str:
        """One commit holding `commit`'s tree on top of `base`, fast-forwarded onto the checkout's
        current branch (which must still be at `base`), so its files appear in the checkout. When it
        cannot land, the commit is kept under `fallback_ref` and WorkspaceError says why."""
        tree = self.main.commit(commit).tree.hexsha
        with self.main.git.custom_environment(**AUTHOR_ENV):
            landed = self.main.git.commit_tree(tree, "-p", base, "-m", message)
        problem = None
        if self.main.head.is_detached or self.main.head.commit.hexsha != base:
            problem = f"the checkout moved on from {base[:7]} meanwhile"
        else:
            try:
                self.main.git.merge("--ff-only", "-q", landed)
            except git.GitCommandError as exc:
                problem = f"git merge --ff-only refused: {_last_line(exc.stderr)}"
        if problem:
            self.main.git.update_ref(fallback_ref, landed)
            raise WorkspaceError(f"{problem}; the commit is kept as {fallback_ref} (git merge it)")
        return landed

    def refs(self) -> dict[str, str]:
        out = self.repo.git.for_each_ref("--format=%(refname) %(objectname)", f"refs/autorl/{self.tag}/")
        return dict(line.split(" ", 1) for line in out.splitlines() if line)


WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def _set_writable(root: Path, writable: bool) -> None:
    """Add or take away every write permission bit of `root` and everything under it (folders last
    when taking away, first when adding, so the walk can still reach and change what is inside)."""
    def chmod(path: str) -> None:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        os.chmod(path, (mode | stat.S_IWUSR) if writable else (mode & ~WRITE_BITS))

    if writable:
        chmod(str(root))
    for folder, dirs, files in os.walk(root, topdown=writable):
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                chmod(os.path.join(folder, name))
        for name in dirs:
            chmod(os.path.join(folder, name))
    if not writable:
        chmod(str(root))


def remove_snapshot(path: Path) -> None:
    """Remove a snapshot, also one `extract` made read-only."""
    if path.exists():
        _set_writable(path, True)
        shutil.rmtree(path, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


# ---------------------------------------------------------------- checks of a proposal
def disallowed(paths: Iterable[str], allowed: list[str]) -> list[str]:
    """Paths outside the phase's allowed set (entries may be glob patterns)."""
    return [p for p in paths if not any(p == a or fnmatch.fnmatchcase(p, a) for a in allowed)]


def compile_errors(worktree: Path, paths: Iterable[str]) -> Optional[str]:
    """The first syntax error among the changed Python files, as one line."""
    for rel in paths:
        path = worktree / rel
        if not rel.endswith(".py") or not path.is_file():
            continue
        try:
            compile(path.read_bytes(), rel, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return f"{rel}:{exc.lineno}: SyntaxError: {exc.msg}"
        except ValueError as exc:  # null bytes
            return f"{rel}: {exc}"
    return None
