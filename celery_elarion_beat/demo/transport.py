"""kombu's filesystem transport, with messages written atomically (the demo's broker).

kombu's ``filesystem`` transport creates a message file under its final name and
writes it afterwards; a worker polling the folder can move and read the file
while it is still empty and crash with ``JSONDecodeError`` (seen in the demo's
runs on this 2-core machine). Here a message is written under a name no consumer
picks (:func:`part_path`) and renamed into place, which is atomic on one file system.
Everything else is kombu's own.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps as _dumps

dumps: Any = _dumps  # untyped in kombu
__all__ = ["Transport", "part_path"]


def part_path(final: str) -> str:
    """Where the message *final* (``<stamp>_<uuid>.<queue>.msg``) is written before it is
    renamed into place: ``<stamp>_<uuid>.<queue>.part``, beside it. No kombu version
    reads it as a message: before 5.7 a reader takes every name that contains
    ``.<queue>.msg`` (``….msg.part`` too), from 5.7 on one whose part after the first
    dot is ``<queue>.msg``."""
    return final.removesuffix(".msg") + ".part"


class Channel(filesystem.Channel):
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        name = f"{time.monotonic() * 1000:.0f}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = part_path(final)
        try:
            with open(partial, "w", encoding="utf-8") as file:
                file.write(dumps(payload))  # kombu's JSON, as its own _put writes it
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
