"""Icons drawn here (no icon theme is sure to be installed): the paperclip of the attach button."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap

SIZE = 32


def paperclip(colour: QColor) -> QIcon:
    """A paperclip, drawn as three nested loops of one stroke, in `colour`."""
    pixmap = QPixmap(SIZE, SIZE)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    pen = QPen(colour, 2.4, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap, Qt.PenJoinStyle.RoundJoin)
    painter.setPen(pen)
    painter.translate(SIZE / 2, SIZE / 2)
    painter.rotate(40)
    painter.translate(-SIZE / 2, -SIZE / 2)
    path = QPainterPath(QPointF(19, 9))
    path.lineTo(19, 23)
    path.arcTo(QRectF(11, 19, 8, 8), 0, -180)  # the bottom bend, around x 15
    path.lineTo(11, 7)
    path.arcTo(QRectF(11, 3, 12, 8), 180, -180)  # the top bend, wider
    path.lineTo(23, 24)
    path.arcTo(QRectF(7, 17, 16, 12), 0, -180)  # the outer bottom bend
    path.lineTo(7, 12)
    painter.drawPath(path)
    painter.end()
    return QIcon(pixmap)
