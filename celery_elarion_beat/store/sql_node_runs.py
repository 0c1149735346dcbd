"""Every-node runs on a SQL database: how often each beat node's workers ran each
every-node entry (:meth:`~.interface.Runs.node_runs`, SQLAlchemy Core, every dialect).

The workers write one row of kind ``node`` per every-node run, keyed by the job and the
run's start (:meth:`~.sql_claims.SqlClaims.record_runs`); here they are counted per job
and node. Every query names its jobs, so it reads the primary key's range of each job
(cluster, job, occurrence) and never scans the claims of other jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import and_, func, or_, select

from ..schedules.clock import as_utc
from .records import NodeRuns
from .sql_base import SqlBase
from .states import EVERY_NODE_KIND

__all__ = ["JOBS_PER_QUERY", "SqlNodeRuns"]

#: Jobs per statement (each job brings a condition of its own to the count).
JOBS_PER_QUERY = 100


class SqlNodeRuns(SqlBase):
    """Every-node runs counted per job and node (:class:`~.interface.Runs`)."""

    def node_runs(self, since: Mapping[str, datetime], tracked_since: datetime) -> NodeRuns:
        found = NodeRuns()
        if not since:
            return found
        c = self.table.c
        jobs = sorted(since)
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            for start in range(0, len(jobs), JOBS_PER_QUERY):
                part = jobs[start:start + JOBS_PER_QUERY]
                mine = (self._mine(self.table), c.kind == EVERY_NODE_KIND)
                newest = conn.execute(
                    select(c.job_name, c.node, func.max(c.occurrence_utc))
                    .where(*mine, c.job_name.in_(part),
                           c.occurrence_utc >= self._param_time(tracked_since))
                    .group_by(c.job_name, c.node))
                for job, node, at in newest:
                    found.last[(job, node)] = as_utc(at)
                counted = conn.execute(
                    select(c.job_name, c.node, func.count())
                    .where(*mine, or_(*[and_(c.job_name == job,
                                             c.occurrence_utc >= self._param_time(since[job]))
                                        for job in part]))
                    .group_by(c.job_name, c.node))
                for job, node, count in counted:
                    found.runs[(job, node)] = int(count)
        return found
