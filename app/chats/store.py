"""The conversation store: one SQLite file in WAL mode, one transaction per message, a schema version.

Every write commits before it returns, with `synchronous=FULL`, so a kill at any moment loses at most
the write in flight and never corrupts the file. An answer being streamed is stored as it grows,
marked `streaming`; opening the store marks any answer still `streaming` as `interrupted` (the engine
or the app died mid-answer), so the partial text is kept and shown for what it is. A file that is not
a readable database is moved aside and a fresh store started; `recovered_from` names the backup so
the GUI can say so.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
ROLES = ("system", "user", "assistant")
STATUSES = ("complete", "streaming", "interrupted", "stopped", "error")
EXPORT_FORMAT = "foresight-chats"
IMAGE_URI_PREFIXES = tuple(f"data:image/{kind};base64," for kind in ("png", "jpeg", "webp"))

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        settings TEXT NOT NULL DEFAULT '{}',
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL DEFAULT '',
        images TEXT NOT NULL DEFAULT '[]',
        status TEXT NOT NULL DEFAULT 'complete'
            CHECK (status IN ('complete', 'streaming', 'interrupted', 'stopped', 'error')),
        stats TEXT,
        created REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    # where an answer's text came from accepted drafts: [start, end) character ranges, as JSON
    2: "ALTER TABLE messages ADD COLUMN draft_spans TEXT NOT NULL DEFAULT '[]'",
}


_INSERT_CONVERSATION = (
    "INSERT INTO conversations(title, system_prompt, settings, created, updated) VALUES (?,?,?,?,?)"
)
_INSERT_MESSAGE = (
    "INSERT INTO messages(conversation_id, role, content, images, status, stats, created, draft_spans) "
    "VALUES (?,?,?,?,?,?,?,?)"
)


class ChatStoreError(RuntimeError):
    """A store operation that cannot be done (unknown conversation, bad import file)."""


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    status: str = "complete"
    images: list[str] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    created: float = 0.0
    draft_spans: list[list[int]] = field(default_factory=list)  # text that came from accepted drafts

    def as_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "content": self.content,
            "status": self.status,
            "images": self.images,
            "stats": self.stats,
            "created": self.created,
            "draft_spans": self.draft_spans,
        }


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(
        row["id"],
        row["title"],
        row["system_prompt"],
        json.loads(row["settings"]),
        row["created"],
        row["updated"],
    )


def _message(row: sqlite3.Row) -> Message:
    return Message(
        row["id"],
        row["conversation_id"],
        row["role"],
        row["content"],
        row["status"],
        json.loads(row["images"]),
        json.loads(row["stats"]) if row["stats"] else None,
        row["created"],
        json.loads(row["draft_spans"]),
    )


class ChatStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.recovered_from: Path | None = None  # set when a damaged file was moved aside
        self._lock = threading.RLock()
        try:
            self._db = self._open()
        except sqlite3.OperationalError:
            raise  # locked, unreadable, no room: the file may be fine, so it is left where it is
        except sqlite3.DatabaseError as exc:
            self.recovered_from = self._set_aside(str(exc))
            self._db = self._open()
        self.interrupted_on_open = self._mark_interrupted()

    # --- opening, migrations, recovery --------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA foreign_keys=ON")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {check}")
            self._migrate(db)
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _migrate(self, db: sqlite3.Connection) -> None:
        for target in range(1, SCHEMA_VERSION + 1):
            # one transaction per step: the schema and its version number change together or not at all;
            # the version is read under the write lock, so two processes opening an old file at once
            # migrate it once
            db.execute("BEGIN IMMEDIATE")
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise ChatStoreError(
                        f"{self.path} was written by a newer Foresight (schema {version}, this one knows "
                        f"{SCHEMA_VERSION}): update the app; the file was not changed"
                    )
                if version < target:
                    for statement in _MIGRATIONS[target].split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute(f"PRAGMA user_version={target}")
                    log.info("chat store %s migrated to schema %d", self.path, target)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _set_aside(self, why: str) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = self.path.with_name(f"{self.path.stem}.damaged-{stamp}{self.path.suffix}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                src.replace(Path(str(backup) + suffix))
        log.error(
            "chat store %s could not be read (%s): moved to %s, starting a fresh one", self.path, why, backup
        )
        return backup

    def _mark_interrupted(self) -> int:
        with self._write() as db:
            return db.execute("UPDATE messages SET status='interrupted' WHERE status='streaming'").rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One committed transaction; BEGIN IMMEDIATE takes the write lock up front (other processes wait)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # --- conversations -----------------------------------------------------------------------

    def create_conversation(
        self, title: str = "New chat", system_prompt: str = "", settings: dict | None = None
    ) -> Conversation:
        now = time.time()
        with self._write() as db:
            cur = db.execute(
                _INSERT_CONVERSATION,
                (title, system_prompt, json.dumps(settings or {}), now, now),
            )
        return self.conversation(int(cur.lastrowid))

    def conversation(self, conversation_id: int) -> Conversation:
        rows = self._read("SELECT * FROM conversations WHERE id=?", (conversation_id,))
        if not rows:
            raise ChatStoreError(f"no conversation {conversation_id}")
        return _conversation(rows[0])

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches titles and message text, case-insensitively."""
        if not search:
            rows = self._read("SELECT * FROM conversations ORDER BY updated DESC, id DESC")
        else:
            like = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self._read(
                "SELECT * FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS "
                "(SELECT 1 FROM messages m WHERE m.conversation_id=c.id AND m.content LIKE ?1 ESCAPE '\\') "
                "ORDER BY updated DESC, id DESC",
                (like,),
            )
        return [_conversation(r) for r in rows]

    def update_conversation(self, conversation_id: int, **fields: Any) -> Conversation:
        """Change title, system_prompt and/or settings."""
        allowed = {"title", "system_prompt", "settings"}
        if not fields or set(fields) - allowed:
            raise ChatStoreError(f"can change only {sorted(allowed)}, not {sorted(set(fields) - allowed)}")
        values = {k: json.dumps(v) if k == "settings" else v for k, v in fields.items()}
        sets = ", ".join(f"{k}=?" for k in values)
        with self._write() as db:
            cur = db.execute(
                f"UPDATE conversations SET {sets}, updated=? WHERE id=?",
                (*values.values(), time.time(), conversation_id),
            )
            if cur.rowcount == 0:
                raise ChatStoreError(f"no conversation {conversation_id}")
        return self.conversation(conversation_id)

    def delete_conversation(self, conversation_id: int) -> None:
        with self._write() as db:
            db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def delete_all(self) -> None:
        """'Delete all my data': every conversation and message, then the free pages are wiped."""
        with self._write() as db:
            db.execute("DELETE FROM messages")
            db.execute("DELETE FROM conversations")
        with self._lock:
            self._db.execute("VACUUM")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # --- messages ----------------------------------------------------------------------------

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        status: str = "complete",
        images: list[str] | None = None,
        stats: dict | None = None,
    ) -> Message:
        if role not in ROLES:
            raise ChatStoreError(f"unknown role {role!r}")
        if status not in STATUSES:
            raise ChatStoreError(f"unknown status {status!r}")
        now = time.time()
        with self._write() as db:
            if not db.execute("SELECT 1 FROM conversations WHERE id=?", (conversation_id,)).fetchone():
                raise ChatStoreError(f"no conversation {conversation_id}")
            cur = db.execute(
                _INSERT_MESSAGE,
                (conversation_id, role, content, json.dumps(images or []), status, _stats(stats), now, "[]"),
            )
            db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))
        return self.message(int(cur.lastrowid))

    def begin_answer(self, conversation_id: int) -> Message:
        """An assistant message that will grow while it streams (status 'streaming')."""
        return self.add_message(conversation_id, "assistant", "", status="streaming")

    def update_answer(
        self,
        message_id: int,
        content: str,
        status: str = "streaming",
        stats: dict | None = None,
        draft_spans: list[list[int]] | None = None,
    ) -> None:
        """Store the answer so far (the GUI calls this every few hundred ms and at the end)."""
        if status not in STATUSES:
            raise ChatStoreError(f"unknown status {status!r}")
        spans = json.dumps([[int(a), int(b)] for a, b in draft_spans]) if draft_spans is not None else None
        with self._write() as db:
            db.execute(
                "UPDATE messages SET content=?, status=?, stats=COALESCE(?, stats), "
                "draft_spans=COALESCE(?, draft_spans) WHERE id=?",
                (content, status, _stats(stats), spans, message_id),
            )

    def message(self, message_id: int) -> Message:
        rows = self._read("SELECT * FROM messages WHERE id=?", (message_id,))
        if not rows:
            raise ChatStoreError(f"no message {message_id}")
        return _message(rows[0])

    def messages(self, conversation_id: int) -> list[Message]:
        return [
            _message(r)
            for r in self._read(
                "SELECT * FROM messages WHERE conversation_id=? ORDER BY id", (conversation_id,)
            )
        ]

    def truncate_from(self, message_id: int) -> None:
        """Drop a message and everything after it in its conversation (regenerate, edit and resend)."""
        msg = self.message(message_id)
        with self._write() as db:
            db.execute(
                "DELETE FROM messages WHERE conversation_id=? AND id>=?", (msg.conversation_id, message_id)
            )

    # --- export / import (the JSON format; files and Markdown: app.chats.transfer) ----------------

    def export_json(self, conversation_ids: list[int] | None = None) -> dict[str, Any]:
        ids = conversation_ids if conversation_ids is not None else [c.id for c in self.conversations()]
        out = []
        for cid in ids:
            c = self.conversation(cid)
            out.append(
                {
                    "title": c.title,
                    "system_prompt": c.system_prompt,
                    "settings": c.settings,
                    "created": c.created,
                    "messages": [m.as_dict() for m in self.messages(cid)],
                }
            )
        return {"format": EXPORT_FORMAT, "version": 1, "conversations": out}

    def import_json(self, data: dict[str, Any]) -> int:
        """Add the conversations of an export (all or nothing); returns how many were added."""
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            raise ChatStoreError("not a Foresight chat export (the 'format' field is missing or different)")
        convs = data.get("conversations")
        if not isinstance(convs, list):
            raise ChatStoreError("the export has no 'conversations' list")
        with self._write() as db:
            for n, c in enumerate(convs):
                try:
                    now = float(c.get("created") or time.time())
                    if not isinstance(c.get("settings") or {}, dict):
                        raise ValueError("settings must be an object")
                    cur = db.execute(
                        _INSERT_CONVERSATION,
                        (
                            str(c["title"]),
                            str(c.get("system_prompt", "")),
                            json.dumps(c.get("settings") or {}),
                            now,
                            now,
                        ),
                    )
                    for m in c.get("messages", []):
                        status = m.get("status", "complete")
                        images = m.get("images") or []
                        if not isinstance(images, list) or not all(map(_is_image_uri, images)):
                            raise ValueError("images must be a list of PNG, JPEG or WebP data URIs")
                        db.execute(
                            _INSERT_MESSAGE,
                            (
                                cur.lastrowid,
                                m["role"],
                                str(m["content"]),
                                json.dumps(images),
                                "interrupted" if status == "streaming" else status,
                                _stats(m.get("stats")),
                                float(m.get("created") or now),
                                json.dumps([[int(a), int(b)] for a, b in m.get("draft_spans") or []]),
                            ),
                        )
                except (KeyError, TypeError, ValueError, AttributeError, sqlite3.IntegrityError) as exc:
                    raise ChatStoreError(f"conversation {n + 1} of the import is malformed: {exc}") from exc
        return len(convs)


def _is_image_uri(uri: Any) -> bool:
    return isinstance(uri, str) and uri.startswith(IMAGE_URI_PREFIXES) and "," in uri


def _stats(stats: dict | None) -> str | None:
    return json.dumps(stats) if stats is not None else None


def trim_to_context(
    messages: list[dict[str, Any]], count_tokens: Callable[[list[dict[str, Any]]], int], budget: int
) -> tuple[list[dict[str, Any]], int]:
    """Leave out the oldest turns until the prompt fits `budget` tokens; system messages always stay.

    Returns (the messages to send, how many were left out). The newest message is never dropped: if it
    alone does not fit, the engine answers with its context_length_exceeded error.
    """
    system = [m for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    dropped = 0
    while len(rest) > 1 and count_tokens(system + rest) > budget:
        rest.pop(0)
        dropped += 1
    return system + rest, dropped
