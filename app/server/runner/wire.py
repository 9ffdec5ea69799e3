"""What crosses the engine child's connection: messages pickled with exceptions by type, message and
attributes (their __init__ may take other arguments), and the runner's END marker by name."""

from __future__ import annotations

import io
import pickle
import threading
from multiprocessing.connection import Connection
from typing import Any

from app.server.runner.base import END


def _rebuild_exception(kind: type[BaseException], message: str, state: dict[str, Any]) -> BaseException:
    exc = kind.__new__(kind)
    exc.args = (message,)
    exc.__dict__.update(state)
    return exc


class _ByValue(pickle.Pickler):
    """Pickles exceptions by type, message and attributes (their __init__ may take other arguments)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, BaseException):
            state = {k: v for k, v in vars(obj).items() if _picklable(v)}
            return _rebuild_exception, (type(obj), str(obj), state)
        return NotImplemented


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # any failure means "leave it out"
        return False
    return True


def dumps(value: Any) -> bytes:
    out = io.BytesIO()
    _ByValue(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


def send(conn: Connection, lock: threading.Lock, *message: Any) -> None:
    data = dumps(message)
    with lock:
        conn.send_bytes(data)


def to_wire(item: Any) -> Any:
    return "END" if item is END else item


def from_wire(item: Any) -> Any:
    return END if item == "END" else item
