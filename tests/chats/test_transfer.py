"""Chat data to and from files, without Qt: export, all-or-nothing import and delete-all, on real files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.chats.store import ChatStore
from app.chats.transfer import (
    ImportFailed,
    damaged_copies,
    data_summary,
    delete_all_data,
    export_all_json,
    export_file_name,
    export_markdown,
    import_json_file,
)
from app.paths import write_atomic
from tests.support.chats import fill_store, snapshot

BAD_IMPORTS = [
    (b"{not json", "is not JSON (line 1"),
    (b"\xff\xfe\x00garbage", "is not a text file"),
    (b'{"format": "something-else", "conversations": []}', "not a Foresight chat export"),
    (b'{"format": "foresight-chats"}', "no 'conversations' list"),
    (b'{"format": "foresight-chats", "conversations": [5]}', "conversation 1 is not an object"),
    (
        b'{"format": "foresight-chats", "conversations": [{"title": "ok", "messages": []},'
        b' {"title": "bad", "settings": [1], "messages": []}]}',
        "the settings of conversation 2 are not an object",
    ),
    (
        b'{"format": "foresight-chats", "conversations": [{"title": "ok", "messages": 3}]}',
        "the messages of conversation 1 are not a list of objects",
    ),
    (  # the first conversation is fine, the second fails inside the store's transaction
        b'{"format": "foresight-chats", "conversations": [{"title": "ok", "messages":'
        b' [{"role": "user", "content": "hi"}]}, {"title": "bad", "messages": [{"role": "robot",'
        b' "content": "x"}]}]}',
        "conversation 2 of the import is malformed",
    ),
]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def test_an_export_imports_into_a_fresh_store_as_it_was(store: ChatStore, tmp_path: Path) -> None:
    fill_store(store)
    out = tmp_path / "export.json"
    assert export_all_json(store, out) == 2
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["format"] == "foresight-chats"
    assert [c["title"] for c in data["conversations"]] == ["Rust", "Kyoto trip"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".export")] == []  # no temp left
    with ChatStore(tmp_path / "fresh.sqlite3") as fresh:
        assert import_json_file(fresh, out) == 2
        assert snapshot(fresh) == snapshot(store)
        assert import_json_file(fresh, out) == 2  # imported again: added again, nothing merged
        assert data_summary(fresh) == (4, 8)


def test_markdown_export_and_its_file_name(store: ChatStore, tmp_path: Path) -> None:
    kyoto, rust = fill_store(store)
    out = tmp_path / "kyoto.md"
    export_markdown(store, kyoto, out)
    assert out.read_text(encoding="utf-8") == (
        "# Kyoto trip\n\n**System:** Be brief.\n\n"
        "## User\n\nWhere to go?\nTwo lines.\n\n## Assistant\n\nFushimi **Inari**\n"
    )
    export_markdown(store, rust, out)
    assert "## Assistant *(stopped)*\n\nhalf an answer" in out.read_text(encoding="utf-8")
    assert export_file_name("Kyoto trip", ".md") == "Kyoto trip.md"
    assert export_file_name("a/b: *c*?", ".md") == "ab c.md"  # nothing a file system refuses
    assert export_file_name("???", ".json") == "conversation.json"
    assert export_file_name("x" * 100, ".md") == "x" * 60 + ".md"


@pytest.mark.parametrize(("content", "message"), BAD_IMPORTS)
def test_a_bad_import_file_is_refused_by_name_and_adds_nothing(
    store: ChatStore, tmp_path: Path, content: bytes, message: str
) -> None:
    fill_store(store)
    before = snapshot(store)
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(ImportFailed, match=r"^bad\.json") as refused:
        import_json_file(store, bad)
    assert message in str(refused.value)
    assert snapshot(store) == before


def test_an_import_of_a_missing_file_says_it_could_not_be_read(store: ChatStore, tmp_path: Path) -> None:
    with pytest.raises(ImportFailed, match=r"gone\.json could not be read"):
        import_json_file(store, tmp_path / "gone.json")
    assert store.conversations() == []


def test_delete_all_takes_the_conversations_and_the_damaged_copies(store: ChatStore, tmp_path: Path) -> None:
    fill_store(store)
    assert data_summary(store) == (2, 4)
    damaged = tmp_path / "chats.damaged-20240101-000000.sqlite3"
    damaged.write_bytes(b"old conversations")
    unrelated = tmp_path / "other.damaged-20240101-000000.sqlite3"  # another store's: not ours to delete
    unrelated.write_bytes(b"someone else's")
    assert damaged_copies(store) == [damaged]
    assert delete_all_data(store) == [damaged]
    assert data_summary(store) == (0, 0)
    assert not damaged.exists()
    assert unrelated.exists()
    store.close()
    with ChatStore(tmp_path / "chats.sqlite3") as reopened:
        assert reopened.conversations() == []


def test_write_atomic_keeps_the_old_file_when_the_write_fails(tmp_path: Path) -> None:
    target = tmp_path / "export.json"
    target.write_text("old")

    with pytest.raises(TypeError):
        write_atomic(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["export.json"]
    write_atomic(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["export.json"]
