"""What crosses the engine child's connection: loaders (closures) by value, exceptions by type, message and
attributes (their __init__ may take other arguments), the worker's END marker by name."""

from __future__ import annotations

import importlib
import io
import marshal
import pickle
import threading
import types
from multiprocessing.connection import Connection
from typing import Any

from app.server.worker import END


def _rebuild_function(
    code: bytes, module: str, name: str, defaults: Any, kwdefaults: Any, cells: tuple
) -> Any:
    function = types.FunctionType(
        marshal.loads(code),
        importlib.import_module(module).__dict__,
        name,
        defaults,
        tuple(types.CellType(value) for value in cells),
    )
    function.__kwdefaults__ = kwdefaults
    return function


def _rebuild_exception(kind: type[BaseException], message: str, state: dict[str, Any]) -> BaseException:
    exc = kind.__new__(kind)
    exc.args = (message,)
    exc.__dict__.update(state)
    return exc


class _ByValue(pickle.Pickler):
    """Pickles closures by value (code, module, cell values: both processes run the same interpreter and
    sources), and exceptions by type, message and attributes (their __init__ may take other arguments)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.FunctionType) and (obj.__closure__ or "<locals>" in obj.__qualname__):
            cells = tuple(cell.cell_contents for cell in obj.__closure__ or ())
            code = marshal.dumps(obj.__code__)
            return _rebuild_function, (
                code,
                obj.__module__,
                obj.__name__,
                obj.__defaults__,
                obj.__kwdefaults__,
                cells,
            )
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
