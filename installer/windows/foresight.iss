; Inno Setup script for Foresight on Windows (untested: built where Windows and Inno Setup 6 are).
; Build the bundle first on Windows with installer/build.sh's steps 1-3 (Git Bash, or by hand:
; a portable llama-cpp-python wheel, `pip install . pyinstaller`, `pyinstaller installer/foresight.spec`),
; then: iscc /DVersion=0.1.0 installer\windows\foresight.iss  ->  dist\Foresight-0.1.0-windows-x64.exe
#ifndef Version
  #define Version "0.1.0"
#endif

[Setup]
AppId={{6C4E9C1B-3F0A-4C39-9E4B-F0E5A1D2C7B8}
AppName=Foresight
AppVersion={#Version}
AppPublisher=Foresight
DefaultDirName={localappdata}\Programs\Foresight
DefaultGroupName=Foresight
PrivilegesRequired=lowest
OutputDir=..\..\dist
OutputBaseFilename=Foresight-{#Version}-windows-x64
Compression=lzma2
SolidCompression=yes
ArchitecturesInstallIn64BitMode=x64compatible
UninstallDisplayIcon={app}\Foresight.exe

[Files]
Source: "..\..\build\installer\dist\Foresight\*"; DestDir: "{app}"; Flags: recursesubdirs ignoreversion

[Icons]
Name: "{group}\Foresight"; Filename: "{app}\Foresight.exe"
Name: "{userdesktop}\Foresight"; Filename: "{app}\Foresight.exe"; Tasks: desktopicon

[Tasks]
Name: "desktopicon"; Description: "Create a desktop shortcut"; Flags: unchecked

[Run]
Filename: "{app}\Foresight.exe"; Description: "Start Foresight"; Flags: nowait postinstall skipifsilent

; Chats, models and settings live in the user's data folders and are kept on uninstall.
