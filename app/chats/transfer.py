"""Chat data to and from files: export (JSON, Markdown), import (all or nothing) and delete-all."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from app import paths
from app.chats.store import ChatStore, ChatStoreError


def export_all_json(store: ChatStore, path: Path) -> int:
    """Every conversation to a JSON file (ChatStore's export format); returns how many."""
    data = store.export_json()
    paths.write_atomic(path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    return len(data["conversations"])


def markdown_of(store: ChatStore, conversation_id: int) -> str:
    """A conversation as Markdown: its title, system prompt, and each turn (an unfinished one says why)."""
    c = store.conversation(conversation_id)
    lines = [f"# {c.title}", ""]
    if c.system_prompt:
        lines += ["**System:** " + c.system_prompt, ""]
    for m in store.messages(conversation_id):
        mark = "" if m.status == "complete" else f" *({m.status})*"
        lines += [f"## {m.role.capitalize()}{mark}", "", m.content, ""]
    return "\n".join(lines)


def export_markdown(store: ChatStore, conversation_id: int, path: Path) -> None:
    paths.write_atomic(path, markdown_of(store, conversation_id))


def export_file_name(title: str, suffix: str) -> str:
    """A file name for a conversation's export: its title without characters file systems refuse."""
    stem = re.sub(r"[^\w\- ]+", "", title).strip()[:60] or "conversation"
    return stem + suffix


class ImportFailed(ValueError):
    """An import file that cannot be read or is not a Foresight export; nothing was imported."""


def import_json_file(store: ChatStore, path: Path) -> int:
    """Add the conversations of an export file, all or none; returns how many were added."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ImportFailed(f"{path.name} could not be read: {exc.strerror or exc}.") from exc
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{path.name} is not a text file (JSON is UTF-8 text).") from exc
    except json.JSONDecodeError as exc:
        raise ImportFailed(
            f"{path.name} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from exc
    _check_shape(data, path.name)
    try:
        return store.import_json(data)  # one transaction: a malformed conversation adds none of them
    except ChatStoreError as exc:
        raise ImportFailed(f"{path.name} could not be imported: {exc}.") from exc


def _check_shape(data: Any, name: str) -> None:
    """What ChatStore.import_json would store without complaint but the app cannot use later."""
    convs = data.get("conversations") if isinstance(data, dict) else None
    if not isinstance(convs, list):
        return  # the store says what is wrong with the top level
    for n, c in enumerate(convs, 1):
        if not isinstance(c, dict):
            raise ImportFailed(f"{name}: conversation {n} is not an object.")
        if not isinstance(c.get("settings") or {}, dict):
            raise ImportFailed(f"{name}: the settings of conversation {n} are not an object.")
        messages = c.get("messages", [])
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ImportFailed(f"{name}: the messages of conversation {n} are not a list of objects.")


def data_summary(store: ChatStore) -> tuple[int, int]:
    """(conversations, messages) in the store."""
    convs = store.conversations()
    return len(convs), sum(len(store.messages(c.id)) for c in convs)


def damaged_copies(store: ChatStore) -> list[Path]:
    """Chat files the store set aside as unreadable: they hold old conversations too."""
    return sorted(store.path.parent.glob(f"{store.path.stem}.damaged-*"))


def delete_all_data(store: ChatStore) -> list[Path]:
    """Every conversation and message, and the set-aside damaged copies; returns the copies removed."""
    store.delete_all()
    removed = damaged_copies(store)
    for p in removed:
        p.unlink(missing_ok=True)
    return removed
