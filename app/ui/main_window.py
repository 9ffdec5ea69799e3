"""The main window: conversations on the left, the streaming chat on the right, the engine below.

The window owns an engine process (app.services.engine) and talks to it over HTTP (app.services.client);
every message and every stretch of a streaming answer goes to the chat store before anything else, so
a crash of the engine or of the app loses nothing but the tokens in flight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QStyle,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from app import keystore
from app.catalog.download import FileSpec, Progress
from app.chats.store import ChatStore, Message, trim_to_context
from app.config import load_settings
from app.services.api_server import ApiKeys
from app.services.client import ChatStream, EngineClient
from app.services.downloads import DownloadTask
from app.services.engine import CRASHED, READY, EngineProcess
from app.ui.api_panel import ApiServerPanel
from app.ui.composer import Composer
from app.ui.devices_panel import DevicesPanel
from app.ui.dialogs import ConversationSettingsDialog, DataActions, SettingsDialog
from app.ui.library_panel import LibraryPanel
from app.ui.transcript import Transcript, add_piece

ICON = Path(__file__).with_name("foresight.png")
SAVE_EVERY_MS = 300  # a streaming answer reaches the store at least this often
RENDER_EVERY_MS = 50
CRASH_GRACE_MS = 1500
CHARS_PER_TOKEN = 3  # a conservative estimate for trimming history before the engine counts exactly


class MainWindow(QMainWindow):
    answerFinished = Signal(str)  # the status the answer ended with: complete, stopped, interrupted, error

    def __init__(
        self,
        store: ChatStore,
        engine_args: list[str],
        n_ctx: int = 4096,
        sampling: dict[str, Any] | None = None,
        api_keys: ApiKeys | None = None,
        api_port: int = 8080,
    ) -> None:
        super().__init__()
        self.store = store
        self.engine_args = engine_args
        self.n_ctx = n_ctx
        self.sampling = {"temperature": 0.7, "max_tokens": 1024, **(sampling or {})}
        self.current: int | None = None
        self._editing: int | None = None  # the question being edited: Send replaces it and what followed
        self._stream: ChatStream | None = None
        self._answer: Message | None = None
        self._answer_text = ""
        self._answer_spans: list[list[int]] = []  # of the answer in flight: text from accepted drafts
        self._context_used = 0  # tokens the conversation takes: the engine's count after an answer
        self._context_estimated = False  # ...or an estimate from the stored text
        self.engine = EngineProcess(self)
        self.client = EngineClient(self)
        self.setWindowTitle("Foresight")
        icon = QIcon(str(ICON))
        if icon.isNull():
            icon = self.style().standardIcon(QStyle.StandardPixmap.SP_ComputerIcon)
        self.setWindowIcon(icon)
        self.resize(1100, 720)
        self.api_panel = ApiServerPanel(self.client, api_keys or ApiKeys(), api_port, self)
        self.devices_panel = DevicesPanel(self.client, _arg(engine_args, "--device") or "auto", self)
        self.devices_panel.deviceChosen.connect(self.use_device)
        models = load_settings().models
        self.library_panel = LibraryPanel(
            self.client,
            models.folder(),
            catalog=Path(models.catalog).expanduser() if models.catalog else None,
            token=keystore.TokenStore().resolve(),
            include_hf_cache=models.hf_cache,
            parent=self,
        )
        self.library_panel.pairLoaded.connect(self._pair_loaded)
        self.library_panel.loadFailed.connect(self._pair_failed)
        self.tray: QSystemTrayIcon | None = None
        self.vision = False  # whether the loaded model reads images (the engine's /props says)
        self._quitting = False
        self._build()
        self.engine.stateChanged.connect(self._engine_state)
        self.engine.ready.connect(self._engine_ready)
        self.engine.crashed.connect(self._engine_crashed)
        self._save_timer = QTimer(self, interval=SAVE_EVERY_MS, timeout=self._save_partial)
        self._render_timer = QTimer(self, singleShot=True, interval=RENDER_EVERY_MS, timeout=self._render)
        if store.recovered_from is not None:
            self._show_banner(
                f"Your chat file could not be read. It was kept as {store.recovered_from.name} and a new "
                "one was started.",
                restart=False,
            )
        self.refresh_conversations()
        self._update_buttons()

    # --- layout ------------------------------------------------------------------------------

    def _build(self) -> None:
        self.search = QLineEdit(placeholderText="Search conversations")
        self.search.textChanged.connect(self.refresh_conversations)
        self.conversation_list = QListWidget()
        self.conversation_list.currentItemChanged.connect(self._conversation_chosen)
        self.conversation_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.conversation_list.customContextMenuRequested.connect(self._conversation_menu)
        self.new_button = QPushButton("New chat")
        self.new_button.clicked.connect(self.new_conversation)
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.addWidget(self.new_button)
        lv.addWidget(self.search)
        lv.addWidget(self.conversation_list)

        self.banner = QLabel(wordWrap=True)
        self.banner.setStyleSheet("background: #fde8e8; color: #7a1010; padding: 8px; border-radius: 4px;")
        self.restart_button = QPushButton("Restart the engine")
        self.restart_button.clicked.connect(self.restart_engine)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.start_download)
        self.download_button.hide()
        banner_row = QWidget()
        br = QHBoxLayout(banner_row)
        br.setContentsMargins(0, 0, 0, 0)
        br.addWidget(self.banner, 1)
        br.addWidget(self.download_button)
        br.addWidget(self.restart_button)
        self.banner_row = banner_row
        banner_row.hide()

        self.transcript = Transcript()
        self.input = Composer()
        self.input.refused.connect(lambda why: self.statusBar().showMessage(why, 8000))
        self.input.changed.connect(self._show_context)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.clicked.connect(self.regenerate)
        self.edit_button = QPushButton("Edit question")
        self.edit_button.setToolTip("Put your last question back in the box; Send replaces it and its answer")
        self.edit_button.clicked.connect(self.edit_last)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.send)
        QShortcut(QKeySequence("Ctrl+N"), self, activated=self.new_conversation)
        QShortcut(QKeySequence("Esc"), self, activated=self.stop)
        buttons = QHBoxLayout()
        buttons.addWidget(self.input.count)
        buttons.addStretch(1)
        for b in (self.edit_button, self.regenerate_button, self.stop_button, self.send_button):
            buttons.addWidget(b)
        right = QWidget()
        rv = QVBoxLayout(right)
        rv.addWidget(banner_row)
        rv.addWidget(self.transcript, 1)
        rv.addWidget(self.input)
        rv.addLayout(buttons)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([260, 840])
        self.setCentralWidget(split)
        self.engine_label = QLabel("engine: stopped")
        self.stats_label = QLabel("")
        self.statusBar().addWidget(self.engine_label)
        self.statusBar().addPermanentWidget(self.stats_label)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.api_panel)
        self.api_panel.hide()
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.devices_panel)
        self.devices_panel.hide()
        self.devices_panel.visibilityChanged.connect(self._devices_shown)
        file_menu = self.menuBar().addMenu("&File")
        self.data_actions = DataActions(self.store, self, lambda: self.current)
        self.data_actions.add_to_menu(file_menu)
        self.data_actions.storeChanged.connect(self.refresh_conversations)
        self.data_actions.deletedAll.connect(self._all_deleted)
        file_menu.addSeparator()
        file_menu.addAction("&Settings…", self.edit_settings)
        self.keep_serving = QAction("&Keep the API serving when the window closes", self, checkable=True)
        self.keep_serving.setToolTip(
            "Closing the window leaves Foresight in the system tray; quit from there"
        )
        self.keep_serving.toggled.connect(self._keep_serving_toggled)
        file_menu.addAction(self.keep_serving)
        file_menu.addAction("&Quit", self.quit, QKeySequence.StandardKey.Quit)
        view = self.menuBar().addMenu("&View")
        self.highlight_drafts = QAction("&Highlight accepted drafts", self, checkable=True)
        self.highlight_drafts.setToolTip("Mark the text the target took from drafts, not from its own steps")
        self.highlight_drafts.toggled.connect(self._render)
        view.addAction(self.highlight_drafts)
        view.addSeparator()
        api_action = self.api_panel.toggleViewAction()
        api_action.setText("Local &API server")
        view.addAction(api_action)
        devices_action = self.devices_panel.toggleViewAction()
        devices_action.setText("&Devices")
        view.addAction(devices_action)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.library_panel)
        self.library_panel.hide()
        self.library_panel.visibilityChanged.connect(self._library_shown)
        library_action = self.library_panel.toggleViewAction()
        library_action.setText("Model &library")
        view.addAction(library_action)
        self.log_view = QPlainTextEdit(readOnly=True)
        self.log_view.setMaximumBlockCount(self.engine.log.maxlen or 2000)
        self.engine.logLine.connect(self.log_view.appendPlainText)
        self.log_panel = QDockWidget("Engine log", self)
        self.log_panel.setObjectName("engine-log")
        self.log_panel.setWidget(self.log_view)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.log_panel)
        self.log_panel.hide()
        log_action = self.log_panel.toggleViewAction()
        log_action.setText("Engine &log")
        view.addAction(log_action)

    # --- engine ------------------------------------------------------------------------------

    def start_engine(self) -> None:
        self.engine.start(self.engine_args)

    def restart_engine(self) -> None:
        self.banner_row.hide()
        self.engine.restart()

    def _engine_state(self, state: str) -> None:
        self.engine_label.setText(f"engine: {state}")
        if state != READY:
            self.api_panel.engine_stopped()
            self.devices_panel.engine_stopped()
            self.library_panel.engine_stopped()
        self._update_buttons()

    def _engine_ready(self, port: int) -> None:
        self.client.configure(self.engine.url, self.engine.token)
        self.banner_row.hide()
        self.api_panel.engine_ready()
        self.devices_panel.engine_ready()
        self.library_panel.engine_ready()
        reply = self.client.get_json("/props")
        reply.done.connect(self._props)
        self._update_buttons()

    def _props(self, props: dict) -> None:
        self.n_ctx = int(props.get("target", {}).get("n_ctx") or self.n_ctx)
        self.vision = bool(props.get("vision"))
        self._show_context()

    def _library_shown(self, visible: bool) -> None:
        panel = self.library_panel
        if visible and not panel.catalog.fits and not panel.fit_scan.running:
            panel.start_scan()
            panel.refresh()

    def _pair_failed(self, message: str) -> None:
        # the engine let go of the old pair before it tried the new one: it has no model now
        self._show_banner(
            f"The pair could not be loaded: {message}. Restart the engine to go back to the last pair.",
            restart=True,
        )

    def _pair_loaded(self, ready: dict) -> None:
        """A pair loaded through the library: a restart of the engine (after a crash) keeps it."""
        if self.library_panel.loaded is None:
            return
        target, draft, ngram, mmproj = self.library_panel.loaded
        args = [
            a
            for a in _without(self.engine_args, "--target", "--draft", "--mmproj")
            if a not in ("--ngram", "--no-draft")
        ]
        args = [
            "--target",
            target,
            *(["--draft", draft] if draft else ["--ngram"] if ngram else ["--no-draft"]),
            *(["--mmproj", mmproj] if mmproj else []),
            *args,
        ]
        self.engine_args = args
        self.n_ctx = int(ready.get("context_length") or self.n_ctx)
        self.engine_label.setText(f"engine: ready, {ready.get('model', '?')}")
        self.banner_row.hide()
        self._count_context()
        reply = self.client.get_json("/props")
        reply.done.connect(self._props)

    def _devices_shown(self, visible: bool) -> None:
        if visible and not self.devices_panel.devices and not self.devices_panel.scan.running:
            self.devices_panel.start_scan(_arg(self.engine_args, "--target"))

    def use_device(self, device: str) -> None:
        """Restart the engine on `device` (auto, cpu, gpu, gpu:N); an answer in flight is stopped."""
        if self._stream is not None:
            self._end_answer("stopped")
        self.engine_args = _with_arg(self.engine_args, "--device", device)
        self.devices_panel.set_current(device)
        self.engine.stop()
        self.engine.start(self.engine_args)

    def _engine_crashed(self, code: int, tail: str) -> None:
        if self._stream is not None:
            self._end_answer("interrupted")
        last = [line for line in tail.splitlines() if line.strip()][-1:] or ["no output"]
        self._show_banner(f"The engine stopped unexpectedly (exit code {code}): {last[0]}", restart=True)
        if not self.isVisible() and self.tray is not None and self.tray.isVisible():
            # serving from the tray: nobody sees the banner, so say it there and bring the engine back
            self.tray.showMessage("Foresight", f"The engine stopped unexpectedly ({last[0]}); restarting it.")
            self.restart_engine()

    # --- first start without a model ---------------------------------------------------------

    def offer_download(
        self,
        files: list[FileSpec],
        models_dir: Path,
        what: str,
        token: str | None = None,
        endpoint: str | None = None,
    ) -> None:
        """Nothing to load yet: offer the download; the engine starts on the first file once it is in."""
        self._download = (files, models_dir, token, endpoint)
        self._show_banner(
            f"No model on this computer yet. Download {what} from Hugging Face to start.", restart=False
        )
        self.download_button.setText("Download")
        self.download_button.setEnabled(True)
        self.download_button.show()

    def start_download(self) -> None:
        files, models_dir, token, endpoint = self._download
        self.download_task = DownloadTask(files, models_dir, token, endpoint, self)
        self.download_task.progress.connect(self._download_progress)
        self.download_task.finished.connect(self._downloaded)
        self.download_task.failed.connect(self._download_failed)
        self.download_button.setEnabled(False)
        self.download_task.start()

    def _download_progress(self, p: Progress) -> None:
        if p.state not in ("downloading", "verifying") or not p.total:
            return
        eta = f", {p.eta:.0f} s left" if p.eta is not None else ""
        self.banner.setText(
            f"{'Checking' if p.state == 'verifying' else 'Downloading'} {p.file}: "
            f"{p.done / 2**20:,.0f} of {p.total / 2**20:,.0f} MiB at {p.speed / 2**20:.1f} MiB/s{eta}"
        )

    def _downloaded(self, paths: list[str]) -> None:
        self.download_button.hide()
        self.banner_row.hide()
        self.engine_args = ["--target", paths[0], *self.engine_args]
        self.start_engine()

    def _download_failed(self, message: str) -> None:
        self._show_banner(f"The download failed: {message}", restart=False)
        self.download_button.setText("Try again")
        self.download_button.setEnabled(True)
        self.download_button.show()

    def _show_banner(self, text: str, restart: bool) -> None:
        self.banner.setText(text)
        self.restart_button.setVisible(restart)
        self.banner_row.show()

    # --- conversations -----------------------------------------------------------------------

    def refresh_conversations(self) -> None:
        self.conversation_list.blockSignals(True)
        self.conversation_list.clear()
        for c in self.store.conversations(self.search.text()):
            item = QListWidgetItem(c.title)
            item.setData(Qt.ItemDataRole.UserRole, c.id)
            self.conversation_list.addItem(item)
            if c.id == self.current:
                self.conversation_list.setCurrentItem(item)
        self.conversation_list.blockSignals(False)

    def _conversation_menu(self, pos: Any) -> None:
        item = self.conversation_list.itemAt(pos)
        if item is None or self._stream is not None:
            return
        conversation_id = int(item.data(Qt.ItemDataRole.UserRole))
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self._ask_rename(conversation_id))
        menu.addAction("Settings…", lambda: self.edit_conversation_settings(conversation_id))
        menu.addAction("Delete…", lambda: self._ask_delete(conversation_id))
        menu.popup(self.conversation_list.viewport().mapToGlobal(pos))

    def _ask_rename(self, conversation_id: int) -> None:
        old = self.store.conversation(conversation_id).title
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title", text=old)
        if ok and title.strip():
            self.rename_conversation(conversation_id, title)

    def _ask_delete(self, conversation_id: int) -> None:
        title = self.store.conversation(conversation_id).title
        answer = QMessageBox.question(self, "Delete conversation", f"Delete “{title}” and all its messages?")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_conversation(conversation_id)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.update_conversation(conversation_id, title=title.strip())
        self.refresh_conversations()

    def delete_conversation(self, conversation_id: int) -> None:
        if self._stream is not None:
            return
        self.store.delete_conversation(conversation_id)
        if self.current == conversation_id:
            self.current = None
            self._stop_editing()
        self.refresh_conversations()
        self._render()
        self._update_buttons()

    def new_conversation(self) -> None:
        if self._stream is not None:
            return
        if self._editing is not None:
            self._stop_editing()
        c = self.store.create_conversation()
        self.current = c.id
        self.refresh_conversations()
        self._render()
        self._count_context()

    def select_conversation(self, conversation_id: int) -> None:
        if conversation_id != self.current and self._editing is not None:
            self._stop_editing()
        if conversation_id != self.current:
            self.current = conversation_id
            self._count_context()
        self.refresh_conversations()
        self._render()
        self._update_buttons()

    def _conversation_chosen(self, item: QListWidgetItem | None, _previous: QListWidgetItem | None) -> None:
        if item is not None and self._stream is None:
            self.select_conversation(int(item.data(Qt.ItemDataRole.UserRole)))

    # --- asking ------------------------------------------------------------------------------

    def send(self, text: str | None = None) -> None:
        text = (text if isinstance(text, str) else self.input.toPlainText()).strip()
        images = list(self.input.images)
        if not (text or images) or self._stream is not None or self.engine.state != READY:
            return
        if images and not self.vision:
            self._show_banner(
                "The loaded model cannot read images (it has no vision projector). Remove the images to "
                "ask without them.",
                restart=False,
            )
            return
        if self._editing is not None and self.current is not None:
            self.store.truncate_from(self._editing)
            self._stop_editing()
        title = _title(text or "Image question")
        if self.current is None:
            self.current = self.store.create_conversation(title).id
        elif not self.store.messages(self.current):
            self.store.update_conversation(self.current, title=title)
        self.store.add_message(self.current, "user", text, images=images)
        self.input.clear()
        self.refresh_conversations()
        self._ask()

    def _last_question(self) -> int | None:
        if self.current is None:
            return None
        return next((m.id for m in reversed(self.store.messages(self.current)) if m.role == "user"), None)

    def edit_last(self) -> None:
        """Put the last question back in the input; nothing changes until it is sent again."""
        question = self._last_question()
        if question is None or self._stream is not None:
            return
        self._editing = question
        self.input.setPlainText(self.store.message(question).content)
        self.input.set_images(self.store.message(question).images)
        self.input.setFocus()
        self.send_button.setText("Resend")
        self.statusBar().showMessage("Editing your last question: Resend replaces it and its answer.")

    def _stop_editing(self) -> None:
        self._editing = None
        self.send_button.setText("Send")
        self.statusBar().clearMessage()

    def regenerate(self) -> None:
        if self.current is None or self._stream is not None:
            return
        msgs = self.store.messages(self.current)
        if msgs and msgs[-1].role == "assistant":
            self.store.truncate_from(msgs[-1].id)
        if self.store.messages(self.current):
            self._ask()

    def stop(self) -> None:
        if self._stream is not None:
            self._stream.abort()

    def _ask(self) -> None:
        assert self.current is not None
        conv = self.store.conversation(self.current)
        history = [
            {"role": m.role, "content": _content(m)}
            for m in self.store.messages(self.current)
            if m.content or m.images
        ]
        if conv.system_prompt:
            history.insert(0, {"role": "system", "content": conv.system_prompt})
        budget = max(256, self.n_ctx - int(self.sampling.get("max_tokens") or 0))

        def estimate(ms: list[dict[str, Any]]) -> int:
            return sum(len(_text(m["content"])) for m in ms) // CHARS_PER_TOKEN + 4 * len(ms)

        sent, dropped = trim_to_context(history, estimate, budget)
        self.statusBar().showMessage(
            f"{dropped} oldest message(s) left out: the conversation is longer than the context"
            if dropped
            else ""
        )
        self._answer = self.store.begin_answer(self.current)
        self._answer_text = ""
        self._answer_spans = []
        params = {**conv.settings, **{k: v for k, v in self.sampling.items() if k not in conv.settings}}
        self._stream = self.client.stream_chat(sent, **params)
        self._stream.piece.connect(self._on_piece)
        self._stream.finished.connect(self._on_finished)
        self._stream.failed.connect(self._on_failed)
        self._save_timer.start()
        self._render()
        self._update_buttons()

    def _on_piece(self, text: str, flags: list) -> None:
        add_piece(self._answer_spans, len(self._answer_text), text, flags)
        self._answer_text += text
        if not self._render_timer.isActive():
            self._render_timer.start()

    def _on_finished(self, reason: str, usage: dict) -> None:
        self._end_answer("stopped" if reason == "aborted" else "complete", usage)

    def _on_failed(self, message: str) -> None:
        # a broken connection is often the first sign of an engine crash: give the process a moment to
        # report it, so the answer is kept as interrupted rather than failed
        stream = self._stream
        QTimer.singleShot(CRASH_GRACE_MS, lambda: self._failed_after_grace(stream, message))

    def _failed_after_grace(self, stream: ChatStream | None, message: str) -> None:
        if stream is None or stream is not self._stream:
            return  # already ended (the crash handler kept it as interrupted)
        if self.engine.state == CRASHED:
            self._end_answer("interrupted")
            return
        self._end_answer("error")
        self._show_banner(f"The answer failed: {message}", restart=False)

    def _end_answer(self, status: str, usage: dict | None = None) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            for signal in (stream.piece, stream.finished, stream.failed):
                signal.disconnect()
            stream.abort()
        self._save_timer.stop()
        if self._answer is not None:
            self.store.update_answer(
                self._answer.id,
                self._answer_text,
                status,
                (usage or {}).get("speculative"),
                self._answer_spans,
            )
        self._answer = None
        self._show_stats(usage or {})
        self._render()
        self._update_buttons()
        self.answerFinished.emit(status)

    def _save_partial(self) -> None:
        if self._answer is not None:
            self.store.update_answer(self._answer.id, self._answer_text, draft_spans=self._answer_spans)

    def _show_stats(self, usage: dict) -> None:
        if usage:
            self.stats_label.setText(stats_line(usage.get("speculative") or {}))
            self._context_used = int(usage.get("total_tokens") or 0)
            self._context_estimated = False
            self._show_context()

    def _count_context(self) -> None:
        """Estimate the shown conversation's context from its text (the engine counts it after an answer)."""
        msgs = self.store.messages(self.current) if self.current is not None else []
        self._context_used = sum(len(m.content) for m in msgs) // CHARS_PER_TOKEN + 4 * len(msgs)
        self._context_estimated = bool(msgs)
        self._show_context()

    def _show_context(self) -> None:
        """The context count: the conversation (as the engine counted it, or estimated), plus the draft."""
        typed = len(self.input.toPlainText()) // CHARS_PER_TOKEN
        used = self._context_used + typed
        estimate = " (estimate)" if typed or self._context_estimated else ""
        self.input.count.setText(f"context: {used:,} of {self.n_ctx:,} tokens{estimate}")
        self.input.count.setStyleSheet("color: #b00020;" if used > self.n_ctx * 0.9 else "")

    # --- rendering ---------------------------------------------------------------------------

    def _render(self) -> None:
        if self.current is None:
            self.transcript.show_messages([])
            return
        live = self._answer.id if self._answer is not None else None
        shown = [
            {
                "role": m.role,
                "content": self._answer_text if m.id == live else m.content,
                "status": m.status,
                "stats": stats_line(m.stats) if m.role == "assistant" and m.stats else "",
                "draft_spans": self._answer_spans if m.id == live else m.draft_spans,
                "images": m.images,
            }
            for m in self.store.messages(self.current)
        ]
        self.transcript.show_messages(shown, self.highlight_drafts.isChecked())
        # a long answer costs more to lay out: render it less often rather than stall the window
        self._render_timer.setInterval(max(RENDER_EVERY_MS, int(4 * self.transcript.last_render_ms)))

    def _update_buttons(self) -> None:
        ready = self.engine.state == READY
        busy = self._stream is not None
        self.send_button.setEnabled(ready and not busy)
        self.stop_button.setEnabled(busy)
        self.regenerate_button.setEnabled(ready and not busy and self.current is not None)
        self.edit_button.setEnabled(not busy and self._last_question() is not None)
        self.new_button.setEnabled(not busy)
        self.conversation_list.setEnabled(not busy)
        self.data_actions.delete_all_action.setEnabled(not busy)
        self.data_actions.import_action.setEnabled(not busy)

    # --- settings, data, tray ----------------------------------------------------------------

    def edit_conversation_settings(self, conversation_id: int) -> ConversationSettingsDialog:
        dialog = ConversationSettingsDialog(self.store, conversation_id, defaults=self.sampling, parent=self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def edit_settings(self) -> SettingsDialog:
        dialog = SettingsDialog(parent=self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._settings_saved(dialog))
        dialog.open()
        return dialog

    def _settings_saved(self, dialog: SettingsDialog) -> None:
        saved = dialog.saved
        self.sampling.update(temperature=saved.sampling.temperature, max_tokens=saved.sampling.max_tokens)
        if dialog.restart_needed:
            self._show_banner("Settings saved. Restart the engine to use them.", restart=True)

    def _all_deleted(self) -> None:
        self.current = None
        self._stop_editing()
        self._count_context()
        self.refresh_conversations()
        self._render()
        self._update_buttons()

    def _keep_serving_toggled(self, on: bool) -> None:
        if on and self.tray is None:
            if not QSystemTrayIcon.isSystemTrayAvailable():
                self.keep_serving.setChecked(False)
                self.statusBar().showMessage(
                    "This desktop has no system tray: closing the window quits.", 8000
                )
                return
            self.tray = QSystemTrayIcon(self.windowIcon(), self)
            self.tray.setToolTip("Foresight")
            menu = QMenu(self)
            menu.addAction("Show Foresight", self._show_window)
            menu.addAction("Quit", self.quit)
            self.tray.setContextMenu(menu)
            self.tray.activated.connect(self._tray_clicked)
        if self.tray is not None:
            self.tray.setVisible(on)

    def _tray_clicked(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self._show_window()

    def _show_window(self) -> None:
        self.show()
        self.raise_()
        self.activateWindow()

    def quit(self) -> None:
        self._quitting = True
        self.close()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.keep_serving.isChecked() and not self._quitting:
            # the engine (and its API listener) keeps running; the tray brings the window back
            self.hide()
            event.ignore()
            return
        if self.tray is not None:
            self.tray.hide()
        if self._quitting:  # a hidden window's close does not end the app: quit it outright
            QTimer.singleShot(0, QApplication.quit)
        task = getattr(self, "download_task", None)
        if task is not None and task.running:
            task.pause()  # the .part file stays; the next start resumes it
            task.wait(10)
        if self._stream is not None:
            self._end_answer("stopped")
        self.engine.stop()
        super().closeEvent(event)


def stats_line(spec: dict[str, Any]) -> str:
    """An answer's speed and speculation in one line: tokens, tok/s, tokens per target pass, drafts taken."""
    parts = [f"{spec.get('emitted', 0)} tokens"]
    if spec.get("tokens_per_second"):
        parts.append(f"{spec['tokens_per_second']:.1f} tok/s")
    if spec.get("drafted"):
        parts.append(f"{spec.get('mean_accepted_len', 1):.2f} tokens per pass")
        rate = spec.get("acceptance_rate", 0)
        parts.append(f"{spec.get('accepted', 0)} of {spec['drafted']} drafted accepted ({rate:.0%})")
    return " · ".join(parts)


def _arg(args: list[str], flag: str) -> str | None:
    """The value given to `flag` in an argument list (the last one wins, as argparse does)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _with_arg(args: list[str], flag: str, value: str) -> list[str]:
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return [*out, flag, value]


def _content(m: Message) -> Any:
    """A stored message as the API takes it: text, or text and images as parts."""
    if not m.images:
        return m.content
    parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    return parts + [{"type": "image_url", "image_url": {"url": uri}} for uri in m.images]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")


def _without(args: list[str], *flags: str) -> list[str]:
    """`args` less each of `flags` and its value."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not any(a.startswith(f + "=") for f in flags):
            out.append(a)
    return out


def _title(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "New chat"
    return line[:48] + ("..." if len(line) > 48 else "")
