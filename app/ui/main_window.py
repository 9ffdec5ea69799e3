"""The main window: conversations on the left, the chat on the right, the panels beside it, the engine log.

The window lays out the views and wires them to the services: the engine it runs
(app.services.engine_control), what the engine is doing (app.services.engine_status), the conversation
shown and its answer in flight (app.services.conversation), the chat view (app.ui.chat_view), and the
panels that talk to the engine over HTTP. It comes back as it was left (app.ui.session).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QCloseEvent, QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import QApplication, QDockWidget, QLabel, QMainWindow, QSplitter, QStyle

from app import keystore
from app.chats.store import ChatStore
from app.config import SamplingSettings, Settings, load_settings
from app.services.api_server import ApiKeys
from app.services.client import EngineClient
from app.services.conversation import ActiveConversation
from app.services.engine import READY, EngineLaunch, stop_reason
from app.services.engine_control import EngineControl
from app.services.engine_status import EngineStatus
from app.ui import theme
from app.ui.api_panel import ApiServerPanel
from app.ui.chat_view import STATS_TIP, ChatView
from app.ui.conversations import ConversationList, ConversationsView
from app.ui.data_menu import DataActions
from app.ui.devices_panel import DevicesPanel
from app.ui.engine_log import EngineLog
from app.ui.first_run import FirstRun
from app.ui.library.panel import LibraryPanel
from app.ui.menus import add_file_menu, add_view_menu
from app.ui.panel import stack_side_panels
from app.ui.session import WindowSession
from app.ui.settings_dialog import ConversationSettingsDialog, SettingsDialog
from app.ui.tray import ServingTray

ICON = Path(__file__).with_name("foresight.png")
STATUS_MS = 8000
START_SIZE = (1100, 720)
MIN_SIZE = (800, 560)  # 1024x700 holds the sidebar, the chat and one panel beside it
SIDEBAR_PX = 240


class MainWindow(QMainWindow):
    """The window. `sampling` is what every request carries (its fields set); `settings` (the settings
    file's, by default) place the model library and fill in what `launch` does not give; `session` is
    where the window keeps what it was like when it closed (by default in the data dir)."""

    def __init__(
        self,
        store: ChatStore,
        launch: EngineLaunch,
        n_ctx: int | None = None,
        sampling: SamplingSettings | None = None,
        api_keys: ApiKeys | None = None,
        api_port: int = 8080,
        settings: Settings | None = None,
        session: WindowSession | None = None,
    ) -> None:
        super().__init__()
        settings = settings if settings is not None else load_settings()
        runs_with = launch.settings(settings)
        n_ctx = n_ctx or runs_with.engine.n_ctx  # 0 (sized by the engine): unknown until /props says
        self.store = store
        self.session = session if session is not None else WindowSession()
        self.engine_control = EngineControl(launch, self)
        self.engine = self.engine_control.process
        self.client = EngineClient(self)
        self.status = EngineStatus(self.engine, self.client, self)
        sampling = sampling or settings.sampling
        self.conversation = ActiveConversation(store, self.client, self.engine, sampling, n_ctx, self)
        self._quitting = False
        self.setWindowTitle("Foresight")
        icon = QIcon(str(ICON))
        self.setWindowIcon(
            self.style().standardIcon(QStyle.StandardPixmap.SP_ComputerIcon) if icon.isNull() else icon
        )
        self.resize(*START_SIZE)
        self.setMinimumSize(*MIN_SIZE)
        self.api_panel = ApiServerPanel(self.client, api_keys or ApiKeys(), api_port, self)
        self.devices_panel = DevicesPanel(self.client, runs_with.engine.device, self)
        token = keystore.TokenStore().resolve()
        self.library_panel = LibraryPanel.from_settings(self.client, settings.models, token, self)
        self.tray = ServingTray(self, icon)
        self._build()
        self._wire()
        self._restore()
        if store.recovered_from is not None:
            self.banner.say(
                f"Your chat file could not be read. It was kept as {store.recovered_from.name} and a new "
                "one was started."
            )
        self._update_buttons()

    # --- layout ------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.conversations = ConversationsView(ConversationList(self.store, self))
        self.chat = ChatView(self.conversation, self.status)
        chat = self.chat
        self.banner, self.transcript, self.input = chat.banner, chat.transcript, chat.input
        self.send_button, self.stop_button, self.edit_button = (
            chat.send_button,
            chat.stop_button,
            chat.edit_button,
        )
        self.regenerate_button, self.continue_button = chat.regenerate_button, chat.continue_button
        self.first_run = FirstRun(self.banner, self)
        self.split = QSplitter(Qt.Orientation.Horizontal, childrenCollapsible=False)
        self.split.addWidget(self.conversations)
        self.split.addWidget(chat)
        self.split.setStretchFactor(1, 1)
        self.split.setSizes([SIDEBAR_PX, START_SIZE[0] - SIDEBAR_PX])
        self.setCentralWidget(self.split)
        self.engine_label = QLabel("engine: stopped")
        self.stats_label = QLabel("")
        self.stats_label.setToolTip(STATS_TIP)
        self.statusBar().addWidget(self.engine_label)
        self.statusBar().addPermanentWidget(self.stats_label)

        self.log_panel = EngineLog(self.engine, self)
        self.panels: tuple[QDockWidget, ...] = (self.api_panel, self.devices_panel, self.library_panel)
        stack_side_panels(self, self.panels)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.log_panel)
        self.log_panel.hide()

        self.data_actions = DataActions(self.store, self, lambda: self.conversation.current)
        add_file_menu(self, self.data_actions, self.tray.action, self.edit_settings, self.quit)
        self.highlight_drafts = add_view_menu(
            self,
            (
                (self.api_panel, "Local &API server"),
                (self.devices_panel, "&Devices"),
                (self.library_panel, "Model &library"),
                (self.log_panel, "Engine &log"),
            ),
        )

    def _wire(self) -> None:
        conversation = self.conversation
        conversation.changed.connect(self._conversation_changed)
        conversation.listChanged.connect(self.conversations.model.refresh)
        self.conversations.chosen.connect(conversation.select)
        self.conversations.newRequested.connect(self.new_chat)
        self.conversations.renamed.connect(conversation.rename)
        self.conversations.deleted.connect(conversation.delete)
        self.conversations.settingsRequested.connect(self.edit_conversation_settings)
        self.data_actions.storeChanged.connect(self.conversations.model.refresh)
        self.data_actions.deletedAll.connect(conversation.forget)
        self.chat.message.connect(lambda why: self.statusBar().showMessage(why, STATUS_MS))
        self.chat.stats.connect(self.stats_label.setText)
        self.chat.libraryRequested.connect(self.library_panel.open_section)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.send)
        QShortcut(QKeySequence("Ctrl+N"), self, activated=self.new_chat)
        QShortcut(QKeySequence("Esc"), self, activated=conversation.stop)
        self.highlight_drafts.toggled.connect(self.chat.set_highlight)

        self.engine.stateChanged.connect(self._engine_state)
        self.engine.ready.connect(self._engine_ready)
        self.engine.crashed.connect(self._engine_crashed)
        self.engine_control.leftoversEnded.connect(self._leftovers_ended)
        self.banner.restart_button.clicked.connect(self.restart_engine)
        self.first_run.installed.connect(self._model_installed)
        self.devices_panel.deviceChosen.connect(self.use_device)
        self.devices_panel.visibilityChanged.connect(self._devices_shown)
        self.library_panel.visibilityChanged.connect(self._library_shown)
        self.library_panel.loader.loadStarted.connect(self.status.watch_load)
        self.library_panel.loader.pairLoaded.connect(self._pair_loaded)
        self.library_panel.loader.loadFailed.connect(self._pair_failed)
        self.tray.quitRequested.connect(self.quit)
        self.tray.refused.connect(lambda why: self.statusBar().showMessage(why, STATUS_MS))

    def _restore(self) -> None:
        """Come back as the window was left: size, panels, the last conversation, the API switch."""
        self.session.restore_layout(self, self.split)
        if (switch := self.session.api) is not None:
            self.api_panel.set_switch(switch)
        last = self.session.conversation
        if last is not None and self.conversations.model.row_of(last) >= 0:
            self.conversation.select(last)
            self.chat.offer_continue()

    def _save_session(self) -> None:
        self.session.save_layout(self, self.split)
        self.session.conversation = self.conversation.current
        self.session.api = self.api_panel.switch()
        self.session.sync()

    # --- the engine --------------------------------------------------------------------------------

    def start_engine(self) -> None:
        """End a leftover engine of an earlier window, if there is one, then start this window's."""
        self.engine_label.setText("engine: looking for a leftover engine…")
        self.engine_control.start()

    def _leftovers_ended(self, notes: list[str]) -> None:
        if notes:
            self.statusBar().showMessage(" ".join(notes), STATUS_MS)

    def restart_engine(self) -> None:
        """Start the engine again on the current launch (a pair loaded from the library included)."""
        self.banner.dismiss()
        self.engine_control.restart()

    def use_device(self, device: str) -> None:
        """Restart the engine on `device` (auto, cpu, gpu, gpu:N); an answer in flight is stopped."""
        self.conversation.end_answer("stopped")
        self.devices_panel.set_current(device)
        self.engine_control.use_device(device)

    def _model_installed(self, path: str) -> None:
        self.engine_control.set_target(path)
        self.start_engine()

    def _engine_state(self, state: str) -> None:
        self.engine_label.setText(f"engine: {state}")
        if state != READY:
            for panel in self.panels:
                panel.engine_stopped()  # type: ignore[attr-defined]
        self._update_buttons()

    def _engine_ready(self, _port: int) -> None:
        self.client.configure(self.engine.url, self.engine.token)
        self.status.refresh()
        if self.banner.restart_button.isVisible():
            self.banner.dismiss()
        for panel in self.panels:
            panel.engine_ready()  # type: ignore[attr-defined]
        self._update_buttons()
        self.chat.offer_continue()

    def _engine_crashed(self, code: int, _tail: str) -> None:
        why = stop_reason(list(self.engine.log), code)
        self.banner.say(f"The engine stopped unexpectedly: {why}", restart=True)
        if not self.isVisible() and self.tray.shown:
            # serving from the tray: nobody sees the banner, so say it there and bring the engine back
            self.tray.notify(f"The engine stopped unexpectedly ({why}); restarting it.")
            self.restart_engine()

    def _pair_loaded(self, ready: dict) -> None:
        """A pair loaded through the library: a restart of the engine (after a crash) keeps it."""
        if self.library_panel.loader.loaded is None:
            return
        self.engine_control.keep_pair(*self.library_panel.loader.loaded)
        self.conversation.set_context_length(int(ready.get("context_length") or self.conversation.n_ctx))
        self.engine_label.setText(f"engine: ready, {ready.get('model', '?')}")
        self.banner.dismiss()
        self.conversation.count_context()

    def _pair_failed(self, message: str) -> None:
        # the engine let go of the old pair before it tried the new one: it has no model now
        self.banner.say(
            f"The pair could not be loaded: {message}. Restart the engine to go back to the last pair.",
            restart=True,
        )

    def _devices_shown(self, visible: bool) -> None:
        if visible and not self.devices_panel.devices and not self.devices_panel.scan.running:
            self.devices_panel.start_scan(self.engine_control.launch.target)

    def _library_shown(self, visible: bool) -> None:
        panel = self.library_panel
        if visible and not panel.catalog.fits and not panel.fit_scan.running:
            panel.start_scan()
            panel.refresh()

    # --- asking ------------------------------------------------------------------------------------

    def send(self, text: str | None = None) -> None:
        self.chat.send(text)

    def new_chat(self) -> None:
        self.conversation.new()
        self.input.setFocus()

    def _conversation_changed(self) -> None:
        self.conversations.show_current(self.conversation.current)
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = self.conversation.busy
        self.chat.update_buttons()
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
        self.conversation.use_sampling(**dialog.sampling_now())  # what applies at once, with the theme
        theme.apply(dialog.saved.appearance.theme)
        if (note := dialog.waiting_note()) is not None:
            self.banner.say(note, restart=dialog.restart_needed, kind="info")

    def quit(self) -> None:
        self._quitting = True
        self.close()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.tray.keeps_serving and not self._quitting:
            # the engine (and its API listener) keeps running; the tray brings the window back
            self.hide()
            event.ignore()
            return
        self._save_session()
        self.tray.hide()
        if self._quitting:  # a hidden window's close does not end the app: quit it outright
            QTimer.singleShot(0, QApplication.quit)
        self.first_run.pause()
        self.conversation.end_answer("stopped")
        self.engine.stop()
        super().closeEvent(event)
