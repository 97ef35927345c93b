"""Generations do not grow without bound (docs/replace.md section 2):
under replace = "owner", a target keeps its current generation, the one it
replaced and those live processes hold or pin, at most max_generations_per_target of them; the journal grows with
that live state only (a replacement is journaled as a delta, and the
journal is compacted), and the metrics carry series for live generations
only. Through the real kregd, kregctl and JAX processes."""

import os
import pathlib
import re
import shutil
import tempfile

import pytest

import kregd_proc
from holder import Holder
from proc_barrier import wait_for
from test_metrics import sample, scrape
from test_replace import register, show

LIMIT = 3
OLD = [0.0, 2.0, 4.0, 6.0]  # libdemo.so's Scale, factor 2
NEW = [0.0, 3.0, 6.0, 9.0]  # libdemo_v2.so's


@pytest.fixture
def d():
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-gens-c-", dir="/tmp"))
  config = root / "kregd.toml"
  config.write_text('replace = "owner"\n'
                    f"max_generations_per_target = {LIMIT}\n")
  metrics = f"unix:{root}/metrics.sock"
  daemon = kregd_proc.start_test_daemon(
      "kreg-gens-", ["--config", str(config), "--metrics-listen", metrics])
  daemon.metrics = metrics
  yield daemon
  kregd_proc.finish_test_daemon(daemon)
  shutil.rmtree(root, ignore_errors=True)


def live(d, name):
  return [g["generation"] for g in show(d, name)["generations"]]


def generation_labels(d, name):
  m = scrape(d.metrics)
  fam = m.get("kregd_target_launches_total", {"samples": []})
  return {l["generation"] for _, l, _ in fam["samples"]
          if l.get("target") == name}


def test_replacements_keep_the_journal_and_the_metrics_bounded(d):
  n = 150
  journal = pathlib.Path(d.state_dir) / "journal"
  register(d, "gen.churn", "libdemo.so")
  h = Holder(d, "gen.churn")  # follows the current generation
  try:
    assert h.call()["y"] == OLD
    for i in range(n):
      module = "libdemo_v2.so" if i % 2 == 0 else "libdemo.so"
      register(d, "gen.churn", module, "--replace")
      assert h.call()["y"] == (NEW if i % 2 == 0 else OLD)
      # A scrape right after a replacement may carry the dropped
      # generation's series a last time (like a retired target's).
      labels = generation_labels(d, "gen.churn")
      assert len(labels) <= LIMIT + 1, (i, sorted(labels))
      assert str(i + 2) in labels
    target = show(d, "gen.churn")
    assert target["generation"] == n + 1
    # The holder follows the current one: the one replaced stays, the rest
    # were dropped.
    assert live(d, "gen.churn") == [n, n + 1]
    # The next scrape has series for live generations only.
    assert generation_labels(d, "gen.churn") <= {str(n), str(n + 1)}
    # kregctl show's total still counts every call, dropped generations'
    # included.
    assert target["stats"]["launches"] == n + 1
  finally:
    h.end()
  # One live target of at most LIMIT generations takes well under 2 KiB;
  # the journal holds a ~0.45 KiB delta per replacement until its dead
  # bytes pass 32 KiB (then it is compacted: these 150 replacements pass
  # it), so it stays below 64 KiB for any number of replacements. Records
  # that repeat every generation (the journal before this bound) take
  # ~2.8 MiB for these 150.
  size = journal.stat().st_size
  assert size < 64 << 10, size
  assert re.search(r"journal \S+: compacted \d+ bytes to \d+ \(1 live",
                   d.log(tail=None)), d.log()
  # A restart replays it to the same state.
  before = show(d, "gen.churn")
  d.restart()
  after = show(d, "gen.churn")
  for t in (before, after):
    t.pop("stats", None)
    t.pop("bound_by", None)
    for g in t["generations"]:
      g.pop("stats", None)
  assert after == before


def bound_pids(d, name):
  return {b["pid"] for b in show(d, name).get("bound_by", [])}


def test_a_generation_past_the_limit_is_refused_while_older_ones_are_pinned(
    d):
  name = "gen.pin"
  register(d, name, "libdemo.so")
  pins = [Holder(d, name, pin=1)]
  try:
    assert pins[0].call()["y"] == OLD
    register(d, name, "libdemo_v2.so", "--replace")
    pins.append(Holder(d, name, pin=2))
    assert pins[1].call()["y"] == NEW
    register(d, name, "libdemo.so", "--replace")
    assert live(d, name) == [1, 2, 3]
    # A fourth live generation is one too many while 1 and 2 are pinned.
    over = register(d, name, "libdemo_v2.so", "--replace", check=False)
    assert over.returncode == 1, over.stderr  # docs/errors.md: exit 1
    root = "uid 0 (root)" if os.getuid() == 0 else f"uid {os.getuid()}"
    message = (
        f'cannot replace target "{name}" (cpu): it would have 4 live '
        f"generations, over max_generations_per_target ({LIMIT}). "
        "Generation 3 is the current one, and 2 earlier generations are "
        "still held or pinned by live processes: generation 1 by pid "
        f"{pins[0].pid} {root} (pinned); generation 2 by pid {pins[1].pid} "
        f"{root} (pinned). A generation is dropped once no process holds or "
        "pins it: let those processes exit (or bind the name without a "
        "generation to follow the current one), then replace again; or ask "
        "the operator to raise max_generations_per_target.")
    assert message in " ".join(over.stderr.split()), over.stderr
    # RESOURCE_EXHAUSTED: counted as a quota refusal and a refused replace.
    m = scrape(d.metrics)
    assert sample(m, "kregd_registrations_refused_total", reason="quota") == 1
    assert sample(m, "kregd_replaces_total", outcome="refused") == 1
    assert show(d, name)["generation"] == 3
    assert pins[0].call()["y"] == OLD and pins[1].call()["y"] == NEW
    # Once the pin of generation 1 ends, generation 1 is dropped and the
    # replacement goes through.
    pins.pop(0).end()
    wait_for(lambda: len(bound_pids(d, name)) == 1, 30,
             "kregd to see the pinned process exit")
    register(d, name, "libdemo_v2.so", "--replace")
    assert live(d, name) == [2, 3, 4]
    assert pins[0].call()["y"] == NEW
  finally:
    for h in pins:
      h.end()
