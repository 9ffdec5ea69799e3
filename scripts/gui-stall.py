"""How long the window's event loop stalls while an answer streams at full speed (reported, not asserted).

The real window runs (offscreen unless a display is set) with its own engine process; a 1 ms timer
ticks through a long answer, and the longest gap between ticks is the longest stall a user could feel.

  QT_QPA_PLATFORM=offscreen python scripts/gui-stall.py [--target gemma-3-270m] [--tokens 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import itertools

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.catalog.packaged import resolve_model
from app.chats.store import ChatStore
from app.config import SamplingSettings
from app.services.engine import EngineLaunch
from app.ui.main_window import MainWindow
from app.ui.session import WindowSession

PROMPT = "Write a long story about a lighthouse keeper and a storm, with many details."


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--tokens", type=int, default=500)
    a = ap.parse_args()
    app = QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory() as tmp, ChatStore(Path(tmp) / "chats.sqlite3") as store:
        window = MainWindow(
            store,
            EngineLaunch(str(resolve_model(a.target)), draft={"mode": "ngram"}, engine={"n_ctx": 2048}),
            sampling=SamplingSettings(temperature=0.8, seed=7, max_tokens=a.tokens),
            session=WindowSession(Path(tmp) / "window.ini"),  # not the user's window
        )
        window.show()
        ticks: list[float] = []
        streaming: dict = {"first": None, "usage": {}}
        timer = QTimer(interval=1)
        timer.timeout.connect(lambda: ticks.append(time.perf_counter()))

        def first_delta(_text: str) -> None:
            if streaming["first"] is None:
                streaming["first"] = time.perf_counter()
                ticks.clear()

        def ready(_port: int) -> None:
            window.send(PROMPT)
            answer = window.conversation.answer
            assert answer is not None
            answer.stream.delta.connect(first_delta)
            timer.start()

        window.engine.ready.connect(ready)

        def finished(_status: str, _usage: dict) -> None:
            timer.stop()
            streaming["end"] = time.perf_counter()
            current = window.conversation.current
            answer = store.messages(current)[-1] if current is not None else None
            streaming["usage"] = (answer.stats or {}) if answer else {}
            app.quit()

        window.conversation.answerFinished.connect(finished)
        window.start_engine()
        app.exec()
        end = streaming.get("end", time.perf_counter())
        window.close()
    gaps = [(b - a_) * 1e3 for a_, b in itertools.pairwise(ticks)]
    tokens = streaming["usage"].get("emitted", 0)
    seconds = end - (streaming["first"] or end)
    if not gaps:
        print("no answer streamed")
        return 1
    p99 = statistics.quantiles(gaps, n=100)[98]
    print(
        f"{tokens} tokens streamed in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.0f} tok/s); "
        f"event loop: longest stall {max(gaps):.1f} ms, 99th percentile {p99:.1f} ms, "
        f"median tick {statistics.median(gaps):.2f} ms over {len(gaps)} ticks"
    )
    start = streaming["first"] or ticks[0]
    worst = sorted(range(len(gaps)), key=gaps.__getitem__, reverse=True)[:3]
    print("longest stalls at " + ", ".join(f"{ticks[i] - start:.2f} s ({gaps[i]:.1f} ms)" for i in worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
