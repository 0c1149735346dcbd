"""The tick: beat's Scheduler glue (:mod:`.scheduler`) and what it drives.

* :mod:`.pipeline`: claim, publish, skip, record, for one tick's due entries
  (:mod:`.sender` publishes and records one plan, :mod:`.entry_rules` holds each
  entry's overlap rule and jitter);
* :mod:`.plan`: what one due occurrence becomes, and its message;
* :mod:`.recovery`, :mod:`.resume`, :mod:`.catch_up`, :mod:`.orphans`: never lose
  a slot that can be recovered;
* :mod:`.maintenance`, :mod:`.purge`: heartbeats, drift and skew alarms, the purge;
* :mod:`.pause_watch`, :mod:`.jitter_queue`, :mod:`.repeat_guard`,
  :mod:`.fail_closed`, :mod:`.chunks`, :mod:`.signals`, :mod:`.watched_schedule`,
  :mod:`.startup`: one concern each.
"""
