"""The conversation store: a real SQLite file, concurrent writers, a writer killed mid-write, damage."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from app.chats.store import _MIGRATIONS, SCHEMA_VERSION, ChatStore, ChatStoreError, trim_to_context
from app.chats.transfer import markdown_of


@pytest.fixture
def store(tmp_path: Path) -> ChatStore:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def test_conversations_and_messages_round_trip(store: ChatStore) -> None:
    c = store.create_conversation("Trip", system_prompt="Be brief.", settings={"temperature": 0.2})
    store.add_message(c.id, "user", "Where to go in Kyoto?")
    answer = store.begin_answer(c.id)
    store.update_answer(answer.id, "Fushimi Inari", status="complete", stats={"tokens_per_second": 40.0})
    got = store.messages(c.id)
    assert [(m.role, m.content, m.status) for m in got] == [
        ("user", "Where to go in Kyoto?", "complete"),
        ("assistant", "Fushimi Inari", "complete"),
    ]
    assert got[1].stats == {"tokens_per_second": 40.0}
    assert store.conversation(c.id).settings == {"temperature": 0.2}
    store.update_conversation(c.id, title="Kyoto")
    other = store.create_conversation("Rust")
    store.add_message(other.id, "user", "borrow checker 100%_done")
    assert [x.title for x in store.conversations()] == ["Rust", "Kyoto"]
    assert [x.title for x in store.conversations("inari")] == ["Kyoto"]
    assert [x.title for x in store.conversations("100%_")] == ["Rust"]  # LIKE wildcards are literal
    store.truncate_from(answer.id)  # regenerate: the answer and what follows go
    assert [m.role for m in store.messages(c.id)] == ["user"]
    store.delete_conversation(other.id)
    assert [x.title for x in store.conversations()] == ["Kyoto"]
    with pytest.raises(ChatStoreError, match="no conversation"):
        store.add_message(other.id, "user", "x")
    with pytest.raises(ChatStoreError, match="unknown role"):
        store.add_message(c.id, "robot", "x")


def test_an_answer_streaming_when_the_app_died_is_kept_as_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    first = ChatStore(path)
    c = first.create_conversation()
    first.add_message(c.id, "user", "Explain TCP")
    answer = first.begin_answer(c.id)
    first.update_answer(answer.id, "TCP is a reliable")
    del first  # no close: as if the process had died here
    again = ChatStore(path)
    assert again.interrupted_on_open == 1
    kept = again.messages(c.id)[-1]
    assert (kept.content, kept.status) == ("TCP is a reliable", "interrupted")


def test_export_and_import_json_and_markdown(store: ChatStore, tmp_path: Path) -> None:
    c = store.create_conversation("Haiku", system_prompt="You are a poet.")
    store.add_message(c.id, "user", "A haiku about rain", images=["data:image/png;base64,AAAA"])
    store.add_message(c.id, "assistant", "Soft rain on the roof", status="stopped")
    data = json.loads(json.dumps(store.export_json()))
    markdown = markdown_of(store, c.id)
    assert "# Haiku" in markdown
    assert "## Assistant *(stopped)*" in markdown
    assert "Soft rain on the roof" in markdown
    with ChatStore(tmp_path / "other.sqlite3") as other:
        assert other.import_json(data) == 1
        (imported,) = other.conversations()
        assert imported.system_prompt == "You are a poet."
        msgs = other.messages(imported.id)
        assert msgs[0].images == ["data:image/png;base64,AAAA"]
        assert msgs[1].status == "stopped"
        broken = {"format": "foresight-chats", "conversations": [{"title": "ok"}, {"messages": []}]}
        with pytest.raises(ChatStoreError, match="conversation 2"):
            other.import_json(broken)
        assert len(other.conversations()) == 1  # all or nothing
        with pytest.raises(ChatStoreError, match="not a Foresight chat export"):
            other.import_json({"conversations": []})


def test_delete_all_my_data_leaves_nothing_readable(store: ChatStore) -> None:
    c = store.create_conversation("secret plans")
    store.add_message(c.id, "user", "the launch code is 0000-SECRET")
    store.delete_all()
    assert store.conversations() == []
    assert b"0000-SECRET" not in store.path.read_bytes()
    wal = Path(str(store.path) + "-wal")
    assert not wal.exists() or b"0000-SECRET" not in wal.read_bytes()


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as s:
        cid = s.create_conversation("busy").id
    n_threads, n_processes, per_writer = 4, 2, 50
    # threads sharing one store (the GUI thread and a download thread), and other processes (a second
    # window, the CLI) writing the same file at the same time
    shared = ChatStore(path)
    errors: list[BaseException] = []

    def thread_writer(k: int) -> None:
        try:
            for i in range(per_writer):
                shared.add_message(cid, "user", f"thread {k} message {i}")
        except BaseException as exc:
            errors.append(exc)

    code = textwrap.dedent(f"""
        import sys
        from app.chats.store import ChatStore
        s = ChatStore(sys.argv[1])
        for i in range({per_writer}):
            s.add_message({cid}, "user", f"process {{sys.argv[2]}} message {{i}}")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(k)]) for k in range(n_processes)]
    threads = [threading.Thread(target=thread_writer, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.wait(120) for p in procs] == [0] * n_processes
    assert not errors
    contents = {m.content for m in shared.messages(cid)}
    assert len(contents) == (n_threads + n_processes) * per_writer
    shared.close()


def test_a_writer_killed_mid_write_leaves_a_sound_file_with_every_committed_message(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as s:
        cid = s.create_conversation("killed").id
    code = textwrap.dedent(f"""
        import sys
        from app.chats.store import ChatStore
        s = ChatStore(sys.argv[1])
        answer = s.begin_answer({cid})
        text = ""
        i = 0
        while True:
            i += 1
            s.add_message({cid}, "user", "x" * 2000 + str(i))
            text += "word "
            s.update_answer(answer.id, text)
            print(i, flush=True)  # printed only after both writes committed
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    committed = 0
    deadline = time.monotonic() + 60
    while committed < 200 and time.monotonic() < deadline:
        committed = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    with ChatStore(path) as s:
        assert s.recovered_from is None
        assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        msgs = s.messages(cid)
        users = [m for m in msgs if m.role == "user"]
        assert len(users) >= committed  # every acknowledged write is there (one more may have landed)
        (answer,) = [m for m in msgs if m.role == "assistant"]
        assert answer.status == "interrupted"
        assert answer.content.count("word") >= committed


def test_a_damaged_file_is_backed_up_and_a_fresh_store_started(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as s:
        s.add_message(s.create_conversation().id, "user", "hello")
    raw = bytearray(path.read_bytes())
    raw[0:16] = b"definitely not!!"  # the SQLite header is gone
    path.write_bytes(bytes(raw))
    with ChatStore(path) as s:
        assert s.recovered_from is not None
        assert s.recovered_from.read_bytes() == bytes(raw)  # the damaged file is kept for rescue
        assert s.conversations() == []
        s.create_conversation("works again")
    with ChatStore(path) as s:
        assert [c.title for c in s.conversations()] == ["works again"]
        assert s.recovered_from is None


def test_a_store_from_a_newer_version_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path):
        pass
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    before = path.read_bytes()
    with pytest.raises(ChatStoreError, match="newer Foresight"):
        ChatStore(path)
    assert path.read_bytes() == before


def test_trim_to_context_drops_the_oldest_turns_and_keeps_the_system_prompt() -> None:
    msgs = [{"role": "system", "content": "sys"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "w " * 10} for i in range(6)
    ]

    def count(ms: list[dict]) -> int:
        return sum(len(m["content"].split()) for m in ms)

    kept, dropped = trim_to_context(msgs, count, budget=40)
    assert kept[0]["role"] == "system"
    assert dropped == 3
    assert kept[1:] == msgs[4:]
    assert count(kept) <= 40
    alone, n = trim_to_context([*msgs[:1], {"role": "user", "content": "w " * 100}], count, budget=10)
    assert n == 0
    assert len(alone) == 2  # the newest message is never dropped


def test_a_version_1_store_is_migrated_and_keeps_its_messages(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(_MIGRATIONS[1] + "PRAGMA user_version=1;")
    db.execute("INSERT INTO conversations(title, created, updated) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages(conversation_id, role, content, created) VALUES (1, 'user', 'hi', 1)")
    db.commit()
    db.close()
    with ChatStore(path) as store:
        (conv,) = store.conversations()
        (msg,) = store.messages(conv.id)
        assert (msg.content, msg.draft_spans) == ("hi", [])
        answer = store.begin_answer(conv.id)
        store.update_answer(answer.id, "abcdef", draft_spans=[[0, 3]])
        store.update_answer(answer.id, "abcdefgh")  # spans not given: kept
        assert store.message(answer.id).draft_spans == [[0, 3]]
        exported = store.export_json()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    with ChatStore(tmp_path / "other.sqlite3") as other:
        other.import_json(exported)
        (conv,) = other.conversations()
        assert other.messages(conv.id)[-1].draft_spans == [[0, 3]]


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "hi", "images": "data:image/png;base64,AAAA"},  # a string, not a list
        {"role": "user", "content": "hi", "images": ["file:///etc/passwd"]},
        {"role": "user", "content": "hi", "images": [42]},
    ],
    ids=["string", "file-url", "number"],
)
def test_an_import_with_bad_images_adds_nothing(store: ChatStore, message: dict) -> None:
    conversation = {"title": "x", "messages": [message]}
    data = {"format": "foresight-chats", "version": 1, "conversations": [conversation]}
    with pytest.raises(ChatStoreError, match="images"):
        store.import_json(data)
    assert store.conversations() == []


def test_an_import_with_settings_that_are_not_an_object_adds_nothing(store: ChatStore) -> None:
    data = {"format": "foresight-chats", "version": 1, "conversations": [{"title": "x", "settings": [1]}]}
    with pytest.raises(ChatStoreError, match="settings"):
        store.import_json(data)
    assert store.conversations() == []
