"""The chat transcript: messages as HTML (Markdown, highlighted code with Copy links, accepted-draft marks).

Markdown is parsed by markdown-it-py and code is coloured with Pygments into inline styles (Qt's rich
text knows no style sheets). Each message's HTML is cached and the document is edited in place, so
while an answer streams only that answer is rendered again (`last_render_ms` says what that cost: a
caller re-rendering on a timer can stretch its interval with it). Accepted-draft highlighting maps
a message's `draft_spans` (character ranges of its Markdown source) onto the rendered text: text
whose source cannot be found verbatim (escapes, entities) is simply left unmarked.
"""

from __future__ import annotations

import base64
import hashlib
import html
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.util import ClassNotFound
from PySide6.QtCore import QEvent, Qt, QUrl
from PySide6.QtGui import (
    QDesktopServices,
    QGuiApplication,
    QImage,
    QPalette,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.chats.store import Message

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}


@dataclass(frozen=True)
class Theme:
    draft: str  # accepted-draft text: a green under the usual colours
    code_style: str  # the Pygments style; its own background frames the code
    inline_code: str
    muted: str  # stats lines, code block labels


LIGHT = Theme("#d8f0d2", "default", "#eff1f3", "#6a737d")
DARK = Theme("#23472b", "monokai", "#2d333b", "#9aa4ae")
DRAFT_BACKGROUND = LIGHT.draft
_theme = LIGHT  # follows the application's palette (Transcript.changeEvent)
CODE_FONT = "'DejaVu Sans Mono', Menlo, Consolas, monospace"
PLACEHOLDER = "<p><i>Start a conversation: type below and press Send.</i></p>"
TITLE_MARGIN_PX = 8
THUMBNAIL_PX = 160  # images sent with a question are shown this high at most
AT_BOTTOM_PX = 4  # a scroll bar this close to its end counts as "following the answer"

Spans = Sequence[Sequence[int]]


def stats_line(spec: dict[str, Any]) -> str:
    """An answer's speed and speculation in one line: tokens, tok/s, tokens per target pass, drafts taken."""
    parts = [f"{spec.get('emitted', 0)} tokens"]
    if spec.get("tokens_per_second"):
        parts.append(f"{spec['tokens_per_second']:.1f} tok/s")
    if spec.get("drafted"):
        parts.append(f"{spec.get('mean_accepted_len', 1):.2f} tokens per target pass")
        rate = spec.get("acceptance_rate", 0)
        parts.append(f"{spec.get('accepted', 0)} of {spec['drafted']} drafted accepted ({rate:.0%})")
    return " · ".join(parts)


@dataclass
class _Rendered:
    key: tuple[Any, ...]
    html: str
    code: dict[str, str]  # copy link -> the block's code


class Transcript(QTextBrowser):
    """A read-only view of one conversation; `show_messages` replaces what it shows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)  # every click comes to anchorClicked: Copy links and web links alike
        self.anchorClicked.connect(self._clicked)
        self._answer_md = _markdown(breaks=False)
        self._cache: list[_Rendered] = []
        self._shown: list[str] = []  # each message's HTML, as the document holds it
        self._tail_start: int | None = None  # where the last message begins in the document
        self._code: dict[str, str] = {}
        self._images: dict[str, QImage] = {}  # thumbnails of the images sent with questions
        self.last_render_ms = 0.0  # what the last show_messages took
        self._last: tuple[Sequence[dict[str, Any]], bool] = ((), False)
        self.setHtml(PLACEHOLDER)
        self._follow_palette()

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:  # the system went light or dark
            self._follow_palette()
        super().changeEvent(event)

    def _follow_palette(self) -> None:
        global _theme
        theme = DARK if self.palette().color(QPalette.ColorRole.Base).lightness() < 128 else LIGHT
        if theme is not _theme:
            _theme = theme
            self._cache, self._shown, self._tail_start = [], [], None
            self.show_messages(*self._last)

    def show_conversation(self, messages: Sequence[Message], highlight_drafts: bool = False) -> None:
        """Show a conversation's stored messages, each answer with its stats line."""
        self.show_messages(
            [
                {
                    "role": m.role,
                    "content": m.content,
                    "status": m.status,
                    "stats": stats_line(m.stats) if m.role == "assistant" and m.stats else "",
                    "draft_spans": m.draft_spans,
                    "images": m.images,
                }
                for m in messages
            ],
            highlight_drafts,
        )

    def show_messages(self, messages: Sequence[dict[str, Any]], highlight_drafts: bool = False) -> None:
        """Show `messages`: dicts with role, content, and optionally status ("complete" shows nothing;
        "writing" or "streaming" marks the answer in flight), stats (a line of text) and draft_spans
        ([start, end) character ranges of content that came from accepted drafts, shown when
        `highlight_drafts`). Scrolled to the end, the view follows new text; scrolled up, it stays."""
        t0 = time.perf_counter()
        self._last = (messages, highlight_drafts)
        try:
            self._show(messages, highlight_drafts)
        finally:
            self.last_render_ms = (time.perf_counter() - t0) * 1000

    def _show(self, messages: Sequence[dict[str, Any]], highlight_drafts: bool) -> None:
        bar = self.verticalScrollBar()
        follow = bar.value() >= bar.maximum() - AT_BOTTOM_PX
        previous = bar.value()
        if not messages:
            self._cache, self._code, self._shown, self._tail_start = [], {}, [], None
            self._images.clear()
            self.setHtml(PLACEHOLDER)
            return
        del self._cache[len(messages) :]
        parts = [self._message_html(i, m, highlight_drafts) for i, m in enumerate(messages)]
        self._code = {link: code for r in self._cache for link, code in r.code.items()}
        if parts == self._shown:
            return
        keep = len(self._shown) - 1  # the messages before the last one shown
        if self._tail_start is not None and len(parts) > keep and parts[:keep] == self._shown[:keep]:
            self._rewrite_tail(parts[keep:])  # streaming, or a new question or answer after the last
        else:
            self.setHtml("".join(f"{p}<hr/>" for p in parts[:-1]))
            self._tail_start = None
            self._rewrite_tail(parts[-1:])
        self._shown = parts
        bar.setValue(bar.maximum() if follow else previous)

    def _rewrite_tail(self, tail: list[str]) -> None:
        """Put `tail` in place of the last message shown (or after the document), noting where its own
        last message begins: setHtml of a 40-message transcript costs ~100 ms of parsing and layout,
        while an edit in place costs what the edited messages cost."""
        cursor = QTextCursor(self.document())
        if self._tail_start is None:
            cursor.movePosition(QTextCursor.MoveOperation.End)
            if cursor.position() > 0:  # after the earlier messages' closing ruler
                cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        else:
            cursor.setPosition(self._tail_start)
            cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
        for i, part in enumerate(tail):
            if i:
                cursor.insertHtml("<hr/>")
                cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            self._tail_start = cursor.position()
            # the message's first block (its title) takes this block's format, not the one in `part`
            title = QTextBlockFormat()
            title.setTopMargin(TITLE_MARGIN_PX)
            title.setBottomMargin(TITLE_MARGIN_PX)
            cursor.setBlockFormat(title)
            cursor.setCharFormat(QTextCharFormat())
            cursor.insertHtml(part)

    def code_block(self, link: str) -> str | None:
        """The code behind a Copy link (`copy:M.B`: message M's block B), as it was last shown."""
        return self._code.get(link)

    def _message_html(self, index: int, message: dict[str, Any], highlight: bool) -> str:
        role = str(message.get("role", "assistant"))
        content = str(message.get("content") or "")
        status = str(message.get("status") or "complete")
        stats = str(message.get("stats") or "")
        spans = tuple(tuple(s) for s in message.get("draft_spans") or ()) if highlight else ()
        images = tuple(message.get("images") or ())
        key = (role, content, status, stats, spans, images, _theme)
        if index < len(self._cache) and self._cache[index].key == key:
            return self._cache[index].html
        code: dict[str, str] = {}
        if role == "user":  # as typed: pasted code keeps its indentation, every line its own
            body = f'<p style="white-space:pre-wrap;">{html.escape(content.strip(chr(10)))}</p>'
        else:  # no trailing newline: inserted as the last message, it would show as a space
            body = _render_markdown(self._answer_md, content, spans, f"copy:{index}.", code).strip()
        title = html.escape(ROLE_TITLES.get(role, role))
        state = ""
        if status in ("writing", "streaming"):  # "streaming": the chat store's name for it
            state = " <i>(writing…)</i>"
        elif status != "complete":
            state = f" <i>({html.escape(status)})</i>"
        footer = f'<p style="color:{_theme.muted};"><i>{html.escape(stats)}</i></p>' if stats else ""
        head = f'<p style="margin-top:{TITLE_MARGIN_PX}px; margin-bottom:{TITLE_MARGIN_PX}px;">'
        pictures = "".join(self._image_html(uri) for uri in images)
        if pictures:
            pictures = f"<p>{pictures}</p>"
        rendered = _Rendered(key, f"{head}<b>{title}</b>{state}</p>{pictures}{body}{footer}", code)
        if index < len(self._cache):
            self._cache[index] = rendered
        else:
            self._cache.append(rendered)
        return rendered.html

    def _image_html(self, uri: str) -> str:
        """A thumbnail of a data-URI image, named by its hash (`loadResource` hands it to the document)."""
        name = f"image:{hashlib.sha1(uri.encode()).hexdigest()}"
        if name not in self._images:
            try:
                image = QImage.fromData(base64.b64decode(uri.partition(",")[2], validate=True))
            except ValueError:  # not base64
                image = QImage()
            if image.isNull():
                return "<i>(an image that could not be read)</i> "
            if image.height() > THUMBNAIL_PX:
                image = image.scaledToHeight(THUMBNAIL_PX, Qt.TransformationMode.SmoothTransformation)
            self._images[name] = image
        return f'<img src="{name}"/> '

    def loadResource(self, kind: int, url: QUrl) -> Any:
        # only the thumbnails this view made: an answer's `![](/some/path)` must not read local files
        return self._images.get(url.toString())

    def _clicked(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            code = self._code.get(url.toString())
            if code is not None:
                QGuiApplication.clipboard().setText(code)
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)


# --- Markdown to Qt-friendly HTML ---------------------------------------------------------------


def _markdown(breaks: bool) -> MarkdownIt:
    # html off: a model's (or a user's) markup is shown as text, never interpreted
    md = MarkdownIt("commonmark", {"html": False, "breaks": breaks}).enable(["table", "strikethrough"])
    md.add_render_rule("text", _render_text)
    md.add_render_rule("code_inline", _render_code_inline)
    md.add_render_rule("fence", _render_fence)
    md.add_render_rule("table_open", lambda *_: '<table border="1" cellspacing="0" cellpadding="4">')
    md.add_render_rule("code_block", _render_fence)
    return md


def _render_markdown(
    md: MarkdownIt, source: str, spans: Spans, link_prefix: str, code: dict[str, str]
) -> str:
    tokens = md.parse(source)
    env: dict[str, Any] = {"code": code, "link_prefix": link_prefix, "mask": None}
    if spans:
        mask = bytearray(len(source))
        for start, end in spans:
            start, end = max(0, start), min(end, len(source))
            if end > start:
                mask[start:end] = b"\x01" * (end - start)
        env["mask"] = mask
        _locate(tokens, source)
    return md.renderer.render(tokens, md.options, env)


def _locate(tokens: list[Token], source: str) -> None:
    """Note in each text token's meta where its text starts in `source` (only where found verbatim)."""
    line_starts = [0]
    for i, ch in enumerate(source):
        if ch == "\n":
            line_starts.append(i + 1)

    def line_start(line: int) -> int:
        return line_starts[line] if line < len(line_starts) else len(source)

    for token in tokens:
        if token.map is None:
            continue
        cursor, end = line_start(token.map[0]), line_start(token.map[1])
        if token.type in ("fence", "code_block"):
            first = token.map[0] + (1 if token.type == "fence" else 0)
            token.meta["lines"] = _line_offsets(token.content, source, line_start(first), end)
        elif token.type == "inline":
            for child in token.children or ():
                if child.type in ("text", "code_inline") and child.content:
                    at = source.find(child.content, cursor, end)
                    if at >= 0:
                        child.meta["offset"] = at
                        cursor = at + len(child.content)


def _line_offsets(content: str, source: str, cursor: int, end: int) -> list[int]:
    """Where each line of a code block starts in `source` (-1: not found verbatim, e.g. tabs expanded)."""
    offsets = []
    for line in content.splitlines(keepends=True):
        text = line.rstrip("\n")
        at = source.find(text, cursor, end) if text else cursor
        offsets.append(at)
        if at >= 0:
            cursor = at + len(text) + 1
    return offsets


def _marked(text: str, offset: int | None, mask: bytearray | None) -> str:
    """`text` escaped, its accepted-draft characters on the draft background."""
    if mask is None or offset is None:
        return html.escape(text, quote=False)
    out, i = [], 0
    while i < len(text):
        drafted = offset + i < len(mask) and mask[offset + i] == 1
        j = i + 1
        while j < len(text) and (offset + j < len(mask) and mask[offset + j] == 1) == drafted:
            j += 1
        piece = html.escape(text[i:j], quote=False)
        out.append(f'<span style="background-color:{_theme.draft};">{piece}</span>' if drafted else piece)
        i = j
    return "".join(out)


def _render_text(self: Any, tokens: list[Token], idx: int, options: Any, env: dict[str, Any]) -> str:
    token = tokens[idx]
    return _marked(token.content, token.meta.get("offset"), env["mask"])


def _render_code_inline(self: Any, tokens: list[Token], idx: int, options: Any, env: dict[str, Any]) -> str:
    token = tokens[idx]
    text = _marked(token.content, token.meta.get("offset"), env["mask"])
    return f'<span style="font-family:{CODE_FONT}; background-color:{_theme.inline_code};">{text}</span>'


def _render_fence(self: Any, tokens: list[Token], idx: int, options: Any, env: dict[str, Any]) -> str:
    token = tokens[idx]
    code = token.content[:-1] if token.content.endswith("\n") else token.content
    language = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
    link = f"{env['link_prefix']}{len(env['code'])}"
    env["code"][link] = code
    style = get_style_by_name(_theme.code_style)
    lines = token.meta.get("lines") if env["mask"] is not None else None
    # no code yet: the language may still be arriving ("pyt"), and a failed lookup scans every plugin
    body = _highlight(code, language if code else "", env["mask"], lines)
    label = html.escape(language) if language else "code"
    return (
        f'<table width="100%" cellspacing="0" cellpadding="6" border="0"'
        f' style="background-color:{style.background_color};">'
        f'<tr><td style="color:{_theme.muted};">{label}</td>'
        f'<td align="right"><a href="{link}">Copy</a></td></tr>'
        f'<tr><td colspan="2"><pre style="font-family:{CODE_FONT};">{body}</pre></td></tr></table>'
    )


@lru_cache(maxsize=64)
def _lexer(language: str) -> Lexer:
    # the lexer must give back the code unchanged, or offsets (and draft marks) would drift
    options = {"stripnl": False, "stripall": False, "ensurenl": False}
    try:
        return get_lexer_by_name(language, **options) if language else TextLexer(**options)
    except ClassNotFound:
        return TextLexer(**options)


@lru_cache(maxsize=256)
def _token_style(token_type: Any, code_style: str) -> str:
    s = get_style_by_name(code_style).style_for_token(token_type)
    css = []
    if s["color"]:
        css.append(f"color:#{s['color']}")
    if s["bold"]:
        css.append("font-weight:bold")
    if s["italic"]:
        css.append("font-style:italic")
    if s["underline"]:
        css.append("text-decoration:underline")
    if s["bgcolor"]:
        css.append(f"background-color:#{s['bgcolor']}")
    return ";".join(css)


def _highlight(code: str, language: str, mask: bytearray | None, lines: list[int] | None) -> str:
    """Pygments tokens as inline-styled spans; accepted-draft characters get the draft background."""
    tokens = list(_lexer(language).get_tokens(code))
    drafted = None
    if mask is not None and lines is not None and "".join(v for _, v in tokens) == code:
        drafted = _code_mask(code, mask, lines)
    out, at = [], 0
    for token_type, value in tokens:
        style = _token_style(token_type, _theme.code_style)
        i = 0
        while i < len(value):
            j = i + 1
            if drafted is not None:
                while j < len(value) and drafted[at + j] == drafted[at + i]:
                    j += 1
            else:
                j = len(value)
            css = style
            if drafted is not None and drafted[at + i]:
                css = (
                    f"{style};background-color:{_theme.draft}"
                    if style
                    else f"background-color:{_theme.draft}"
                )
            piece = html.escape(value[i:j], quote=False)
            out.append(f'<span style="{css}">{piece}</span>' if css else piece)
            i = j
        at += len(value)
    return "".join(out)


def _code_mask(code: str, mask: bytearray, lines: list[int]) -> bytearray:
    """The draft mask of each character of `code`, taken from its lines' places in the source."""
    drafted = bytearray(len(code))
    at = 0
    for line, offset in zip(code.splitlines(keepends=True), lines, strict=False):
        if offset >= 0:
            drafted[at : at + len(line)] = mask[offset : offset + len(line)].ljust(len(line), b"\0")
        at += len(line)
    return drafted
