#!/usr/bin/env bash
# macOS disk image (untested: run on a Mac with Xcode's command line tools). The same spec builds a
# one-folder bundle there; this wraps it as Foresight.app and puts it in a .dmg with hdiutil.
#   bash installer/build.sh        # steps 1-3 work on macOS too (Metal is llama.cpp's default there)
#   bash installer/macos/build-dmg.sh
# The app is not signed or notarised: first start needs right-click > Open.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build/installer
version=$("$B/venv/bin/python" -c 'import app; print(app.__version__)')
APPDIR="$B/Foresight.app"
rm -rf "$APPDIR" && mkdir -p "$APPDIR/Contents/MacOS" "$APPDIR/Contents/Resources"
cp -R "$B/dist/Foresight/." "$APPDIR/Contents/MacOS/"
sips -s format icns assets/foresight.png --out "$APPDIR/Contents/Resources/foresight.icns" >/dev/null
cat > "$APPDIR/Contents/Info.plist" <<PLIST
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict>
  <key>CFBundleName</key><string>Foresight</string>
  <key>CFBundleIdentifier</key><string>app.foresight.desktop</string>
  <key>CFBundleVersion</key><string>$version</string>
  <key>CFBundleShortVersionString</key><string>$version</string>
  <key>CFBundleExecutable</key><string>Foresight</string>
  <key>CFBundleIconFile</key><string>foresight</string>
  <key>LSMinimumSystemVersion</key><string>12.0</string>
  <key>NSHighResolutionCapable</key><true/>
</dict></plist>
PLIST
mkdir -p dist
hdiutil create -volname Foresight -srcfolder "$APPDIR" -ov -format UDZO "dist/Foresight-$version-macos.dmg"
echo "dist/Foresight-$version-macos.dmg"
