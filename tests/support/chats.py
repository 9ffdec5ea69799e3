"""Chat stores for tests: two conversations with prompts, settings and statuses, and a snapshot to compare."""

from __future__ import annotations

from app.chats.store import ChatStore


def fill_store(store: ChatStore) -> list[int]:
    a = store.create_conversation("Kyoto trip", system_prompt="Be brief.", settings={"temperature": 0.2})
    store.add_message(a.id, "user", "Where to go?\nTwo lines.")
    answer = store.begin_answer(a.id)
    store.update_answer(answer.id, "Fushimi **Inari**", status="complete", stats={"emitted": 3})
    b = store.create_conversation("Rust", settings={"seed": 7, "custom": "kept"})
    store.add_message(b.id, "user", "borrow checker?")
    store.add_message(b.id, "assistant", "half an answer", status="stopped")
    return [a.id, b.id]


def snapshot(store: ChatStore) -> list[tuple]:
    return [
        (
            c.title,
            c.system_prompt,
            c.settings,
            c.created,
            [(m.role, m.content, m.status, m.images, m.stats, m.created) for m in store.messages(c.id)],
        )
        for c in sorted(store.conversations(), key=lambda c: (c.created, c.title))
    ]
