"""The question box's images: checked by content, WebP sent as PNG, a big file refused unread."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from PySide6.QtCore import QBuffer
from PySide6.QtGui import QColor, QImage
from pytestqt.qtbot import QtBot

from app.ui import composer
from app.ui.composer import Composer, ImageRefused, image_data_uri


def _encoded(fmt: str, colour: str = "green") -> bytes:
    image = QImage(16, 12, QImage.Format.Format_RGB32)
    image.fill(QColor(colour))
    buf = QBuffer()
    buf.open(QBuffer.OpenModeFlag.WriteOnly)
    assert image.save(buf, fmt)
    return bytes(buf.data().data())


@pytest.mark.usefixtures("qapp")
def test_png_and_jpeg_go_as_they_are_and_webp_goes_as_png() -> None:
    for fmt, mime in (("PNG", "image/png"), ("JPEG", "image/jpeg")):
        data = _encoded(fmt)
        assert image_data_uri(data) == f"data:{mime};base64,{base64.b64encode(data).decode()}"
    uri = image_data_uri(_encoded("WEBP"), "leaf.webp")
    assert uri.startswith("data:image/png;base64,")
    back = QImage.fromData(base64.b64decode(uri.partition(",")[2]))
    assert (back.width(), back.height()) == (16, 12)
    pixel = back.pixelColor(3, 3)  # WebP is lossy: green, give or take a step
    assert (abs(pixel.red() - 0) <= 4, abs(pixel.green() - 128) <= 4, abs(pixel.blue() - 0) <= 4) == (
        True,
        True,
        True,
    )


@pytest.mark.usefixtures("qapp")
def test_what_is_not_a_whole_image_is_refused_by_name() -> None:
    with pytest.raises(ImageRefused, match=r"notes\.txt"):
        image_data_uri(b"just some text", "notes.txt")
    with pytest.raises(ImageRefused, match="could not be read"):
        image_data_uri(_encoded("PNG")[:40], "cut.png")  # a header without its pixels
    with pytest.raises(ImageRefused, match="PNG, JPEG and WebP images are taken"):
        image_data_uri(_encoded("BMP"), "old.bmp")


def test_a_file_over_the_limit_is_refused_before_it_is_read(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = Composer()
    qtbot.addWidget(box)
    monkeypatch.setattr(composer, "MAX_IMAGE_BYTES", 1000)
    big = tmp_path / "big.png"
    big.write_bytes(_encoded("PNG") + b"\0" * 2000)
    refusals: list[str] = []
    box.refused.connect(refusals.append)
    box.add_image_file(big)
    box.add_image_file(tmp_path / "missing.png")
    assert box.images == []
    assert "big.png" in refusals[0]
    assert "MiB" in refusals[0]
    assert "missing.png could not be read" in refusals[1]
    small = tmp_path / "small.png"
    small.write_bytes(_encoded("PNG"))
    box.add_image_file(small)
    assert len(box.images) == 1
    box.remove_image(0)
    assert box.images == []
