"""When: the clock, slot naming, ``cron`` and daylight-saving arithmetic.

Pure functions and value types, no I/O: every node computes the same instants from
the same schedule, which is what lets an exact slot be claimed once.

* :mod:`.clock`: the one clock (aware UTC);
* :mod:`.slots`: which occurrence a due entry is, as a claim key;
* :mod:`.cron`, :mod:`.cron_dst`: ``cron``, croniter with seconds and a time zone;
* :mod:`.dst_marks`: how an entry's occurrences meet its zone's offset changes.
"""
