"""Chunks: how one tick's claims are split and in which order a node walks them.

Pure functions, no I/O. A big batch is sorted by job name and cut into chunks of
at most ``elarion_beat_claim_chunk`` entries, small enough that every live node
gets a chunk of its own to start at. Every node walks the same chunks in the
same cyclic order but starts at its own rank among the live nodes, so the nodes
of a cluster win different chunks and publish in parallel, and a node killed
mid-batch loses at most one chunk.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["chunk_size", "first_chunk", "rotated_chunks"]

T = TypeVar("T")


def chunk_size(entries: int, limit: int, live: int) -> int:
    """At most *limit*, and no bigger than one live node's share of *entries*."""
    share = -(-entries // live) if live > 1 else entries
    return max(1, min(limit, share))


def first_chunk(chunks: int, node: str, live: Sequence[str]) -> int:
    """*node*'s starting chunk: its rank among the *live* nodes (sorted), spread over
    the chunks; a node not (yet) among them starts where its name's hash says."""
    if chunks <= 1:
        return 0
    if node in live:
        return live.index(node) * chunks // len(live)
    return zlib.crc32(node.encode()) % chunks


def rotated_chunks(items: Sequence[T], key: Callable[[T], str], node: str,
                   live: Sequence[str], limit: int) -> list[list[T]]:
    """*items* sorted by *key*, chunked, in the order *node* claims them."""
    ordered = sorted(items, key=key)
    size = chunk_size(len(ordered), limit, len(live))
    chunks = [ordered[i:i + size] for i in range(0, len(ordered), size)]
    first = first_chunk(len(chunks), node, live)
    return chunks[first:] + chunks[:first]
