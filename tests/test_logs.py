"""Uncaught exceptions reach the log (and the process's way of showing them), from any thread."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_an_uncaught_error_in_a_thread_and_in_the_main_thread_is_logged_and_shown(tmp_path: Path) -> None:
    log_file = tmp_path / "foresight.log"
    code = textwrap.dedent(
        f"""
        import threading
        from pathlib import Path
        from app.logs import install_excepthooks, setup_logging

        setup_logging("INFO", Path({str(log_file)!r}))
        install_excepthooks(show=lambda message: print("SHOWN", message, flush=True))

        def fail():
            raise ValueError("the worker broke")

        thread = threading.Thread(target=fail, name="engine")
        thread.start()
        thread.join()
        raise RuntimeError("the main thread broke")
        """
    )
    script = tmp_path / "crash.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "SHOWN ValueError in thread 'engine': the worker broke" in done.stdout
    assert "SHOWN RuntimeError in the main thread: the main thread broke" in done.stdout
    logged = log_file.read_text()
    assert "CRITICAL foresight.crash: uncaught ValueError in thread 'engine': the worker broke" in logged
    assert 'raise ValueError("the worker broke")' in logged  # with its traceback
    assert "uncaught RuntimeError in the main thread" in logged
