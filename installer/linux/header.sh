#!/bin/sh
# Foresight for Linux: a self-extracting installer. Run it (double-click and choose "Run", or
# `sh Foresight-*.run`); no root needed. It installs into ~/.local/share/Foresight/app, adds a menu
# entry, an icon and the `foresight` command in ~/.local/bin, and writes an uninstaller:
#   ~/.local/share/Foresight/uninstall.sh [--purge]   (--purge also deletes chats, models and settings)
# FORESIGHT_PREFIX moves the installation; nothing outside it and the entries above is touched.
set -eu
DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
ROOT="${FORESIGHT_PREFIX:-$DATA/Foresight}"
APP="$ROOT/app"
BIN="$HOME/.local/bin"
say() { printf '%s\n' "$*"; }
if [ -e "$APP" ] && [ ! -x "$APP/Foresight" ]; then
    say "$APP exists and is not a Foresight installation: nothing was changed (set FORESIGHT_PREFIX)"
    exit 1
fi
line=$(awk '/^__FORESIGHT_PAYLOAD__$/ { print NR + 1; exit }' "$0")
mkdir -p "$ROOT"
rm -rf "$APP.new"
mkdir "$APP.new"
if ! tail -n +"$line" "$0" | tar xzf - -C "$APP.new"; then
    rm -rf "$APP.new"
    say "the installer is damaged (the archive did not unpack); download it again"
    exit 1
fi
# switch over only once the new copy is complete: an interrupted install leaves the old one working
[ -d "$APP" ] && mv "$APP" "$APP.old"
mv "$APP.new" "$APP"
rm -rf "$APP.old"
mkdir -p "$DATA/applications" "$DATA/icons/hicolor/256x256/apps" "$BIN"
cp "$APP/foresight.png" "$DATA/icons/hicolor/256x256/apps/foresight.png"
cat > "$DATA/applications/foresight.desktop" <<DESKTOP
[Desktop Entry]
Type=Application
Name=Foresight
Comment=Fast, private, local AI
Exec="$APP/Foresight"
Icon=foresight
Terminal=false
Categories=Development;Utility;
DESKTOP
ln -sf "$APP/Foresight" "$BIN/foresight"
cat > "$ROOT/uninstall.sh" <<UNINSTALL
#!/bin/sh
# Removes Foresight; with --purge also its data (chats, models, settings, cache, logs).
set -eu
if [ -e "$APP" ] && [ ! -x "$APP/Foresight" ]; then
    echo "$APP is not a Foresight installation: nothing was removed"
    exit 1
fi
rm -rf "$APP" "$DATA/applications/foresight.desktop" "$DATA/icons/hicolor/256x256/apps/foresight.png"
[ -L "$BIN/foresight" ] && rm -f "$BIN/foresight"
if [ "\${1:-}" = "--purge" ]; then
    rm -rf "$DATA/Foresight" "\${XDG_CONFIG_HOME:-$HOME/.config}/Foresight" "\${XDG_CACHE_HOME:-$HOME/.cache}/Foresight" \
        "\${XDG_STATE_HOME:-$HOME/.local/state}/Foresight"
    echo "Foresight and its data were removed"
else
    rm -f "$ROOT/uninstall.sh"
    rmdir "$ROOT" 2>/dev/null || true
    echo "Foresight was removed; your chats, models and settings were kept (uninstall.sh --purge removes them)"
fi
UNINSTALL
chmod +x "$ROOT/uninstall.sh"
say "Foresight is installed in $APP"
say "start it from the applications menu, or run: $BIN/foresight"
say "uninstall: $ROOT/uninstall.sh"
exit 0
__FORESIGHT_PAYLOAD__
