"""kombu's filesystem transport, with messages written atomically.

The stock transport creates a message file and then writes into it, while
the consumer moves away and reads any file whose name matches: a consumer
polling at the wrong instant reads an empty file, fails to decode it, and
the worker's consumer stops with ``JSONDecodeError: Expecting value`` (kombu
issue #1551). Here the message is written under a temporary name the
consumer ignores, then renamed into place, and a rename within one folder is
atomic. Everything else is the stock transport.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    """Writes each message to ``.<name>.tmp`` first, then renames it."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # Same name shape as the stock transport: "<ms>_<uuid>.<queue>.msg",
        # so ordering and queue matching are unchanged.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: the consumer only takes names whose text after the
        # first dot is "<queue>.msg", which a ".<name>.tmp" file never matches.
        temporary = os.path.join(self.data_folder_out, f".{name}.tmp")
        try:
            with open(temporary, "wb") as out:
                out.write(str_to_bytes(dumps(payload)))
            os.replace(temporary, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    """The filesystem transport with :class:`Channel`."""

    Channel = Channel
