"""report.html: one self-contained page (charts inlined as PNG)."""
from __future__ import annotations

import base64
import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from ..results import ExpFolder, RunFolder
from .night import FAILED, Night
from .text import hours, kept, num, state_line, summary_text


CSS = """
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
margin:0;color:#1f2328;background:#f6f8fa}
main{max-width:1240px;margin:0 auto;padding:20px 28px 60px;background:#fff}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;
padding-bottom:4px}.sub{color:#57606a;margin:0 0 12px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #d0d7de;border-radius:8px;padding:8px 14px;flex:1 1 0;min-width:130px}
.card b{display:block;font-size:20px}.card span{color:#57606a;font-size:12px}
.up{color:#1a7f37}.down{color:#cf222e}img{max-width:100%;height:auto;display:block}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{padding:4px 8px;border-bottom:1px solid #eaeef2;
text-align:left;vertical-align:top}th{background:#f6f8fa;position:sticky;top:0}td.n{text-align:right;
font-variant-numeric:tabular-nums;white-space:nowrap}
.st{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;color:#fff;background:#8c96a8}
.st-keep{background:#1a7f37}.st-baseline{background:#24292f}.st-crash,.st-timeout,.st-invalid{background:#cf222e}
.st-interrupted{background:#bf8700}tr.keep td{background:#f0fbf3}tr.failed td{background:#fff6f5}
details{margin:4px 0}summary{cursor:pointer;color:#0969da}
pre{background:#f6f8fa;border:1px solid #eaeef2;border-radius:6px;padding:8px;overflow:auto;max-height:420px;
font:12px/1.35 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre}
.add{color:#116329;background:#e6ffec}.del{color:#82071e;background:#ffebe9}.hunk{color:#8250df}
.muted{color:#57606a}code{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
"""


def _img(data: Optional[bytes], alt: str) -> str:
    if not data:
        return ""
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _muted(text: str) -> str:
    return f'<p class="muted">{html.escape(text)}</p>'


def _diff_html(text: str, limit: int = 60_000) -> str:
    if len(text) > limit:
        text = text[:limit] + f"\n... ({len(text) - limit:,} more characters in diff.patch)"
    out = []
    for line in text.splitlines():
        escaped = html.escape(line)
        if line.startswith("+") and not line.startswith("+++"):
            out.append(f'<span class="add">{escaped}</span>')
        elif line.startswith("-") and not line.startswith("---"):
            out.append(f'<span class="del">{escaped}</span>')
        elif line.startswith("@@"):
            out.append(f'<span class="hunk">{escaped}</span>')
        else:
            out.append(escaped)
    return "<pre>" + "\n".join(out) + "</pre>"


def _tail(path: Path, lines: int = 40, chars: int = 6000) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])[-chars:]


def _cards(night: Night) -> str:
    cards = []

    def card(value: str, label: str, css: str = "") -> None:
        cards.append(f'<div class="card"><b class="{css}">{html.escape(value)}</b><span>{html.escape(label)}</span>'
                     "</div>")

    r = night.rescore
    if r is not None:
        low, high = r.interval
        card(num(r.gain, ".2f", True), f"out of sample: best - start on {len(r.seeds)} fresh seeds, 95% CI "
                                       f"[{num(low, '.2f', True)}, {num(high, '.2f', True)}]",
             "up" if r.gain > 0 else "down")
    base = night.baseline
    card(num(night.baseline_score, ".2f"), f"baseline (IQM {num(base.iqm if base else None, '.2f')}; "
                                            f"noise σ {num(night.noise, '.2f')})")
    if night.best_row is not None and night.best_row["exp"] > 0:
        low, high = night.ci
        card(num(night.best_row["score"], ".2f"), f"best: exp {night.best_row['exp']} "
                                                   f"(IQM {num(night.best.iqm if night.best else None, '.2f')})")
        card(num(night.gain, ".2f", True), f"in-sample gain (biased up), 95% CI over seeds [{num(low, '.2f', True)}, {num(high, '.2f', True)}]",
             "up" if night.gain > 0 else "down")
    experiments = night.rows[night.rows.exp > 0].drop_duplicates("exp", keep="last")
    card(str(len(experiments)), f"experiments ({(experiments.status == 'keep').sum()} kept)")
    card(f"{num(hours(night), '.2f')} h", "wall clock")
    card(f"${night.rows.cost_usd.sum():.2f}", "cost")
    return '<div class="cards">' + "".join(cards) + "</div>"


def _experiment_rows(night: Night) -> str:
    folder = night.folder
    head = ("<tr><th>exp</th><th>time (UTC)</th><th>phase</th><th>status</th><th>score ± se</th><th>IQM</th>"
            "<th>best</th><th>env steps</th><th>steps/s</th><th>wall s</th><th>cost</th><th>commit</th>"
            "<th>description</th></tr>")
    body = []
    for _, row in night.rows.iterrows():
        failed = row.status in FAILED
        css = "keep" if row.status == "keep" else "failed" if failed else ""
        score = "" if row.score != row.score else f"{row.score:.2f}" + (
            f" ± {row.se:.2f}" if row.se == row.se else "")
        details = ""
        exp_folder = folder.exp(row.exp)
        if row.status == "keep" and exp_folder.diff.exists():
            diff = exp_folder.diff.read_text(encoding="utf-8", errors="replace")
            details += (f"<details><summary>diff ({diff.count(chr(10)):,} lines, "
                        f"exp-{row.exp:04d}/{ExpFolder.DIFF})</summary>{_diff_html(diff)}</details>")
        if failed or (row.status == "discard" and row.phase == "translate"):  # a discarded train run's
            failure = _tail(exp_folder.failure) if exp_folder.failure.exists() else ""  # reason is its score
            if failure:
                details += (f"<details><summary>why ({'failure' if failed else 'verification or benchmark'}, "
                            f"exp-{row.exp:04d}/{ExpFolder.FAILURE})</summary><pre>{html.escape(failure)}</pre>"
                            "</details>")
        time_text = str(row.time)[11:16] if row.time else ""
        body.append(
            f'<tr class="{css}" id="exp-{row.exp}"><td class="n">{row.exp}</td><td>{html.escape(time_text)}</td>'
            f"<td>{html.escape(row.phase)}</td><td><span class=\"st st-{html.escape(row.status)}\">"
            f"{html.escape(row.status)}</span></td><td class=\"n\">{score}</td>"
            f"<td class=\"n\">{num(row.iqm, '.2f') if row.score == row.score else ''}</td>"
            f"<td class=\"n\">{num(row.best, '.2f')}</td>"
            f"<td class=\"n\">{'' if row.env_steps != row.env_steps else f'{int(row.env_steps):,}'}</td>"
            f"<td class=\"n\">{'' if row.sps != row.sps else f'{row.sps:,.0f}'}</td>"
            f"<td class=\"n\">{num(row.wall_s, '.0f')}</td><td class=\"n\">${row.cost_usd:.3f}</td>"
            f"<td><code>{html.escape(str(row.commit))}</code></td>"
            f"<td>{html.escape(str(row.description))}{details}</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _translations(night: Night) -> str:
    if not night.translations:
        kind = "no translate experiment ran" if not (night.rows.phase == "translate").any() \
            else "no translation was kept"
        return f'<p class="muted">{kind}.</p>'
    head = ("<tr><th>exp</th><th>commit</th><th>backend</th><th>speed-up vs incumbent</th><th>vs reference</th>"
            "<th>steps/s (at envs)</th><th>description</th></tr>")
    body = []
    for t in night.translations:
        speed = t.get("speedup")
        ratio = t.get("ratio")
        sps = t.get("adapter_sps")
        body.append(
            f"<tr><td class=\"n\">{t['exp']}</td><td><code>{html.escape(str(t.get('commit', '')))}</code></td>"
            f"<td><code>{html.escape(str(t.get('spec', '')))}</code></td>"
            f"<td class=\"n\">{num(speed, '.2f')}x over {html.escape(str(t.get('incumbent', '?')))}</td>"
            f"<td class=\"n\">{num(ratio, '.0f')}x</td>"
            f"<td class=\"n\">{'-' if sps is None else f'{sps:,.0f}'} ({t.get('num_envs', '?')})</td>"
            f"<td>{html.escape(str(t.get('description', '')))}</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _transfer(night: Night) -> str:
    frame = night.transfer
    if frame is None or frame.empty:
        return ""
    from ..transfer_table import summary

    head = ("<tr><th>env</th><th>baseline [95% CI]</th><th>best [95% CI]</th><th>change</th><th>seeds</th>"
            "<th>failed</th></tr>")
    body = []
    for r in summary(frame).itertuples():
        cells = [f"{num(getattr(r, w), '.1f')} [{num(getattr(r, w + '_low'), '.1f')}, "
                 f"{num(getattr(r, w + '_high'), '.1f')}]" for w in ("baseline", "best")]
        css = "up" if r.change > 0 else "down" if r.change < 0 else ""
        pct = "" if r.change_pct != r.change_pct else f" ({r.change_pct:+.0f}%)"
        body.append(f"<tr><td>{html.escape(r.env)}</td><td class=\"n\">{cells[0]}</td><td class=\"n\">{cells[1]}"
                    f"</td><td class=\"n {css}\">{num(r.change, '.1f', True)}{pct}</td>"
                    f"<td class=\"n\">{r.baseline_seeds}/{r.best_seeds}</td>"
                    f"<td class=\"n\">{r.baseline_failed + r.best_failed}</td></tr>")
    png = night.folder.transfer_png
    return ("<h2>Transfer to other environments</h2><p class=\"sub\">The run's starting train.py (baseline) and "
            "its best, trained with the same budget and seeds on each environment and scored by the run's harness "
            f"(every cell in <code>{RunFolder.TRANSFER_TSV}</code>). CI: percentile bootstrap over seeds; with one "
            "seed, ±1.96 se over its evaluation episodes.</p>"
            + _img(png.read_bytes() if png.exists() else None, "transfer chart")
            + f"<table>{head}{''.join(body)}</table>")


def html_page(night: Night, progress: bytes, distributions: Optional[bytes], over_night: Optional[bytes],
              curves: Optional[bytes] = None, kept_curves: Optional[bytes] = None) -> str:
    c = night.config
    written = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    summary = html.escape(summary_text(night))
    kept_rows = kept(night)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<link rel="icon" href="data:,"><title>autorl · {html.escape(night.tag)}</title><style>{CSS}</style></head>
<body><main>
<h1>{html.escape(night.tag)} <span class="muted">· {html.escape(str(c.get('env_id', '')))}</span></h1>
<p class="sub">{html.escape(str(c.get('agent', '?')))} agent · budget {c.get('budget_s', 0):g} s per experiment ·
{html.escape(str(c.get('eval_episodes', '?')))} evaluation episodes
· runner {html.escape(str(c.get('runner', 'local')))}
· branch <code>{html.escape(str(c.get('branch', '')))}</code> · started {html.escape(str(c.get('created', '?')))}
· {html.escape(state_line(night))} · written {written}</p>
{_cards(night)}
<h2>Summary</h2><pre>{summary}</pre>
<p class="muted">Gain CI: 95% interval of best minus baseline with training seeds as the units, Welch-style like
the keep rule: each side's seed-to-seed variance is the night's sigma² or its own runs' spread where larger, a Student t
quantile with Welch's degrees of freedom (episodes within a run are not independent evidence of a gain). IQM: mean of the
middle 50% of episode returns.</p>
<h2>Progress</h2>{_img(progress, "progress chart")}
<h2>Learning curves</h2>{_img(curves, "learning curves") or _muted("no train.log with update lines yet.")}
{_img(kept_curves, "each kept experiment beside the incumbent it beat")}
<h2>Returns: baseline vs best</h2>{_img(distributions, "return distributions") or _muted("no scored run yet.")}
<h2>Throughput and cost over the night</h2>{_img(over_night, "throughput and cost") or _muted("no rows yet.")}
<h2>Translations kept</h2>{_translations(night)}
{_transfer(night)}
<h2>Experiments ({len(night.rows)} rows; {len(kept_rows)} kept)</h2>
<p class="sub">Kept experiments show their diff; failed ones (and discarded translations) the reason the agent was given.</p>
{_experiment_rows(night)}
</main></body></html>
"""
