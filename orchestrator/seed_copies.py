"""Runs that copy each other: told apart from runs that trained with seeds of their own.

The keep rule (keep_rule.py) treats a candidate's runs as independent draws, which holds only
if train.py seeds everything from AUTORL_SEED. A train.py that pins its own seed exports the same
policy on every "seed" (or nearly: a wall-clock budget lets each run make a slightly different
number of updates), and its confirmations would confirm nothing: with such candidates, 12-candidate null
nights kept something in a third of them. So runs of one candidate that copy each other count as
one run (`seed_copies`): the same artifact (policy.pt's sha256), or scores spread implausibly
little against the night's sigma and the evaluation's standard error alike (chi-square lower tails
below COPY_ALPHA; the se spares a fix far quieter than a noisy start). Such a candidate is
judged as one run (its mean, the one-run prior) and never confirmed again (its confirmations would
copy it too), its row says `train.py ignores AUTORL_SEED: ...`, and its runs join the noise
estimate as one run. Copies that differ a little pass that test on few runs, so a keep on runs
closer than independent seeds mostly are (below KEEP_INDEPENDENCE) waits for one more run.
"""
from __future__ import annotations

import hashlib
import math
import zipfile
from functools import lru_cache
from typing import Optional, Sequence

from scipy import special

from .artifacts import find_policy
from .results import ExpFolder

MIN_SIGMA = 1e-9       # sigma when every run and every evaluation agree exactly
# Runs of one candidate are taken for copies when their spread is this improbable for independent
# seeds at the night's sigma and at the evaluation's standard error alike (chi-square lower tails):
# judged as one run at once (in practice discarded), a false flag at most 0.1% of a candidate's looks.
COPY_ALPHA = 0.001
# A keep needs runs that spread at least as much as independent seeds' do this often (the same two
# tails); closer runs are confirmed once more first, and still that close at the last run, judged as
# one. Copies that differ a little (a wall-clock budget's extra updates: 0.3 x the evaluation's se)
# slip past COPY_ALPHA on two or three runs, and kept 12% of simulated null nights without this; with
# it 2.5%. Its cost falls on candidates so stable that their seeds differ by no more than the
# evaluation's se: a +4 sigma gain over a start 10x noisier, kept in 90% of nights instead of 95%
# (bench/keep_rule.py). Honest candidates at the night's noise spread far above the se: never held.
KEEP_INDEPENDENCE = 0.1


def artifact_sha256(run_folder: ExpFolder) -> str:
    """The content hash of the policy artifact a run left in its out/ folder ("" when there is none):
    equal for two exports of the same policy (`policy_sha256`)."""
    policy = find_policy(run_folder.out)
    if policy is None:
        return ""
    stat = policy.stat()
    return policy_sha256(str(policy), stat.st_size, stat.st_mtime_ns)


# Members of a TorchScript / torch.export archive that differ between two saves of the same policy:
# the source ranges name the file it was scripted from (each run trains in a snapshot folder of its
# own), and every save draws a fresh serialization id
_SAVE_SPECIFIC = (".debug_pkl", "/.data/serialization_id")


@lru_cache(maxsize=4096)
def policy_sha256(path: str, size: int = 0, mtime_ns: int = 0) -> str:
    """sha256 of a policy artifact's content: for a zip archive (policy.pt, policy.pt2) its members by
    name within the archive, without what differs between saves of one policy; else the file's bytes.
    (size and mtime: the cache's key, so that every round does not hash every run's artifact again.)"""
    digest = hashlib.sha256()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            members = sorted((info.filename.split("/", 1)[-1], info) for info in archive.infolist()
                             if not info.is_dir() and not info.filename.endswith(_SAVE_SPECIFIC))
            for name, info in members:
                data = archive.read(info)
                digest.update(f"{name}\0{len(data)}\0".encode())
                digest.update(data)
        return digest.hexdigest()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def copy_evidence(scores: Sequence[float], sigma: float, ses: Sequence[float] = (),
                  artifacts: Sequence[str] = ()) -> tuple[float, str]:
    """How plausible it is that a candidate's runs (their scores, evaluation standard errors and
    artifact hashes, "" for unknown) trained with seeds of their own: (p, why), p the chance that
    independent seeds spread this little, 0 when two runs exported the same artifact, 1 when their
    scores cannot tell.

    The spread: (n - 1) s^2 / sigma^2 ~ chi2(n - 1) at seed-to-seed sd `sigma`, and (where `ses` are
    known) the same against their RMS, the evaluation's resolution; p is the larger of the two lower
    tails, so runs count as close only when they are closer than the night's seeds *and* closer than
    the evaluation resolves (a candidate far quieter than a noisy start, a fix, still differs by about
    the evaluation's noise; copies agree well inside it, playing its episodes nearly alike). Equal
    scores whose every evaluation had no spread (se 0: every episode returned the same, a policy at the
    env's ceiling) tell nothing: independent seeds tie there too, so only the artifacts do."""
    n = len(scores)
    if n < 2:
        return 1.0, ""
    known = [a for a in artifacts if a]
    distinct = len(set(known))
    if len(known) == n and distinct < n:
        what = "the same policy" if distinct == 1 else f"only {distinct} different policies"
        return 0.0, f"train.py ignores AUTORL_SEED: {n} runs exported {what} (policy.pt sha256 {known[0][:12]})"
    if len(set(scores)) == 1 and len(ses) == n and all(se == 0 for se in ses):
        return 1.0, ""
    mean = sum(scores) / n
    squares = sum((x - mean) ** 2 for x in scores)
    p = _chi2_cdf(squares / max(sigma, MIN_SIGMA) ** 2, n - 1)
    eval_se = math.sqrt(sum(se * se for se in ses) / len(ses)) if ses else 0.0
    if eval_se > 0:
        p = max(p, _chi2_cdf(squares / eval_se ** 2, n - 1))
    return p, (f"train.py ignores AUTORL_SEED: {n} runs within {max(scores) - min(scores):.3g} of each other "
               f"where seeds differ by {sigma:.3g}")


def seed_copies(scores: Sequence[float], sigma: float, ses: Sequence[float] = (),
                artifacts: Sequence[str] = ()) -> Optional[str]:
    """Why a candidate's runs copy each other rather than train with their own seeds (the same
    artifact, or a spread below `copy_evidence`'s COPY_ALPHA), or None."""
    p, why = copy_evidence(scores, sigma, ses, artifacts)
    return why if p < COPY_ALPHA else None


def _chi2_cdf(x: float, df: int) -> float:
    return float(special.gammainc(df / 2, x / 2))   # chi-square's cdf, without scipy.stats' overhead
