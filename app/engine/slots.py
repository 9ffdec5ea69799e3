"""KV slots: which sequence of the target's cache a request runs in, so each client reuses its own prefix.

A slot is one llama.cpp sequence, the tokens it keeps and the client that left them there. A request goes
to the idle slot of its own client whose tokens share the longest prefix with its prompt; failing that, to
an empty slot, else to the least recently used idle one, which is emptied first when another client left
it. A prefix never serves another client, so `cached_tokens` tells a client nothing of anyone else's
prompts (a client is the window, an API key or a remote address: the server names it).

All slots share the context's cells (llama.cpp's unified cache): room for a request is made by emptying
idle slots, least recently used first. A backend with one sequence (our kernels) has one slot, emptied
whenever another client takes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from app.engine.backends.base import Backend, BatchingBackend
from app.engine.drafting.drafters import common_prefix

MIN_SHARED = 2  # a slot shares less than this (its BOS at most) with a prompt: an empty one is taken first


@dataclass
class Slot:
    seq: int
    client: str = ""
    last_used: int = 0  # the tick of its last release: the least recently used slot is emptied first
    busy: bool = False
    reserved: int = 0  # while busy: the cells its generation may grow to


class NoIdleSlot(RuntimeError):
    """Every slot runs a generation (a scheduler admits at most as many streams as there are slots)."""


class Slots:
    """The target's KV slots and the clients whose prefixes they keep."""

    def __init__(self, target: Backend) -> None:
        self.target = target
        self._multi = cast(BatchingBackend, target) if target.n_seq > 1 else None
        self.slots = [Slot(i) for i in range(self._multi.n_seq if self._multi else 1)]
        self._tick = 0
        self.last: Slot = self.slots[0]  # the slot the last generation ended in

    def tokens(self, slot: Slot) -> list[int]:
        """The tokens the slot's sequence keeps."""
        return self._multi.seq_tokens(slot.seq) if self._multi else self.target.kv_tokens

    def select(self, slot: Slot) -> None:
        """Make the slot's sequence the one the target's Backend calls act on."""
        if self._multi:
            self._multi.select(slot.seq)

    def empty(self, slot: Slot) -> None:
        if self._multi:
            self._multi.rollback_seq(slot.seq, 0)
        else:
            self.target.rollback(0)

    def empty_others(self, slot: Slot) -> None:
        """Empty every slot but this one (a reproducible request runs alone in the cache)."""
        for other in self.slots:
            if other is not slot:
                assert not other.busy, "a reproducible request runs alone"
                self.empty(other)

    def _held(self, slot: Slot) -> int:
        """Cells a slot holds, or may come to hold while it runs a generation."""
        return max(len(self.tokens(slot)), slot.reserved) if slot.busy else len(self.tokens(slot))

    def fits(self, need: int) -> bool:
        """Whether an idle slot is left and a generation of `need` cells fits beside the running ones
        (idle slots are emptied to make the room)."""
        busy = [s for s in self.slots if s.busy]
        return len(busy) < len(self.slots) and sum(self._held(s) for s in busy) + need <= self.target.n_ctx

    def acquire(self, client: str, prompt: list[int], need: int) -> Slot:
        """The slot this client's prompt runs in, marked busy, with room for `need` tokens in it."""
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            raise NoIdleSlot(f"all {len(self.slots)} KV slots are busy")
        own = [(common_prefix(self.tokens(s), prompt), s.last_used, s) for s in idle if s.client == client]
        shared, _, slot = max(own, key=lambda t: t[:2], default=(0, 0, None))
        if slot is None or shared < MIN_SHARED:
            empty = [s for s in idle if not self.tokens(s)]
            slot = empty[0] if empty else min(idle, key=lambda s: s.last_used)
        if slot.client != client:
            self.empty(slot)  # another client's prefix: never reused, never reported
            slot.client = client
        slot.busy, slot.reserved = True, need
        self._make_room()
        return slot

    def release(self, slot: Slot) -> None:
        self._tick += 1
        slot.busy, slot.last_used, slot.reserved = False, self._tick, 0
        self.last = slot

    def _make_room(self) -> None:
        """Empty idle slots, least recently used first, until every busy slot can grow as it reserved."""
        for idle in sorted((s for s in self.slots if not s.busy), key=lambda s: s.last_used):
            if sum(self._held(s) for s in self.slots) <= self.target.n_ctx:
                return
            self.empty(idle)

    def figures(self, slots: list[Slot] | None = None) -> tuple[int, int]:
        """(tokens these slots keep, cells llama.cpp's cache holds for them): equal unless cells leaked.
        All slots by default."""
        if not self._multi:
            return len(self.target.kv_tokens), self.target.kv_pos_max() + 1
        cells = 0
        for s in slots or self.slots:
            low, high = self._multi.seq_cells(s.seq)
            cells += high - low + 1 if high >= 0 else 0
        return sum(len(self.tokens(s)) for s in slots or self.slots), cells
