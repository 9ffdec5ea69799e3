"""The main window: conversations on the left, the streaming chat on the right, the engine below.

The window lays out the views and wires them to the services: the engine process it starts from an
EngineLaunch (app.services.engine), the conversation shown and its answer in flight, which reach the
chat store as they stream (app.services.conversation), and the panels that talk to the engine over HTTP.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QSplitter,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app import keystore
from app.chats.store import ChatStore
from app.config import SamplingSettings, Settings, load_settings
from app.services.api_server import ApiKeys
from app.services.client import EngineClient
from app.services.conversation import ActiveConversation
from app.services.engine import READY, EngineLaunch, EngineProcess
from app.ui.api_panel import ApiServerPanel
from app.ui.banner import Banner
from app.ui.composer import Composer
from app.ui.conversations import ConversationList, ConversationsView
from app.ui.data_menu import DataActions
from app.ui.devices_panel import DevicesPanel
from app.ui.engine_log import EngineLog
from app.ui.first_run import FirstRun
from app.ui.library_panel import LibraryPanel
from app.ui.settings_dialog import ConversationSettingsDialog, SettingsDialog
from app.ui.transcript import Transcript, stats_line
from app.ui.tray import ServingTray

ICON = Path(__file__).with_name("foresight.png")
RENDER_EVERY_MS = 50
RENDER_COST_FACTOR = 4  # a render that took t ms waits at least this many times t for the next
STATUS_MS = 8000


class MainWindow(QMainWindow):
    """The window. `sampling` is what every request carries (its fields set); `settings` (the settings
    file's, by default) place the model library and fill in what `launch` does not give."""

    def __init__(
        self,
        store: ChatStore,
        launch: EngineLaunch,
        n_ctx: int | None = None,
        sampling: SamplingSettings | None = None,
        api_keys: ApiKeys | None = None,
        api_port: int = 8080,
        settings: Settings | None = None,
    ) -> None:
        super().__init__()
        settings = settings if settings is not None else load_settings()
        runs_with = launch.settings(settings)
        n_ctx = n_ctx or runs_with.engine.n_ctx  # until the engine says what it loaded
        self.store = store
        self.launch = launch
        self.engine = EngineProcess(self)
        self.client = EngineClient(self)
        sampling = sampling or settings.sampling
        self.conversation = ActiveConversation(store, self.client, self.engine, sampling, n_ctx, self)
        self.vision = False  # whether the loaded model reads images (the engine's /props says)
        self._quitting = False
        self.setWindowTitle("Foresight")
        icon = QIcon(str(ICON))
        self.setWindowIcon(
            self.style().standardIcon(QStyle.StandardPixmap.SP_ComputerIcon) if icon.isNull() else icon
        )
        self.resize(1100, 720)
        self.api_panel = ApiServerPanel(self.client, api_keys or ApiKeys(), api_port, self)
        self.devices_panel = DevicesPanel(self.client, runs_with.engine.device, self)
        token = keystore.TokenStore().resolve()
        self.library_panel = LibraryPanel.from_settings(self.client, settings.models, token, self)
        self.tray = ServingTray(self, icon)
        self._render_timer = QTimer(self, singleShot=True, interval=RENDER_EVERY_MS, timeout=self._render)
        self._build()
        self._wire()
        if store.recovered_from is not None:
            self.banner.say(
                f"Your chat file could not be read. It was kept as {store.recovered_from.name} and a new "
                "one was started.",
                restart=False,
            )
        self._update_buttons()

    # --- layout ------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.conversations = ConversationsView(ConversationList(self.store, self))
        self.banner = Banner()
        self.first_run = FirstRun(self.banner, self)
        self.transcript = Transcript()
        self.input = Composer()
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.regenerate_button = QPushButton("Regenerate")
        self.edit_button = QPushButton("Edit question")
        self.edit_button.setToolTip("Put your last question back in the box; Send replaces it and its answer")
        buttons = QHBoxLayout()
        buttons.addWidget(self.input.count)
        buttons.addStretch(1)
        for b in (self.edit_button, self.regenerate_button, self.stop_button, self.send_button):
            buttons.addWidget(b)
        right = QWidget()
        rv = QVBoxLayout(right)
        rv.addWidget(self.banner)
        rv.addWidget(self.transcript, 1)
        rv.addWidget(self.input)
        rv.addLayout(buttons)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.conversations)
        split.addWidget(right)
        split.setSizes([260, 840])
        self.setCentralWidget(split)
        self.engine_label = QLabel("engine: stopped")
        self.stats_label = QLabel("")
        self.statusBar().addWidget(self.engine_label)
        self.statusBar().addPermanentWidget(self.stats_label)

        self.log_panel = EngineLog(self.engine, self)
        for panel in (self.api_panel, self.devices_panel, self.library_panel):
            self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, panel)
            panel.hide()
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.log_panel)
        self.log_panel.hide()

        file_menu = self.menuBar().addMenu("&File")
        self.data_actions = DataActions(self.store, self, lambda: self.conversation.current)
        self.data_actions.add_to_menu(file_menu)
        file_menu.addSeparator()
        file_menu.addAction("&Settings…", self.edit_settings)
        file_menu.addAction(self.tray.action)
        file_menu.addAction("&Quit", self.quit, QKeySequence.StandardKey.Quit)
        view = self.menuBar().addMenu("&View")
        self.highlight_drafts = QAction("&Highlight accepted drafts", self, checkable=True)
        self.highlight_drafts.setToolTip("Mark the text the target took from drafts, not from its own steps")
        view.addAction(self.highlight_drafts)
        view.addSeparator()
        for dock, text in (
            (self.api_panel, "Local &API server"),
            (self.devices_panel, "&Devices"),
            (self.library_panel, "Model &library"),
            (self.log_panel, "Engine &log"),
        ):
            action = dock.toggleViewAction()
            action.setText(text)
            view.addAction(action)

    def _wire(self) -> None:
        conversation = self.conversation
        conversation.changed.connect(self._conversation_changed)
        conversation.answerGrew.connect(self._answer_grew)
        conversation.answerFinished.connect(self._answer_finished)
        conversation.failed.connect(lambda message: self.banner.say(f"The answer failed: {message}", False))
        conversation.listChanged.connect(self.conversations.model.refresh)
        conversation.contextChanged.connect(self._show_context)
        conversation.editingChanged.connect(self._editing_changed)
        conversation.trimmed.connect(self._trimmed)
        self.conversations.chosen.connect(conversation.select)
        self.conversations.newRequested.connect(conversation.new)
        self.conversations.renamed.connect(conversation.rename)
        self.conversations.deleted.connect(conversation.delete)
        self.conversations.settingsRequested.connect(self.edit_conversation_settings)
        self.data_actions.storeChanged.connect(self.conversations.model.refresh)
        self.data_actions.deletedAll.connect(conversation.forget)

        self.input.refused.connect(lambda why: self.statusBar().showMessage(why, STATUS_MS))
        self.input.changed.connect(self._show_context)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(conversation.stop)
        self.regenerate_button.clicked.connect(conversation.regenerate)
        self.edit_button.clicked.connect(self.edit_last)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.send)
        QShortcut(QKeySequence("Ctrl+N"), self, activated=conversation.new)
        QShortcut(QKeySequence("Esc"), self, activated=conversation.stop)
        self.highlight_drafts.toggled.connect(self._render)

        self.engine.stateChanged.connect(self._engine_state)
        self.engine.ready.connect(self._engine_ready)
        self.engine.crashed.connect(self._engine_crashed)
        self.banner.restart_button.clicked.connect(self.restart_engine)
        self.first_run.installed.connect(self._model_installed)
        self.devices_panel.deviceChosen.connect(self.use_device)
        self.devices_panel.visibilityChanged.connect(self._devices_shown)
        self.library_panel.visibilityChanged.connect(self._library_shown)
        self.library_panel.pairLoaded.connect(self._pair_loaded)
        self.library_panel.loadFailed.connect(self._pair_failed)
        self.tray.quitRequested.connect(self.quit)
        self.tray.refused.connect(lambda why: self.statusBar().showMessage(why, STATUS_MS))

    # --- the engine --------------------------------------------------------------------------------

    def start_engine(self) -> None:
        self.engine.start(self.launch.argv())

    def restart_engine(self) -> None:
        """Start the engine again on the current launch (a pair loaded from the library included)."""
        self.banner.hide()
        self.engine.restart(self.launch.argv())

    def use_device(self, device: str) -> None:
        """Restart the engine on `device` (auto, cpu, gpu, gpu:N); an answer in flight is stopped."""
        self.conversation.end_answer("stopped")
        self.launch = self.launch.with_engine(device=device)
        self.devices_panel.set_current(device)
        self.engine.stop()
        self.start_engine()

    def _model_installed(self, path: str) -> None:
        self.launch = self.launch.with_target(path)
        self.start_engine()

    def _engine_state(self, state: str) -> None:
        self.engine_label.setText(f"engine: {state}")
        if state != READY:
            for panel in (self.api_panel, self.devices_panel, self.library_panel):
                panel.engine_stopped()
        self._update_buttons()

    def _engine_ready(self, _port: int) -> None:
        self.client.configure(self.engine.url, self.engine.token)
        self.banner.hide()
        for panel in (self.api_panel, self.devices_panel, self.library_panel):
            panel.engine_ready()
        self._ask_props()
        self._update_buttons()

    def _ask_props(self) -> None:
        self.client.get_json("/props").done.connect(self._props)

    def _props(self, props: dict) -> None:
        self.vision = bool(props.get("vision"))
        self.conversation.set_context_length(
            int(props.get("target", {}).get("n_ctx") or self.conversation.n_ctx)
        )

    def _engine_crashed(self, code: int, tail: str) -> None:
        last = [line for line in tail.splitlines() if line.strip()][-1:] or ["no output"]
        self.banner.say(f"The engine stopped unexpectedly (exit code {code}): {last[0]}", restart=True)
        if not self.isVisible() and self.tray.shown:
            # serving from the tray: nobody sees the banner, so say it there and bring the engine back
            self.tray.notify(f"The engine stopped unexpectedly ({last[0]}); restarting it.")
            self.restart_engine()

    def _pair_loaded(self, ready: dict) -> None:
        """A pair loaded through the library: a restart of the engine (after a crash) keeps it."""
        if self.library_panel.loaded is None:
            return
        self.launch = self.launch.with_pair(*self.library_panel.loaded)
        self.conversation.set_context_length(int(ready.get("context_length") or self.conversation.n_ctx))
        self.engine_label.setText(f"engine: ready, {ready.get('model', '?')}")
        self.banner.hide()
        self.conversation.count_context()
        self._ask_props()

    def _pair_failed(self, message: str) -> None:
        # the engine let go of the old pair before it tried the new one: it has no model now
        self.banner.say(
            f"The pair could not be loaded: {message}. Restart the engine to go back to the last pair.",
            restart=True,
        )

    def _devices_shown(self, visible: bool) -> None:
        if visible and not self.devices_panel.devices and not self.devices_panel.scan.running:
            self.devices_panel.start_scan(self.launch.target)

    def _library_shown(self, visible: bool) -> None:
        panel = self.library_panel
        if visible and not panel.catalog.fits and not panel.fit_scan.running:
            panel.start_scan()
            panel.refresh()

    # --- asking ------------------------------------------------------------------------------------

    def send(self, text: str | None = None) -> None:
        """Send `text` (by default the question box's) with the box's images."""
        text = (text if isinstance(text, str) else self.input.toPlainText()).strip()
        images = list(self.input.images)
        if not (text or images) or not self.conversation.can_ask:
            return
        if images and not self.vision:
            self.banner.say(
                "The loaded model cannot read images (it has no vision projector). Remove the images to "
                "ask without them.",
                restart=False,
            )
            return
        if self.conversation.send(text, images):
            self.input.clear()

    def edit_last(self) -> None:
        """Put the last question back in the box; nothing changes until it is sent again."""
        question = self.conversation.edit_last()
        if question is not None:
            self.input.setPlainText(question.content)
            self.input.set_images(question.images)
            self.input.setFocus()

    def _editing_changed(self, editing: bool) -> None:
        self.send_button.setText("Resend" if editing else "Send")
        if editing:
            self.statusBar().showMessage("Editing your last question: Resend replaces it and its answer.")
        else:
            self.statusBar().clearMessage()

    def _trimmed(self, dropped: int) -> None:
        self.statusBar().showMessage(
            f"{dropped} oldest message(s) left out: the conversation is longer than the context"
            if dropped
            else ""
        )

    def _answer_grew(self) -> None:
        if not self._render_timer.isActive():
            self._render_timer.start()

    def _answer_finished(self, _status: str, usage: dict) -> None:
        if usage:
            self.stats_label.setText(stats_line(usage.get("speculative") or {}))

    def _conversation_changed(self) -> None:
        self.conversations.show_current(self.conversation.current)
        self._render()
        self._update_buttons()

    def _show_context(self) -> None:
        c = self.conversation
        self.input.show_context(c.context_used, c.n_ctx, c.context_estimated)

    def _render(self) -> None:
        self.transcript.show_conversation(self.conversation.shown(), self.highlight_drafts.isChecked())
        # a long answer costs more to lay out: render it less often rather than stall the window
        interval = int(RENDER_COST_FACTOR * self.transcript.last_render_ms)
        self._render_timer.setInterval(max(RENDER_EVERY_MS, interval))

    def _update_buttons(self) -> None:
        ready = self.engine.state == READY
        busy = self.conversation.busy
        self.send_button.setEnabled(ready and not busy)
        self.stop_button.setEnabled(busy)
        self.regenerate_button.setEnabled(ready and not busy and self.conversation.current is not None)
        self.edit_button.setEnabled(not busy and self.conversation.last_question() is not None)
        self.conversations.set_busy(busy)
        self.data_actions.delete_all_action.setEnabled(not busy)
        self.data_actions.import_action.setEnabled(not busy)

    # --- settings and closing ----------------------------------------------------------------------

    def edit_conversation_settings(self, conversation_id: int) -> ConversationSettingsDialog:
        return ConversationSettingsDialog.open_for(
            self.store, conversation_id, self.conversation.sampling, self
        )

    def edit_settings(self) -> SettingsDialog:
        dialog = SettingsDialog.open_for(self)
        dialog.accepted.connect(lambda: self._settings_saved(dialog))
        return dialog

    def _settings_saved(self, dialog: SettingsDialog) -> None:
        saved = dialog.saved.sampling
        self.conversation.use_sampling(temperature=saved.temperature, max_tokens=saved.max_tokens)
        if dialog.restart_needed:
            self.banner.say("Settings saved. Restart the engine to use them.", restart=True)

    def quit(self) -> None:
        self._quitting = True
        self.close()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.tray.keeps_serving and not self._quitting:
            # the engine (and its API listener) keeps running; the tray brings the window back
            self.hide()
            event.ignore()
            return
        self.tray.hide()
        if self._quitting:  # a hidden window's close does not end the app: quit it outright
            QTimer.singleShot(0, QApplication.quit)
        self.first_run.pause()
        self.conversation.end_answer("stopped")
        self.engine.stop()
        super().closeEvent(event)
