"""Per-stage breakdown of forwarded calls on the launch ring (DESIGN §9).

With KREG_TRACE_STAGES=1 in a JAX process's environment the client shim
stamps each forwarded ring call at every stage, and the executor stamps its
own stages in the completion (kreg._shim.take_stage_records). This module
turns those stamps into a table of per-stage medians and p99s. Both clocks
are CLOCK_MONOTONIC on one host, so cross-process intervals are real.
"""

from __future__ import annotations

import statistics

# (label, from stage, to stage): the intervals, in call order.
INTERVALS = (
    ("shim: XLA call -> inputs ready", "enter", "prepared"),
    ("shim: publish on the ring", "prepared", "published"),
    ("handoff: client -> executor", "published", "picked"),
    ("executor: validate + decode", "picked", "decoded"),
    ("executor: build call frame", "decoded", "handler_start"),
    ("executor: handler", "handler_start", "handler_end"),
    ("executor: publish completion", "handler_end", "completed"),
    ("handoff: executor -> client", "completed", "woke"),
    ("shim: outputs -> return to XLA", "woke", "returned"),
    ("total (forwarding handler)", "enter", "returned"),
)


def _p99(v: list[float]) -> float:
  s = sorted(v)
  return s[min(len(s) - 1, int(len(s) * 0.99))]


def summarize(records: list[dict]) -> dict[str, dict[str, float]]:
  """label -> {"median_us", "p99_us", "n"} over the records that reached
  both ends of each interval."""
  out = {}
  for label, a, b in INTERVALS:
    v = [(r[b] - r[a]) / 1e3 for r in records if r[a] > 0 and r[b] >= r[a]]
    if v:
      out[label] = {"median_us": statistics.median(v), "p99_us": _p99(v),
                    "n": len(v)}
  return out


def table(summary: dict[str, dict[str, float]], title: str) -> str:
  lines = [f"== {title}", f"{'stage':36} {'median µs':>10} {'p99 µs':>10}"
           f" {'calls':>7}"]
  for label, _, _ in INTERVALS:
    s = summary.get(label)
    if s is None:
      lines.append(f"{label:36} {'-':>10} {'-':>10} {0:>7}")
    else:
      lines.append(f"{label:36} {s['median_us']:>10.2f} {s['p99_us']:>10.2f}"
                   f" {s['n']:>7}")
  return "\n".join(lines)
