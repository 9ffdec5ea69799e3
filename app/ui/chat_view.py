"""The chat side of the window: the header (model and engine), the banner, the transcript, the question
box and its buttons, wired to the conversation shown (app.services.conversation)."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from app.services.conversation import ActiveConversation
from app.services.engine_status import EngineStatus
from app.ui.banner import Banner
from app.ui.chat_header import ChatHeader
from app.ui.composer import Composer
from app.ui.transcript import Transcript, stats_line

RENDER_EVERY_MS = 50
RENDER_COST_FACTOR = 4  # a render that took t ms waits at least this many times t for the next
STATS_TIP = (
    "The last answer: tokens written, their speed, and how speculative decoding went: tokens per target "
    "pass (1.00 is plain decoding; more means drafts were accepted) and the share of drafted tokens the "
    "target accepted"
)
INTERRUPTED = (
    "This answer was cut short: Foresight or its engine stopped while it was being written. Continue "
    "carries on from its last word; Regenerate writes it again."
)


class ChatView(QWidget):
    """Shows `conversation` and asks through it; `message` carries words for the status bar, `stats` the
    figures of the answer shown, `libraryRequested` a wish for the model library ("images": its
    vision projectors)."""

    message = Signal(str)
    stats = Signal(str)
    libraryRequested = Signal(str)

    def __init__(self, conversation: ActiveConversation, status: EngineStatus, parent: QWidget | None = None):
        super().__init__(parent)
        self.conversation = conversation
        self.status = status
        self.highlight = False
        self._given_n_ctx = conversation.n_ctx
        self.header = ChatHeader(status)
        self.banner = Banner()
        self.transcript = Transcript()
        self.input = Composer()
        self.send_button = QPushButton("Send")
        self.send_button.setToolTip("Send the question (Ctrl+Enter)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the answer here; it is kept (Esc)")
        self.continue_button = QPushButton("Continue")
        self.continue_button.setToolTip("Carry on the last answer from where it was cut short")
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Write the last answer again")
        self.edit_button = QPushButton("Edit question")
        self.edit_button.setToolTip("Put your last question back in the box; Send replaces it and its answer")
        buttons = QHBoxLayout()
        buttons.addWidget(self.input.count, 1)
        for b in (self.edit_button, self.continue_button, self.regenerate_button, self.stop_button):
            buttons.addWidget(b)
        buttons.addWidget(self.send_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.header)
        layout.addWidget(self.banner)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.input)
        layout.addLayout(buttons)
        self._render_timer = QTimer(self, singleShot=True, interval=RENDER_EVERY_MS, timeout=self.render)
        self._wire()
        self.show_context()

    def _wire(self) -> None:
        c = self.conversation
        c.changed.connect(self._changed)
        c.answerGrew.connect(lambda: self._render_timer.isActive() or self._render_timer.start())
        c.answerFinished.connect(self._finished)
        c.failed.connect(lambda text: self.banner.say(f"The answer failed: {text}", scope=c.current))
        c.contextChanged.connect(self.show_context)
        c.editingChanged.connect(self._editing_changed)
        c.trimmed.connect(self._trimmed)
        self.input.refused.connect(self.message)
        self.input.changed.connect(self.show_context)
        self.input.libraryRequested.connect(lambda: self.libraryRequested.emit("images"))
        self.header.pickModel.connect(lambda: self.libraryRequested.emit(""))
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(c.stop)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.banner.regenerate_button.clicked.connect(self.regenerate)
        self.continue_button.clicked.connect(self.continue_answer)
        self.banner.continue_button.clicked.connect(self.continue_answer)
        self.edit_button.clicked.connect(self.edit_last)
        self.status.changed.connect(self._status_changed)

    # --- asking ------------------------------------------------------------------------------------

    def send(self, text: str | None = None) -> None:
        """Send `text` (by default the question box's) with the box's images; the box keeps the focus."""
        text = (text if isinstance(text, str) else self.input.toPlainText()).strip()
        images = list(self.input.images)
        if not (text or images) or not self.conversation.can_ask:
            return
        if images and self.status.props and not self.status.vision:
            self.input.set_vision(False)  # the box says why, with the way to a model that reads images
            self.message.emit("Nothing was sent: the loaded model cannot read images.")
            return
        if self.conversation.send(text, images):
            self.input.clear()
        self.input.setFocus()

    def regenerate(self) -> None:
        self.banner.dismiss_scope(self.conversation.current)
        self.conversation.regenerate()
        self.input.setFocus()

    def continue_answer(self) -> None:
        self.banner.dismiss_scope(self.conversation.current)
        self.conversation.continue_answer()
        self.input.setFocus()

    def edit_last(self) -> None:
        """Put the last question back in the box; nothing changes until it is sent again."""
        question = self.conversation.edit_last()
        if question is not None:
            self.input.setPlainText(question.content)
            self.input.set_images(question.images)
            self.input.setFocus()

    def offer_continue(self) -> None:
        """Say that the answer shown was cut short, with Continue and Regenerate (a relaunch, a crash)."""
        c = self.conversation
        if c.cut_short() is not None and c.cut_short().status == "interrupted":
            self.banner.say(INTERRUPTED, scope=c.current, kind="warning", answer_actions=True)

    # --- showing -----------------------------------------------------------------------------------

    def render(self) -> None:
        self.transcript.show_conversation(self.conversation.shown(), self.highlight)
        # a long answer costs more to lay out: render it less often rather than stall the window
        interval = int(RENDER_COST_FACTOR * self.transcript.last_render_ms)
        self._render_timer.setInterval(max(RENDER_EVERY_MS, interval))

    def set_highlight(self, on: bool) -> None:
        self.highlight = on
        self.header.show_legend(on)
        self.render()

    def show_context(self) -> None:
        c = self.conversation
        self.input.show_context(c.context_used, c.n_ctx, c.context_estimated)

    def update_buttons(self) -> None:
        c = self.conversation
        ready, busy = self.status.state == "ready", c.busy
        self.send_button.setEnabled(ready and not busy)
        self.stop_button.setEnabled(busy)
        self.regenerate_button.setEnabled(ready and not busy and c.can_regenerate)
        self.continue_button.setVisible(not busy and c.cut_short() is not None)
        self.continue_button.setEnabled(ready)
        self.banner.continue_button.setEnabled(ready and not busy)
        self.banner.regenerate_button.setEnabled(ready and not busy)
        self.edit_button.setEnabled(not busy and c.last_question() is not None)
        self.header.set_writing(busy)

    def _changed(self) -> None:
        self.banner.show_for(self.conversation.current)
        self.render()
        self.update_buttons()
        spec = self.conversation.last_stats()
        self.stats.emit(stats_line(spec) if spec else "")

    def _finished(self, _status: str, usage: dict) -> None:
        if usage.get("speculative"):
            self.stats.emit(stats_line(usage["speculative"]))

    def _status_changed(self) -> None:
        known = bool(self.status.props)  # until /props answers, nothing is refused
        self.input.set_vision(self.status.vision or not known)
        n_ctx = self.status.n_ctx or self._given_n_ctx  # the launch's, or unknown (0) until /props says
        if n_ctx != self.conversation.n_ctx:
            self.conversation.set_context_length(n_ctx)
        self.update_buttons()

    def _editing_changed(self, editing: bool) -> None:
        self.send_button.setText("Resend" if editing else "Send")
        self.message.emit("Editing your last question: Resend replaces it and its answer." if editing else "")

    def _trimmed(self, dropped: int) -> None:
        if dropped:
            self.message.emit(
                f"{dropped} oldest message(s) left out: the conversation is longer than the context"
            )
