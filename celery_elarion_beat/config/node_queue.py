"""Node-local queues: where every-node entries go, and who consumes them.

Every node that runs beat sends its ``placement="every_node"`` entries to its
own queue, ``elarion.node.<node>`` by default (setting ``elarion_beat_node_queue``),
through the direct exchange ``elarion.node``. The workers on that node consume
it once the app calls :func:`consume_node_queue` (the worker one-liner), or when
started with ``-Q celery,elarion.node.$(hostname)``.

Stale work is bounded twice:

* every message expires after at most the entry's period (``expires``: the
  worker discards it unexecuted; RabbitMQ also drops it with a per-message TTL);
* the queue itself expires when unused for ``elarion_beat_node_queue_expires``
  seconds: ``x-expires`` on RabbitMQ; on Redis, a TTL on the queue's keys that
  every send refreshes, so a dead node's queue disappears on its own.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import celeryd_after_setup
from kombu.entity import Exchange, Queue

from .settings import Settings

__all__ = ["NODE_EXCHANGE", "consume_node_queue", "node_queue", "refresh_queue_ttl"]

logger = logging.getLogger(__name__)

#: The direct exchange that routes every-node messages to node queues.
NODE_EXCHANGE = Exchange("elarion.node", type="direct", durable=True)  # type: ignore[no-untyped-call]

#: The app attribute that holds the app's ``celeryd_after_setup`` receiver.
_RECEIVER = "_elarion_node_queue_receiver"


def node_queue(settings: Settings) -> Queue:
    """The node queue of *settings*' node, declared alike by beat and the workers.

    Beat and the workers must declare the queue with the same arguments (RabbitMQ
    refuses a redeclaration with other ones), so both build it here.
    """
    return Queue(  # type: ignore[no-untyped-call]
        settings.node_queue,
        exchange=NODE_EXCHANGE,
        routing_key=settings.node_queue,
        durable=True,
        auto_delete=False,
        queue_arguments={"x-expires": int(settings.node_queue_expires * 1000)},
    )


def consume_node_queue(app: Any) -> None:
    """Make every worker of *app* also consume this node's queue.

    Call it once in the module that creates the app::

        app = Celery("proj")
        celery_elarion_beat.consume_node_queue(app)

    The node is ``elarion_beat_node`` (env ``ELARION_BEAT_NODE``, default: the host
    name), the same name beat uses on this node. Works with or without ``-Q``.
    """

    app = getattr(app, "_get_current_object", lambda: app)()  # a proxy: the app itself

    def add_node_queue(sender: Any = None, instance: Any = None, **_: Any) -> None:
        worker_app = getattr(instance, "app", None)
        if worker_app is not app:  # this app object, not another one of the same name
            return
        queue = node_queue(Settings.from_app(worker_app))
        worker_app.amqp.queues.select_add(queue)
        logger.info("elarion: worker %s also consumes node queue %s", sender, queue.name,
                    extra={"action": "node-queue", "worker": str(sender), "queue": queue.name})

    # once per app object: the app holds the receiver, the signal only weakly, so a
    # dropped app goes with it (and its id, free again, names no stale receiver)
    if getattr(app, _RECEIVER, None) is None:
        setattr(app, _RECEIVER, add_node_queue)
        celeryd_after_setup.connect(add_node_queue, weak=True,
                                    dispatch_uid=f"celery_elarion_beat.config.node_queue.{id(app)}")


def refresh_queue_ttl(producer: Any, queue: Queue, seconds: float) -> None:
    """On Redis, (re)arm the TTL of *queue*'s keys; elsewhere do nothing.

    Redis has no queue expiry of its own: a node queue is a list key (one per
    priority step). Every send re-arms its TTL, so the keys of a node that stopped
    sending vanish after *seconds*. Failures are logged, never raised.
    """
    channel: Any = getattr(producer, "channel", None)
    client: Any = getattr(channel, "client", None)
    if client is None or not hasattr(channel, "_q_for_pri"):
        return
    try:
        steps = getattr(channel, "priority_steps", [0]) or [0]
        with client.pipeline() as pipe:
            for step in steps:
                pipe.pexpire(channel._q_for_pri(queue.name, step), max(1, int(seconds * 1000)))
            pipe.execute()
    except Exception as exc:  # the message is sent; a missing TTL is not worth a skip
        logger.warning("beat: could not set the TTL of node queue %s: %s", queue.name, exc)
