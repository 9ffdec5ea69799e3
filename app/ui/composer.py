"""The question box: text, images attached, dropped or pasted in (PNG, JPEG, WebP), and a count of the
context.

An image is kept as the bytes the user gave, checked by what they are (not by the file name) and sent as
a data URI; a thumbnail with a remove button shows what goes with the question.
"""

from __future__ import annotations

import base64
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QEvent, QMimeData, QSize, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage, QImageReader, QPalette, QPixmap
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.config import EngineSettings
from app.services.conversation import CHARS_PER_TOKEN
from app.ui import icons, theme
from app.ui.elided import ElidedLabel

IMAGE_FORMATS = {b"png": "image/png", b"jpeg": "image/jpeg", b"webp": "image/webp"}
# the engine's own limits, as its settings default them
MAX_IMAGE_BYTES = EngineSettings.model_fields["max_image_bytes"].default
MAX_IMAGES = EngineSettings.model_fields["max_images"].default
CONTEXT_WARNING = 0.9  # the count turns red past this share of the context
THUMB = 72
NO_VISION = (
    "The loaded model cannot read images: it has no vision projector, so the question cannot go with "
    'them. <a href="library:images">Load a model that reads images</a> (Model library, "Images"), or '
    "remove the images."
)


class ImageRefused(ValueError):
    """Not an image the engine takes (format, size, count): the message says which and why."""


def image_data_uri(data: bytes, name: str = "the image") -> str:
    """`data` as a data URI, after checking it is a whole PNG, JPEG or WebP image of a sane size."""
    if len(data) > MAX_IMAGE_BYTES:
        limit = MAX_IMAGE_BYTES // 2**20
        raise ImageRefused(f"{name} is {len(data) / 2**20:.1f} MiB; images up to {limit} MiB are taken")
    buf = QBuffer()
    buf.setData(QByteArray(data))
    buf.open(QBuffer.OpenModeFlag.ReadOnly)
    reader = QImageReader(buf)
    fmt = bytes(reader.format().data())
    if fmt not in IMAGE_FORMATS:
        kind = fmt.decode() or "not an image"
        raise ImageRefused(f"{name}: {kind}; PNG, JPEG and WebP images are taken")
    image = reader.read()
    if image.isNull():
        raise ImageRefused(f"{name} could not be read: {reader.errorString()}")
    if fmt == b"webp":  # the engine's decoder (llama.cpp's) reads PNG and JPEG, not WebP
        data, fmt = _png(image), b"png"
        if not data or len(data) > MAX_IMAGE_BYTES:
            raise ImageRefused(f"{name} as PNG is {len(data) / 2**20:.1f} MiB, over the limit")
    return f"data:{IMAGE_FORMATS[fmt]};base64,{base64.b64encode(data).decode()}"


def image_from_data_uri(uri: str) -> QImage:
    return QImage.fromData(base64.b64decode(uri.partition(",")[2]))


def _png(image: QImage) -> bytes:
    buf = QBuffer()
    buf.open(QBuffer.OpenModeFlag.WriteOnly)
    image.save(buf, "PNG")
    return bytes(buf.data().data())


def read_image_file(path: str | Path) -> tuple[bytes | None, str]:
    """(the file's bytes, its name), or (None, why not) for a file too big or unreadable; the size is
    checked before anything is read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            return None, f"{path.name} is not a file"
        if size > MAX_IMAGE_BYTES:
            limit = MAX_IMAGE_BYTES // 2**20
            return None, f"{path.name} is {size / 2**20:.1f} MiB; images up to {limit} MiB are taken"
        return path.read_bytes(), path.name
    except OSError as exc:
        return None, f"{path.name} could not be read: {exc.strerror}"


class QuestionEdit(QPlainTextEdit):
    """Plain text, plus images from drops and pastes (files, or image data such as a screenshot)."""

    imagesGiven = Signal(list)  # [(bytes, name)], or (None, why not) for a file that was not read

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return source.hasImage() or source.hasUrls() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        files = [u.toLocalFile() for u in source.urls() if u.isLocalFile()] if source.hasUrls() else []
        if files:
            self.imagesGiven.emit([read_image_file(f) for f in files])
        elif source.hasImage():
            self.imagesGiven.emit([(_png(QImage(source.imageData())), "the pasted image")])
        else:
            super().insertFromMimeData(source)


class Composer(QWidget):
    """The question, its images (the attach button, drops and pastes) and the context count; `refused`
    says why an image was not taken; a model without vision says so as soon as an image is added, with
    a link to the library's Images section (`libraryRequested`)."""

    refused = Signal(str)
    changed = Signal()
    libraryRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.vision = True  # until the engine says otherwise, nothing is refused
        self.edit = QuestionEdit(placeholderText="Ask anything (Ctrl+Enter sends)")
        self.edit.setMaximumHeight(120)
        self.edit.imagesGiven.connect(self.add_images)
        self.edit.textChanged.connect(self.changed)
        self.images: list[str] = []
        self.attach = QToolButton(text="Attach")
        self.attach.setIcon(icons.paperclip(self.palette().color(QPalette.ColorRole.ButtonText)))
        self.attach.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.attach.setToolTip("Attach a PNG, JPEG or WebP image to the question (or drop or paste it here)")
        self.attach.clicked.connect(self.choose_images)
        self._thumbs = QHBoxLayout()
        self._thumbs.setContentsMargins(0, 0, 0, 0)
        self._thumb_row = QWidget()
        self._thumb_row.setLayout(self._thumbs)
        self._thumb_row.hide()
        self.no_vision = QLabel(NO_VISION, wordWrap=True)
        self.no_vision.setObjectName("no-vision")
        self.no_vision.linkActivated.connect(lambda _link: self.libraryRequested.emit())
        self.no_vision.hide()
        self.count = ElidedLabel("")
        self.count.setObjectName("context-count")
        self.setAcceptDrops(True)  # the whole box is the drop zone, not only the text
        box = QHBoxLayout()
        box.setContentsMargins(0, 0, 0, 0)
        box.addWidget(self.edit, 1)
        box.addWidget(self.attach, 0, Qt.AlignmentFlag.AlignBottom)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.no_vision)
        layout.addWidget(self._thumb_row)
        layout.addLayout(box)
        self._restyle()
        theme.notifier().changed.connect(self._restyle)

    def set_vision(self, vision: bool) -> None:
        """Whether the loaded model reads images (the engine's /props); images in the box are judged again."""
        self.vision = vision
        self._show_thumbs()

    def choose_images(self) -> None:
        files, _ = QFileDialog.getOpenFileNames(
            self, "Attach images", "", "Images (*.png *.jpg *.jpeg *.webp);;All files (*)"
        )
        for file in files:
            self.add_image_file(file)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        self.edit.insertFromMimeData(event.mimeData())
        event.acceptProposedAction()

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._restyle()
        super().changeEvent(event)

    def _restyle(self) -> None:
        sheet = f"QLabel#no-vision {{ {theme.tone('warning').style()} padding: 6px; }}"
        if self.styleSheet() != sheet:
            self.setStyleSheet(sheet)

    # the text box's own API, for callers that treat the composer as the input
    def toPlainText(self) -> str:
        return self.edit.toPlainText()

    def setPlainText(self, text: str) -> None:
        self.edit.setPlainText(text)

    def clear(self) -> None:
        self.edit.clear()
        self.set_images([])

    def setFocus(self) -> None:
        self.edit.setFocus()

    def show_context(self, used: int, n_ctx: int, estimated: bool) -> None:
        """The context count: the conversation's tokens (the engine's count, or `estimated`) and an
        estimate of the question typed, against the context length."""
        typed = len(self.toPlainText()) // CHARS_PER_TOKEN
        total = used + typed
        mark = " (estimate)" if typed or estimated else ""
        of = f"{n_ctx:,}" if n_ctx > 0 else "…"  # "…": the engine has not said yet (it may size it itself)
        self.count.setText(f"context: {total:,} of {of} tokens{mark}")
        self.count.setToolTip(
            "Tokens of this conversation and your question, against the model's context length"
        )
        full = n_ctx > 0 and total > n_ctx * CONTEXT_WARNING
        self.count.setStyleSheet(theme.error_text(self) if full else "")

    def add_images(self, given: list[tuple[bytes | None, str]]) -> None:
        for data, name in given:
            if data is None:
                self.refused.emit(name)
                continue
            if len(self.images) >= MAX_IMAGES:
                self.refused.emit(f"At most {MAX_IMAGES} images go with one question.")
                break
            try:
                self.images.append(image_data_uri(data, name))
            except ImageRefused as exc:
                self.refused.emit(str(exc))
        self._show_thumbs()

    def add_image_file(self, path: str | Path) -> None:
        self.add_images([read_image_file(path)])

    def set_images(self, images: list[str]) -> None:
        self.images = list(images)
        self._show_thumbs()

    def remove_image(self, index: int) -> None:
        del self.images[index]
        self._show_thumbs()

    def _show_thumbs(self) -> None:
        while (item := self._thumbs.takeAt(0)) is not None:
            if item.widget() is not None:
                item.widget().deleteLater()
        for i, uri in enumerate(self.images):
            button = QToolButton()
            button.setIconSize(QSize(THUMB, THUMB))
            pix = QPixmap.fromImage(image_from_data_uri(uri))
            button.setIcon(pix.scaled(THUMB, THUMB, Qt.AspectRatioMode.KeepAspectRatio))
            button.setToolTip("Remove this image")
            button.clicked.connect(lambda _=False, i=i: self.remove_image(i))
            self._thumbs.addWidget(button)
        self._thumbs.addStretch(1)
        self._thumb_row.setVisible(bool(self.images))
        self.no_vision.setVisible(bool(self.images) and not self.vision)
        self.changed.emit()
